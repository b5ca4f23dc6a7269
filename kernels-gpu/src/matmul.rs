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
//! Four thread mappings, for the shapes of small product, by the length of the inner dimension:
//! * `matmul_small_thread`: one thread per four neighbouring outputs of a row, for a short one
//!   (a layer's forward from few inputs, `[1024, 2] · [2, 128]`);
//! * `matmul_small_warp`: one warp per four neighbouring outputs of a row, its lanes splitting
//!   the inner dimension and adding their sums as a tree, for a middling one
//!   (`[1024, 128] · [128, 2]`);
//! * `matmul_small_columns`: one block per four neighbouring outputs of a row, for a long one
//!   with `b` read by rows (a weight gradient, `[2, 1024] · [1024, 128]`): the block's threads
//!   split the inner dimension into slices, and the four threads of a slice read 16 contiguous
//!   bytes of a row of `b`;
//! * `matmul_small_block`: one block per output, for a long one with `b` read by columns.
//!
//! The column mapping also gives `linear_grads_columns`: a linear layer's weight and bias
//! gradients in one launch (the bias's as one more row of the product, of ones), reading the
//! output's gradient through the ReLU's mask when the layer has one.
//!
//! The thread, warp and column mappings also come as `linear_small_*` kernels, a linear layer
//! `act(a · b + bias)` (a layer's weight is read by rows, so a long layer takes the column
//! mapping): the bias (by column) is added to each output's f32 sum and a ReLU, when asked for,
//! applied before the one rounding, so a small layer with its bias and activation is one
//! launch, where the ops apart are three (in a captured graph, three nodes one after another).
//!
//! Two more fuse a two-layer block `relu(x · w1 + b1) · w2 + b2` whose input and output are
//! narrow (a small classifier's hidden layer and logits): `two_layer_forward`, one warp per row
//! computing the row's hidden units and its outputs, and `two_layer_first_grads`, the first
//! layer's weight and bias gradients with the hidden layer's gradient `(g · w2ᵀ) · [h > 0]`
//! computed as it is read. Each adds in the order of one of the separate kernels it replaces;
//! in a captured training step each removes one node from the critical path.
//!
//! Every thread keeps several loads in flight ([`strided_fold`](crate::device::unroll)): a small
//! product is bound by memory latency, not by bandwidth or arithmetic.
use crate::names::MatmulKernels;
#[cfg(target_arch = "nvptx64")]
use core::num::NonZeroU64;

/// The two-layer gradient kernels hold rows of output gradients in flight a thread, and a hidden
/// unit's row of `w2`: at most 512 threads a block, two blocks a multiprocessor (64 registers on
/// sm_90), so that the first layer's gradient shares the GPU with the second layer's
/// (`linear_grads`, a parallel branch of a training step's graph). The host keeps to it.
#[cfg(not(target_arch = "nvptx64"))]
pub(crate) const LAUNCH_BOUNDS: &[crate::names::LaunchBounds] = &[
    two_layer_grads_bounds("two_layer_first_grads_f32"),
    two_layer_grads_bounds("two_layer_first_grads_f16"),
    two_layer_grads_bounds("two_layer_first_grads_bf16"),
];

/// The most threads a block of a two-layer gradient kernel may have.
pub const TWO_LAYER_GRADS_MAX_BLOCK: u32 = 512;

#[cfg(not(target_arch = "nvptx64"))]
const fn two_layer_grads_bounds(kernel: &'static str) -> crate::names::LaunchBounds {
    crate::names::LaunchBounds { kernel, max_threads: TWO_LAYER_GRADS_MAX_BLOCK, min_blocks: 2 }
}

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
            small_columns: $columns:ident,
            linear_thread: $lthread:ident,
            linear_warp: $lwarp:ident,
            linear_columns: $lcolumns:ident,
            linear_grads: $grads:ident,
            two_layer_forward: $tlf:ident,
            two_layer_first_grads: $tlg:ident $(,)?
        }
    ) => {
        $(#[$table_doc])*
        #[cfg(not(target_arch = "nvptx64"))]
        pub const $table: MatmulKernels = MatmulKernels {
            small_thread: $thread,
            small_warp: $warp,
            small_block: $block,
            small_columns: $columns,
            linear_thread: $lthread,
            linear_warp: $lwarp,
            linear_columns: $lcolumns,
            linear_grads: $grads,
            two_layer_forward: $tlf,
            two_layer_first_grads: $tlg,
        };

        small_product_kernel! {
            /// `c[b, i, j] = Σ_k a[b, i, k] · b[b, k, j]` with one thread per run of four
            /// neighbouring outputs of a row (fewer at a row's end): thread `t` (grid-stride)
            /// computes run `t` in row-major order, reading each value of its row of `a` once and
            /// adding each output's products in order of `k` with FMAs in f32 (two steps of `k`
            /// in flight). Neighbouring threads take neighbouring runs, so they read neighbouring
            /// values of `b`'s row when `b_col_stride` is 1.
            ///
            /// # Safety
            /// `a` is valid for `batch·m·k` elements, `b` for `batch·k·n` and `c` for
            /// `batch·m·n`; every `(i, k)` with `i < m`, `k < k` has
            /// `i·a_row_stride + k·a_col_stride < m·k` (likewise for `b` with `k·n`); `c`
            /// overlaps neither input.
            $thread, $elem, thread_per_run
        }

        small_product_kernel! {
            /// `c[b, i, j] = Σ_k a[b, i, k] · b[b, k, j]` with one warp per run of four
            /// neighbouring outputs of a row (fewer at a row's end; warps grid-stride over the
            /// runs in row-major order): lane `l` adds each output's products for
            /// `k = l, l + 32, …` in order with FMAs in f32 (four steps of `k` in flight), reading
            /// each value of the row of `a` once for the run, then the warp adds its lanes' sums
            /// as a tree and lane 0 writes the run.
            ///
            /// # Safety
            /// As for the thread kernel of this family; besides, `blockDim.x` is a
            /// multiple of 32 (every warp whole).
            $warp, $elem, warp_per_run
        }

        small_product_kernel! {
            /// `c[b, i, j] = Σ_k a[b, i, k] · b[b, k, j]` with one block per output (blocks
            /// grid-stride over the outputs in row-major order): thread `t` adds the products for
            /// `k = t, t + blockDim.x, …` in order with FMAs in f32 (four loads in flight), then
            /// the block adds its threads' sums ([`BlockReduce`](crate::device::block::BlockReduce))
            /// and thread 0 writes the output.
            ///
            /// # Safety
            /// As for the thread kernel of this family; besides, `blockDim.x` is a
            /// multiple of 32, at most 1024, and `blockDim.y = blockDim.z = 1`.
            $block, $elem, block_per_output
        }

        small_product_kernel! {
            /// `c[b, i, j] = Σ_k a[b, i, k] · b[b, k, j]` with one block per tile of four
            /// neighbouring outputs of a row (blocks grid-stride over the tiles, row-major): thread
            /// `t` takes column `t % 4` of the tile and slice `t / 4` of the inner dimension,
            /// adding the products for `k = s, s + S, …` (`S = blockDim.x / 4` slices) in order
            /// with FMAs in f32 (eight loads in flight); each warp adds its eight slices of a column
            /// by shuffles, and the warps' sums are added in warp order
            /// ([`LaneSums`](crate::device::block::LaneSums)). For a long inner dimension with
            /// `b`'s rows contiguous (`b_col_stride` 1): the four threads of a slice read 16
            /// neighbouring bytes of a row of `b`, where a block per output would read a column.
            /// The order of the additions depends only on the block size, so every run with it
            /// gives the same bits.
            ///
            /// # Safety
            /// As for the thread kernel of this family; besides, `blockDim.x` is a
            /// multiple of 32, at most 1024, and `blockDim.y = blockDim.z = 1`.
            $columns, $elem, columns_only
        }

        small_linear_kernel! {
            /// A linear layer, `c[b, i, j] = act(Σ_k a[b, i, k] · b[b, k, j] + bias[j])`, with
            /// `act` the identity, or ReLU when `relu` is non-zero: the thread product
            /// of this family, the bias added to the f32 sum and the ReLU applied before the one
            /// rounding to the element type.
            ///
            /// # Safety
            /// As for the thread product of this family; besides, `bias` is valid for
            /// `n` elements and `c` does not overlap it.
            $lthread, $elem, thread_per_run
        }

        small_linear_kernel! {
            /// A linear layer, `c[b, i, j] = act(Σ_k a[b, i, k] · b[b, k, j] + bias[j])` (`act` as
            /// for the thread linear kernel of this family), with one warp per run of outputs as
            /// the warp product of this family.
            ///
            /// # Safety
            /// As for the warp product of this family; besides, `bias` is valid for
            /// `n` elements and `c` does not overlap it.
            $lwarp, $elem, warp_per_run
        }

        small_linear_kernel! {
            /// A linear layer, `c[b, i, j] = act(Σ_k a[b, i, k] · b[b, k, j] + bias[j])` (`act` as
            /// for the thread linear kernel of this family), with a block per tile of
            /// four outputs as the column-split product of this family.
            ///
            /// # Safety
            /// As for the column-split product of this family; besides, `bias` is valid for `n`
            /// elements and `c` does not overlap it.
            $lcolumns, $elem, columns_only
        }

        crate::kernel! {
            /// A linear layer's weight and bias gradients from its input `x` (`[k, m]`: k rows of
            /// m features) and the gradient `g` of its output (`[k, n]`), in one launch:
            /// `dw[i, j] = Σ_r x[r, i] · g'[r, j]` and `db[j] = Σ_r g'[r, j]`, where `g' = g`, or
            /// with `relu` non-zero `g'[r, j] = g[r, j]` where `mask[r, j] > 0` and 0 elsewhere
            /// (NaN included): the backward of a ReLU layer whose output is `mask`, without
            /// `g'` as a tensor of its own. Sums in f32, rounded once.
            ///
            /// Thread mapping: the column-split product of this family over `xᵀ · g'` with one
            /// more row of `xᵀ`, all ones, whose outputs are `db`; each `dw` output gets the same
            /// bits as that product would give it.
            ///
            /// # Safety
            /// `x` is valid for `k·m` elements, `g` and `mask` for `k·n` (`mask` is only read
            /// when `relu` is non-zero), `dw` for `m·n` and `db` for `n`; `dw` and `db` overlap
            /// no input nor each other. `blockDim.x` is a multiple of 32, at most 1024, and
            /// `blockDim.y = blockDim.z = 1`.
            pub unsafe fn $grads(
                x: *const [$elem; k * m],
                g: *const [$elem; k * n],
                mask: *const [$elem; k * n],
                dw: *mut [$elem; m * n],
                db: *mut [$elem; n],
                m: u64,
                k: u64,
                n: u64,
                relu: u32,
            ) {
                // `x` read transposed: element (i, r) of xᵀ is x[r·m + i].
                let p = Product { a: x, b: g, c: dw, batch: 1, m, k, n, a_strides: (1, m), b_strides: (n, 1) };
                let extras = Extras { mask, column_sums: db };
                // SAFETY: forwarded from this kernel's contract: x holds k·m values read as
                // (i, r) at r·m + i < k·m, g and mask k·n as (r, j) at r·n + j.
                unsafe {
                    if relu != 0 {
                        columns_per_block::<$elem, true>(p, Epilogue::NONE, extras)
                    } else {
                        columns_per_block::<$elem, false>(p, Epilogue::NONE, extras)
                    }
                }
            }
        }

        crate::kernel! {
            /// A two-layer block, `y = relu(x · w1 + b1) · w2 + b2`, in one launch, for narrow
            /// inputs and outputs: `x [m, d_in]`, `w1 [d_in, hidden]`, `w2 [hidden, d_out]`; the
            /// hidden layer `h = relu(x · w1 + b1)` is written too (its backward needs it). One
            /// warp per row of `x` (warps grid-stride over the rows): lane `l` computes hidden
            /// units `l, l + 32, …`, each as the thread linear kernel of this family would (its
            /// products added in order of the input, then the bias, then the ReLU, rounded once),
            /// and adds its units' products with `w2` in order, as the warp linear kernel would;
            /// the warp adds its lanes' sums as a tree and lane 0 writes the row of `y`, its
            /// bias added. So `h` has the bits of the thread linear kernel, and `y` those of the
            /// warp linear kernel (which the host takes for 33 to 256 hidden units).
            ///
            /// With `d_in` above [`TWO_LAYER_MAX_IN`] or `d_out` above [`TWO_LAYER_MAX_OUT`]
            /// nothing is written (the host sends such layers to the composed kernels).
            ///
            /// # Safety
            /// Every pointer is valid for its stated length; `h` and `y` overlap no input nor each
            /// other; `blockDim.x` is a multiple of 32 (every warp whole).
            pub unsafe fn $tlf(
                x: *const [$elem; m * d_in],
                w1: *const [$elem; d_in * hidden],
                b1: *const [$elem; hidden],
                w2: *const [$elem; hidden * d_out],
                b2: *const [$elem; d_out],
                h: *mut [$elem; m * hidden],
                y: *mut [$elem; m * d_out],
                m: u64,
                d_in: u64,
                hidden: u64,
                d_out: u64,
            ) {
                let block = TwoLayers { x, w1, b1, w2, b2, m, d_in, hidden, d_out };
                // SAFETY: forwarded from this kernel's contract.
                unsafe { two_layer_forward(block, h, y) }
            }
        }

        crate::kernel! {
            /// The first layer's weight and bias gradients of a two-layer block (the forward
            /// kernel of this family), from its input `x [m, d_in]`, its hidden layer
            /// `h [m, hidden]`, the gradient `g [m, d_out]` of its output and its second weight
            /// `w2 [hidden, d_out]`: `dw1 = xᵀ · d` and `db1 = Σ_rows d`, where
            /// `d = (g · w2ᵀ) · [h > 0]` is computed as it is read and never stored. Each
            /// value of `g · w2ᵀ` is added in order of the output and rounded to the element type,
            /// as the thread product of this family computes it, and the sums over rows are the
            /// `linear_grads` kernel's (slices of rows, a butterfly, the warps in order), so with
            /// the same block size the results have the bits of those two launches. One block per
            /// four neighbouring hidden units of a row of `dw1` (or of `db1`), as in
            /// `linear_grads`.
            ///
            /// With `d_in` above [`TWO_LAYER_MAX_IN`] or `d_out` above [`TWO_LAYER_MAX_OUT`]
            /// nothing is written.
            ///
            /// # Safety
            /// Every pointer is valid for its stated length; `dw1` and `db1` overlap no input nor
            /// each other. `blockDim.x` is a multiple of 32, at most 1024, and
            /// `blockDim.y = blockDim.z = 1`.
            pub unsafe fn $tlg(
                x: *const [$elem; m * d_in],
                h: *const [$elem; m * hidden],
                g: *const [$elem; m * d_out],
                w2: *const [$elem; hidden * d_out],
                dw1: *mut [$elem; d_in * hidden],
                db1: *mut [$elem; hidden],
                m: u64,
                d_in: u64,
                hidden: u64,
                d_out: u64,
            ) {
                // SAFETY: forwarded from this kernel's contract.
                unsafe { two_layer_first_grads(x, h, g, w2, (dw1, db1), (m, d_in, hidden, d_out)) }
            }
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

    /// The bias of column `j` (unused without a bias), read before the sum so that its load is
    /// in flight with the operands'.
    ///
    /// # Safety
    /// `bias` is null or valid for more than `j` elements.
    #[inline(always)]
    unsafe fn bias_at(self, j: u64) -> f32 {
        // SAFETY: forwarded from this function's contract.
        if self.bias.is_null() { 0.0 } else { unsafe { self.bias.add(j as usize).read() }.to_f32() }
    }

    /// The output from its sum `acc` and its column's [`bias_at`](Self::bias_at).
    #[inline(always)]
    fn apply(self, acc: f32, bias: f32) -> f32 {
        // Without a bias the sum stays as it is (adding 0 would turn −0 into +0).
        let biased = if self.bias.is_null() { acc } else { acc + bias };
        // The relu kernels' ReLU: NaN stays NaN, −0 becomes +0.
        if self.relu { crate::activation::relu(biased) } else { biased }
    }
}

/// Neighbouring outputs of a row that each thread of the thread mapping, and each warp of the
/// warp mapping, computes: it reads its row's values of `a` once for all of them and does its
/// index arithmetic once. A small product's time is mostly instructions issued per output, not
/// memory.
#[cfg(target_arch = "nvptx64")]
const RUN: usize = 4;

/// One run of up to [`RUN`] neighbouring outputs of a row: outputs `(matrix, i, j0 + jj)` for
/// `jj < width`.
#[cfg(target_arch = "nvptx64")]
#[derive(Clone, Copy)]
struct Run {
    /// The offset of `a`'s row `i` in its matrix, and of `b`'s column `j0`.
    a_row: u64,
    b_col: u64,
    /// The offset of the run's first output in `c`.
    out: u64,
    j0: u64,
    /// At least 1: `j0 < n`.
    width: u64,
}

#[cfg(target_arch = "nvptx64")]
impl Run {
    /// The runs of a product: `batch · m · ⌈n / RUN⌉` of them, row-major; `None` when there
    /// are none.
    #[inline(always)]
    fn count<T>(p: &Product<T>) -> Option<(NonZeroU64, NonZeroU64)> {
        let per_row = NonZeroU64::new(p.n.div_ceil(RUN as u64))?;
        let per_matrix = NonZeroU64::new(p.m * per_row.get())?;
        Some((per_row, per_matrix))
    }

    /// Run `run` (row-major) of `p`, given [`count`](Self::count)'s divisors. The divisors are
    /// non-zero by type, so the divisions have no panic path.
    #[inline(always)]
    fn at<T>(p: &Product<T>, run: u64, (per_row, per_matrix): (NonZeroU64, NonZeroU64)) -> Self {
        let (matrix, within) = (run / per_matrix, run % per_matrix);
        let (i, j0) = (within / per_row, within % per_row * RUN as u64);
        Run {
            a_row: matrix * p.m * p.k + i * p.a_strides.0,
            b_col: matrix * p.k * p.n + j0 * p.b_strides.1,
            out: matrix * p.m * p.n + i * p.n + j0,
            j0,
            width: (p.n - j0).min(RUN as u64),
        }
    }

    /// Whether output `jj` of the run lies inside the row.
    #[inline(always)]
    fn inside(self, jj: usize) -> bool {
        (jj as u64) < self.width
    }

    /// The biases of the run's columns (unused ones 0).
    ///
    /// # Safety
    /// `epilogue`'s bias is null or valid for `n` elements, and the run is one of `p`'s.
    #[inline(always)]
    unsafe fn biases<T: crate::device::element::Element>(self, epilogue: Epilogue<T>) -> [f32; RUN] {
        let mut bias = [0.0f32; RUN];
        // SAFETY: j0 + jj < n.
        crate::device::unroll::unroll::<RUN>(|jj| {
            if self.inside(jj) {
                bias[jj] = unsafe { epilogue.bias_at(self.j0 + jj as u64) };
            }
        });
        bias
    }

    /// Row `i`'s value of `a` at `kk` and the run's values of `b`'s row `kk` (unused ones 0).
    ///
    /// # Safety
    /// `kk < k`, the run is one of `p`'s, and `p` satisfies its kernel's contract (the offsets
    /// are then inside matrix `matrix` of each operand).
    #[inline(always)]
    unsafe fn load<T: crate::device::element::Element>(self, p: &Product<T>, kk: u64) -> (f32, [f32; RUN]) {
        let mut b = [0.0f32; RUN];
        let b_at = self.b_col + kk * p.b_strides.0;
        // SAFETY: forwarded from this function's contract; j0 + jj < n.
        crate::device::unroll::unroll::<RUN>(|jj| {
            if self.inside(jj) {
                b[jj] = unsafe { p.b.add((b_at + jj as u64 * p.b_strides.1) as usize).read() }.to_f32();
            }
        });
        // SAFETY: as above.
        (unsafe { p.a.add((self.a_row + kk * p.a_strides.1) as usize).read() }.to_f32(), b)
    }

    /// Writes the run's outputs from their sums and biases.
    ///
    /// # Safety
    /// The run is one of `p`'s, which satisfies its kernel's contract.
    #[inline(always)]
    unsafe fn store<T: crate::device::element::Element>(
        self,
        p: &Product<T>,
        epilogue: Epilogue<T>,
        sums: [f32; RUN],
        bias: [f32; RUN],
    ) {
        crate::device::unroll::unroll::<RUN>(|jj| {
            if self.inside(jj) {
                // SAFETY: out + jj < batch·m·n, the output (matrix, i, j0 + jj).
                unsafe {
                    p.c.add((self.out + jj as u64) as usize).write(T::from_f32(epilogue.apply(sums[jj], bias[jj])))
                };
            }
        });
    }
}

/// Each of a run's sums advanced by one step of `k`: `acc[jj] += x · y[jj]`, an FMA.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn fma_run(mut acc: [f32; RUN], (x, y): (f32, [f32; RUN])) -> [f32; RUN] {
    crate::device::unroll::unroll::<RUN>(|jj| acc[jj] = crate::device::math::fma(x, y[jj], acc[jj]));
    acc
}

/// The body of the thread kernels: grid-stride over the runs, one each, adding each output's
/// products in order of `k`.
///
/// # Safety
/// The contract of `matmul_small_thread_*`, and `epilogue`'s bias null or valid for `n` elements.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn thread_per_run<T: crate::device::element::Element>(p: Product<T>, epilogue: Epilogue<T>) {
    use crate::device::{index, unroll::strided_fold};
    let Some(divisors) = Run::count(&p) else {
        return;
    };
    for index in index::GridStride::over(0, p.batch * divisors.1.get()) {
        let run = Run::at(&p, index, divisors);
        // SAFETY (all three): the run is one of p's; kk < k.
        let bias = unsafe { run.biases(epilogue) };
        let sums = strided_fold::<2, _, _>(0, p.k, 1, [0.0; RUN], |kk| unsafe { run.load(&p, kk) }, fma_run);
        unsafe { run.store(&p, epilogue, sums, bias) };
    }
}

/// The body of the warp kernels: warps grid-stride over the runs, lane `l` adding each output's
/// products for `k = l, l + 32, …` in order, then the warp adding its lanes' sums as a tree.
///
/// # Safety
/// The contract of `matmul_small_warp_*`, and `epilogue`'s bias null or valid for `n` elements.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn warp_per_run<T: crate::device::element::Element>(p: Product<T>, epilogue: Epilogue<T>) {
    use crate::device::{
        index,
        unroll::{strided_fold, unroll},
        warp,
    };
    let Some(divisors) = Run::count(&p) else {
        return;
    };
    let lane = warp::lane_id() as u64;
    // Every lane of a warp takes the same runs, so the warp stays converged.
    for index in index::GridStride::over_warps(p.batch * divisors.1.get()) {
        let run = Run::at(&p, index, divisors);
        // Every lane reads the biases (one address each, one transaction), with its operands.
        // SAFETY (both): the run is one of p's; kk < k.
        let bias = unsafe { run.biases(epilogue) };
        let sums = strided_fold::<4, _, _>(lane, p.k, 32, [0.0; RUN], |kk| unsafe { run.load(&p, kk) }, fma_run);
        let mut totals = [0.0f32; RUN];
        unroll::<RUN>(|jj| {
            if run.inside(jj) {
                // SAFETY: the whole warp is here: `width` is the same for every lane.
                totals[jj] = unsafe { warp::warp_sum(sums[jj]) };
            }
        });
        if lane == 0 {
            // SAFETY: the run is one of p's.
            unsafe { run.store(&p, epilogue, totals, bias) };
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
        // SAFETY: j < n.
        let bias = unsafe { epilogue.bias_at(j) };
        // SAFETY: as in the thread body: kk < k.
        let load = |kk: u64| unsafe { load_pair(p.a, p.b, a_row + kk * p.a_strides.1, b_col + kk * p.b_strides.0) };
        let acc = strided_fold::<4, (f32, f32), f32>(thread, p.k, threads, 0.0, load, |acc, (x, y)| fma(x, y, acc));
        // SAFETY: every thread of the block calls it, once per output (see above).
        let total = unsafe { reduce.sum(acc) };
        if thread == 0 {
            // SAFETY: out < batch·m·n.
            unsafe { p.c.add(out as usize).write(T::from_f32(epilogue.apply(total, bias))) };
        }
    }
}

/// Outputs per tile of the column-split kernels: four neighbouring columns of a row, 16 bytes
/// of a row of `b` in f32 that the four threads of a slice read at once. Four rather than eight
/// (a whole sector) gives a weight gradient twice the blocks, each half as long: its time is
/// the instructions each SM issues, not the sectors it reads.
#[cfg(target_arch = "nvptx64")]
const TILE_COLUMNS: u64 = 4;

/// What the column-split body computes besides the product: `b` read through a ReLU's mask, and
/// the column sums of (the masked) `b`, as the products with one more row of `a`, all ones. With
/// both, the body is a linear layer's weight and bias gradients in one launch.
#[cfg(target_arch = "nvptx64")]
#[derive(Clone, Copy)]
struct Extras<T> {
    /// Laid out as `b`, read only by the `MASKED` body: `b(kk, j)` counts where
    /// `mask(kk, j) > 0` and is 0 elsewhere (NaN included), as `relu_backward` of `b` with
    /// `mask` the ReLU's output.
    mask: *const T,
    /// Null, or `[batch, n]`: the column sums of (the masked) `b`.
    column_sums: *mut T,
}

#[cfg(target_arch = "nvptx64")]
impl<T> Extras<T> {
    /// A plain product.
    const NONE: Self = Extras { mask: core::ptr::null(), column_sums: core::ptr::null_mut() };
}

/// The column-split body of a plain product or linear layer.
///
/// # Safety
/// As for [`columns_per_block`] with no extras.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn columns_only<T: crate::device::element::Element>(p: Product<T>, epilogue: Epilogue<T>) {
    // SAFETY: forwarded from this function's contract.
    unsafe { columns_per_block::<T, false>(p, epilogue, Extras::NONE) }
}

/// The body of the column-split kernels; with `MASKED` it reads `b` through `extras.mask`.
///
/// # Safety
/// The contract of `matmul_small_columns_*`; `epilogue`'s bias null or valid for `n` elements;
/// with `MASKED`, `extras.mask` valid as `b` is; `extras.column_sums` null or valid for `batch·n`
/// elements, overlapping no input and not `c`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn columns_per_block<T: crate::device::element::Element, const MASKED: bool>(
    p: Product<T>,
    epilogue: Epilogue<T>,
    extras: Extras<T>,
) {
    use crate::device::{block::LaneSums, index, math::fma, unroll::strided_fold, warp};
    use core::arch::nvptx;
    let mut sums = LaneSums::new();
    // Row m, when the column sums are asked for, is the row of ones.
    let rows = p.m + u64::from(!extras.column_sums.is_null());
    let groups = p.n.div_ceil(TILE_COLUMNS);
    let (Some(groups_nz), Some(per_matrix)) = (NonZeroU64::new(groups), NonZeroU64::new(rows * groups)) else {
        return;
    };
    // SAFETY: reading the special registers has no preconditions.
    let (thread, threads) = unsafe { (nvptx::_thread_idx_x() as u64, nvptx::_block_dim_x() as u64) };
    let (column, slice, slices) = (thread % TILE_COLUMNS, thread / TILE_COLUMNS, (threads / TILE_COLUMNS).max(1));
    // Every thread of a block takes the same tiles, so all reach each barrier together.
    for tile in index::GridStride::over_blocks(p.batch * per_matrix.get()) {
        let (matrix, within) = (tile / per_matrix, tile % per_matrix);
        let (i, j) = (within / groups_nz, within % groups_nz * TILE_COLUMNS + column);
        let (inside, ones) = (j < p.n, i == p.m);
        let (a_row, b_col) = (matrix * p.m * p.k + i * p.a_strides.0, matrix * p.k * p.n + j * p.b_strides.1);
        // SAFETY: j < n.
        let bias = if inside { unsafe { epilogue.bias_at(j) } } else { 0.0 };
        // SAFETY: as in the thread body: kk < k and j < n, and i < m where `a` is read; the mask
        // is laid out as `b`.
        // The loads return the mask's value as it is and the combining tests it, so that every
        // load of a batch is in flight before any value is used (a test in the load would wait
        // for each mask value in turn).
        let load = |kk: u64| unsafe {
            let x = if ones { 1.0 } else { p.a.add((a_row + kk * p.a_strides.1) as usize).read().to_f32() };
            let at = (b_col + kk * p.b_strides.0) as usize;
            let mask = if MASKED { extras.mask.add(at).read().to_f32() } else { 1.0 };
            (x, p.b.add(at).read().to_f32(), mask)
        };
        // Widening is exact, so the test is the element type's own; NaN fails it.
        let combine = |acc, (x, y, mask): (f32, f32, f32)| fma(x, if mask > 0.0 { y } else { 0.0 }, acc);
        let acc = if inside { strided_fold::<8, _, f32>(slice, p.k, slices, 0.0, load, combine) } else { 0.0 };
        // Lanes c, c + 4, …, c + 28 of a warp hold eight slices of column c: the butterfly leaves
        // their sum, the same bits, in each of them.
        // SAFETY: the whole warp is here (the branches above have rejoined).
        let acc = unsafe {
            let pairs = acc + warp::xor_shuffle(acc, 4);
            let quads = pairs + warp::xor_shuffle(pairs, 8);
            quads + warp::xor_shuffle(quads, 16)
        };
        // SAFETY: every thread of the block calls it, once per tile (see above).
        let total = unsafe { sums.sum_to_first_warp(acc) };
        if thread < TILE_COLUMNS && inside {
            let value = T::from_f32(epilogue.apply(total, bias));
            // SAFETY: matrix < batch, j < n, and i < m for `c`; the column sums hold batch·n.
            unsafe {
                if ones {
                    extras.column_sums.add((matrix * p.n + j) as usize).write(value)
                } else {
                    p.c.add((matrix * p.m * p.n + i * p.n + j) as usize).write(value)
                }
            };
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

/// The widest input of a fused two-layer block (`two_layer_*` kernels): a row of `x` is held in
/// registers, as are, in the gradient kernel, the rows of several steps of its sum.
pub const TWO_LAYER_MAX_IN: u64 = 4;

/// The widest output of a fused two-layer block: a lane's sums for each output, and a hidden
/// unit's row of `w2`, are held in registers.
pub const TWO_LAYER_MAX_OUT: u64 = 8;

#[cfg(target_arch = "nvptx64")]
const MAX_IN: usize = TWO_LAYER_MAX_IN as usize;
#[cfg(target_arch = "nvptx64")]
const MAX_OUT: usize = TWO_LAYER_MAX_OUT as usize;

/// A two-layer block's inputs and sizes, as its forward kernel takes them.
#[cfg(target_arch = "nvptx64")]
#[derive(Clone, Copy)]
struct TwoLayers<T> {
    x: *const T,
    w1: *const T,
    b1: *const T,
    w2: *const T,
    b2: *const T,
    m: u64,
    d_in: u64,
    hidden: u64,
    d_out: u64,
}

/// `values[i] = at(i)` for `i < len` (the rest 0), the loads in flight together.
///
/// # Safety
/// `at(i)` is safe to call for every `i < len`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn load_first<const N: usize>(len: u64, mut at: impl FnMut(u64) -> f32) -> [f32; N]
where
    crate::device::unroll::Count<N>: crate::device::unroll::Unrolled,
{
    let mut values = [0.0f32; N];
    crate::device::unroll::unroll::<N>(|i| {
        if (i as u64) < len {
            values[i] = at(i as u64);
        }
    });
    values
}

/// The body of the two-layer forward kernels.
///
/// # Safety
/// The contract of `two_layer_forward_*`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn two_layer_forward<T: crate::device::element::Element>(p: TwoLayers<T>, h: *mut T, y: *mut T) {
    use crate::device::{index, math::fma, unroll::strided_fold, warp};
    if p.d_in > TWO_LAYER_MAX_IN || p.d_out > TWO_LAYER_MAX_OUT {
        return;
    }
    let lane = warp::lane_id() as u64;
    // SAFETY (the loads): c < d_out.
    let b2: [f32; MAX_OUT] = unsafe { load_first(p.d_out, |c| p.b2.add(c as usize).read().to_f32()) };
    // Every lane of a warp takes the same rows, so the warp stays converged.
    for row in index::GridStride::over_warps(p.m) {
        // The row of `x`, in every lane (one address, one transaction).
        // SAFETY: row < m, i < d_in.
        let xs: [f32; MAX_IN] = unsafe { load_first(p.d_in, |i| p.x.add((row * p.d_in + i) as usize).read().to_f32()) };
        // Hidden unit `j`'s column of `w1`, its bias and its row of `w2`.
        // SAFETY: j < hidden, i < d_in, c < d_out.
        let load = |j: u64| unsafe {
            let w1: [f32; MAX_IN] = load_first(p.d_in, |i| p.w1.add((i * p.hidden + j) as usize).read().to_f32());
            let w2: [f32; MAX_OUT] = load_first(p.d_out, |c| p.w2.add((j * p.d_out + c) as usize).read().to_f32());
            (j, w1, p.b1.add(j as usize).read().to_f32(), w2)
        };
        let unit = |mut sums: [f32; MAX_OUT], (j, w1, b1, w2): (u64, [f32; MAX_IN], f32, [f32; MAX_OUT])| {
            // As the thread linear kernel: the products in order from 0, then the bias and ReLU.
            let mut acc = 0.0f32;
            crate::device::unroll::unroll::<MAX_IN>(|i| {
                if (i as u64) < p.d_in {
                    acc = fma(xs[i], w1[i], acc);
                }
            });
            let value = T::from_f32(crate::activation::relu(acc + b1));
            // SAFETY: row < m, j < hidden.
            unsafe { h.add((row * p.hidden + j) as usize).write(value) };
            let value = value.to_f32();
            crate::device::unroll::unroll::<MAX_OUT>(|c| {
                if (c as u64) < p.d_out {
                    sums[c] = fma(value, w2[c], sums[c]);
                }
            });
            sums
        };
        let sums = strided_fold::<4, _, _>(lane, p.hidden, 32, [0.0f32; MAX_OUT], load, unit);
        crate::device::unroll::unroll::<MAX_OUT>(|c| {
            if (c as u64) < p.d_out {
                // SAFETY: the whole warp is here (d_out is the same for every lane).
                let total = unsafe { warp::warp_sum(sums[c]) };
                if lane == 0 {
                    // SAFETY: row < m, c < d_out.
                    unsafe { y.add((row * p.d_out + c as u64) as usize).write(T::from_f32(total + b2[c])) };
                }
            }
        });
    }
}

/// The body of the two-layer gradient kernels: outputs `(dw1, db1)`, sizes
/// `(m, d_in, hidden, d_out)`. The tiles are `linear_grads`' over `xᵀ · d` with its row of ones
/// (row `d_in`, whose outputs are `db1`): a block per four neighbouring hidden units of one row
/// of `dw1`, so a layer of 128 units and 2 inputs has 96 blocks. Each block computes `d` for its
/// columns as it reads them.
///
/// # Safety
/// The contract of `two_layer_first_grads_*`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn two_layer_first_grads<T: crate::device::element::Element>(
    x: *const T,
    h: *const T,
    g: *const T,
    w2: *const T,
    outs: (*mut T, *mut T),
    sizes: (u64, u64, u64, u64),
) {
    let (d_in, d_out) = (sizes.1, sizes.3);
    if d_in > TWO_LAYER_MAX_IN || d_out > TWO_LAYER_MAX_OUT {
        return;
    }
    // The output width as a constant: a row of `g` and a row of `w2` take that many registers
    // each, so within 64 registers a narrow output (a binary classifier's 2) keeps 4 rows of
    // loads in flight, 4 outputs 2 rows, the widest 1.
    // SAFETY: forwarded from this function's contract.
    unsafe {
        if d_out <= 2 {
            two_layer_first_grads_out::<T, 2, 4>(x, h, g, w2, outs, sizes)
        } else if d_out <= 4 {
            two_layer_first_grads_out::<T, 4, 2>(x, h, g, w2, outs, sizes)
        } else {
            two_layer_first_grads_out::<T, MAX_OUT, 1>(x, h, g, w2, outs, sizes)
        }
    }
}

/// [`two_layer_first_grads`] for `d_out <= OUT`, with the loads of `ROWS` rows in flight.
///
/// # Safety
/// The contract of `two_layer_first_grads_*`, and `d_in <= TWO_LAYER_MAX_IN`, `d_out <= OUT`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn two_layer_first_grads_out<T: crate::device::element::Element, const OUT: usize, const ROWS: usize>(
    x: *const T,
    h: *const T,
    g: *const T,
    w2: *const T,
    (dw1, db1): (*mut T, *mut T),
    (m, d_in, hidden, d_out): (u64, u64, u64, u64),
) where
    crate::device::unroll::Count<OUT>: crate::device::unroll::Unrolled,
    crate::device::unroll::Count<ROWS>: crate::device::unroll::Unrolled,
    [f32; OUT]: Default,
{
    use crate::device::{block::LaneSums, index, math::fma, unroll::strided_fold, unroll::unroll, warp};
    use core::arch::nvptx;
    let mut lane_sums = LaneSums::new();
    let groups = hidden.div_ceil(TILE_COLUMNS);
    let Some(groups_nz) = NonZeroU64::new(groups) else {
        return;
    };
    // SAFETY: reading the special registers has no preconditions.
    let (thread, threads) = unsafe { (nvptx::_thread_idx_x() as u64, nvptx::_block_dim_x() as u64) };
    let (column, slice, slices) = (thread % TILE_COLUMNS, thread / TILE_COLUMNS, (threads / TILE_COLUMNS).max(1));
    // Every thread of a block takes the same tiles, so all reach each barrier together.
    for tile in index::GridStride::over_blocks((d_in + 1) * groups) {
        let (i, j) = (tile / groups_nz, tile % groups_nz * TILE_COLUMNS + column);
        let (inside, ones) = (j < hidden, i == d_in);
        // This thread's hidden unit's row of `w2`.
        // SAFETY: j < hidden, c < d_out.
        let w2_row: [f32; OUT] = if inside {
            unsafe { load_first(d_out, |c| w2.add((j * d_out + c) as usize).read().to_f32()) }
        } else {
            [0.0; OUT]
        };
        // Row r's input `i` (1 in the row of ones), output gradient and hidden value (the
        // ReLU's mask), every load of a batch in flight before any is used.
        // SAFETY: r < m, i < d_in where `x` is read, c < d_out, j < hidden.
        let load = |r: u64| unsafe {
            let x_value = if ones { 1.0 } else { x.add((r * d_in + i) as usize).read().to_f32() };
            let g_row = g.add((r * d_out) as usize);
            let gs: [f32; OUT] = load_first(d_out, |c| g_row.add(c as usize).read().to_f32());
            (x_value, gs, h.add((r * hidden + j) as usize).read().to_f32())
        };
        let combine = |acc: f32, (x_value, gs, mask): (f32, [f32; OUT], f32)| {
            // g · w2ᵀ at (r, j) as the thread product computes it, rounded to the element type.
            let mut d = 0.0f32;
            unroll::<OUT>(|c| {
                if (c as u64) < d_out {
                    d = fma(gs[c], w2_row[c], d);
                }
            });
            // Widening is exact, so the test is the element type's own; NaN fails it.
            fma(x_value, if mask > 0.0 { T::from_f32(d).to_f32() } else { 0.0 }, acc)
        };
        let acc = if inside { strided_fold::<ROWS, _, f32>(slice, m, slices, 0.0, load, combine) } else { 0.0 };
        // As `linear_grads` adds a column: lanes c, c + 4, …, c + 28 of a warp by a butterfly,
        // then the warps in order.
        // SAFETY: the whole warp is here (the branches above have rejoined); every thread of the
        // block calls it, once per tile.
        let total = unsafe {
            let pairs = acc + warp::xor_shuffle(acc, 4);
            let quads = pairs + warp::xor_shuffle(pairs, 8);
            lane_sums.sum_to_first_warp(quads + warp::xor_shuffle(quads, 16))
        };
        if thread < TILE_COLUMNS && inside {
            let value = T::from_f32(total);
            // SAFETY: j < hidden, and i < d_in for `dw1`.
            unsafe {
                if ones { db1.add(j as usize).write(value) } else { dw1.add((i * hidden + j) as usize).write(value) }
            };
        }
    }
}

matmul_family! {
    /// The small-product kernels for f32 matrices.
    F32, f32, {
        small_thread: matmul_small_thread_f32,
        small_warp: matmul_small_warp_f32,
        small_block: matmul_small_block_f32,
        small_columns: matmul_small_columns_f32,
        linear_thread: linear_small_thread_f32,
        linear_warp: linear_small_warp_f32,
        linear_columns: linear_small_columns_f32,
        linear_grads: linear_grads_columns_f32,
        two_layer_forward: two_layer_forward_f32,
        two_layer_first_grads: two_layer_first_grads_f32,
    }
}

matmul_family! {
    /// The small-product kernels for f16 matrices (products and sums in f32).
    F16, crate::dtype::F16, {
        small_thread: matmul_small_thread_f16,
        small_warp: matmul_small_warp_f16,
        small_block: matmul_small_block_f16,
        small_columns: matmul_small_columns_f16,
        linear_thread: linear_small_thread_f16,
        linear_warp: linear_small_warp_f16,
        linear_columns: linear_small_columns_f16,
        linear_grads: linear_grads_columns_f16,
        two_layer_forward: two_layer_forward_f16,
        two_layer_first_grads: two_layer_first_grads_f16,
    }
}

matmul_family! {
    /// The small-product kernels for bf16 matrices (products and sums in f32).
    BF16, crate::dtype::Bf16, {
        small_thread: matmul_small_thread_bf16,
        small_warp: matmul_small_warp_bf16,
        small_block: matmul_small_block_bf16,
        small_columns: matmul_small_columns_bf16,
        linear_thread: linear_small_thread_bf16,
        linear_warp: linear_small_warp_bf16,
        linear_columns: linear_small_columns_bf16,
        linear_grads: linear_grads_columns_bf16,
        two_layer_forward: two_layer_forward_bf16,
        two_layer_first_grads: two_layer_first_grads_bf16,
    }
}
