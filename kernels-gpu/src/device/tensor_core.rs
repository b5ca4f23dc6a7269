//! Tensor-core matrix products and the copies that feed them (sm_80 and newer).
//!
//! * [`mma`]: `D = A·B + D` for a 16×16 `A` and a 16×8 `B` of f16 or bf16, f32 accumulators
//!   (`mma.sync.aligned.m16n8k16`), one warp-wide instruction.
//! * [`ldmatrix_x4`], [`ldmatrix_x4_trans`]: four 8×8 matrices of 16-bit values from shared
//!   memory into the fragment layout `mma` takes, each lane giving one row's address.
//! * [`cp_async_16`], [`cp_async_commit`], [`cp_async_wait`]: 16-byte copies from global to
//!   shared memory that run while the warp computes.
//! * [`SharedTile`]: a static shared-memory array addressed as the 32-bit offsets those
//!   instructions take.
//!
//! Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with `g = lane / 4` and
//! `t = lane % 4`: `A`'s four registers hold rows `g`, `g + 8` at columns `2t, 2t + 1` and
//! `2t + 8, 2t + 9` (two 16-bit values per register, the lower column in the low half); `B`'s
//! two registers hold rows (the `k` index) `2t, 2t + 1` and `2t + 8, 2t + 9` of column `g`; the
//! accumulator's four f32 are row `g` at columns `2t, 2t + 1`, then row `g + 8`.
use super::element::{Bf16, F16};
use core::arch::asm;

/// A 16-bit element type the tensor cores multiply.
pub trait MmaElement: Copy {
    /// Whether the bits are bfloat16 (else IEEE binary16).
    const IS_BF16: bool;
}

impl MmaElement for F16 {
    const IS_BF16: bool = false;
}

impl MmaElement for Bf16 {
    const IS_BF16: bool = true;
}

/// `c += a·b` for one 16×16 `a` and 16×8 `b` fragment pair, accumulating in f32.
///
/// # Safety
/// All 32 lanes of the warp call it together, with fragments laid out as the module docs say.
#[inline(always)]
pub unsafe fn mma<T: MmaElement>(c: &mut [f32; 4], a: &[u32; 4], b: [u32; 2]) {
    // SAFETY: a register-only instruction; the caller keeps the warp converged.
    unsafe {
        if T::IS_BF16 {
            asm!(
                "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{{0}, {1}, {2}, {3}}}, {{{4}, {5}, {6}, {7}}}, {{{8}, {9}}}, {{{0}, {1}, {2}, {3}}};",
                inout(reg32) c[0], inout(reg32) c[1], inout(reg32) c[2], inout(reg32) c[3],
                in(reg32) a[0], in(reg32) a[1], in(reg32) a[2], in(reg32) a[3],
                in(reg32) b[0], in(reg32) b[1],
                options(pure, nomem, nostack, preserves_flags),
            )
        } else {
            asm!(
                "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{{0}, {1}, {2}, {3}}}, {{{4}, {5}, {6}, {7}}}, {{{8}, {9}}}, {{{0}, {1}, {2}, {3}}};",
                inout(reg32) c[0], inout(reg32) c[1], inout(reg32) c[2], inout(reg32) c[3],
                in(reg32) a[0], in(reg32) a[1], in(reg32) a[2], in(reg32) a[3],
                in(reg32) b[0], in(reg32) b[1],
                options(pure, nomem, nostack, preserves_flags),
            )
        }
    }
}

/// Two f32 rounded to nearest into one register of two 16-bit values, `lo` in the low half: the
/// layout of an `mma` operand register and of two neighbouring values in memory.
#[inline(always)]
pub fn pack<T: MmaElement>(lo: f32, hi: f32) -> u32 {
    let packed: u32;
    // SAFETY: a register-only conversion (`cvt.rn.{bf16x2,f16x2}.f32` puts its first source in
    // the upper half).
    unsafe {
        if T::IS_BF16 {
            asm!("cvt.rn.bf16x2.f32 {0}, {1}, {2};", out(reg32) packed, in(reg32) hi, in(reg32) lo,
                options(pure, nomem, nostack, preserves_flags))
        } else {
            asm!("cvt.rn.f16x2.f32 {0}, {1}, {2};", out(reg32) packed, in(reg32) hi, in(reg32) lo,
                options(pure, nomem, nostack, preserves_flags))
        }
    }
    packed
}

/// Four 8×8 matrices of 16-bit values from shared memory: lane `l` gives the address of row
/// `l % 8` of matrix `l / 8`; register `i` of every lane receives its part of matrix `i` in the
/// `mma` fragment layout (row `lane / 4`, columns `2·(lane % 4)` and the next).
///
/// # Safety
/// All 32 lanes call it together; each address is a 16-byte aligned offset into this block's
/// shared memory, of 16 readable bytes that no copy is still writing.
#[inline(always)]
pub unsafe fn ldmatrix_x4(row_address: u32) -> [u32; 4] {
    let r: [u32; 4];
    // SAFETY: the caller's contract. Not `nomem`: it must stay between the barriers that order it
    // after the copies that fill the tile.
    unsafe {
        let (r0, r1, r2, r3): (u32, u32, u32, u32);
        asm!(
            "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{0}, {1}, {2}, {3}}}, [{4}];",
            out(reg32) r0, out(reg32) r1, out(reg32) r2, out(reg32) r3, in(reg32) row_address,
            options(nostack, preserves_flags, readonly),
        );
        r = [r0, r1, r2, r3];
    }
    r
}

/// As [`ldmatrix_x4`], each matrix transposed: register `i` receives matrix `i`'s rows
/// `2·(lane % 4)` and the next at column `lane / 4`, the `B` fragment of a matrix stored with
/// its `k` index along the rows.
///
/// # Safety
/// As for [`ldmatrix_x4`].
#[inline(always)]
pub unsafe fn ldmatrix_x4_trans(row_address: u32) -> [u32; 4] {
    let r: [u32; 4];
    // SAFETY: as in `ldmatrix_x4`.
    unsafe {
        let (r0, r1, r2, r3): (u32, u32, u32, u32);
        asm!(
            "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{0}, {1}, {2}, {3}}}, [{4}];",
            out(reg32) r0, out(reg32) r1, out(reg32) r2, out(reg32) r3, in(reg32) row_address,
            options(nostack, preserves_flags, readonly),
        );
        r = [r0, r1, r2, r3];
    }
    r
}

/// Stores one 32-bit word at a shared-memory offset (two packed 16-bit values, say).
///
/// # Safety
/// `address` is a 4-byte aligned offset into this block's shared memory that no other thread
/// reads or writes until a barrier.
#[inline(always)]
pub unsafe fn store_shared_u32(address: u32, value: u32) {
    // SAFETY: the caller's contract.
    unsafe { asm!("st.shared.u32 [{0}], {1};", in(reg32) address, in(reg32) value, options(nostack, preserves_flags)) }
}

/// Starts copying 16 bytes from global `source` to shared offset `target`, of which the first
/// `valid` bytes (16 or 0) are read and the rest are zero-filled, so a row past the end of the
/// input arrives as zeros. It bypasses L1 (`.cg`): each tile is read once per block.
///
/// # Safety
/// `target` is a 16-byte aligned offset into this block's shared memory that nothing reads
/// until a [`cp_async_wait`] and a barrier; `source` is 16-byte aligned and, when `valid` is
/// 16, 16 readable bytes of global memory (when 0, any mapped address).
#[inline(always)]
pub unsafe fn cp_async_16(target: u32, source: *const u8, valid: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!(
            "cp.async.cg.shared.global [{0}], [{1}], 16, {2};",
            in(reg32) target, in(reg64) source as u64, in(reg32) valid,
            options(nostack, preserves_flags),
        )
    }
}

/// Starts copying 4 bytes from global `source` to shared offset `target`, or, when `valid` is
/// 0, writes zeros there: [`cp_async_16`] for scalars whose addresses are not 16-byte aligned.
///
/// # Safety
/// `target` is a 4-byte aligned offset into this block's shared memory that nothing reads until
/// a [`cp_async_wait`] and a barrier; `source` is 4-byte aligned and, when `valid` is 4, 4
/// readable bytes of global memory (when 0, any mapped address).
#[inline(always)]
pub unsafe fn cp_async_4(target: u32, source: *const u8, valid: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!(
            "cp.async.ca.shared.global [{0}], [{1}], 4, {2};",
            in(reg32) target, in(reg64) source as u64, in(reg32) valid,
            options(nostack, preserves_flags),
        )
    }
}

/// Reads an f32 at a shared-memory offset.
///
/// # Safety
/// `address` is a 4-byte aligned offset into this block's shared memory, written before a
/// barrier that this thread has passed.
#[inline(always)]
pub unsafe fn load_shared_f32(address: u32) -> f32 {
    let value: f32;
    // SAFETY: the caller's contract.
    unsafe {
        asm!("ld.shared.f32 {v}, [{a}];", v = out(reg32) value, a = in(reg32) address, options(nostack, preserves_flags, readonly))
    };
    value
}

/// Closes the group of copies started since the last commit.
#[inline(always)]
pub fn cp_async_commit() {
    // SAFETY: no operands; it only marks a point in this thread's copy queue.
    unsafe { asm!("cp.async.commit_group;", options(nostack, preserves_flags)) }
}

/// Waits until at most `PENDING` (0 or 1) of this thread's committed copy groups are still in
/// flight. Other threads' copies are visible after a barrier that follows their own wait.
#[inline(always)]
pub fn cp_async_wait<const PENDING: u32>() {
    // SAFETY: no operands; it waits on this thread's own copies.
    unsafe {
        if PENDING == 0 {
            asm!("cp.async.wait_group 0;", options(nostack, preserves_flags))
        } else {
            asm!("cp.async.wait_group 1;", options(nostack, preserves_flags))
        }
    }
}

/// Declares a block-scoped `.shared` array of `$bytes` bytes, 128-byte aligned, and evaluates to
/// its 32-bit shared-memory offset: the address form `ldmatrix` and `cp.async` take.
macro_rules! shared_tile {
    ($name:ident, $bytes:literal) => {{
        let offset: u32;
        // SAFETY: declares a shared array and reads its offset; it touches no memory. The braces
        // give the declaration its own scope (PTX reports a duplicate otherwise); not `pure`, so
        // LLVM never merges two arrays.
        unsafe {
            core::arch::asm!(
                "{{",
                concat!(".shared .align 128 .b8 ", stringify!($name), "[", stringify!($bytes), "];"),
                concat!("mov.u32 {o}, ", stringify!($name), ";"),
                "}}",
                o = out(reg32) offset,
                options(nostack, preserves_flags),
            )
        };
        offset
    }};
}
pub(crate) use shared_tile;

// The block's dynamic shared memory (its size is the launch's `shared_mem_bytes`). PTX allows
// `.extern` only at module scope, hence a module-level declaration.
core::arch::global_asm!(".extern .shared .align 128 .b8 opsmith_dynamic_shared[];");

/// The shared-window offset of the block's dynamic shared memory, whose size the launch sets
/// (above 48 KiB only after the host raises the kernel's limit).
#[inline(always)]
pub fn dynamic_shared() -> u32 {
    let offset: u32;
    // SAFETY: reads the offset of a shared symbol; touches no memory.
    unsafe {
        asm!("mov.u32 {o}, opsmith_dynamic_shared;", o = out(reg32) offset, options(pure, nomem, nostack, preserves_flags))
    };
    offset
}
