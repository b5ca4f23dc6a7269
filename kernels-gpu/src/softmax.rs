//! Softmax along the last axis, `y = softmax(scale * x + mask)`, and its backward
//! `gx = scale * y * (g - sum(g * y))`, one kernel each, in three tiers by row length.
//!
//! * Rows of up to 1024 values: one warp per row, `32 * V` values held in registers, `V` per
//!   lane (the name table has one such kernel per `V`).
//! * Rows of up to 16384 values: one thread block per row, 16 values a thread; the host sizes the
//!   block to the row (32 to 1024 threads, warp `w` holding values `512 w .. 512 (w + 1)`), and
//!   the maximum, the sum of exponentials and the backward's `sum(g * y)` are reduced across the
//!   block ([`BlockReduce`](crate::device::block::BlockReduce): shuffles, then 256 bytes of shared
//!   memory, one barrier per reduction). At 16 values a thread these kernels need at most 64
//!   registers, so blocks of 1024 threads launch; at 4096 values a row (256 threads, 56
//!   registers a thread at sm_90) 32 warps are resident per multiprocessor, where the one-warp
//!   kernel for 4096 values needed 254 registers a thread and left room for 8.
//! * Longer rows take the `_long` kernels (one warp per row), which stream the row in tiles
//!   twice: once for the maximum and the sum of exponentials (online: the sum is rescaled
//!   whenever the maximum grows), once to write.
//!
//! In the first two tiers `x` and the mask are read once and `y` written once: 12 bytes per f32
//! element with a full mask, the least any softmax can move. The backward of the block tier
//! holds `y` and reads `g` a second time (from L1 or L2, not DRAM): holding both would take
//! more than 64 registers.
//!
//! The mask is a `[mask_rows, cols]` matrix of additive terms (`-inf` masks a value out); row
//! `r` of `x` takes row `r % mask_rows` of it, which is how one `[seq, seq]` mask serves every
//! batch and head of an attention matrix. A row whose every term is `-inf` gives zeros.
use crate::names::{BlockRowKernel, RowKernel, SoftmaxKernels};

/// The largest block the block-per-row kernels take (a CUDA limit). Launching it needs at most
/// 64 registers a thread on a 64K-register multiprocessor, which the PTX test checks.
const MAX_BLOCK: u32 = 1024;

/// Slots per lane per tile of the `_long` kernels.
#[cfg(target_arch = "nvptx64")]
const LONG_TILE: usize = 32;

/// The bodies behind the entry points; each entry point picks, once per launch, packed or scalar
/// access and masked or not, so the row loop itself has no such branch. The bodies are generic
/// over the [`imp::RowGroup`] that holds a row: a warp or a whole block.
#[cfg(target_arch = "nvptx64")]
mod imp {
    use crate::device::block::BlockReduce;
    use crate::device::element::Element;
    use crate::device::index::GridStride;
    use crate::device::logsumexp::{LongExpSum, exp_bias, exp_shifted, local_max, reciprocal_or_zero};
    use crate::device::math::{CompensatedSum, fma};
    use crate::device::rows::{RowLanes, rows_packable};
    use crate::device::unroll::{Count, Unrolled, fold, from_fn};
    use crate::device::warp::{warp_max, warp_sum};

    /// The threads that hold one row together: which rows they visit, where each thread's
    /// values lie, and the row-wide collectives.
    pub trait RowGroup {
        /// The rows this group visits, every thread of the group the same ones.
        fn rows(&self, rows: u64) -> GridStride;
        /// The tile of a row held in registers that the calling thread's warp holds (see
        /// [`RowLanes`]): 0 for a warp, the warp's index in its block for a block.
        fn tile(&self) -> u64;
        /// Up to this many slots per thread the backward holds both `g` and `y` in registers;
        /// past it, `y` only, reading `g` again.
        const HELD_GRADIENT_SLOTS: usize;
        /// The largest `value` over the group (NaN ignored), to every thread of it.
        ///
        /// # Safety
        /// Every thread of the group calls it together.
        unsafe fn max(&mut self, value: f32) -> f32;
        /// The sum of `value` over the group, to every thread of it.
        ///
        /// # Safety
        /// Every thread of the group calls it together.
        unsafe fn sum(&mut self, value: f32) -> f32;
    }

    /// One warp per row.
    #[derive(Clone, Copy)]
    pub struct Warp;

    impl RowGroup for Warp {
        #[inline(always)]
        fn rows(&self, rows: u64) -> GridStride {
            GridStride::over_warps(rows)
        }
        const HELD_GRADIENT_SLOTS: usize = 64;
        #[inline(always)]
        fn tile(&self) -> u64 {
            0
        }
        #[inline(always)]
        unsafe fn max(&mut self, value: f32) -> f32 {
            // SAFETY: forwarded from the caller.
            unsafe { warp_max(value) }
        }
        #[inline(always)]
        unsafe fn sum(&mut self, value: f32) -> f32 {
            // SAFETY: forwarded from the caller.
            unsafe { warp_sum(value) }
        }
    }

    /// One thread block per row, reducing through its [`BlockReduce`] scratch.
    pub struct Block(pub BlockReduce);

    impl RowGroup for Block {
        #[inline(always)]
        fn rows(&self, rows: u64) -> GridStride {
            GridStride::over_blocks(rows)
        }
        // A block of 1024 threads launches only at 64 registers a thread or fewer.
        const HELD_GRADIENT_SLOTS: usize = 8;
        #[inline(always)]
        fn tile(&self) -> u64 {
            // SAFETY: reading the special register has no preconditions.
            unsafe { core::arch::nvptx::_thread_idx_x() as u64 / 32 }
        }
        #[inline(always)]
        unsafe fn max(&mut self, value: f32) -> f32 {
            // SAFETY: forwarded from the caller; the block kernels' contract bounds blockDim.
            unsafe { self.0.max(value) }
        }
        #[inline(always)]
        unsafe fn sum(&mut self, value: f32) -> f32 {
            // SAFETY: as above.
            unsafe { self.0.sum(value) }
        }
    }

    /// The forward kernels' parameters, as the entry points take them.
    #[derive(Clone, Copy)]
    pub struct Forward<T> {
        pub x: *const T,
        pub mask: *const T,
        pub out: *mut T,
        pub rows: u64,
        pub cols: u64,
        pub mask_rows: u64,
        pub scale: f32,
    }

    /// The backward kernels' parameters.
    #[derive(Clone, Copy)]
    pub struct Backward<T> {
        pub g: *const T,
        pub y: *const T,
        pub gx: *mut T,
        pub rows: u64,
        pub cols: u64,
        pub scale: f32,
    }

    /// # Safety
    /// The entry points' contract.
    #[inline(always)]
    pub unsafe fn forward<T: Element, G: RowGroup, const V: usize, const LONG: bool>(p: Forward<T>, group: G)
    where
        Count<V>: Unrolled,
    {
        let masked = p.mask_rows > 0;
        let packed = rows_packable(p.cols, [p.x, p.out as *const T]) && (!masked || rows_packable(p.cols, [p.mask]));
        // SAFETY: forwarded; `packed` was checked for every pointer the body reads or writes.
        unsafe {
            match (packed, masked) {
                (true, true) => forward_rows::<T, G, V, LONG, true, true>(p, group),
                (true, false) => forward_rows::<T, G, V, LONG, true, false>(p, group),
                (false, true) => forward_rows::<T, G, V, LONG, false, true>(p, group),
                (false, false) => forward_rows::<T, G, V, LONG, false, false>(p, group),
            }
        }
    }

    /// `LONG` (the two-pass tiles) only with [`Warp`]: a block's warps would each stream every
    /// tile of the row.
    #[inline(always)]
    unsafe fn forward_rows<
        T: Element,
        G: RowGroup,
        const V: usize,
        const LONG: bool,
        const PACKED: bool,
        const MASK: bool,
    >(
        p: Forward<T>,
        mut group: G,
    ) where
        Count<V>: Unrolled,
    {
        let (lanes, tile) = (RowLanes::<T, V, PACKED>::new(p.cols), group.tile());
        for r in group.rows(p.rows) {
            // `mask_rows > 0` when MASK; `checked_rem` spares a division-by-zero panic path.
            let mask_row = r.checked_rem(p.mask_rows).unwrap_or(0);
            // SAFETY: r < rows and mask_row < mask_rows, so each row start is inside its matrix.
            let (x, mask, out) = unsafe {
                (
                    p.x.add((r * p.cols) as usize),
                    if MASK { p.mask.add((mask_row * p.cols) as usize) } else { p.mask },
                    p.out.add((r * p.cols) as usize),
                )
            };
            let row = |tile| {
                // SAFETY: the row starts computed above hold `cols` values each.
                unsafe { logits::<T, V, PACKED, MASK>(lanes, x, mask, tile, p.scale) }
            };
            // SAFETY (every collective below): every thread of the group runs the same rows and
            // tiles, so the group is converged at each collective; the output row is this
            // group's alone, and within it each column belongs to one thread.
            if LONG {
                let local = (0..lanes.tiles()).fold(LongExpSum::EMPTY, |s, k| s.add(&row(k)));
                let max = unsafe { group.max(local.max) };
                let rescale = if local.max == max { 1.0 } else { exp_shifted(local.max, exp_bias(max)) };
                let sum = unsafe { group.sum(local.sum.total() * rescale) };
                let (bias, inv) = (exp_bias(max), reciprocal_or_zero(sum));
                for k in 0..lanes.tiles() {
                    let y = |x, m| exp_shifted(logit::<MASK>(x, m, p.scale), bias) * inv;
                    unsafe {
                        if MASK {
                            lanes.map_store([x, mask], out, k, |_, [x, m]| y(x, m))
                        } else {
                            lanes.map_store([x], out, k, |_, [x]| y(x, 0.0))
                        }
                    }
                }
            } else {
                let z = row(tile);
                let bias = exp_bias(unsafe { group.max(local_max(&z)) });
                let e: [f32; V] = from_fn(|s| exp_shifted(z[s], bias));
                let inv = reciprocal_or_zero(unsafe { group.sum(fold::<V, f32>(0.0, |sum, s| sum + e[s])) });
                unsafe { lanes.store(out, tile, &from_fn(|s| e[s] * inv)) };
            }
        }
    }

    /// One logit: `scale * x + mask` in one FMA, or `scale * x` without a mask.
    #[inline(always)]
    fn logit<const MASK: bool>(x: f32, mask: f32, scale: f32) -> f32 {
        if MASK { fma(x, scale, mask) } else { x * scale }
    }

    /// `scale * x + mask` over tile `tile` of a row (one FMA), `-inf` in slots past its end.
    ///
    /// # Safety
    /// `x` (and `mask` when `MASK`) are valid rows for `lanes`.
    #[inline(always)]
    unsafe fn logits<T: Element, const V: usize, const PACKED: bool, const MASK: bool>(
        lanes: RowLanes<T, V, PACKED>,
        x: *const T,
        mask: *const T,
        tile: u64,
        scale: f32,
    ) -> [f32; V]
    where
        Count<V>: Unrolled,
    {
        // SAFETY: forwarded from the caller.
        unsafe {
            if MASK {
                lanes.load_map([x, mask], tile, f32::NEG_INFINITY, |_, [x, m]| logit::<MASK>(x, m, scale))
            } else {
                lanes.load_map([x], tile, f32::NEG_INFINITY, |_, [x]| logit::<MASK>(x, 0.0, scale))
            }
        }
    }

    /// # Safety
    /// The entry points' contract.
    #[inline(always)]
    pub unsafe fn backward<T: Element, G: RowGroup, const V: usize, const LONG: bool>(p: Backward<T>, group: G)
    where
        Count<V>: Unrolled,
    {
        // SAFETY: forwarded; `packed` was checked for every pointer the body reads or writes.
        unsafe {
            if rows_packable(p.cols, [p.g, p.y, p.gx as *const T]) {
                backward_rows::<T, G, V, LONG, true>(p, group)
            } else {
                backward_rows::<T, G, V, LONG, false>(p, group)
            }
        }
    }

    /// `LONG` only with [`Warp`], as for the forward.
    #[inline(always)]
    unsafe fn backward_rows<T: Element, G: RowGroup, const V: usize, const LONG: bool, const PACKED: bool>(
        p: Backward<T>,
        mut group: G,
    ) where
        Count<V>: Unrolled,
    {
        let (lanes, tile) = (RowLanes::<T, V, PACKED>::new(p.cols), group.tile());
        let dot = |g: &[f32; V], y: &[f32; V]| fold::<V, f32>(0.0, |acc, s| fma(g[s], y[s], acc));
        for r in group.rows(p.rows) {
            let start = (r * p.cols) as usize;
            // SAFETY: r < rows, so each row start is inside its matrix.
            let (g, y, gx) = unsafe { (p.g.add(start), p.y.add(start), p.gx.add(start)) };
            let gx_of = |y: f32, g: f32, dot: f32| y * (g - dot) * p.scale;
            // SAFETY (every block below): the rows hold `cols` values and the output row is this
            // group's alone, each column one thread's; every thread of the group runs the same
            // rows and tiles, so the group is converged at each collective.
            if LONG {
                // Compensated: a lane adds thousands of products of a long row.
                let mut local = CompensatedSum::ZERO;
                for k in 0..lanes.tiles() {
                    unsafe { lanes.for_each([g, y], k, |_, [g, y]| local = local.add(g * y)) };
                }
                let total = unsafe { group.sum(local.total()) };
                for k in 0..lanes.tiles() {
                    unsafe { lanes.map_store([g, y], gx, k, |_, [g, y]| gx_of(y, g, total)) };
                }
            } else if V <= G::HELD_GRADIENT_SLOTS {
                let (gs, ys) = unsafe { (lanes.load(g, tile), lanes.load(y, tile)) };
                let total = unsafe { group.sum(dot(&gs, &ys)) };
                unsafe { lanes.store(gx, tile, &from_fn(|s| gx_of(ys[s], gs[s], total))) };
            } else {
                // Holding both g and y would take 2 V registers: y is held, and g read again
                // (from L1 or L2: this warp read it a moment ago). The second read goes through
                // a pointer the compiler cannot prove equal to the first (`rows < 2^63` makes the
                // offset 0), so it cannot reuse the first loads, which would hold them after all.
                let mut local = 0.0;
                let ys = unsafe {
                    lanes.load_map([g, y], tile, 0.0, |_, [g, y]| {
                        local = fma(g, y, local);
                        y
                    })
                };
                let total = unsafe { group.sum(local) };
                let g = g.wrapping_add((p.rows >> 63) as usize);
                unsafe { lanes.map_store([g], gx, tile, |s, [g]| gx_of(ys[s], g, total)) };
            }
        }
    }
}

macro_rules! softmax_family {
    (
        $(#[$table_doc:meta])*
        $table:ident, $elem:ty, {
            forward: [$($fwd:ident = $fwd_v:literal),+ $(,)?],
            forward_block: [$($fwd_b:ident = $fwd_b_v:literal),+ $(,)?],
            forward_long: $fwd_long:ident,
            backward: [$($bwd:ident = $bwd_v:literal),+ $(,)?],
            backward_block: [$($bwd_b:ident = $bwd_b_v:literal),+ $(,)?],
            backward_long: $bwd_long:ident $(,)?
        }
    ) => {
        $(#[$table_doc])*
        pub const $table: SoftmaxKernels = SoftmaxKernels {
            forward: &[$(RowKernel { name: stringify!($fwd), max_cols: 32 * $fwd_v }),+],
            forward_block: &[$(BlockRowKernel { name: stringify!($fwd_b), per_thread: $fwd_b_v, max_block: MAX_BLOCK }),+],
            forward_long: stringify!($fwd_long),
            backward: &[$(RowKernel { name: stringify!($bwd), max_cols: 32 * $bwd_v }),+],
            backward_block: &[$(BlockRowKernel { name: stringify!($bwd_b), per_thread: $bwd_b_v, max_block: MAX_BLOCK }),+],
            backward_long: stringify!($bwd_long),
        };

        $(
            #[doc = concat!("`out = softmax(scale * x + mask)` along the rows of a `rows × cols` matrix, for rows of at most ", stringify!($fwd_v), " × 32 values.")]
            ///
            /// Thread mapping: one warp per row (warps loop over rows), each lane holding its
            /// share of the row in registers ([`RowLanes`](crate::device::rows::RowLanes)); 16-byte
            /// packs when `cols` is a whole number of packs and every pointer is 16-byte aligned,
            /// scalar accesses otherwise. Any grid size is correct.
            ///
            /// `mask_rows == 0` means no mask (`mask` is not read); otherwise row `r` adds row
            /// `r % mask_rows` of the `[mask_rows, cols]` matrix `mask`.
            ///
            /// # Safety
            /// `x` and `out` are valid for `rows * cols` elements and `mask` (when
            /// `mask_rows > 0`) for `mask_rows * cols`, all aligned to the element type;
            /// `cols <= 32 * V`; `out` overlaps no input; `blockDim.x` is a multiple of 32.
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $fwd(
                x: *const $elem, mask: *const $elem, out: *mut $elem, rows: u64, cols: u64, mask_rows: u64, scale: f32,
            ) {
                crate::device::dependent_launch::prologue();
                // SAFETY: forwarded from this kernel's contract.
                unsafe { imp::forward::<$elem, _, $fwd_v, false>(imp::Forward { x, mask, out, rows, cols, mask_rows, scale }, imp::Warp) }
            }
        )+

        $(
            #[doc = concat!("`out = softmax(scale * x + mask)` along the rows of a `rows × cols` matrix, one thread block per row, for rows of at most ", stringify!($fwd_b_v), " × `blockDim.x` values.")]
            ///
            /// Thread mapping: one block per row (blocks loop over rows), warp `w` of the block
            /// holding values `32 V w .. 32 V (w + 1)` of the row in registers, laid out over its
            /// lanes as in the one-warp-per-row kernels
            /// ([`RowLanes`](crate::device::rows::RowLanes)); the maximum and the sum are reduced
            /// across the block
            /// ([`BlockReduce`](crate::device::block::BlockReduce), 256 bytes of shared memory);
            /// packed or scalar access and the mask as for the one-warp-per-row kernels. Any
            /// grid size is correct; the host sizes the block to the row.
            ///
            /// # Safety
            /// `x` and `out` are valid for `rows * cols` elements and `mask` (when
            /// `mask_rows > 0`) for `mask_rows * cols`, all aligned to the element type;
            /// `out` overlaps no input; the block is 1-D, `blockDim.x` is a multiple of 32 and at
            /// most 1024, and `cols <= V * blockDim.x`.
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $fwd_b(
                x: *const $elem, mask: *const $elem, out: *mut $elem, rows: u64, cols: u64, mask_rows: u64, scale: f32,
            ) {
                crate::device::dependent_launch::prologue();
                let block = imp::Block(crate::device::block::BlockReduce::new());
                // SAFETY: forwarded from this kernel's contract.
                unsafe { imp::forward::<$elem, _, $fwd_b_v, false>(imp::Forward { x, mask, out, rows, cols, mask_rows, scale }, block) }
            }
        )+

        /// `out = softmax(scale * x + mask)` for rows of any length: two passes over each row in
        /// tiles (the maximum and sum of exponentials, then the output).
        ///
        /// Thread mapping, mask and safety as for the register-resident kernels of this family,
        /// without the bound on `cols`.
        ///
        /// # Safety
        /// `x` and `out` are valid for `rows * cols` elements and `mask` (when `mask_rows > 0`)
        /// for `mask_rows * cols`, all aligned to the element type; `out` overlaps no input;
        /// `blockDim.x` is a multiple of 32.
        #[cfg(target_arch = "nvptx64")]
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $fwd_long(
            x: *const $elem, mask: *const $elem, out: *mut $elem, rows: u64, cols: u64, mask_rows: u64, scale: f32,
        ) {
            crate::device::dependent_launch::prologue();
            // SAFETY: forwarded from this kernel's contract.
            unsafe { imp::forward::<$elem, _, LONG_TILE, true>(imp::Forward { x, mask, out, rows, cols, mask_rows, scale }, imp::Warp) }
        }

        $(
            #[doc = concat!("`gx = scale * y * (g - sum(g * y))` along the rows of a `rows × cols` matrix (the backward of softmax), for rows of at most ", stringify!($bwd_v), " × 32 values.")]
            ///
            /// Thread mapping as for the forward kernels: one warp per row, held in registers.
            ///
            /// # Safety
            /// `g`, `y` and `gx` are valid for `rows * cols` elements and aligned to the element
            /// type; `cols <= 32 * V`; `gx` overlaps neither input; `blockDim.x` is a multiple of
            /// 32.
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $bwd(
                g: *const $elem, y: *const $elem, gx: *mut $elem, rows: u64, cols: u64, scale: f32,
            ) {
                crate::device::dependent_launch::prologue();
                // SAFETY: forwarded from this kernel's contract.
                unsafe { imp::backward::<$elem, _, $bwd_v, false>(imp::Backward { g, y, gx, rows, cols, scale }, imp::Warp) }
            }
        )+

        $(
            #[doc = concat!("The backward of softmax along the rows of a `rows × cols` matrix, one thread block per row, for rows of at most ", stringify!($bwd_b_v), " × `blockDim.x` values.")]
            ///
            /// Thread mapping as for the block-per-row forward kernels: the row held across
            /// the block, the dot product `sum(g * y)` reduced across it.
            ///
            /// # Safety
            /// `g`, `y` and `gx` are valid for `rows * cols` elements and aligned to the element
            /// type; `gx` overlaps neither input; the block is 1-D, `blockDim.x` is a multiple of
            /// 32 and at most 1024, and `cols <= V * blockDim.x`.
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $bwd_b(
                g: *const $elem, y: *const $elem, gx: *mut $elem, rows: u64, cols: u64, scale: f32,
            ) {
                crate::device::dependent_launch::prologue();
                let block = imp::Block(crate::device::block::BlockReduce::new());
                // SAFETY: forwarded from this kernel's contract.
                unsafe { imp::backward::<$elem, _, $bwd_b_v, false>(imp::Backward { g, y, gx, rows, cols, scale }, block) }
            }
        )+

        /// The backward of softmax for rows of any length: two passes over each row in tiles
        /// (the dot product `sum(g * y)`, then the output).
        ///
        /// Thread mapping as for the forward kernels of this family.
        ///
        /// # Safety
        /// `g`, `y` and `gx` are valid for `rows * cols` elements and aligned to the element
        /// type; `gx` overlaps neither input; `blockDim.x` is a multiple of 32.
        #[cfg(target_arch = "nvptx64")]
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $bwd_long(
            g: *const $elem, y: *const $elem, gx: *mut $elem, rows: u64, cols: u64, scale: f32,
        ) {
            crate::device::dependent_launch::prologue();
            // SAFETY: forwarded from this kernel's contract.
            unsafe { imp::backward::<$elem, _, LONG_TILE, true>(imp::Backward { g, y, gx, rows, cols, scale }, imp::Warp) }
        }
    };
}

softmax_family! {
    /// The softmax kernels for f32 tensors: one warp per row up to 1024 values, one block per
    /// row (16 values a thread, 32 to 1024 threads) up to 16384, two passes beyond.
    F32, f32, {
        forward: [softmax_f32_v8 = 8, softmax_f32_v16 = 16, softmax_f32_v32 = 32],
        forward_block: [softmax_block_f32_v16 = 16],
        forward_long: softmax_long_f32,
        backward: [softmax_backward_f32_v8 = 8, softmax_backward_f32_v16 = 16, softmax_backward_f32_v32 = 32],
        backward_block: [softmax_backward_block_f32_v16 = 16],
        backward_long: softmax_backward_long_f32,
    }
}

softmax_family! {
    /// The softmax kernels for f16 tensors (arithmetic in f32), by row length as for f32.
    F16, crate::device::element::F16, {
        forward: [softmax_f16_v8 = 8, softmax_f16_v16 = 16, softmax_f16_v32 = 32],
        forward_block: [softmax_block_f16_v16 = 16],
        forward_long: softmax_long_f16,
        backward: [softmax_backward_f16_v8 = 8, softmax_backward_f16_v16 = 16, softmax_backward_f16_v32 = 32],
        backward_block: [softmax_backward_block_f16_v16 = 16],
        backward_long: softmax_backward_long_f16,
    }
}

softmax_family! {
    /// The softmax kernels for bf16 tensors (arithmetic in f32), by row length as for f32.
    BF16, crate::device::element::Bf16, {
        forward: [softmax_bf16_v8 = 8, softmax_bf16_v16 = 16, softmax_bf16_v32 = 32],
        forward_block: [softmax_block_bf16_v16 = 16],
        forward_long: softmax_long_bf16,
        backward: [softmax_backward_bf16_v8 = 8, softmax_backward_bf16_v16 = 16, softmax_backward_bf16_v32 = 32],
        backward_block: [softmax_backward_block_bf16_v16 = 16],
        backward_long: softmax_backward_long_bf16,
    }
}
