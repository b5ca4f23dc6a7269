//! The fused attention forward: one block per 128 queries of one head (64 in the narrow form),
//! walking the keys in tiles of 64 with an online softmax (FlashAttention-2's loop order), on
//! `mma.sync` tensor cores.
//!
//! Per block: four warps, each owning 32 query rows as two 16-row `mma` tiles, so that every
//! `k` and `v` fragment a warp reads from shared memory feeds four `mma` (shared-memory reads,
//! not the tensor cores, bounded the 16-row form). The narrow form (`ROWS = 1`, 16 rows a warp)
//! makes twice as many blocks, for causal grids too small to balance the wide ones. The block's `q` tile is copied to
//! (dynamic) shared memory once; at head size 64 it moves into registers as `mma` `A`
//! fragments, at 128 (where the output accumulators take 128 registers a thread) it is read
//! again from shared memory for each tile of keys. For each tile of keys:
//!
//! 1. `S = q·kᵀ` (32 × 64 per warp, f32 in registers), from `k` fragments read with `ldmatrix`;
//! 2. masking (past `seq_k`, and above the diagonal when causal) and scaling by
//!    `scale·log2(e)`, so that every exponential is one `ex2`;
//! 3. the online softmax: each row's running maximum `m` grows to cover the tile, the running
//!    output and sum are multiplied by `2^(m_old − m_new)`, and `P = 2^(S − m_new)`;
//! 4. `O += P·v`, with `P` converted in registers from the accumulator layout to the `A`
//!    fragment layout (the two coincide for the m16n8k16 shape) and `v` read with a transposing
//!    `ldmatrix`.
//!
//! `k` and `v` tiles each have one shared buffer; the copy of `v` runs during step 1 and the
//! copy of the next `k` during steps 3–4, behind `cp.async`. Shared rows are stored in 16-byte
//! chunks whose index is XOR-ed with the row number mod 8, so the 8 rows an `ldmatrix` reads at
//! one column fall in 8 different bank groups.
//!
//! Row sums are kept per thread (each of the four lanes sharing a row holds a quarter of it)
//! and added across the four lanes once, at the end. A row that sees no key keeps `m = -inf`;
//! its exponentials are taken against 0 instead, so it sums to 0 and writes zeros and
//! `lse = -inf`.
use super::math::{LN_2, exp2_ftz, log2};
use super::tensor_core::{
    MmaElement, cp_async_16, cp_async_commit, cp_async_wait, dynamic_shared, ldmatrix_x4, ldmatrix_x4_trans, mma, pack,
};
use super::unroll::{Count, Unrolled, unroll};
use super::warp::xor_shuffle;
use core::arch::nvptx;

/// Query rows of one 16-row `mma` tile; a forward warp owns `ROWS` of them (1 or 2) and a
/// forward block `4·ROWS`.
pub const ROW_TILE: u32 = 16;
/// Keys per tile.
pub const BLOCK_K: u32 = 64;
/// Threads per block.
pub const THREADS: u32 = 128;
/// Key column groups of 8 in a tile: the `n` blocks of `S`.
const KEY_GROUPS: usize = BLOCK_K as usize / 8;

/// The byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile of `chunks` chunks
/// per row.
#[inline(always)]
pub(super) fn swizzled(row: u32, chunk: u32, chunks: u32) -> u32 {
    (row * chunks + (chunk ^ (row & 7))) * 16
}

/// Whether `key` is hidden from query `row`: past the last key, or above the diagonal when
/// causal. Written with non-short-circuit operators so that it compiles to predicates and
/// selects; the `&&`/`||` form became a branch per score.
#[inline(always)]
pub(super) fn hidden(key: u32, row: u32, seq_k: u32, causal: bool) -> bool {
    (key >= seq_k) | (causal & (key > row))
}

/// `%tid.x` through an asm statement that LLVM does not merge with other reads, so that values
/// derived from it are computed again where used instead of kept in registers across a loop.
#[inline(always)]
pub(super) fn thread_index_uncached() -> u32 {
    let tid: u32;
    // SAFETY: reads a special register; touches no memory. Not `pure`, so it is not merged.
    unsafe { core::arch::asm!("mov.u32 {t}, %tid.x;", t = out(reg32) tid, options(nomem, nostack, preserves_flags)) };
    tid
}

/// The head and the first row of the `tile`-row tile this block owns, in a grid of
/// `heads · ceil(rows / tile)` blocks (tiles of a head side by side); `None` for a block past the
/// last head, or no rows. With `last_first`, each head's tiles go in reverse order, so that the
/// causal tiles that see the most keys start first.
#[inline(always)]
pub(super) fn owned_tile(rows: u32, heads: u32, last_first: bool, tile: u32) -> Option<(u32, u32)> {
    let tiles = rows.div_ceil(tile);
    // SAFETY: reading a special register has no preconditions.
    let block = unsafe { nvptx::_block_idx_x() } as u32;
    if tiles == 0 || block / tiles >= heads {
        return None;
    }
    let index = if last_first { tiles - 1 - block % tiles } else { block % tiles };
    Some((block / tiles, index * tile))
}

/// Starts the copy of rows `first..first + R` of a `[rows, D]` matrix into a swizzled tile of
/// `R = LOADS · BLOCK · 8 / D` rows (`LOADS` 16-byte chunks per thread of a `BLOCK`-thread
/// block), as one commit group; rows past `rows` are zero-filled.
///
/// # Safety
/// `matrix` is valid for `rows·D` 16-byte aligned elements; the tile holds `R·D` elements and
/// nothing reads it until a wait and a barrier.
#[inline(always)]
pub(super) unsafe fn load_tile<const D: usize, const LOADS: usize, const BLOCK: u32>(
    tile: u32,
    matrix: *const u16,
    first: u32,
    rows: u32,
    tid: u32,
) where
    Count<LOADS>: Unrolled,
{
    let chunks = D as u32 / 8;
    unroll::<LOADS>(|i| {
        let c = tid + BLOCK * i as u32;
        let (r, chunk) = (c / chunks, c % chunks);
        let row = first + r;
        let valid = row < rows;
        // A row past the end copies nothing; its source is any mapped address.
        let source = if valid { matrix.wrapping_add(row as usize * D + chunk as usize * 8) } else { matrix };
        // SAFETY: `source` is inside the matrix when valid; `tile + swizzled(..)` is inside the tile.
        unsafe { cp_async_16(tile + swizzled(r, chunk, chunks), source as *const u8, if valid { 16 } else { 0 }) };
    });
    cp_async_commit();
}

/// The dynamic shared memory of a forward block with `rows` queries: a `rows`-row `q` tile and
/// one `BLOCK_K`-row tile each of `k` and `v`, `d` bf16/f16 elements a row.
pub const fn forward_shared_bytes(rows: u32, d: u32) -> u32 {
    (rows + 2 * BLOCK_K) * d * 2
}

/// The attention forward for head size `D`, with its unroll counts: `K_STEPS = D / 16` (the `k`
/// steps of `q·kᵀ`, and the pairs of 8-wide output column groups of `P·v`), `K_PAIRS = D / 32`
/// and `LOADS = D / 16` (copies per thread per 64-row tile); `ROWS`, the 16-row tiles of a warp
/// (2: each `k` and `v` fragment read from shared memory feeds four `mma` instead of two; 1:
/// blocks of half the queries, twice as many, for grids too small to balance), and
/// `MASKS = ROWS · 32`, the scores of a thread. See the module docs.
///
/// # Safety
/// The kernel's contract (`attention_forward_d*` in the attention family): `q`/`out` valid for
/// `heads·seq_q·D` elements and `k`/`v` for `heads·seq_k·D`, `lse` for `heads·seq_q`, all 16-byte
/// aligned, outputs disjoint from everything else; 128 threads per block,
/// `heads·ceil(seq_q / (64·ROWS))` blocks, `forward_shared_bytes(64·ROWS, D)` bytes of dynamic
/// shared memory.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn forward<
    T: MmaElement,
    const D: usize,
    const K_STEPS: usize,
    const K_PAIRS: usize,
    const LOADS: usize,
    const ROWS: usize,
    const MASKS: usize,
>(
    q: *const T,
    k: *const T,
    v: *const T,
    out: *mut T,
    lse: *mut f32,
    heads: u32,
    seq_q: u32,
    seq_k: u32,
    scale_log2: f32,
    causal: bool,
) where
    Count<K_STEPS>: Unrolled,
    Count<K_PAIRS>: Unrolled,
    Count<LOADS>: Unrolled,
    Count<ROWS>: Unrolled,
    Count<MASKS>: Unrolled,
{
    let block_rows = 4 * ROW_TILE * ROWS as u32;
    let Some((head, q_start)) = owned_tile(seq_q, heads, causal, block_rows) else { return };
    if seq_k == 0 {
        return;
    }
    // SAFETY: reading a special register has no preconditions.
    let tid = unsafe { nvptx::_thread_idx_x() } as u32;
    let (warp, lane) = (tid / 32, tid % 32);
    let t = lane % 4;
    let chunks = D as u32 / 8;

    // 64-row tiles: `ROWS` of q, one each of k and v.
    let tile_bytes = BLOCK_K * D as u32 * 2;
    let q_tile = dynamic_shared();
    let (k_tile, v_tile) = (q_tile + ROWS as u32 * tile_bytes, q_tile + (ROWS as u32 + 1) * tile_bytes);

    let q_head = q.wrapping_add(head as usize * seq_q as usize * D) as *const u16;
    let k_head = k.wrapping_add(head as usize * seq_k as usize * D) as *const u16;
    let v_head = v.wrapping_add(head as usize * seq_k as usize * D) as *const u16;

    // The key tiles this block needs: with causal masking, none past its last query.
    let mut key_tiles = seq_k.div_ceil(BLOCK_K);
    if causal {
        let last_query = (q_start + block_rows - 1).min(seq_q - 1);
        key_tiles = key_tiles.min(last_query / BLOCK_K + 1);
    }

    // SAFETY (the copies): the heads' matrices are in bounds by the kernel's contract; the tiles
    // are this block's shared memory, read only after the waits and barriers below. A second
    // half of the q tile starts 64 rows in, a multiple of the swizzle's 8 rows.
    unsafe {
        unroll::<ROWS>(|m| {
            let rows_in = BLOCK_K * m as u32;
            load_tile::<D, LOADS, THREADS>(q_tile + m as u32 * tile_bytes, q_head, q_start + rows_in, seq_q, tid);
        });
        load_tile::<D, LOADS, THREADS>(k_tile, k_head, 0, seq_k, tid);
        load_tile::<D, LOADS, THREADS>(v_tile, v_head, 0, seq_k, tid);
    }
    cp_async_wait::<1>();
    // SAFETY: every thread of the block reaches each barrier of this function (the branches
    // around them depend only on block-wide values).
    unsafe { nvptx::_syncthreads() };

    // The q fragment addresses: row tile m, k step kk of this warp. With `r = lane % 8` (every
    // row read is r mod 8) the chunk `(2kk + lane / 16) ^ r` is
    // `2·((kk & 3) ^ (r >> 1)) + ((lane / 16) ^ (r & 1)) + 2·(kk & !3)`: four per-lane bases.
    let (r, c) = (lane % 8, lane / 8);
    let warp_rows = warp * ROW_TILE * ROWS as u32;
    let q_row = q_tile + ((warp_rows + r + 8 * (c & 1)) * chunks + ((c >> 1) ^ (r & 1))) * 16;
    let q_lane: [u32; 4] = core::array::from_fn(|j| q_row + 32 * (j as u32 ^ (r >> 1)));
    let q_fragment = |m: usize, kk: usize| {
        let address = q_lane[kk & 3] + (16 * m as u32 * chunks + 2 * (kk as u32 & !3)) * 16;
        // SAFETY: the q tile has arrived (wait + barrier above) and nothing writes it; the warp
        // is converged.
        unsafe { ldmatrix_x4(address) }
    };
    // At head size 64, or with one row tile a warp, the warp's q stays in registers (32 a
    // thread); at 128 with two it is read again each key tile.
    let resident = D == 64 || ROWS == 1;
    let mut q_frag = [[[0u32; 4]; K_STEPS]; ROWS];
    if resident {
        unroll::<ROWS>(|m| unroll::<K_STEPS>(|kk| q_frag[m][kk] = q_fragment(m, kk)));
    }

    // The k and v ldmatrix addresses, as a few per-lane bases plus constants, so that the
    // compiler keeps 6 registers of addresses rather than one per load: a k load reads chunk
    // `(4kp + c) ^ r = 4·(kp ^ (r >> 2)) + (c ^ (r & 3))` (r >> 2 flips only kp's lowest bit),
    // a v load chunk `(2d + (c >> 1)) ^ r = 2·(d ^ (r >> 1)) + ((c >> 1) ^ (r & 1))` (r >> 1 flips
    // only d's two lowest bits).
    let k_row = k_tile + (r * chunks + (c ^ (r & 3))) * 16;
    let k_lane = [k_row + 64 * (r >> 2), k_row + 64 * (1 ^ (r >> 2))];
    let v_row = v_tile + ((r + 8 * (c & 1)) * chunks + ((c >> 1) ^ (r & 1))) * 16;
    let v_lane: [u32; 4] = core::array::from_fn(|j| v_row + 32 * (j as u32 ^ (r >> 1)));

    // The thread's rows: g and g + 8 of each of the warp's two 16-row tiles, as query indices.
    // The thread's rows, from `%tid.x` read again where they are needed (the rare masked tiles
    // and the end) rather than kept across the loop, where ptxas had to spill them at 255
    // registers.
    let row_of = |m: usize, h: usize| {
        let fresh = thread_index_uncached();
        q_start + fresh / 32 * ROW_TILE * ROWS as u32 + 16 * m as u32 + fresh % 32 / 4 + 8 * h as u32
    };
    let mut row_max = [[f32::NEG_INFINITY; 2]; ROWS];
    let mut row_sum = [[0.0f32; 2]; ROWS];
    let mut acc = [[[[0.0f32; 4]; 2]; K_STEPS]; ROWS];

    for key_tile in 0..key_tiles {
        let key_start = key_tile * BLOCK_K;

        // 1. S = q·kᵀ: 8 column groups of 8 keys; each k ldmatrix brings two k steps of one
        // group, for both row tiles.
        let mut s = [[[0.0f32; 4]; KEY_GROUPS]; ROWS];
        unroll::<K_PAIRS>(|kp| {
            let a: [[[u32; 4]; 2]; ROWS] = core::array::from_fn(|m| {
                if resident {
                    [q_frag[m][2 * kp], q_frag[m][2 * kp + 1]]
                } else {
                    [q_fragment(m, 2 * kp), q_fragment(m, 2 * kp + 1)]
                }
            });
            unroll::<KEY_GROUPS>(|n| {
                // Row 8n + lane % 8, chunk 4kp + lane / 8, swizzled (see `k_lane`).
                let address = k_lane[kp & 1] + (8 * n as u32 * chunks + 4 * (kp as u32 & !1)) * 16;
                // SAFETY: the k tile has arrived; the warp is converged.
                let b = unsafe { ldmatrix_x4(address) };
                unroll::<ROWS>(|m| {
                    // SAFETY: converged warp, fragments as `mma` takes them.
                    unsafe {
                        mma::<T>(&mut s[m][n], &a[m][0], [b[0], b[1]]);
                        mma::<T>(&mut s[m][n], &a[m][1], [b[2], b[3]]);
                    }
                });
            });
        });
        // SAFETY: as for the first barrier. Every warp is done reading the k tile.
        unsafe { nvptx::_syncthreads() };
        let more = key_tile + 1 < key_tiles;
        if more {
            // SAFETY: as for the first copies; the k tile is no longer read.
            unsafe { load_tile::<D, LOADS, THREADS>(k_tile, k_head, key_start + BLOCK_K, seq_k, tid) };
        }

        // 2. Mask and scale. Only tiles that cross the end of the keys or the diagonal mask; the
        // test is once per tile, and the masking itself is selects, not branches.
        if key_start + BLOCK_K > seq_k || (causal && key_start + BLOCK_K - 1 > q_start) {
            // One flat unroll: a nested one's outer closure grew past LLVM's inlining threshold,
            // and the call left `s` and the kernel's scalars in local memory.
            unroll::<MASKS>(|i| {
                let (m, n, e) = (i / (KEY_GROUPS * 4), i / 4 % KEY_GROUPS, i % 4);
                let key = key_start + 8 * n as u32 + 2 * t + (e as u32 & 1);
                let visible = !hidden(key, row_of(m, e / 2), seq_k, causal);
                s[m][n][e] = if visible { s[m][n][e] * scale_log2 } else { f32::NEG_INFINITY };
            });
        } else {
            unroll::<ROWS>(|m| unroll::<KEY_GROUPS>(|n| unroll::<4>(|e| s[m][n][e] *= scale_log2)));
        }

        // 3. Online softmax, per row: the tile's maximum over the four lanes of the row.
        unroll::<ROWS>(|m| {
            let mut scale_old = [0.0f32; 2];
            unroll::<2>(|h| {
                let mut tile_max = f32::NEG_INFINITY;
                unroll::<KEY_GROUPS>(|n| tile_max = tile_max.max(s[m][n][2 * h]).max(s[m][n][2 * h + 1]));
                // SAFETY: the whole warp runs this code together.
                unsafe {
                    tile_max = tile_max.max(xor_shuffle(tile_max, 1));
                    tile_max = tile_max.max(xor_shuffle(tile_max, 2));
                }
                let new_max = row_max[m][h].max(tile_max);
                // A row with no visible key so far keeps -inf; exponentials against 0 give 0.
                let base = if new_max == f32::NEG_INFINITY { 0.0 } else { new_max };
                scale_old[h] = exp2_ftz(row_max[m][h] - base);
                row_max[m][h] = new_max;
                let mut sum = 0.0f32;
                unroll::<KEY_GROUPS>(|n| {
                    s[m][n][2 * h] = exp2_ftz(s[m][n][2 * h] - base);
                    s[m][n][2 * h + 1] = exp2_ftz(s[m][n][2 * h + 1] - base);
                    sum += s[m][n][2 * h] + s[m][n][2 * h + 1];
                });
                row_sum[m][h] = row_sum[m][h] * scale_old[h] + sum;
            });
            unroll::<K_STEPS>(|d| {
                unroll::<2>(|x| {
                    acc[m][d][x][0] *= scale_old[0];
                    acc[m][d][x][1] *= scale_old[0];
                    acc[m][d][x][2] *= scale_old[1];
                    acc[m][d][x][3] *= scale_old[1];
                });
            });
        });

        // The v tile (copied since the tile began) must have arrived; the next k tile may not.
        if more {
            cp_async_wait::<1>();
        } else {
            cp_async_wait::<0>();
        }
        // SAFETY: as for the first barrier.
        unsafe { nvptx::_syncthreads() };

        // 4. O += P·v: P's accumulator layout is the A layout, 16 keys (two groups) per k step.
        unroll::<{ KEY_GROUPS / 2 }>(|ks| {
            let p: [[u32; 4]; ROWS] = core::array::from_fn(|m| {
                [
                    pack::<T>(s[m][2 * ks][0], s[m][2 * ks][1]),
                    pack::<T>(s[m][2 * ks][2], s[m][2 * ks][3]),
                    pack::<T>(s[m][2 * ks + 1][0], s[m][2 * ks + 1][1]),
                    pack::<T>(s[m][2 * ks + 1][2], s[m][2 * ks + 1][3]),
                ]
            });
            unroll::<K_STEPS>(|d| {
                // Row 16ks + lane % 8 + 8·(lane / 8 % 2), chunk 2d + lane / 16, swizzled.
                let address = v_lane[d & 3] + (16 * ks as u32 * chunks + 2 * (d as u32 & !3)) * 16;
                // SAFETY: the v tile has arrived; the warp is converged.
                let b = unsafe { ldmatrix_x4_trans(address) };
                unroll::<ROWS>(|m| {
                    // SAFETY: converged warp, fragments as `mma` takes them.
                    unsafe {
                        mma::<T>(&mut acc[m][d][0], &p[m], [b[0], b[1]]);
                        mma::<T>(&mut acc[m][d][1], &p[m], [b[2], b[3]]);
                    }
                });
            });
        });
        // SAFETY: as for the first barrier. Every warp is done reading the v tile.
        unsafe { nvptx::_syncthreads() };
        if more {
            // SAFETY: as for the first copies; the v tile is no longer read.
            unsafe { load_tile::<D, LOADS, THREADS>(v_tile, v_head, key_start + BLOCK_K, seq_k, tid) };
            // The next k tile, copied during steps 3 and 4, must have arrived.
            cp_async_wait::<1>();
            // SAFETY: as for the first barrier.
            unsafe { nvptx::_syncthreads() };
        }
    }

    // The row sums, whole; the output divided by them; the log-sum-exp in natural units.
    let out_head = out.wrapping_add(head as usize * seq_q as usize * D) as *mut u32;
    unroll::<ROWS>(|m| {
        unroll::<2>(|h| {
            let mut sum = row_sum[m][h];
            // SAFETY: the whole warp runs this code together.
            unsafe {
                sum += xor_shuffle(sum, 1);
                sum += xor_shuffle(sum, 2);
            }
            let inverse = if sum > 0.0 { 1.0 / sum } else { 0.0 };
            let row = row_of(m, h);
            if row < seq_q {
                unroll::<K_STEPS>(|d| {
                    unroll::<2>(|x| {
                        let col = 16 * d as u32 + 8 * x as u32 + 2 * t;
                        let value = pack::<T>(acc[m][d][x][2 * h] * inverse, acc[m][d][x][2 * h + 1] * inverse);
                        // SAFETY: row < seq_q and col + 1 < D: two elements of this head's
                        // `out`, 4-byte aligned (col is even); no other thread writes them.
                        unsafe { out_head.wrapping_add((row as usize * D + col as usize) / 2).write(value) };
                    });
                });
                if t == 0 {
                    let value = if sum > 0.0 { (row_max[m][h] + log2(sum)) * LN_2 } else { f32::NEG_INFINITY };
                    // SAFETY: head < heads and row < seq_q.
                    unsafe { lse.add(head as usize * seq_q as usize + row as usize).write(value) };
                }
            }
        });
    });
}
