//! The fused attention backward, FlashAttention-2's equations in two kernels that recompute the
//! probabilities from the forward's log-sum-exp instead of reading a `[seq_q, seq_k]` matrix.
//!
//! With `P = exp(scale·q·kᵀ − lse)` (rows: queries), the output's gradient `dO` and
//! `Δ_i = Σ_c dO_ic · O_ic`:
//!
//! * `dP = dO·vᵀ`, `dS = P ⊙ (dP − Δ)`;
//! * `dQ = scale · dS·k` ([`backward_dq`]: one block per 64 queries, walking the key tiles; it
//!   also writes `Δ` for the second kernel);
//! * `dV = Pᵀ·dO`, `dK = scale · dSᵀ·q` ([`backward_dkdv`]: one block per 64 keys, walking the
//!   query tiles, with `Pᵀ` and `dSᵀ` computed directly in the transposed orientation, as
//!   `k·qᵀ` and `v·dOᵀ`).
//!
//! Splitting the work this way costs two more products than FlashAttention-2's single kernel
//! (`S` and `dP` are computed by both) but needs no atomic adds: every gradient element is
//! written once, by one thread, so the result is the same on every run.
//!
//! Both kernels use the forward's machinery (`device::flash`): 128 threads, four warps of 16
//! rows, swizzled shared tiles filled by `cp.async`, `ldmatrix` into `mma.sync` fragments, and
//! the accumulator-to-`A`-fragment reuse of a product's result. A block owns a tile of 64 rows
//! and streams the other operands in tiles of `STREAM = 32` rows, which keeps the four tiles in
//! the 48 KiB of static shared memory at head_dim 128 and every accumulator in registers.
use super::element::Element;
use super::flash::{BLOCK_Q, hidden, load_tile, owned_tile};
use super::math::{LOG2_E, exp2_ftz, fma};
use super::tensor_core::{MmaElement, cp_async_wait, ldmatrix_x4, ldmatrix_x4_trans, mma, pack, shared_tile};
use super::unroll::{Count, Unrolled, unroll};
use super::warp::xor_shuffle;
use core::arch::nvptx;

/// Rows of the tile a block owns (16 per warp).
const OWNED: u32 = 64;

/// A lane's share of every `ldmatrix` address in a swizzled tile of `chunks` 16-byte chunks per
/// row, precomputed so that each load's address is a tile base plus a lane register plus a
/// constant: without it the compiler keeps one register per load (dozens, across the loops).
///
/// Every row a load reads is `r = lane % 8` modulo 8, so its swizzle XORs the chunk index with
/// `r`. A load at chunk `2J + lo` (`lo = lane / 16`) reads chunk
/// `2·(J ^ (r >> 1)) + (lo ^ (r & 1))`, where `r >> 1` flips only `J`'s two lowest bits; one at
/// chunk `4J + lo` (`lo = lane / 8 % 4`) reads `4·(J ^ (r >> 2)) + (lo ^ (r & 3))`, where
/// `r >> 2` flips only `J`'s lowest bit.
#[derive(Clone, Copy)]
struct Lanes {
    /// Bytes per tile row.
    row_bytes: u32,
    /// The byte offset of this lane's row in a 16-row `ldmatrix`: `lane % 8 + 8·(lane / 8 % 2)`.
    row16: u32,
    /// The same for an 8-row one: `lane % 8`.
    row8: u32,
    /// Chunk offsets (bytes) of a load at chunk `2J + lane / 16`, by `J % 4`.
    pair: [u32; 4],
    /// Chunk offsets (bytes) of a load at chunk `4J + lane / 8`, by `J % 2`.
    quad: [u32; 2],
}

impl Lanes {
    #[inline(always)]
    fn new(chunks: u32, lane: u32) -> Lanes {
        let r = lane % 8;
        let row_bytes = chunks * 16;
        let (lo2, lo4) = (lane / 16, (lane / 8) % 4);
        Lanes {
            row_bytes,
            row16: (r + 8 * ((lane / 8) % 2)) * row_bytes,
            row8: r * row_bytes,
            pair: core::array::from_fn(|j| 16 * (2 * (j as u32 ^ (r >> 1)) + (lo2 ^ (r & 1)))),
            quad: core::array::from_fn(|j| 16 * (4 * (j as u32 ^ (r >> 2)) + (lo4 ^ (r & 3)))),
        }
    }

    /// The address of chunk `2J + lane / 16` in the lane's row of a 16-row load at `row0`.
    #[inline(always)]
    fn at_pair(&self, tile: u32, row0: u32, j: u32) -> u32 {
        tile + self.row16 + self.pair[(j % 4) as usize] + row0 * self.row_bytes + 32 * (j & !3)
    }
}

/// The `A` fragment of rows `row0..row0 + 16`, columns `16kk..16kk + 16` of a swizzled tile.
///
/// # Safety
/// The tile has arrived and the warp is converged.
#[inline(always)]
unsafe fn a_fragment(tile: u32, lanes: &Lanes, row0: u32, kk: u32) -> [u32; 4] {
    // SAFETY: the caller's contract.
    unsafe { ldmatrix_x4(lanes.at_pair(tile, row0, kk)) }
}

/// `B` fragments of an operand stored with its `n` index along the tile's rows: rows
/// `8n..8n + 8`, `k` steps `2kp` (registers 0, 1) and `2kp + 1` (registers 2, 3).
///
/// # Safety
/// As for [`a_fragment`].
#[inline(always)]
unsafe fn b_rows_n(tile: u32, lanes: &Lanes, n: u32, kp: u32) -> [u32; 4] {
    let address = tile + lanes.row8 + lanes.quad[(kp % 2) as usize] + 8 * n * lanes.row_bytes + 64 * (kp & !1);
    // SAFETY: the caller's contract.
    unsafe { ldmatrix_x4(address) }
}

/// `B` fragments of an operand stored with its `k` index along the tile's rows: `k` step `ks`
/// (rows `16ks..16ks + 16`), column groups `2p` (registers 0, 1) and `2p + 1` (registers 2, 3).
///
/// # Safety
/// As for [`a_fragment`].
#[inline(always)]
unsafe fn b_rows_k(tile: u32, lanes: &Lanes, ks: u32, p: u32) -> [u32; 4] {
    // SAFETY: the caller's contract.
    unsafe { ldmatrix_x4_trans(lanes.at_pair(tile, 16 * ks, p)) }
}

/// `acc += a·b` over `d` columns: for each pair `p` of 8-wide column groups, one transposing
/// load of `b` (stored with `k` along the rows) and two products.
///
/// # Safety
/// As for [`a_fragment`].
#[inline(always)]
unsafe fn accumulate<T: MmaElement, const PAIRS: usize>(
    acc: &mut [[[f32; 4]; 2]; PAIRS],
    a: &[u32; 4],
    b_tile: u32,
    lanes: &Lanes,
    ks: u32,
) where
    Count<PAIRS>: Unrolled,
{
    unroll::<PAIRS>(|p| {
        // SAFETY: the caller's contract.
        unsafe {
            let b = b_rows_k(b_tile, lanes, ks, p as u32);
            mma::<T>(&mut acc[p][0], a, [b[0], b[1]]);
            mma::<T>(&mut acc[p][1], a, [b[2], b[3]]);
        }
    });
}

/// `s = a_rows · b_rowsᵀ` for the warp's 16 rows `row0..` of `a_tile` against the `8·GROUPS`
/// rows of `b_tile`, over `D = 16·K_STEPS` columns: f32 accumulators, group `n` holding columns
/// `8n..8n + 8` of the result.
///
/// # Safety
/// As for [`a_fragment`].
#[inline(always)]
unsafe fn product_t<T: MmaElement, const GROUPS: usize, const K_STEPS: usize, const K_PAIRS: usize>(
    a_tile: u32,
    b_tile: u32,
    lanes: &Lanes,
    row0: u32,
) -> [[f32; 4]; GROUPS]
where
    Count<GROUPS>: Unrolled,
    Count<K_STEPS>: Unrolled,
    Count<K_PAIRS>: Unrolled,
{
    let mut a = [[0u32; 4]; K_STEPS];
    // SAFETY: the caller's contract.
    unroll::<K_STEPS>(|kk| a[kk] = unsafe { a_fragment(a_tile, lanes, row0, kk as u32) });
    let mut s = [[0.0f32; 4]; GROUPS];
    unroll::<GROUPS>(|n| {
        unroll::<K_PAIRS>(|kp| {
            // SAFETY: the caller's contract.
            unsafe {
                let b = b_rows_n(b_tile, lanes, n as u32, kp as u32);
                mma::<T>(&mut s[n], &a[2 * kp], [b[0], b[1]]);
                mma::<T>(&mut s[n], &a[2 * kp + 1], [b[2], b[3]]);
            }
        });
    });
    s
}

/// Accumulator groups `2ks` and `2ks + 1` as the `A` fragment of `k` step `ks` (the
/// accumulator layout of two neighbouring 8-column groups is the `A` layout of 16 columns).
#[inline(always)]
fn as_a<T: MmaElement, const GROUPS: usize>(x: &[[f32; 4]; GROUPS], ks: usize) -> [u32; 4] {
    [
        pack::<T>(x[2 * ks][0], x[2 * ks][1]),
        pack::<T>(x[2 * ks][2], x[2 * ks][3]),
        pack::<T>(x[2 * ks + 1][0], x[2 * ks + 1][1]),
        pack::<T>(x[2 * ks + 1][2], x[2 * ks + 1][3]),
    ]
}

/// Writes the warp's 16 rows of `acc · factor` (columns `16p + 8h + 2t`, `+ 1`) to rows
/// `row0 + 16·warp + g` and `+ 8` of a `[rows, D]` matrix, skipping rows past `rows`.
///
/// # Safety
/// `matrix` is valid for `rows·D` elements, written by no other thread at these places.
#[inline(always)]
unsafe fn store_rows<T: MmaElement, const D: usize, const PAIRS: usize>(
    matrix: *mut T,
    acc: &[[[f32; 4]; 2]; PAIRS],
    factor: f32,
    first_row: u32,
    rows: u32,
    lane: u32,
) where
    Count<PAIRS>: Unrolled,
{
    let (g, t) = (lane / 4, lane % 4);
    let words = matrix as *mut u32;
    unroll::<2>(|r| {
        let row = first_row + g + 8 * r as u32;
        if row < rows {
            unroll::<PAIRS>(|p| {
                unroll::<2>(|h| {
                    let col = 16 * p as u32 + 8 * h as u32 + 2 * t;
                    let value = pack::<T>(acc[p][h][2 * r] * factor, acc[p][h][2 * r + 1] * factor);
                    // SAFETY: row < rows, col + 1 < D, col even: two elements, 4-byte aligned.
                    unsafe { words.wrapping_add((row as usize * D + col as usize) / 2).write(value) };
                });
            });
        }
    });
}

/// `dQ` for 64 queries of one head, and `Δ` for them (see the module docs). `STREAM` keys per
/// tile: `GROUPS = STREAM / 8`, `STEPS = STREAM / 16`; `K_STEPS = D / 16`, `K_PAIRS = D / 32`;
/// `OWN_LOADS = 64·D / 8 / 128`, `STREAM_LOADS = STREAM·D / 8 / 128` copies per thread.
///
/// # Safety
/// The kernel's contract (`attention_backward_dq_*`): `q`, `out`, `dout`, `dq` valid for
/// `heads·seq_q·D` elements, `k`, `v` for `heads·seq_k·D`, `lse` and `delta` for `heads·seq_q`
/// f32, all 16-byte aligned; `dq` and `delta` overlap nothing else; `lse` is the forward's;
/// 128 threads per block, `heads·ceil(seq_q / 64)` blocks.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn backward_dq<
    T: MmaElement + Element,
    const D: usize,
    const K_STEPS: usize,
    const K_PAIRS: usize,
    const STREAM: usize,
    const GROUPS: usize,
    const STEPS: usize,
    const OWN_LOADS: usize,
    const STREAM_LOADS: usize,
>(
    q: *const T,
    k: *const T,
    v: *const T,
    out: *const T,
    dout: *const T,
    lse: *const f32,
    delta: *mut f32,
    dq: *mut T,
    heads: u32,
    seq_q: u32,
    seq_k: u32,
    scale_log2: f32,
    scale: f32,
    causal: bool,
) where
    Count<K_STEPS>: Unrolled,
    Count<K_PAIRS>: Unrolled,
    Count<GROUPS>: Unrolled,
    Count<STEPS>: Unrolled,
    Count<OWN_LOADS>: Unrolled,
    Count<STREAM_LOADS>: Unrolled,
{
    let Some((head, q_start)) = owned_tile(seq_q, heads, causal, BLOCK_Q) else { return };
    if seq_k == 0 {
        return;
    }
    // SAFETY: reading a special register has no preconditions.
    let tid = unsafe { nvptx::_thread_idx_x() } as u32;
    let (warp, lane) = (tid / 32, tid % 32);
    let (g, t) = (lane / 4, lane % 4);
    let chunks = D as u32 / 8;
    let lanes = Lanes::new(chunks, lane);
    let stream = STREAM as u32;

    let tiles = match D {
        64 => shared_tile!(opsmith_flash_dq_tiles_d64, 24576),
        _ => shared_tile!(opsmith_flash_dq_tiles_d128, 49152),
    };
    let own_bytes = OWNED * D as u32 * 2;
    let stream_bytes = stream * D as u32 * 2;
    let (q_tile, do_tile) = (tiles, tiles + own_bytes);
    let (k_tile, v_tile) = (tiles + 2 * own_bytes, tiles + 2 * own_bytes + stream_bytes);

    let rows_base = head as usize * seq_q as usize;
    let keys_base = head as usize * seq_k as usize;
    let (q_head, do_head) =
        (q.wrapping_add(rows_base * D) as *const u16, dout.wrapping_add(rows_base * D) as *const u16);
    let (k_head, v_head) = (k.wrapping_add(keys_base * D) as *const u16, v.wrapping_add(keys_base * D) as *const u16);

    // SAFETY (the copies): in bounds by the contract; read only after the waits and barriers.
    unsafe {
        load_tile::<D, OWN_LOADS>(q_tile, q_head, q_start, seq_q, tid);
        load_tile::<D, OWN_LOADS>(do_tile, do_head, q_start, seq_q, tid);
        load_tile::<D, STREAM_LOADS>(k_tile, k_head, 0, seq_k, tid);
        load_tile::<D, STREAM_LOADS>(v_tile, v_head, 0, seq_k, tid);
    }

    // While the copies run: Δ and the log-sum-exp (in log2 units) of the thread's two rows, Δ
    // summed by the four lanes of a row over a quarter of the columns each.
    let rows = [q_start + warp * 16 + g, q_start + warp * 16 + g + 8];
    let mut row_delta = [0.0f32; 2];
    let mut row_lse = [f32::INFINITY; 2];
    unroll::<2>(|r| {
        let row = rows[r];
        let mut sum = 0.0f32;
        if row < seq_q {
            let at = (rows_base + row as usize) * D;
            let quarter = D / 4;
            for c in t as usize * quarter..(t as usize + 1) * quarter {
                // SAFETY: row < seq_q, c < D.
                let (o, d) = unsafe { (out.add(at + c).read(), dout.add(at + c).read()) };
                sum += o.to_f32() * d.to_f32();
            }
            // SAFETY: row < seq_q. A row that saw no key (lse = -inf) gets P = 0 from +inf.
            let l = unsafe { lse.add(rows_base + row as usize).read() };
            row_lse[r] = if l == f32::NEG_INFINITY { f32::INFINITY } else { l * LOG2_E };
        }
        // SAFETY: the whole warp runs this code together.
        unsafe {
            sum += xor_shuffle(sum, 1);
            sum += xor_shuffle(sum, 2);
        }
        row_delta[r] = sum;
        if row < seq_q && t == 0 {
            // SAFETY: row < seq_q; one lane per row writes it.
            unsafe { delta.add(rows_base + row as usize).write(sum) };
        }
    });

    let mut key_tiles = seq_k.div_ceil(stream);
    if causal {
        let last_query = (q_start + OWNED - 1).min(seq_q - 1);
        key_tiles = key_tiles.min(last_query / stream + 1);
    }
    let mut acc = [[[0.0f32; 4]; 2]; K_STEPS];
    for key_tile in 0..key_tiles {
        let key_start = key_tile * stream;
        cp_async_wait::<0>();
        // SAFETY: every thread of the block reaches each barrier (block-wide conditions only).
        unsafe { nvptx::_syncthreads() };

        // SAFETY (the products): the tiles have arrived; the warp is converged.
        let s = unsafe { product_t::<T, GROUPS, K_STEPS, K_PAIRS>(q_tile, k_tile, &lanes, warp * 16) };
        let dp = unsafe { product_t::<T, GROUPS, K_STEPS, K_PAIRS>(do_tile, v_tile, &lanes, warp * 16) };
        // P from the saved log-sum-exp; masked scores get P = 0 by a select (the tile test is
        // uniform, so unmasked tiles skip the key arithmetic).
        let masked = key_start + stream > seq_k || (causal && key_start + stream - 1 > q_start);
        let mut ds = [[0.0f32; 4]; GROUPS];
        unroll::<GROUPS>(|n| {
            unroll::<4>(|e| {
                let r = e / 2;
                let p = exp2_ftz(fma(s[n][e], scale_log2, -row_lse[r]));
                ds[n][e] = p * (dp[n][e] - row_delta[r]);
            });
        });
        if masked {
            unroll::<GROUPS>(|n| {
                unroll::<4>(|e| {
                    let key = key_start + 8 * n as u32 + 2 * t + (e as u32 & 1);
                    ds[n][e] = if hidden(key, rows[e / 2], seq_k, causal) { 0.0 } else { ds[n][e] };
                });
            });
        }
        unroll::<STEPS>(|ks| {
            let a = as_a::<T, GROUPS>(&ds, ks);
            // SAFETY: the k tile has arrived; the warp is converged.
            unsafe { accumulate::<T, K_STEPS>(&mut acc, &a, k_tile, &lanes, ks as u32) };
        });

        // SAFETY: as above. Every warp is done with this key tile.
        unsafe { nvptx::_syncthreads() };
        if key_tile + 1 < key_tiles {
            // SAFETY: as for the first copies; the tiles are no longer read.
            unsafe {
                load_tile::<D, STREAM_LOADS>(k_tile, k_head, key_start + stream, seq_k, tid);
                load_tile::<D, STREAM_LOADS>(v_tile, v_head, key_start + stream, seq_k, tid);
            }
        }
    }
    // SAFETY: the rows are this block's, inside the head's `dq`.
    unsafe {
        store_rows::<T, D, K_STEPS>(dq.wrapping_add(rows_base * D), &acc, scale, q_start + warp * 16, seq_q, lane)
    };
}

/// `dK` and `dV` for 64 keys of one head (see the module docs). `STREAM` queries per tile:
/// `GROUPS = STREAM / 8`, `STEPS = STREAM / 16`; the other counts as for [`backward_dq`].
///
/// # Safety
/// The kernel's contract (`attention_backward_dkdv_*`): `q`, `dout` valid for `heads·seq_q·D`
/// elements, `k`, `v`, `dk`, `dv` for `heads·seq_k·D`, `lse` and `delta` for `heads·seq_q` f32
/// (`delta` as [`backward_dq`] wrote it), all 16-byte aligned; `dk` and `dv` overlap nothing
/// else; 128 threads per block, `heads·ceil(seq_k / 64)` blocks.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn backward_dkdv<
    T: MmaElement + Element,
    const D: usize,
    const K_STEPS: usize,
    const K_PAIRS: usize,
    const STREAM: usize,
    const GROUPS: usize,
    const STEPS: usize,
    const OWN_LOADS: usize,
    const STREAM_LOADS: usize,
>(
    q: *const T,
    k: *const T,
    v: *const T,
    dout: *const T,
    lse: *const f32,
    delta: *const f32,
    dk: *mut T,
    dv: *mut T,
    heads: u32,
    seq_q: u32,
    seq_k: u32,
    scale_log2: f32,
    scale: f32,
    causal: bool,
) where
    Count<K_STEPS>: Unrolled,
    Count<K_PAIRS>: Unrolled,
    Count<GROUPS>: Unrolled,
    Count<STEPS>: Unrolled,
    Count<OWN_LOADS>: Unrolled,
    Count<STREAM_LOADS>: Unrolled,
{
    // Causal: the first key tiles see the most queries, and their blocks start first.
    let Some((head, key_start)) = owned_tile(seq_k, heads, false, BLOCK_Q) else { return };
    // SAFETY: reading a special register has no preconditions.
    let tid = unsafe { nvptx::_thread_idx_x() } as u32;
    let (warp, lane) = (tid / 32, tid % 32);
    let (g, t) = (lane / 4, lane % 4);
    let chunks = D as u32 / 8;
    let lanes = Lanes::new(chunks, lane);
    let stream = STREAM as u32;

    let tiles = match D {
        64 => shared_tile!(opsmith_flash_dkdv_tiles_d64, 24576),
        _ => shared_tile!(opsmith_flash_dkdv_tiles_d128, 49152),
    };
    let own_bytes = OWNED * D as u32 * 2;
    let stream_bytes = stream * D as u32 * 2;
    let (k_tile, v_tile) = (tiles, tiles + own_bytes);
    let (q_tile, do_tile) = (tiles + 2 * own_bytes, tiles + 2 * own_bytes + stream_bytes);

    let rows_base = head as usize * seq_q as usize;
    let keys_base = head as usize * seq_k as usize;
    let (q_head, do_head) =
        (q.wrapping_add(rows_base * D) as *const u16, dout.wrapping_add(rows_base * D) as *const u16);
    let (k_head, v_head) = (k.wrapping_add(keys_base * D) as *const u16, v.wrapping_add(keys_base * D) as *const u16);

    // Queries before the first key of the tile see none of its keys when causal.
    let first = if causal { key_start / stream } else { 0 };
    let query_tiles = seq_q.div_ceil(stream);
    // SAFETY (the copies): in bounds by the contract; read only after the waits and barriers.
    unsafe {
        load_tile::<D, OWN_LOADS>(k_tile, k_head, key_start, seq_k, tid);
        load_tile::<D, OWN_LOADS>(v_tile, v_head, key_start, seq_k, tid);
        if first < query_tiles {
            load_tile::<D, STREAM_LOADS>(q_tile, q_head, first * stream, seq_q, tid);
            load_tile::<D, STREAM_LOADS>(do_tile, do_head, first * stream, seq_q, tid);
        }
    }
    let keys = [key_start + warp * 16 + g, key_start + warp * 16 + g + 8];
    let (mut dk_acc, mut dv_acc) = ([[[0.0f32; 4]; 2]; K_STEPS], [[[0.0f32; 4]; 2]; K_STEPS]);
    for query_tile in first..query_tiles {
        let q0 = query_tile * stream;
        cp_async_wait::<0>();
        // SAFETY: every thread of the block reaches each barrier (block-wide conditions only).
        unsafe { nvptx::_syncthreads() };

        // Sᵀ = k·qᵀ and dPᵀ = v·dOᵀ for the warp's 16 keys against the tile's queries.
        // SAFETY (the products): the tiles have arrived; the warp is converged.
        let st = unsafe { product_t::<T, GROUPS, K_STEPS, K_PAIRS>(k_tile, q_tile, &lanes, warp * 16) };
        let dpt = unsafe { product_t::<T, GROUPS, K_STEPS, K_PAIRS>(v_tile, do_tile, &lanes, warp * 16) };
        let masked = q0 + stream > seq_q || (causal && key_start + OWNED - 1 > q0);
        let (mut pt, mut dst) = ([[0.0f32; 4]; GROUPS], [[0.0f32; 4]; GROUPS]);
        unroll::<GROUPS>(|n| {
            unroll::<2>(|c| {
                let query = q0 + 8 * n as u32 + 2 * t + c as u32;
                // The query's log-sum-exp (log2 units) and Δ; past seq_q, none.
                let (l, d) = if query < seq_q {
                    // SAFETY: query < seq_q.
                    unsafe {
                        let l = lse.add(rows_base + query as usize).read();
                        let l = if l == f32::NEG_INFINITY { f32::INFINITY } else { l * LOG2_E };
                        (l, delta.add(rows_base + query as usize).read())
                    }
                } else {
                    (f32::INFINITY, 0.0)
                };
                unroll::<2>(|r| {
                    let e = 2 * r + c;
                    let hidden = masked && (query >= seq_q || (causal && keys[r] > query));
                    let p = if hidden { 0.0 } else { exp2_ftz(st[n][e] * scale_log2 - l) };
                    pt[n][e] = p;
                    dst[n][e] = p * (dpt[n][e] - d);
                });
            });
        });
        unroll::<STEPS>(|ks| {
            let (p, ds) = (as_a::<T, GROUPS>(&pt, ks), as_a::<T, GROUPS>(&dst, ks));
            // SAFETY: the q and dO tiles have arrived; the warp is converged.
            unsafe {
                accumulate::<T, K_STEPS>(&mut dv_acc, &p, do_tile, &lanes, ks as u32);
                accumulate::<T, K_STEPS>(&mut dk_acc, &ds, q_tile, &lanes, ks as u32);
            }
        });

        // SAFETY: as above. Every warp is done with this query tile.
        unsafe { nvptx::_syncthreads() };
        if query_tile + 1 < query_tiles {
            // SAFETY: as for the first copies; the tiles are no longer read.
            unsafe {
                load_tile::<D, STREAM_LOADS>(q_tile, q_head, q0 + stream, seq_q, tid);
                load_tile::<D, STREAM_LOADS>(do_tile, do_head, q0 + stream, seq_q, tid);
            }
        }
    }
    let first_key = key_start + warp * 16;
    // SAFETY: the rows are this block's, inside the head's `dk` and `dv`.
    unsafe {
        store_rows::<T, D, K_STEPS>(dk.wrapping_add(keys_base * D), &dk_acc, scale, first_key, seq_k, lane);
        store_rows::<T, D, K_STEPS>(dv.wrapping_add(keys_base * D), &dv_acc, 1.0, first_key, seq_k, lane);
    }
}
