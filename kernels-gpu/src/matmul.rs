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
//! Each mapping also comes as a `linear_small_*` kernel, a linear layer `act(a · b + bias)`: the
//! bias (by column) is added to each output's f32 sum and a ReLU, when asked for, applied before
//! the one rounding, so a small layer with its bias and activation is one launch, where the ops
//! apart are three (in a captured graph, three nodes one after another).
//!
//! Every thread keeps several loads in flight ([`strided_fold`](crate::device::unroll)): a small
//! product is bound by memory latency, not by bandwidth or arithmetic.
use crate::names::MatmulKernels;
#[cfg(target_arch = "nvptx64")]
use core::num::NonZeroU64;

/// A small-product kernel of element type `$elem`: its parameters, and `$body` (one of the
/// mappings below) with no epilogue.
macro_rules! small_product_kernel {
    ($(#[$doc:meta])* $name:ident, $elem:ty, $body:ident) => {
        crate::kernel! {
            $(#[$doc])*
            pub unsafe fn $name(
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
                let p = Product { a, b, c, batch, m, k, n, a_strides: (a_row_stride, a_col_stride), b_strides: (b_row_stride, b_col_stride) };
                // SAFETY: forwarded from this kernel's contract.
                unsafe { $body(p, Epilogue::NONE) }
            }
        }
    };
}

/// A small linear-layer kernel of element type `$elem`: the product's parameters with a bias and
/// a ReLU flag, and `$body` with them as its epilogue.
macro_rules! small_linear_kernel {
    ($(#[$doc:meta])* $name:ident, $elem:ty, $body:ident) => {
        crate::kernel! {
            $(#[$doc])*
            pub unsafe fn $name(
                a: *const [$elem; batch * m * k],
                b: *const [$elem; batch * k * n],
                bias: *const [$elem; n],
                c: *mut [$elem; batch * m * n],
                batch: u64,
                m: u64,
                k: u64,
                n: u64,
                a_row_stride: u64,
                a_col_stride: u64,
                b_row_stride: u64,
                b_col_stride: u64,
                relu: u32,
            ) {
                let p = Product { a, b, c, batch, m, k, n, a_strides: (a_row_stride, a_col_stride), b_strides: (b_row_stride, b_col_stride) };
                // SAFETY: forwarded from this kernel's contract.
                unsafe { $body(p, Epilogue { bias, relu: relu != 0 }) }
            }
        }
    };
}

macro_rules! matmul_family {
    (
        $(#[$table_doc:meta])*
        $table:ident, $elem:ty, {
            small_thread: $thread:ident,
            small_warp: $warp:ident,
            small_block: $block:ident,
            linear_thread: $lthread:ident,
            linear_warp: $lwarp:ident,
            linear_block: $lblock:ident $(,)?
        }
    ) => {
        $(#[$table_doc])*
        #[cfg(not(target_arch = "nvptx64"))]
        pub const $table: MatmulKernels = MatmulKernels {
            small_thread: $thread,
            small_warp: $warp,
            small_block: $block,
            linear_thread: $lthread,
            linear_warp: $lwarp,
            linear_block: $lblock,
        };

        small_product_kernel! {
            /// `c[b, i, j] = Σ_k a[b, i, k] · b[b, k, j]` with one thread per output: thread `t`
            /// (grid-stride) computes output `t` in row-major order, adding the products in
            /// order of `k` with FMAs in f32 (four loads in flight). Neighbouring threads take
            /// neighbouring `j`, so they read neighbouring values of `b`'s row when
            /// `b_col_stride` is 1.
            ///
            /// # Safety
            /// `a` is valid for `batch·m·k` elements, `b` for `batch·k·n` and `c` for
            /// `batch·m·n`; every `(i, k)` with `i < m`, `k < k` has
            /// `i·a_row_stride + k·a_col_stride < m·k` (likewise for `b` with `k·n`); `c`
            /// overlaps neither input.
            $thread, $elem, thread_per_output
        }

        small_product_kernel! {
            /// `c[b, i, j] = Σ_k a[b, i, k] · b[b, k, j]` with one warp per output (warps
            /// grid-stride over the outputs in row-major order): lane `l` adds the products for
            /// `k = l, l + 32, …` in order with FMAs in f32 (eight loads in flight), then the
            /// warp adds its lanes' sums as a tree and lane 0 writes the output.
            ///
            /// # Safety
            /// As for the thread-per-output kernel of this family; besides, `blockDim.x` is a
            /// multiple of 32 (every warp whole).
            $warp, $elem, warp_per_output
        }

        small_product_kernel! {
            /// `c[b, i, j] = Σ_k a[b, i, k] · b[b, k, j]` with one block per output (blocks
            /// grid-stride over the outputs in row-major order): thread `t` adds the products for
            /// `k = t, t + blockDim.x, …` in order with FMAs in f32 (four loads in flight), then
            /// the block adds its threads' sums ([`BlockReduce`](crate::device::block::BlockReduce))
            /// and thread 0 writes the output.
            ///
            /// # Safety
            /// As for the thread-per-output kernel of this family; besides, `blockDim.x` is a
            /// multiple of 32, at most 1024, and `blockDim.y = blockDim.z = 1`.
            $block, $elem, block_per_output
        }

        small_linear_kernel! {
            /// A linear layer, `c[b, i, j] = act(Σ_k a[b, i, k] · b[b, k, j] + bias[j])`, with
            /// `act` the identity, or ReLU when `relu` is non-zero: the thread-per-output product
            /// of this family, the bias added to the f32 sum and the ReLU applied before the one
            /// rounding to the element type.
            ///
            /// # Safety
            /// As for the thread-per-output product of this family; besides, `bias` is valid for
            /// `n` elements and `c` does not overlap it.
            $lthread, $elem, thread_per_output
        }

        small_linear_kernel! {
            /// A linear layer, `c[b, i, j] = act(Σ_k a[b, i, k] · b[b, k, j] + bias[j])` (`act` as
            /// for the thread-per-output linear kernel of this family), with one warp per output
            /// as the warp-per-output product of this family.
            ///
            /// # Safety
            /// As for the warp-per-output product of this family; besides, `bias` is valid for
            /// `n` elements and `c` does not overlap it.
            $lwarp, $elem, warp_per_output
        }

        small_linear_kernel! {
            /// A linear layer, `c[b, i, j] = act(Σ_k a[b, i, k] · b[b, k, j] + bias[j])` (`act` as
            /// for the thread-per-output linear kernel of this family), with one block per output
            /// as the block-per-output product of this family.
            ///
            /// # Safety
            /// As for the block-per-output product of this family; besides, `bias` is valid for
            /// `n` elements and `c` does not overlap it.
            $lblock, $elem, block_per_output
        }
    };
}

/// One small product's operands and sizes, as the kernels take them.
#[cfg(target_arch = "nvptx64")]
#[derive(Clone, Copy)]
struct Product<T> {
    a: *const T,
    b: *const T,
    c: *mut T,
    batch: u64,
    m: u64,
    k: u64,
    n: u64,
    /// `a`'s row and column strides.
    a_strides: (u64, u64),
    /// `b`'s row and column strides.
    b_strides: (u64, u64),
}

/// What happens to an output's f32 sum before its one rounding to the element type: a bias by
/// column added (when `bias` is not null), then a ReLU (when `relu`).
#[cfg(target_arch = "nvptx64")]
#[derive(Clone, Copy)]
struct Epilogue<T> {
    bias: *const T,
    relu: bool,
}

#[cfg(target_arch = "nvptx64")]
impl<T: crate::device::element::Element> Epilogue<T> {
    /// A plain product: the sum as it is.
    const NONE: Self = Epilogue { bias: core::ptr::null(), relu: false };

    /// The output at column `j` from its sum `acc`.
    ///
    /// # Safety
    /// `bias` is null or valid for more than `j` elements.
    #[inline(always)]
    unsafe fn apply(self, acc: f32, j: u64) -> f32 {
        // SAFETY: forwarded from this function's contract.
        let biased = if self.bias.is_null() { acc } else { acc + unsafe { self.bias.add(j as usize).read() }.to_f32() };
        // The relu kernels' ReLU: NaN stays NaN, −0 becomes +0.
        if self.relu { crate::activation::relu(biased) } else { biased }
    }
}

/// The body of the thread-per-output kernels: grid-stride over the outputs, one each.
///
/// # Safety
/// The contract of `matmul_small_thread_*`, and `epilogue`'s bias null or valid for `n` elements.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn thread_per_output<T: crate::device::element::Element>(p: Product<T>, epilogue: Epilogue<T>) {
    use crate::device::{index, math::fma, unroll::strided_fold};
    let (Some(n_nz), Some(per_matrix)) = (NonZeroU64::new(p.n), NonZeroU64::new(p.m * p.n)) else {
        return;
    };
    for out in index::GridStride::over(0, p.batch * per_matrix.get()) {
        let (a_row, b_col, j) = dot_origin(out, p.m, p.k, n_nz, per_matrix, (p.a_strides.0, p.b_strides.1));
        // SAFETY: kk < k, so the offsets are inside matrix `matrix` of each operand (the
        // contract on the strides).
        let load = |kk: u64| unsafe { load_pair(p.a, p.b, a_row + kk * p.a_strides.1, b_col + kk * p.b_strides.0) };
        let acc = strided_fold::<4, (f32, f32), f32>(0, p.k, 1, 0.0, load, |acc, (x, y)| fma(x, y, acc));
        // SAFETY: out < batch·m·n and j < n.
        unsafe { p.c.add(out as usize).write(T::from_f32(epilogue.apply(acc, j))) };
    }
}

/// The body of the warp-per-output kernels.
///
/// # Safety
/// The contract of `matmul_small_warp_*`, and `epilogue`'s bias null or valid for `n` elements.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn warp_per_output<T: crate::device::element::Element>(p: Product<T>, epilogue: Epilogue<T>) {
    use crate::device::{index, math::fma, unroll::strided_fold, warp};
    let (Some(n_nz), Some(per_matrix)) = (NonZeroU64::new(p.n), NonZeroU64::new(p.m * p.n)) else {
        return;
    };
    let lane = warp::lane_id() as u64;
    // Every lane of a warp takes the same outputs, so the warp stays converged.
    for out in index::GridStride::over_warps(p.batch * per_matrix.get()) {
        let (a_row, b_col, j) = dot_origin(out, p.m, p.k, n_nz, per_matrix, (p.a_strides.0, p.b_strides.1));
        // SAFETY: as in the thread-per-output body: kk < k.
        let load = |kk: u64| unsafe { load_pair(p.a, p.b, a_row + kk * p.a_strides.1, b_col + kk * p.b_strides.0) };
        let acc = strided_fold::<8, (f32, f32), f32>(lane, p.k, 32, 0.0, load, |acc, (x, y)| fma(x, y, acc));
        // SAFETY: the whole warp is here (converged: same outputs for every lane).
        let total = unsafe { warp::warp_sum(acc) };
        if lane == 0 {
            // SAFETY: out < batch·m·n and j < n.
            unsafe { p.c.add(out as usize).write(T::from_f32(epilogue.apply(total, j))) };
        }
    }
}

/// The body of the block-per-output kernels.
///
/// # Safety
/// The contract of `matmul_small_block_*`, and `epilogue`'s bias null or valid for `n` elements.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn block_per_output<T: crate::device::element::Element>(p: Product<T>, epilogue: Epilogue<T>) {
    use crate::device::{block::BlockReduce, index, math::fma, unroll::strided_fold};
    use core::arch::nvptx;
    let mut reduce = BlockReduce::new();
    let (Some(n_nz), Some(per_matrix)) = (NonZeroU64::new(p.n), NonZeroU64::new(p.m * p.n)) else {
        return;
    };
    // SAFETY: reading the special registers has no preconditions.
    let (thread, threads) = unsafe { (nvptx::_thread_idx_x() as u64, nvptx::_block_dim_x() as u64) };
    // Every thread of a block takes the same outputs, so all reach each barrier.
    for out in index::GridStride::over_blocks(p.batch * per_matrix.get()) {
        let (a_row, b_col, j) = dot_origin(out, p.m, p.k, n_nz, per_matrix, (p.a_strides.0, p.b_strides.1));
        // SAFETY: as in the thread-per-output body: kk < k.
        let load = |kk: u64| unsafe { load_pair(p.a, p.b, a_row + kk * p.a_strides.1, b_col + kk * p.b_strides.0) };
        let acc = strided_fold::<4, (f32, f32), f32>(thread, p.k, threads, 0.0, load, |acc, (x, y)| fma(x, y, acc));
        // SAFETY: every thread of the block calls it, once per output (see above).
        let total = unsafe { reduce.sum(acc) };
        if thread == 0 {
            // SAFETY: out < batch·m·n and j < n.
            unsafe { p.c.add(out as usize).write(T::from_f32(epilogue.apply(total, j))) };
        }
    }
}

/// The offsets at which output `out` (row-major over `[batch, m, n]`) starts reading, its row
/// of `a` and its column of `b`, and its column `j`. The divisors are non-zero by type, so the
/// divisions have no panic path.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn dot_origin(out: u64, m: u64, k: u64, n: NonZeroU64, per_matrix: NonZeroU64, strides: (u64, u64)) -> (u64, u64, u64) {
    let (matrix, within) = (out / per_matrix, out % per_matrix);
    let (i, j) = (within / n, within % n);
    (matrix * m * k + i * strides.0, matrix * k * n.get() + j * strides.1, j)
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
        linear_thread: linear_small_thread_f32,
        linear_warp: linear_small_warp_f32,
        linear_block: linear_small_block_f32,
    }
}

matmul_family! {
    /// The small-product kernels for f16 matrices (products and sums in f32).
    F16, crate::dtype::F16, {
        small_thread: matmul_small_thread_f16,
        small_warp: matmul_small_warp_f16,
        small_block: matmul_small_block_f16,
        linear_thread: linear_small_thread_f16,
        linear_warp: linear_small_warp_f16,
        linear_block: linear_small_block_f16,
    }
}

matmul_family! {
    /// The small-product kernels for bf16 matrices (products and sums in f32).
    BF16, crate::dtype::Bf16, {
        small_thread: matmul_small_thread_bf16,
        small_warp: matmul_small_warp_bf16,
        small_block: matmul_small_block_bf16,
        linear_thread: linear_small_thread_bf16,
        linear_warp: linear_small_warp_bf16,
        linear_block: linear_small_block_bf16,
    }
}
