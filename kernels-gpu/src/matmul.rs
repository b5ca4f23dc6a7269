//! Small matrix products: `c[b] = a[b] · b[b]` for products too small to fill the GPU, where a
//! library GEMM's launch (and, for a long inner dimension, its split-K reduction, a second
//! launch) costs more than the arithmetic. The host sends a product here when its
//! multiply-adds are few (see `opsmith-host`'s `matmul`), and to cuBLAS otherwise.
//!
//! Operands are read through strides, so a transposed operand is read in place: element
//! `(i, k)` of `a`'s matrix `b` is at `b·m·k + i·a_row_stride + k·a_col_stride`, and likewise
//! for `b`; `c` is row-major `[batch, m, n]`. Each output is one dot product, accumulated in f32
//! with FMAs in a fixed order, so every run gives the same bits.
//!
//! Three thread mappings, for the shapes of small product, by the length of the inner dimension:
//! * `matmul_small_thread`: one thread per output, for a short one (a layer's forward from few
//!   inputs, `[1024, 2] · [2, 128]`);
//! * `matmul_small_warp`: one warp per output, its lanes splitting the inner dimension and
//!   adding their sums as a tree, for a middling one (`[1024, 128] · [128, 2]`);
//! * `matmul_small_block`: one block per output, for a long one (a weight gradient,
//!   `[128, 1024] · [1024, 2]`).
//!
//! Every thread keeps several loads in flight ([`strided_fold`](crate::device::unroll)): a small
//! product is bound by memory latency, not by bandwidth or arithmetic.
use crate::names::MatmulKernels;
#[cfg(target_arch = "nvptx64")]
use core::num::NonZeroU64;

macro_rules! matmul_family {
    (
        $(#[$table_doc:meta])*
        $table:ident, $elem:ty, {
            small_thread: $thread:ident,
            small_warp: $warp:ident,
            small_block: $block:ident $(,)?
        }
    ) => {
        $(#[$table_doc])*
        #[cfg(not(target_arch = "nvptx64"))]
        pub const $table: MatmulKernels = MatmulKernels {
            small_thread: $thread,
            small_warp: $warp,
            small_block: $block,
        };

        crate::kernel! {
            /// `c[b, i, j] = Σ_k a[b, i, k] · b[b, k, j]` with one thread per output: thread `t`
            /// (grid-stride) computes output `t` in row-major order, adding the products in
            /// order of `k` with FMAs in f32 (four loads in flight). Neighbouring threads take neighbouring `j`, so they
            /// read neighbouring values of `b`'s row when `b_col_stride` is 1.
            ///
            /// # Safety
            /// `a` is valid for `batch·m·k` elements, `b` for `batch·k·n` and `c` for
            /// `batch·m·n`; every `(i, k)` with `i < m`, `k < k` has
            /// `i·a_row_stride + k·a_col_stride < m·k` (likewise for `b` with `k·n`); `c`
            /// overlaps neither input.
            pub unsafe fn $thread(
                a: *const [$elem; batch * m * k],
                b: *const [$elem; batch * k * n],
                c: *mut [$elem; batch * m * n],
                batch: u64,
                m: u64,
                k: u64,
                n: u64,
                a_row_stride: u64,
                a_col_stride: u64,
                b_row_stride: u64,
                b_col_stride: u64,
            ) {
                use crate::device::{element::Element, index, math::fma, unroll::strided_fold};
                let (Some(n_nz), Some(per_matrix)) = (NonZeroU64::new(n), NonZeroU64::new(m * n)) else {
                    return;
                };
                for out in index::GridStride::over(0, batch * per_matrix.get()) {
                    let (a_row, b_col) = dot_origin(out, m, k, n_nz, per_matrix, (a_row_stride, b_col_stride));
                    // SAFETY: kk < k, so the offsets are inside matrix `matrix` of each operand
                    // (this kernel's contract on the strides).
                    let load = |kk: u64| unsafe { load_pair(a, b, a_row + kk * a_col_stride, b_col + kk * b_row_stride) };
                    let acc = strided_fold::<4, (f32, f32), f32>(0, k, 1, 0.0, load, |acc, (x, y)| fma(x, y, acc));
                    // SAFETY: out < batch·m·n.
                    unsafe { c.add(out as usize).write(<$elem>::from_f32(acc)) };
                }
            }
        }

        crate::kernel! {
            /// `c[b, i, j] = Σ_k a[b, i, k] · b[b, k, j]` with one warp per output (warps
            /// grid-stride over the outputs in row-major order): lane `l` adds the products for
            /// `k = l, l + 32, …` in order with FMAs in f32 (eight loads in flight), then the
            /// warp adds its lanes' sums as a tree and lane 0 writes the output.
            ///
            /// # Safety
            /// As for the thread-per-output kernel of this family; besides, `blockDim.x` is a
            /// multiple of 32 (every warp whole).
            pub unsafe fn $warp(
                a: *const [$elem; batch * m * k],
                b: *const [$elem; batch * k * n],
                c: *mut [$elem; batch * m * n],
                batch: u64,
                m: u64,
                k: u64,
                n: u64,
                a_row_stride: u64,
                a_col_stride: u64,
                b_row_stride: u64,
                b_col_stride: u64,
            ) {
                use crate::device::{element::Element, index, math::fma, unroll::strided_fold, warp};
                let (Some(n_nz), Some(per_matrix)) = (NonZeroU64::new(n), NonZeroU64::new(m * n)) else {
                    return;
                };
                let lane = warp::lane_id() as u64;
                // Every lane of a warp takes the same outputs, so the warp stays converged.
                for out in index::GridStride::over_warps(batch * per_matrix.get()) {
                    let (a_row, b_col) = dot_origin(out, m, k, n_nz, per_matrix, (a_row_stride, b_col_stride));
                    // SAFETY: as in the thread-per-output kernel: kk < k.
                    let load = |kk: u64| unsafe { load_pair(a, b, a_row + kk * a_col_stride, b_col + kk * b_row_stride) };
                    let acc = strided_fold::<8, (f32, f32), f32>(lane, k, 32, 0.0, load, |acc, (x, y)| fma(x, y, acc));
                    // SAFETY: the whole warp is here (converged: same outputs for every lane).
                    let total = unsafe { warp::warp_sum(acc) };
                    if lane == 0 {
                        // SAFETY: out < batch·m·n.
                        unsafe { c.add(out as usize).write(<$elem>::from_f32(total)) };
                    }
                }
            }
        }

        crate::kernel! {
            /// `c[b, i, j] = Σ_k a[b, i, k] · b[b, k, j]` with one block per output (blocks
            /// grid-stride over the outputs in row-major order): thread `t` adds the products for
            /// `k = t, t + blockDim.x, …` in order with FMAs in f32 (four loads in flight), then
            /// the block adds its threads' sums ([`BlockReduce`](crate::device::block::BlockReduce))
            /// and thread 0 writes the output.
            ///
            /// # Safety
            /// As for the thread-per-output kernel of this family; besides, `blockDim.x` is a
            /// multiple of 32, at most 1024, and `blockDim.y = blockDim.z = 1`.
            pub unsafe fn $block(
                a: *const [$elem; batch * m * k],
                b: *const [$elem; batch * k * n],
                c: *mut [$elem; batch * m * n],
                batch: u64,
                m: u64,
                k: u64,
                n: u64,
                a_row_stride: u64,
                a_col_stride: u64,
                b_row_stride: u64,
                b_col_stride: u64,
            ) {
                use crate::device::{block::BlockReduce, element::Element, index, math::fma, unroll::strided_fold};
                use core::arch::nvptx;
                let mut reduce = BlockReduce::new();
                let (Some(n_nz), Some(per_matrix)) = (NonZeroU64::new(n), NonZeroU64::new(m * n)) else {
                    return;
                };
                // SAFETY: reading the special registers has no preconditions.
                let (thread, threads) = unsafe { (nvptx::_thread_idx_x() as u64, nvptx::_block_dim_x() as u64) };
                // Every thread of a block takes the same outputs, so all reach each barrier.
                for out in index::GridStride::over_blocks(batch * per_matrix.get()) {
                    let (a_row, b_col) = dot_origin(out, m, k, n_nz, per_matrix, (a_row_stride, b_col_stride));
                    // SAFETY: as in the thread-per-output kernel: kk < k.
                    let load = |kk: u64| unsafe { load_pair(a, b, a_row + kk * a_col_stride, b_col + kk * b_row_stride) };
                    let acc = strided_fold::<4, (f32, f32), f32>(thread, k, threads, 0.0, load, |acc, (x, y)| fma(x, y, acc));
                    // SAFETY: every thread of the block calls it, once per output (see above).
                    let total = unsafe { reduce.sum(acc) };
                    if thread == 0 {
                        // SAFETY: out < batch·m·n.
                        unsafe { c.add(out as usize).write(<$elem>::from_f32(total)) };
                    }
                }
            }
        }
    };
}

/// The offsets at which output `out` (row-major over `[batch, m, n]`) starts reading: its row
/// of `a` and its column of `b`. The divisors are non-zero by type, so the divisions have no
/// panic path.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn dot_origin(out: u64, m: u64, k: u64, n: NonZeroU64, per_matrix: NonZeroU64, strides: (u64, u64)) -> (u64, u64) {
    let (matrix, within) = (out / per_matrix, out % per_matrix);
    let (i, j) = (within / n, within % n);
    (matrix * m * k + i * strides.0, matrix * k * n.get() + j * strides.1)
}

/// `(a[i], b[j])`, widened to f32.
///
/// # Safety
/// `a` is valid at offset `i` and `b` at offset `j`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn load_pair<T: crate::device::element::Element>(a: *const T, b: *const T, i: u64, j: u64) -> (f32, f32) {
    // SAFETY: forwarded from this function's contract.
    unsafe { (a.add(i as usize).read().to_f32(), b.add(j as usize).read().to_f32()) }
}

matmul_family! {
    /// The small-product kernels for f32 matrices.
    F32, f32, {
        small_thread: matmul_small_thread_f32,
        small_warp: matmul_small_warp_f32,
        small_block: matmul_small_block_f32,
    }
}

matmul_family! {
    /// The small-product kernels for f16 matrices (products and sums in f32).
    F16, crate::dtype::F16, {
        small_thread: matmul_small_thread_f16,
        small_warp: matmul_small_warp_f16,
        small_block: matmul_small_block_f16,
    }
}

matmul_family! {
    /// The small-product kernels for bf16 matrices (products and sums in f32).
    BF16, crate::dtype::Bf16, {
        small_thread: matmul_small_thread_bf16,
        small_warp: matmul_small_warp_bf16,
        small_block: matmul_small_block_bf16,
    }
}
