//! The fused attention backward, FlashAttention-2's: the probabilities are recomputed from the
//! forward's log-sum-exp instead of read from a `[seq_q, seq_k]` matrix.
//!
//! With `P = exp(scale·q·kᵀ − lse)` (rows: queries), the output's gradient `dO` and
//! `Δ_i = Σ_c dO_ic · O_ic`:
//!
//! * `dP = dO·vᵀ`, `dS = P ⊙ (dP − Δ)`;
//! * `dV = Pᵀ·dO`, `dK = scale · dSᵀ·q`, `dQ = scale · dS·k`.
//!
//! Three kernels: [`backward_prep`] computes `Δ` and zeroes an f32 `dQ` accumulator;
//! [`backward`] takes one block per 128 keys and walks the query tiles, computing `Pᵀ` and `dSᵀ`
//! directly in the transposed orientation (as `k·qᵀ` and `v·dOᵀ`), accumulating `dK` and `dV`
//! in registers, and adding each tile's `dS·k` to the `dQ` accumulator with atomic adds (`dS`
//! goes through shared memory, since `dQ` sums over the block's eight warps' keys);
//! [`backward_dq_finish`] scales and rounds the accumulator into `dq`. Five products, as many
//! as the forward's two plus the three gradients. The order of the atomic additions varies
//! from run to run, so `dq` may differ in its last bits between runs; `dk` and `dv` do not.
//!
//! The block uses the forward's machinery (`device::flash`): 256 threads, eight warps of 16 key
//! rows, swizzled shared tiles filled by `cp.async`, `ldmatrix` into `mma.sync` fragments, and
//! the accumulator-to-`A`-fragment reuse of a product's result. It streams `q` and `dO` in
//! tiles of `STREAM = 32` rows, which keeps every accumulator in registers, through one shared
//! buffer each: the next tile's copy runs while the block computes the current tile's `dQ`
//! (which reads only `k` and `dS`). A second buffer measured no faster.
use super::element::Element;
use super::flash::{load_tile, owned_tile, thread_index_uncached};
use super::index::GridStride;
#[cfg(not(target_feature = "sm_90"))]
use super::math::atomic_add;
#[cfg(target_feature = "sm_90")]
use super::math::atomic_add2;
use super::math::{LOG2_E, exp2_ftz, fma};
use super::memory::{load_pack, store_pack};
use super::tensor_core::{
    MmaElement, cp_async_4, cp_async_commit, cp_async_wait, dynamic_shared, ldmatrix_x4, ldmatrix_x4_trans,
    load_shared_f32, mma, pack, store_shared_u32,
};
use super::unroll::{Count, Unrolled, unroll};
use super::warp::xor_shuffle;
use core::arch::nvptx;

/// Warps of a block.
const WARPS: u32 = 8;
/// Threads of a block.
const THREADS: u32 = 32 * WARPS;
/// Keys a block owns (16 per warp). 128 rather than 64: each block adds its share of `dQ` once
/// per query tile, and those atomic adds, not the products, bounded the 64-key form (H100: about
/// 2·10^11 f32 adds a second at both head sizes).
const OWNED: u32 = 16 * WARPS;

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
    /// The chunk offset (bytes) of a load at chunk `lane / 16`; one at chunk `2J + lane / 16`
    /// is this XOR `32·(J % 4)`.
    pair: u32,
    /// The chunk offset (bytes) of a load at chunk `lane / 8 % 4`; one at chunk
    /// `4J + lane / 8 % 4` is this XOR `64·(J % 2)`.
    quad: u32,
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
            pair: 16 * (2 * (r >> 1) + (lo2 ^ (r & 1))),
            quad: 16 * (4 * (r >> 2) + (lo4 ^ (r & 3))),
        }
    }

    /// The address of chunk `2J + lane / 16` in the lane's row of a 16-row load at `row0`.
    #[inline(always)]
    fn at_pair(&self, tile: u32, row0: u32, j: u32) -> u32 {
        tile + self.row16 + (self.pair ^ (32 * (j % 4))) + row0 * self.row_bytes + 32 * (j & !3)
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
    let address = tile + lanes.row8 + (lanes.quad ^ (64 * (kp % 2))) + 8 * n * lanes.row_bytes + 64 * (kp & !1);
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

/// Rows of `dO ⊙ O` summed (`Δ`, the backward's per-query constant), and the `dQ` accumulator
/// zeroed, for `rows` query rows of head size `D`: four lanes a row, 32 rows a block; `PACKS =
/// D / 32`, the 16-byte packs of `dO` (and of `O`) a lane reads.
///
/// # Safety
/// The kernel's contract (`attention_backward_prep_*`): `out` and `dout` valid for `rows·D`
/// elements, `delta` for `rows` f32 and `dq_accum` for `rows·D` f32, all 16-byte aligned,
/// `delta` and `dq_accum` overlapping nothing else; 128 threads per block, `ceil(rows / 32)`
/// blocks.
#[inline(always)]
pub unsafe fn backward_prep<T: Element, const D: usize, const PACKS: usize>(
    out: *const T,
    dout: *const T,
    delta: *mut f32,
    dq_accum: *mut f32,
    rows: u32,
) where
    Count<PACKS>: Unrolled,
{
    // SAFETY: reading special registers has no preconditions.
    let (block, tid) = unsafe { (nvptx::_block_idx_x() as u32, nvptx::_thread_idx_x() as u32) };
    let (row, t) = (block * 32 + tid / 4, tid % 4);
    // The four lanes of a row share `valid`, and all 32 lanes reach the shuffles.
    let valid = row < rows;
    let mut sum = 0.0f32;
    if valid {
        let (first_pack, first_f32_pack) = (row as u64 * D as u64 / 8, row as u64 * D as u64 / 4);
        unroll::<PACKS>(|i| {
            let index = first_pack + 4 * i as u64 + t as u64;
            // SAFETY: pack `index` is inside row `row` (< rows) of 16-byte aligned matrices.
            let (o, d) = unsafe { (T::unpack(load_pack(out, index)), T::unpack(load_pack(dout, index))) };
            unroll::<8>(|k| sum = fma(o[k], d[k], sum));
        });
        // The row's D f32 are D / 4 packs: each lane zeroes every fourth.
        for i in 0..D as u64 / 16 {
            // SAFETY: inside row `row` of the accumulator, which only this row's lanes write.
            unsafe { store_pack(dq_accum, first_f32_pack + 4 * i + t as u64, [0; 4]) };
        }
    }
    // SAFETY: the whole warp runs this code together.
    unsafe {
        sum += xor_shuffle(sum, 1);
        sum += xor_shuffle(sum, 2);
    }
    if valid && t == 0 {
        // SAFETY: row < rows; one lane per row writes it.
        unsafe { delta.add(row as usize).write(sum) };
    }
}

/// `dq = scale · dq_accum`, rounded to `T`, over `n` elements (`n` a multiple of 8), grid-stride
/// in packs of 8.
///
/// # Safety
/// The kernel's contract (`attention_backward_dq_*`): `dq_accum` valid for `n` f32 and `dq` for
/// `n` elements, both 16-byte aligned, `dq` overlapping nothing else.
#[inline(always)]
pub unsafe fn backward_dq_finish<T: Element<Wide = [f32; 8]>>(dq_accum: *const f32, dq: *mut T, n: u32, scale: f32) {
    for pack in GridStride::over(0, n as u64 / 8) {
        // SAFETY: packs 2·pack and 2·pack + 1 of the accumulator and pack `pack` of `dq` are
        // inside their `n` elements; each pack is this thread's alone.
        unsafe {
            let (lo, hi) = (load_pack(dq_accum, 2 * pack), load_pack(dq_accum, 2 * pack + 1));
            let wide: [f32; 8] = core::array::from_fn(|k| {
                let word = if k < 4 { lo[k] } else { hi[k - 4] };
                f32::from_bits(word) * scale
            });
            store_pack(dq, pack, T::pack(wide));
        }
    }
}

/// Bytes per row of the shared `dS` tile: `STREAM` 16-bit queries and 16 bytes of padding, so
/// that the 8 rows one `ldmatrix` (or one warp's stores) touch start in 8 different bank groups.
const fn ds_row_bytes(stream: u32) -> u32 {
    stream * 2 + 16
}

/// The dynamic shared memory of a backward block at head size `d`: the owned 128-row `k` and
/// `v` tiles, the streamed 32-row `q` and `dO` tiles, the `dSᵀ` tile (128 keys × 32 queries,
/// padded rows), and the 32 queries' log-sum-exp and `Δ` (f32).
pub const fn backward_shared_bytes(d: u32) -> u32 {
    (2 * OWNED + 2 * 32) * d * 2 + OWNED * ds_row_bytes(32) + 2 * 32 * 4
}

/// This lane's `ldmatrix` addresses for `dQ = dS·k` in a block of eight warps: warp `w` takes
/// the 16 queries `16·(w / 4)..` and the 16-column pairs `DQ_PAIRS·(w % 4)..` of `D`.
///
/// * The `A` fragment of dS (queries × keys), read from the dSᵀ tile (keys × queries, rows of
///   `ds_row` bytes) with a transposing `ldmatrix`: lane `l` gives row (key) `8·(l / 16) + l % 8`,
///   column (query) `16·(w / 4) + 8·(l / 8 % 2)`, so that matrix `l / 8` is the fragment's
///   register.
/// * The `B` fragments: the k tile read with `k` (keys) along its rows, at the warp's column
///   pairs `p`: chunk `(2p + l / 16) ^ (l % 8)`. (`Lanes::at_pair`'s table, indexed by a
///   warp-dependent pair, would land in local memory.)
///
/// From `%tid.x` read again where used: kept across the query loop, these registers made
/// ptxas spill at head_dim 128.
#[inline(always)]
fn dq_addresses<const DQ_PAIRS: usize>(
    ds_tile: u32,
    ds_row: u32,
    k_tile: u32,
    lanes: &Lanes,
) -> (u32, [u32; DQ_PAIRS]) {
    let tid = thread_index_uncached();
    let (warp, lane) = (tid / 32, tid % 32);
    let ds_lane = ds_tile + (8 * (lane / 16) + lane % 8) * ds_row + 32 * (warp / 4) + 16 * ((lane / 8) % 2);
    let b = core::array::from_fn(|j| {
        let pair = (warp % 4) * DQ_PAIRS as u32 + j as u32;
        k_tile + lanes.row16 + 16 * ((2 * pair + lane / 16) ^ (lane % 8))
    });
    (ds_lane, b)
}

/// Starts copying the log-sum-exp and `Δ` of the `STREAM` queries from `first` into `stats`
/// (`STREAM` f32 of each, in that order), as its own copy group: threads `0..2·STREAM` copy one
/// value each, zeros for queries past `rows`. Read from shared memory, they cost the
/// elementwise step no global-memory wait.
///
/// # Safety
/// `lse` and `delta` are valid for `rows` f32; `stats` is `2·STREAM` f32 of shared memory that
/// nothing reads until a [`cp_async_wait`] and a barrier.
#[inline(always)]
unsafe fn load_stats<const STREAM: usize>(
    stats: u32,
    lse: *const f32,
    delta: *const f32,
    first: u32,
    rows: u32,
    tid: u32,
) {
    let stream = STREAM as u32;
    if tid < 2 * stream {
        let (source, i) = if tid < stream { (lse, tid) } else { (delta, tid - stream) };
        let row = first + i;
        let valid = row < rows;
        let at = if valid { source.wrapping_add(row as usize) } else { source };
        // SAFETY: `at` is inside the rows when valid; the target is inside `stats`.
        unsafe { cp_async_4(stats + 4 * tid, at as *const u8, if valid { 4 } else { 0 }) };
    }
    cp_async_commit();
}

/// Adds a warp's `dQ` tile (16 queries from `first_query`, the `DQ_PAIRS` 16-column pairs of
/// quarter `quarter` of `D`) to the f32 accumulator `dq_head` (`[seq_q, D]`), skipping rows
/// past `seq_q`.
///
/// From sm_90 on, each lane's two neighbouring columns go in one `red.global.add.v2.f32`
/// instead of two scalar adds. (Four-wide adds after a swap of values between lanes `t` and
/// `t ^ 1` measured slower on an H100: the shuffles compete with `ldmatrix` for the
/// shared-memory pipe.)
///
/// # Safety
/// `dq_head` is valid for `seq_q·D` f32 in global memory, 16-byte aligned; the whole warp
/// calls this together.
#[inline(always)]
unsafe fn add_dq<const D: usize, const DQ_PAIRS: usize>(
    dq_head: *mut f32,
    dq: &[[[f32; 4]; 2]; DQ_PAIRS],
    first_query: u32,
    seq_q: u32,
    quarter: u32,
    lane: u32,
) where
    Count<DQ_PAIRS>: Unrolled,
{
    let (g, t) = (lane / 4, lane % 4);
    unroll::<2>(|r| {
        let query = first_query + g + 8 * r as u32;
        if query < seq_q {
            unroll::<DQ_PAIRS>(|j| {
                unroll::<2>(|h| {
                    let col = 16 * (quarter * DQ_PAIRS as u32 + j as u32) + 8 * h as u32 + 2 * t;
                    let at = dq_head.wrapping_add(query as usize * D + col as usize);
                    let (x, y) = (dq[j][h][2 * r], dq[j][h][2 * r + 1]);
                    // SAFETY: query < seq_q and col + 1 < D with col even: two f32 inside this
                    // head's rows, 8-byte aligned (D is even).
                    unsafe {
                        #[cfg(target_feature = "sm_90")]
                        atomic_add2(at, [x, y]);
                        #[cfg(not(target_feature = "sm_90"))]
                        {
                            atomic_add(at, x);
                            atomic_add(at.wrapping_add(1), y);
                        }
                    }
                });
            });
        }
    });
}

/// `dK` and `dV` for 128 keys of one head, and their share of `dQ` (see the module docs).
/// `STREAM` queries per tile: `GROUPS = STREAM / 8`, `STEPS = STREAM / 16`; `K_STEPS = D / 16`,
/// `K_PAIRS = D / 32`, `DQ_PAIRS = D / 64` (the 16-column pairs of `dQ` each warp computes);
/// `OWN_LOADS = 128·D / 8 / 256`, `STREAM_LOADS = STREAM·D / 8 / 256` copies per thread.
///
/// # Safety
/// The kernel's contract (`attention_backward_d*`): `q`, `dout` valid for `heads·seq_q·D`
/// elements, `k`, `v`, `dk`, `dv` for `heads·seq_k·D`, `lse` and `delta` for `heads·seq_q` f32
/// (`delta` as [`backward_prep`] wrote it), `dq_accum` for `heads·seq_q·D` f32 (zeroed, or
/// holding what is to be added to), all 16-byte aligned; `dk`, `dv` and `dq_accum` overlap
/// nothing else; 256 threads per block, `heads·ceil(seq_k / 128)` blocks,
/// [`backward_shared_bytes`]`(D)` bytes of dynamic shared memory.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn backward<
    T: MmaElement + Element,
    const D: usize,
    const K_STEPS: usize,
    const K_PAIRS: usize,
    const DQ_PAIRS: usize,
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
    dq_accum: *mut f32,
    heads: u32,
    seq_q: u32,
    seq_k: u32,
    scale_log2: f32,
    scale: f32,
    causal: bool,
) where
    Count<K_STEPS>: Unrolled,
    Count<K_PAIRS>: Unrolled,
    Count<DQ_PAIRS>: Unrolled,
    Count<GROUPS>: Unrolled,
    Count<STEPS>: Unrolled,
    Count<OWN_LOADS>: Unrolled,
    Count<STREAM_LOADS>: Unrolled,
{
    // Causal: the first key tiles see the most queries, and their blocks start first.
    let Some((head, key_start)) = owned_tile(seq_k, heads, false, OWNED) else { return };
    // SAFETY: reading a special register has no preconditions.
    let tid = unsafe { nvptx::_thread_idx_x() } as u32;
    let (warp, lane) = (tid / 32, tid % 32);
    let (g, t) = (lane / 4, lane % 4);
    let chunks = D as u32 / 8;
    let stream = STREAM as u32;

    let own_bytes = OWNED * D as u32 * 2;
    let stream_bytes = stream * D as u32 * 2;
    let (k_tile, v_tile) = (dynamic_shared(), dynamic_shared() + own_bytes);
    let (q_tile, do_tile) = (k_tile + 2 * own_bytes, k_tile + 2 * own_bytes + stream_bytes);
    let ds_tile = do_tile + stream_bytes;
    let ds_row = ds_row_bytes(stream);
    let stats = ds_tile + OWNED * ds_row;

    let rows_base = head as usize * seq_q as usize;
    let keys_base = head as usize * seq_k as usize;
    let (q_head, do_head) =
        (q.wrapping_add(rows_base * D) as *const u16, dout.wrapping_add(rows_base * D) as *const u16);
    let (k_head, v_head) = (k.wrapping_add(keys_base * D) as *const u16, v.wrapping_add(keys_base * D) as *const u16);
    let (lse_head, delta_head) = (lse.wrapping_add(rows_base), delta.wrapping_add(rows_base));

    // Queries before the first key of the tile see none of its keys when causal.
    let first = if causal { key_start / stream } else { 0 };
    let query_tiles = seq_q.div_ceil(stream);
    // SAFETY (the copies): in bounds by the contract; read only after the waits and barriers.
    unsafe {
        load_tile::<D, OWN_LOADS, THREADS>(k_tile, k_head, key_start, seq_k, tid);
        load_tile::<D, OWN_LOADS, THREADS>(v_tile, v_head, key_start, seq_k, tid);
        if first < query_tiles {
            load_tile::<D, STREAM_LOADS, THREADS>(q_tile, q_head, first * stream, seq_q, tid);
            load_tile::<D, STREAM_LOADS, THREADS>(do_tile, do_head, first * stream, seq_q, tid);
            load_stats::<STREAM>(stats, lse_head, delta_head, first * stream, seq_q, tid);
        }
    }
    // Rows past the last key hold zeros in the k and v tiles; their dS must still be 0 for dQ.
    let keys_end = key_start + OWNED > seq_k;
    let dq_head = dq_accum.wrapping_add(rows_base * D);
    let (mut dk_acc, mut dv_acc) = ([[[0.0f32; 4]; 2]; K_STEPS], [[[0.0f32; 4]; 2]; K_STEPS]);
    for query_tile in first..query_tiles {
        let q0 = query_tile * stream;
        cp_async_wait::<0>();
        // SAFETY: every thread of the block reaches each barrier (block-wide conditions only).
        unsafe { nvptx::_syncthreads() };

        // Sᵀ = k·qᵀ and dPᵀ = v·dOᵀ for the warp's 16 keys against the tile's queries.
        // SAFETY (the products): the tiles have arrived; the warp is converged.
        // The lane's address offsets from `%tid.x` read again each tile, not kept across the
        // loop: at head_dim 128 those registers made ptxas spill.
        let fresh = thread_index_uncached();
        let (lanes, warp) = (Lanes::new(chunks, fresh % 32), fresh / 32);
        let st = unsafe { product_t::<T, GROUPS, K_STEPS, K_PAIRS>(k_tile, q_tile, &lanes, warp * 16) };
        let dpt = unsafe { product_t::<T, GROUPS, K_STEPS, K_PAIRS>(v_tile, do_tile, &lanes, warp * 16) };
        let masked = keys_end || q0 + stream > seq_q || (causal && key_start + OWNED - 1 > q0);
        let (mut pt, mut dst) = ([[0.0f32; 4]; GROUPS], [[0.0f32; 4]; GROUPS]);
        unroll::<GROUPS>(|n| {
            unroll::<2>(|c| {
                // The query's log-sum-exp (log2 units) and Δ. Past seq_q they are zeros, and
                // the tile is masked: the selects below zero those scores.
                let i = 8 * n as u32 + 2 * t + c as u32;
                // SAFETY: inside the stats tile, which arrived with the q and dO tiles.
                let (l, d) = unsafe { (load_shared_f32(stats + 4 * i), load_shared_f32(stats + 4 * (stream + i))) };
                let l = if l == f32::NEG_INFINITY { f32::INFINITY } else { l * LOG2_E };
                unroll::<2>(|r| {
                    let e = 2 * r + c;
                    let p = exp2_ftz(fma(st[n][e], scale_log2, -l));
                    pt[n][e] = p;
                    dst[n][e] = p * (dpt[n][e] - d);
                });
            });
        });
        // Masked scores get P = dS = 0 by selects; the tile test is uniform, so unmasked tiles
        // skip the key arithmetic.
        if masked {
            // The thread's keys from `%tid.x` read again here, not kept across the loop, where
            // they cost the registers that made ptxas spill.
            let fresh = thread_index_uncached();
            let key0 = key_start + fresh / 32 * 16 + fresh % 32 / 4;
            unroll::<GROUPS>(|n| {
                unroll::<4>(|e| {
                    let query = q0 + 8 * n as u32 + 2 * t + (e as u32 & 1);
                    let key = key0 + 8 * (e as u32 / 2);
                    let hidden = (query >= seq_q) | (key >= seq_k) | (causal & (key > query));
                    pt[n][e] = if hidden { 0.0 } else { pt[n][e] };
                    dst[n][e] = if hidden { 0.0 } else { dst[n][e] };
                });
            });
        }
        unroll::<STEPS>(|ks| {
            let (p, ds) = (as_a::<T, GROUPS>(&pt, ks), as_a::<T, GROUPS>(&dst, ks));
            // SAFETY: the q and dO tiles have arrived; the warp is converged.
            unsafe {
                accumulate::<T, K_STEPS>(&mut dv_acc, &p, do_tile, &lanes, ks as u32);
                accumulate::<T, K_STEPS>(&mut dk_acc, &ds, q_tile, &lanes, ks as u32);
            }
        });
        // dSᵀ to shared memory (the warp's 16 key rows), for dQ, which sums over the block's keys.
        unroll::<GROUPS>(|n| {
            unroll::<2>(|r| {
                let address = ds_tile + (warp * 16 + g + 8 * r as u32) * ds_row + (8 * n as u32 + 2 * t) * 2;
                // SAFETY: inside the dS tile, at this thread's own two values; read after the
                // barrier below, and the previous tile's reads ended at this tile's first one.
                unsafe { store_shared_u32(address, pack::<T>(dst[n][2 * r], dst[n][2 * r + 1])) };
            });
        });

        // SAFETY: as above. dS is whole, and every warp is done with the q and dO tiles: the
        // next ones are copied while dQ is computed.
        unsafe { nvptx::_syncthreads() };
        if query_tile + 1 < query_tiles {
            // SAFETY: as for the first copies; the tiles are no longer read.
            unsafe {
                load_tile::<D, STREAM_LOADS, THREADS>(q_tile, q_head, q0 + stream, seq_q, tid);
                load_tile::<D, STREAM_LOADS, THREADS>(do_tile, do_head, q0 + stream, seq_q, tid);
                load_stats::<STREAM>(stats, lse_head, delta_head, q0 + stream, seq_q, tid);
            }
        }

        // dQ += dS·k for the tile's queries, summed over the block's 128 keys: warp `w` takes
        // the 16 queries `16·(w / 4)..` and the D / 4 columns of quarter `w % 4`.
        let mut dq = [[[0.0f32; 4]; 2]; DQ_PAIRS];
        let (ds_lane, dq_b) = dq_addresses::<DQ_PAIRS>(ds_tile, ds_row, k_tile, &lanes);
        unroll::<{ OWNED as usize / 16 }>(|ks| {
            // SAFETY: the dS tile is whole (barrier above) and the k tile never changes; the
            // warp is converged.
            unsafe {
                let a = ldmatrix_x4_trans(ds_lane + 16 * ks as u32 * ds_row);
                unroll::<DQ_PAIRS>(|j| {
                    let b = ldmatrix_x4_trans(dq_b[j] + 16 * ks as u32 * lanes.row_bytes);
                    mma::<T>(&mut dq[j][0], &a, [b[0], b[1]]);
                    mma::<T>(&mut dq[j][1], &a, [b[2], b[3]]);
                });
            }
        });
        // SAFETY: the rows are inside this head's, the columns inside D; the warp is converged.
        unsafe { add_dq::<D, DQ_PAIRS>(dq_head, &dq, q0 + 16 * (warp / 4), seq_q, warp % 4, lane) };
    }
    // The warp and lane from `%tid.x` again, rather than kept across the loop (a spill).
    let fresh = thread_index_uncached();
    let first_key = key_start + fresh / 32 * 16;
    // SAFETY: the rows are this block's, inside the head's `dk` and `dv`.
    unsafe {
        store_rows::<T, D, K_STEPS>(dk.wrapping_add(keys_base * D), &dk_acc, scale, first_key, seq_k, fresh % 32);
        store_rows::<T, D, K_STEPS>(dv.wrapping_add(keys_base * D), &dv_acc, 1.0, first_key, seq_k, fresh % 32);
    }
}
