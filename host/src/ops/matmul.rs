//! Matrix products: `a [m, k] · b [k, n] → [m, n]`, or a batch of them,
//! `a [B, m, k] · b [B, k, n] → [B, m, n]`, with either operand read transposed (no copy).
//! The CPU half runs on `ndarray` (`general_mat_mul`), the CUDA half on cuBLAS
//! (`cublasGemmStridedBatchedEx`), except for small products: up to
//! [`SMALL_PRODUCT_MACS`] multiply-adds, one of opsmith's `matmul` kernels computes each output as
//! one dot product in a single launch. At that size a library GEMM is all launch latency, and
//! for a long inner dimension it adds a second launch (its split-K reduction), which inside a
//! CUDA graph is a node of its own.
//!
//! Arithmetic: f32, f16 and bf16 multiply and accumulate in f32 and round once to the output
//! dtype; f64 in f64 (CPU only, like every op: CUDA has no f64 kernels, so a CUDA f64 matmul is
//! [`Error::UnsupportedDType`] rather than the one f64 op on the GPU). On CUDA, f32 runs in full
//! f32 (`CUBLAS_COMPUTE_32F`, TF32 off), so CUDA and the CPU agree to within the f32 rounding of
//! the sums, but not bit for bit: the two libraries add the products in different orders.
//!
//! [`linear`] and [`linear_relu`] are a layer's `x · w + b` (and its ReLU) as one op: for a
//! small product one launch of a `linear` kernel, which adds the bias and applies the ReLU
//! before rounding.
//!
//! An empty inner dimension (`k = 0`) gives zeros, the value of an empty sum; an empty `m` or `n`
//! gives an empty result. Neither calls cuBLAS.
use super::check;
#[cfg(feature = "cublas")]
use crate::cuda::{CudaDevice, blas, launch_blocking};
use crate::dtype::{Accumulator, with_float_type};
#[cfg(feature = "cublas")]
use crate::tensor::storage::with_cuda_ptrs;
use crate::{DType, Device, Element, Error, Result, Shape, Tensor};
#[cfg(feature = "cublas")]
use cudarc::cublas::result::{self as cublas, CublasError};
#[cfg(feature = "cublas")]
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use ndarray::{ArrayView2, ArrayViewMut2, linalg::general_mat_mul};
#[cfg(feature = "cublas")]
use std::ffi::c_void;

/// `a [m, k] · b [k, n] → [m, n]`; batched, `a [B, m, k] · b [B, k, n] → [B, m, n]`.
///
/// Both operands have rank 2, or both rank 3 with the same batch size `B`; the inner dimensions
/// must agree ([`Error::ShapeMismatch`] otherwise).
///
/// f32, f16 and bf16 multiply and accumulate in f32 and round once to the dtype; f64 runs in f64
/// on the CPU and is [`Error::UnsupportedDType`] on CUDA, like every other op. On CUDA (cuBLAS,
/// or for a product of at most [`SMALL_PRODUCT_MACS`] multiply-adds opsmith's own kernel) f32
/// runs in full f32, without TF32, so CUDA and the CPU agree to within the f32 rounding of the
/// sums, though not bit for bit (they add the products in different orders). `k = 0` gives
/// zeros (an empty sum), and an empty `m`, `n` or batch an empty tensor.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3], Device::Cpu)?;
/// let b = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0], [3, 2], Device::Cpu)?;
/// let c = ops::matmul(&a, &b)?;
/// assert_eq!(c.dims(), [2, 2]);
/// assert_eq!(c.to_vec::<f32>()?, [4.0, 5.0, 10.0, 11.0]);
/// # Ok(()) }
/// ```
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    product_new("matmul", a, false, b, false)
}

/// `op(a) · op(b)`, where `op` transposes the last two dimensions of its operand when the flag
/// is set, without copying it (cuBLAS and `ndarray` read the operand transposed).
///
/// The gradients of `c = a · b` for the upstream gradient `g` are
/// `matmul_t(g, false, b, true)` for `a` and `matmul_t(a, true, g, false)` for `b`. Shapes,
/// precision and empty sizes as for [`matmul`].
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2], Device::Cpu)?;
/// // aᵀ · a
/// assert_eq!(ops::matmul_t(&a, true, &a, false)?.to_vec::<f32>()?, [10.0, 14.0, 14.0, 20.0]);
/// // a · aᵀ
/// assert_eq!(ops::matmul_t(&a, false, &a, true)?.to_vec::<f32>()?, [5.0, 11.0, 11.0, 25.0]);
/// # Ok(()) }
/// ```
pub fn matmul_t(a: &Tensor, transpose_a: bool, b: &Tensor, transpose_b: bool) -> Result<Tensor> {
    product_new("matmul_t", a, transpose_a, b, transpose_b)
}

/// `out = a · b`, into an existing tensor of the product's shape. `out` may not share memory
/// with `a` or `b` (a product cannot be computed in place).
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, DType, Device, Tensor};
/// let a = Tensor::from_vec(vec![1.0f32, 2.0], [1, 2], Device::Cpu)?;
/// let b = Tensor::from_vec(vec![3.0f32, 4.0], [2, 1], Device::Cpu)?;
/// let out = Tensor::zeros([1, 1], DType::F32, Device::Cpu)?;
/// ops::matmul_into(&a, &b, &out)?;
/// assert_eq!(out.to_vec::<f32>()?, [11.0]);
/// # Ok(()) }
/// ```
pub fn matmul_into(a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
    product_into("matmul_into", a, false, b, false, out)
}

/// `out = op(a) · op(b)` (see [`matmul_t`]), into an existing tensor of the product's shape.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, DType, Device, Tensor};
/// let a = Tensor::from_vec(vec![1.0f32, 2.0], [1, 2], Device::Cpu)?;
/// let out = Tensor::zeros([2, 2], DType::F32, Device::Cpu)?;
/// ops::matmul_t_into(&a, true, &a, false, &out)?; // aᵀ · a
/// assert_eq!(out.to_vec::<f32>()?, [1.0, 2.0, 2.0, 4.0]);
/// # Ok(()) }
/// ```
pub fn matmul_t_into(a: &Tensor, transpose_a: bool, b: &Tensor, transpose_b: bool, out: &Tensor) -> Result<()> {
    product_into("matmul_t_into", a, transpose_a, b, transpose_b, out)
}

/// A linear layer, `x [m, k] · w [k, n] + b [n] → [m, n]`: the product with the bias row added
/// to every row, as one op.
///
/// On CUDA a product of at most [`SMALL_PRODUCT_MACS`] multiply-adds is one launch of opsmith's
/// `linear` kernel, which adds the bias to each output's f32 sum before its one rounding; larger
/// ones are a cuBLAS product and [`add_row`](super::add_row), as is the CPU. In f32 both ways
/// give the same bits (the sum is an f32 either way); in f16 and bf16 the fused kernel rounds
/// once where the composed ops round twice. Shapes and errors as for [`matmul`], and the bias must
/// be `[n]` of the same dtype and device ([`Error::ShapeMismatch`] otherwise).
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, -3.0, 1.0], [2, 2], Device::Cpu)?;
/// let w = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], [2, 2], Device::Cpu)?;
/// let b = Tensor::from_vec(vec![0.5f32, -1.0], [2], Device::Cpu)?;
/// assert_eq!(ops::linear(&x, &w, &b)?.to_vec::<f32>()?, [1.5, 1.0, -2.5, 0.0]);
/// # Ok(()) }
/// ```
pub fn linear(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    linear_layer("linear", x, w, b, false)
}

/// A linear layer followed by a ReLU, `max(x · w + b, 0)`, as one op: on CUDA, for a small
/// product, one launch whose kernel applies the ReLU to each biased f32 sum before rounding it.
/// Otherwise as [`linear`] then [`relu`](super::relu). The ReLU is the [`relu`](super::relu) op's: NaN stays NaN.
///
/// Its gradient needs only the output: `g · [y > 0]` ([`relu_backward`](super::relu_backward)
/// of `y`, since `y > 0` exactly where `x · w + b > 0`).
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, -3.0, 1.0], [2, 2], Device::Cpu)?;
/// let w = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], [2, 2], Device::Cpu)?;
/// let b = Tensor::from_vec(vec![0.5f32, -1.0], [2], Device::Cpu)?;
/// assert_eq!(ops::linear_relu(&x, &w, &b)?.to_vec::<f32>()?, [1.5, 1.0, 0.0, 0.0]);
/// # Ok(()) }
/// ```
pub fn linear_relu(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    linear_layer("linear_relu", x, w, b, true)
}

/// The gradients of a linear layer's weight and bias, `(xᵀ · g', Σ_rows g')`, from its input
/// `x [rows, k]` and the gradient `g [rows, n]` of its output: `[k, n]` and `[n]`. With
/// `relu_output` (the output `y` of [`linear_relu`]), `g' = g · [y > 0]`, the gradient through
/// the ReLU ([`relu_backward`](super::relu_backward)); without it `g' = g`.
///
/// On CUDA, for a product of at most [`SMALL_PRODUCT_MACS`] multiply-adds, this is one launch:
/// the bias gradient is one more row of the weight gradient's product (a row of ones), and the
/// ReLU's mask is applied as `g` is read, so `g'` is never a tensor. Its sums are in another
/// order than [`matmul_t`]`(x, true, g', false)` takes for short sums or fewer than four columns,
/// so the bits may differ from those ops' (within f32 rounding; the same bits on every run).
/// Otherwise, and on the CPU, it is those ops:
/// [`relu_backward`](super::relu_backward), [`matmul_t`] and [`sum_rows`](super::sum_rows).
/// Errors as theirs: `x`, `g` and `y` on one device and of one dtype, `g` and `y` of one shape,
/// `x` and `g` of as many rows ([`Error::ShapeMismatch`]).
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2], Device::Cpu)?;
/// let g = Tensor::from_vec(vec![1.0f32, -1.0, 0.5, 2.0], [2, 2], Device::Cpu)?;
/// let (dw, db) = ops::linear_grads(&x, &g, None)?;
/// assert_eq!(dw.to_vec::<f32>()?, [2.5, 5.0, 4.0, 6.0]); // xᵀ · g
/// assert_eq!(db.to_vec::<f32>()?, [1.5, 1.0]);
/// // Through a ReLU whose output was positive only in the first column.
/// let y = Tensor::from_vec(vec![3.0f32, 0.0, 1.0, -0.0], [2, 2], Device::Cpu)?;
/// let (dw, db) = ops::linear_grads(&x, &g, Some(&y))?;
/// assert_eq!(dw.to_vec::<f32>()?, [2.5, 0.0, 4.0, 0.0]);
/// assert_eq!(db.to_vec::<f32>()?, [1.5, 0.0]);
/// # Ok(()) }
/// ```
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))] // the checked product is for the CUDA half
pub fn linear_grads(x: &Tensor, g: &Tensor, relu_output: Option<&Tensor>) -> Result<(Tensor, Tensor)> {
    let op = "linear_grads";
    if x.dims().len() != 2 || g.dims().len() != 2 {
        return Err(Error::InvalidArgument {
            op,
            reason: format!("expects x [rows, k] and g [rows, n], got shapes {:?} and {:?}", x.dims(), g.dims()),
        });
    }
    let p = Product::new(op, x, true, g, false)?;
    if let Some(y) = relu_output {
        check::same_device(op, &[g, y])?;
        check::same_dtype(op, &[g, y])?;
        if y.dims() != g.dims() {
            return Err(Error::ShapeMismatch { op, lhs: g.dims().to_vec(), rhs: y.dims().to_vec() });
        }
    }
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() && p.is_small() && !p.is_trivial() {
        return small_linear_grads(&p, x, g, relu_output);
    }
    let masked = relu_output.map(|y| super::relu_backward(g, y)).transpose()?;
    let g = masked.as_ref().unwrap_or(g);
    Ok((product_new(op, x, true, g, false)?, super::sum_rows(g)?))
}

/// [`linear`], or [`linear_relu`] when `relu`, under the name `op`.
fn linear_layer(op: &'static str, x: &Tensor, w: &Tensor, b: &Tensor, relu: bool) -> Result<Tensor> {
    if x.dims().len() != 2 || w.dims().len() != 2 {
        return Err(Error::InvalidArgument {
            op,
            reason: format!("expects x [m, k] and w [k, n], got shapes {:?} and {:?}", x.dims(), w.dims()),
        });
    }
    let p = Product::new(op, x, false, w, false)?;
    check::same_device(op, &[x, b])?;
    check::same_dtype(op, &[x, b])?;
    if b.dims() != [p.n] {
        return Err(Error::ShapeMismatch { op, lhs: vec![p.n], rhs: b.dims().to_vec() });
    }
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() && p.is_small() && !p.is_trivial() {
        let out = Tensor::empty(Shape::from(p.out_dims.clone()), x.dtype(), x.device())?;
        small_linear(&p, x, w, b, relu, &out)?;
        return Ok(out);
    }
    let biased = super::add_row(&product_new(op, x, false, w, false)?, b)?;
    if relu {
        // In place: the pre-activation is not kept, so it needs no allocation of its own.
        super::relu_into(&biased, &biased)?;
    }
    Ok(biased)
}

/// Whether small products run on opsmith's own kernels: not with `OPSMITH_SMALL_MATMUL=0` in
/// the environment (read once per process; for comparisons with cuBLAS).
#[cfg(feature = "cuda")]
pub(super) fn small_products_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("OPSMITH_SMALL_MATMUL").map_or(true, |v| v.trim() != "0"))
}

/// One checked product: the operands' layout and the sizes of `op(a) [m, k] · op(b) [k, n]`.
struct Product {
    op: &'static str,
    /// 1 for 2-D operands.
    batch: usize,
    m: usize,
    k: usize,
    n: usize,
    transpose_a: bool,
    transpose_b: bool,
    /// `[m, n]`, or `[batch, m, n]` for 3-D operands.
    out_dims: Vec<usize>,
}

impl Product {
    fn new(op: &'static str, a: &Tensor, transpose_a: bool, b: &Tensor, transpose_b: bool) -> Result<Self> {
        check::same_device(op, &[a, b])?;
        check::same_dtype(op, &[a, b])?;
        let (batch, rows_a, cols_a) = batch_and_matrix(op, a)?;
        let (batch_b, rows_b, cols_b) = batch_and_matrix(op, b)?;
        let (m, k) = if transpose_a { (cols_a, rows_a) } else { (rows_a, cols_a) };
        let (k_b, n) = if transpose_b { (cols_b, rows_b) } else { (rows_b, cols_b) };
        if a.dims().len() != b.dims().len() || batch != batch_b || k != k_b {
            return Err(Error::ShapeMismatch { op, lhs: a.dims().to_vec(), rhs: b.dims().to_vec() });
        }
        let out_dims = if a.dims().len() == 3 { vec![batch, m, n] } else { vec![m, n] };
        if a.dtype() == DType::F64 && a.device().is_cuda() {
            return Err(Error::UnsupportedDType { op, dtype: DType::F64, device: a.device() });
        }
        Ok(Self { op, batch, m, k, n, transpose_a, transpose_b, out_dims })
    }

    /// `a` as stored: `[m, k]`, or `[k, m]` when it is read transposed.
    fn a_stored(&self) -> (usize, usize) {
        if self.transpose_a { (self.k, self.m) } else { (self.m, self.k) }
    }

    /// `b` as stored: `[k, n]`, or `[n, k]` when it is read transposed.
    fn b_stored(&self) -> (usize, usize) {
        if self.transpose_b { (self.n, self.k) } else { (self.k, self.n) }
    }

    /// Whether it is small enough for opsmith's own kernels ([`SMALL_PRODUCT_MACS`]), and they
    /// are not turned off (`OPSMITH_SMALL_MATMUL=0`, read once per process: for comparisons
    /// with cuBLAS).
    #[cfg(feature = "cuda")]
    fn is_small(&self) -> bool {
        let macs = (self.batch as u128) * (self.m as u128) * (self.k as u128) * (self.n as u128);
        small_products_enabled() && macs <= SMALL_PRODUCT_MACS as u128
    }

    /// Whether the result has no elements or is all zeros (an empty sum): no library call.
    fn is_trivial(&self) -> bool {
        self.batch == 0 || self.m == 0 || self.n == 0 || self.k == 0
    }
}

/// (batch, rows, cols) of a 2-D matrix (batch 1) or a 3-D batch of matrices.
fn batch_and_matrix(op: &'static str, t: &Tensor) -> Result<(usize, usize, usize)> {
    match *t.dims() {
        [rows, cols] => Ok((1, rows, cols)),
        [batch, rows, cols] => Ok((batch, rows, cols)),
        _ => Err(Error::InvalidArgument {
            op,
            reason: format!("expects 2-D matrices or 3-D batches of matrices, got shape {:?}", t.dims()),
        }),
    }
}

fn product_new(op: &'static str, a: &Tensor, transpose_a: bool, b: &Tensor, transpose_b: bool) -> Result<Tensor> {
    let p = Product::new(op, a, transpose_a, b, transpose_b)?;
    let shape = Shape::from(p.out_dims.clone());
    if p.is_trivial() {
        return Tensor::zeros(shape, a.dtype(), a.device());
    }
    let out = Tensor::empty(shape, a.dtype(), a.device())?;
    compute(&p, a, b, &out)?;
    Ok(out)
}

fn product_into(
    op: &'static str,
    a: &Tensor,
    transpose_a: bool,
    b: &Tensor,
    transpose_b: bool,
    out: &Tensor,
) -> Result<()> {
    let p = Product::new(op, a, transpose_a, b, transpose_b)?;
    check::same_device(op, &[a, out])?;
    check::same_dtype(op, &[a, out])?;
    if out.dims() != p.out_dims.as_slice() {
        return Err(Error::ShapeMismatch { op, lhs: p.out_dims, rhs: out.dims().to_vec() });
    }
    if check::overlaps(out, a) || check::overlaps(out, b) {
        return Err(Error::InvalidArgument {
            op,
            reason: "the output shares memory with an input; a matrix product cannot be computed in place".into(),
        });
    }
    if p.is_trivial() {
        return if out.elem_count() == 0 { Ok(()) } else { out.fill_(0.0) };
    }
    compute(&p, a, b, out)
}

/// Runs a checked, non-trivial product on the operands' device.
fn compute(p: &Product, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
    match a.device() {
        Device::Cpu => {
            check::cpu_work("matmul")?;
            with_float_type!(a.dtype(), p.op, a.device(), T => cpu::<T>(p, a, b, out))
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) if p.is_small() => small(p, a, b, out),
        #[cfg(feature = "cublas")]
        Device::Cuda(ordinal) => cuda(p, ordinal, a, b, out),
        #[cfg(not(feature = "cublas"))]
        device @ Device::Cuda(_) => Err(Error::FeatureDisabled { op: p.op, feature: "cublas", device }),
    }
}

/// Products of up to this many multiply-adds (`batch·m·k·n`) run on opsmith's own kernels on
/// CUDA, larger ones on cuBLAS (all of them with `OPSMITH_SMALL_MATMUL=0` in the environment).
/// A product that small is all launch latency: one launch instead of cuBLAS's GEMM and, for a
/// long inner dimension, its split-K reduction. On the H200, train_mlp's replayed step took
/// 39.4 µs with them and 57.5 µs with cuBLAS for every product (BENCHMARKS.md).
pub const SMALL_PRODUCT_MACS: u64 = 1 << 20;

/// Up to this inner dimension a small product takes one thread per run of four neighbouring
/// outputs of a row.
#[cfg(feature = "cuda")]
const THREAD_MAPPING_MAX_K: usize = 32;

/// Up to this inner dimension (8 products a lane) a small product takes one warp per run of
/// four neighbouring outputs of a row.
/// Beyond it, a block per four outputs of a row when `b`'s rows are contiguous and hold four
/// columns or more (the threads splitting the inner dimension and reading `b` by rows), else a
/// block of [`DEFAULT_BLOCK`](crate::cuda::DEFAULT_BLOCK) threads per output.
#[cfg(feature = "cuda")]
const WARP_MAPPING_MAX_K: usize = 256;

/// The CUDA half of a small product: one launch of a `matmul` kernel, the operands read in place
/// through strides (a transposed operand's rows are its stored columns).
#[cfg(feature = "cuda")]
fn small(p: &Product, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
    use crate::cuda;
    use opsmith_kernels::names::matmul;
    let table = super::cuda::dtype_table(p.op, a, [matmul::F32, matmul::F16, matmul::BF16])?;
    let (shape, grid) = small_launch(p);
    let args = (a, b, out, shape[0], shape[1], shape[2], shape[3], shape[4], shape[5], shape[6], shape[7]);
    match grid.1 {
        Mapping::Thread => cuda::launch(table.small_thread, grid.0, args),
        Mapping::Warp => cuda::launch(table.small_warp, grid.0, args),
        Mapping::Block => cuda::launch(table.small_block, grid.0, args),
        Mapping::Columns => cuda::launch(table.small_columns, grid.0, args),
    }
}

/// The CUDA half of a small [`linear`] or [`linear_relu`]: one launch of a `linear` kernel.
#[cfg(feature = "cuda")]
fn small_linear(p: &Product, x: &Tensor, w: &Tensor, bias: &Tensor, relu: bool, out: &Tensor) -> Result<()> {
    use crate::cuda;
    use opsmith_kernels::names::matmul;
    let table = super::cuda::dtype_table(p.op, x, [matmul::F32, matmul::F16, matmul::BF16])?;
    let (s, grid) = small_launch(p);
    let args = (x, w, bias, out, s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], u32::from(relu));
    match grid.1 {
        Mapping::Thread => cuda::launch(table.linear_thread, grid.0, args),
        Mapping::Warp => cuda::launch(table.linear_warp, grid.0, args),
        // A layer's weight is read by rows, so a long inner dimension maps to `Columns`; the
        // column-split kernel is correct for any strides, so `Block` needs no kernel of its own.
        Mapping::Block | Mapping::Columns => cuda::launch(table.linear_columns, grid.0, args),
    }
}

/// The CUDA half of a small [`linear_grads`]: one launch of a `linear_grads` kernel over
/// `xᵀ · g` with its row of ones.
#[cfg(feature = "cuda")]
fn small_linear_grads(p: &Product, x: &Tensor, g: &Tensor, relu_output: Option<&Tensor>) -> Result<(Tensor, Tensor)> {
    use crate::cuda::{self, Grid};
    use opsmith_kernels::names::matmul;
    let table = super::cuda::dtype_table(p.op, x, [matmul::F32, matmul::F16, matmul::BF16])?;
    let dw = Tensor::empty(Shape::from(p.out_dims.clone()), x.dtype(), x.device())?;
    let db = Tensor::empty(Shape::from(p.n), x.dtype(), x.device())?;
    let (m, k, n) = (p.m as u64, p.k as u64, p.n as u64);
    // The weight's m rows and the bias's one, four columns a block.
    let tiles = (m + 1) * n.div_ceil(COLUMN_TILE);
    let block = column_split_block(k);
    // Without a mask the kernel reads none; `g` stands in for it.
    let mask = relu_output.unwrap_or(g);
    let args = (x, g, mask, &dw, &db, m, k, n, u32::from(relu_output.is_some()));
    cuda::launch(table.linear_grads, Grid::covering(tiles * u64::from(block)).with_block(block), args)?;
    Ok((dw, db))
}

/// How a small product's kernel maps threads to outputs, by the length of the inner dimension.
#[cfg(feature = "cuda")]
#[derive(Clone, Copy)]
enum Mapping {
    Thread,
    Warp,
    Block,
    Columns,
}

/// A small product's size arguments (`batch, m, k, n` and the operands' row and column strides,
/// in the kernels' order), its grid and its thread mapping.
#[cfg(feature = "cuda")]
fn small_launch(p: &Product) -> ([u64; 8], (crate::cuda::Grid, Mapping)) {
    use crate::cuda::{self, Grid};
    let (m, k, n) = (p.m as u64, p.k as u64, p.n as u64);
    // Element (i, kk) of a's matrix: stored [m, k] at i·k + kk, stored [k, m] at kk·m + i.
    let (a_row, a_col) = if p.transpose_a { (1, m) } else { (k, 1) };
    // Element (kk, j) of b's matrix: stored [k, n] at kk·n + j, stored [n, k] at j·k + kk.
    let (b_row, b_col) = if p.transpose_b { (1, k) } else { (n, 1) };
    let outputs = (p.batch * p.m * p.n) as u64;
    let sizes = [p.batch as u64, m, k, n, a_row, a_col, b_row, b_col];
    // Runs of up to four neighbouring outputs of a row (the thread and warp kernels' unit).
    let runs = (p.batch * p.m) as u64 * n.div_ceil(4);
    let grid = match p.k {
        // A thread per run of four neighbouring outputs of a row.
        k if k <= THREAD_MAPPING_MAX_K => (Grid::covering(runs), Mapping::Thread),
        // A warp per run of four neighbouring outputs of a row.
        k if k <= WARP_MAPPING_MAX_K => (Grid::covering(runs * 32), Mapping::Warp),
        // b's rows contiguous: a block per four outputs of a row, reading b by rows (with
        // fewer than four columns, most of its threads would idle: a block per output).
        _ if b_col == 1 && n >= COLUMN_TILE => {
            let tiles = (p.batch * p.m) as u64 * n.div_ceil(COLUMN_TILE);
            let block = column_split_block(k);
            (Grid::covering(tiles * u64::from(block)).with_block(block), Mapping::Columns)
        }
        _ => (Grid::covering(outputs * u64::from(cuda::DEFAULT_BLOCK)), Mapping::Block),
    };
    (sizes, grid)
}

/// Outputs per block of the column-split kernels (`matmul_small_columns_*`): four neighbouring
/// columns of a row.
#[cfg(feature = "cuda")]
const COLUMN_TILE: u64 = 4;

/// The block of the column-split kernels for an inner dimension of `k`: four threads per slice,
/// and enough slices that each thread adds at most eight products (one batch of loads in
/// flight), up to 256 slices (1024 threads); a whole number of warps.
#[cfg(feature = "cuda")]
pub(super) fn column_split_block(k: u64) -> u32 {
    let slices = k.div_ceil(8).clamp(8, 256).next_multiple_of(8);
    // At most 256 · 4 = 1024 threads, so the conversion cannot fail.
    u32::try_from(slices * COLUMN_TILE).unwrap_or(1024)
}

/// The CPU half: each matrix of the batch through `general_mat_mul` in the arithmetic type
/// (f32, or f64 for f64), rounded once to the storage dtype at the end.
fn cpu<T: Element>(p: &Product, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
    let widen = |t: &Tensor| -> Result<Vec<T::Acc>> { Ok(t.to_vec::<T>()?.into_iter().map(T::to_acc).collect()) };
    let (a_values, b_values) = (widen(a)?, widen(b)?);
    let (a_shape, b_shape) = (p.a_stored(), p.b_stored());
    let (zero, one) = (T::Acc::from_f64(0.0), T::Acc::from_f64(1.0));
    let mut c_values = crate::tensor::host_vec(p.op, out.elem_count(), zero)?;
    // Every length is non-zero here (`is_trivial` is false), as `chunks_exact` requires.
    let batches = a_values
        .chunks_exact(a_shape.0 * a_shape.1)
        .zip(b_values.chunks_exact(b_shape.0 * b_shape.1))
        .zip(c_values.chunks_exact_mut(p.m * p.n));
    for ((a_i, b_i), c_i) in batches {
        let a_i = matrix(p.op, a_i, a_shape, p.transpose_a)?;
        let b_i = matrix(p.op, b_i, b_shape, p.transpose_b)?;
        let mut c_i = ArrayViewMut2::from_shape((p.m, p.n), c_i).map_err(|e| layout_error(p.op, e))?;
        // In slices of K_SLICE along k: each product accumulates at most K_SLICE terms in
        // registers, then adds into `c`, so a sum's longest chain of roundings is about
        // K_SLICE + k / K_SLICE rather than k (at k = 256, a third of the error).
        let k = a_i.ncols();
        for start in (0..k).step_by(K_SLICE) {
            let end = (start + K_SLICE).min(k);
            let (a_s, b_s) = (a_i.slice(ndarray::s![.., start..end]), b_i.slice(ndarray::s![start..end, ..]));
            general_mat_mul(one, &a_s, &b_s, if start == 0 { zero } else { one }, &mut c_i);
        }
    }
    let rounded: Vec<T> = c_values.into_iter().map(T::from_acc).collect();
    out.write_values(&rounded)
}

/// The slice of the inner dimension the CPU half multiplies at a time (see `cpu`).
const K_SLICE: usize = 64;

/// A stored row-major matrix as a 2-D view, transposed (by swapping its strides) if asked.
fn matrix<'a, A>(op: &'static str, data: &'a [A], shape: (usize, usize), transpose: bool) -> Result<ArrayView2<'a, A>> {
    let view = ArrayView2::from_shape(shape, data).map_err(|e| layout_error(op, e))?;
    Ok(if transpose { view.reversed_axes() } else { view })
}

fn layout_error(op: &'static str, e: ndarray::ShapeError) -> Error {
    Error::InvalidArgument { op, reason: format!("matrix layout: {e}") }
}

/// A size as cuBLAS's `int`, or [`Error::TooLarge`] naming `op`.
#[cfg(feature = "cublas")]
fn blas_int(op: &'static str, value: usize) -> Result<i32> {
    i32::try_from(value).map_err(|_| Error::TooLarge { op, elements: value as u64, limit: i32::MAX as u64 })
}

/// A batch stride as cuBLAS's `long long`, or [`Error::TooLarge`] naming `op`.
#[cfg(feature = "cublas")]
fn blas_stride(op: &'static str, value: usize) -> Result<i64> {
    i64::try_from(value).map_err(|_| Error::TooLarge { op, elements: value as u64, limit: i64::MAX as u64 })
}

/// The CUDA half: one `cublasGemmStridedBatchedEx` over the whole batch, storage in the tensor
/// dtype and compute in f32.
///
/// cuBLAS is column-major and a row-major matrix read column-major is its transpose, so the
/// row-major `C = op(A)·op(B)` is computed as the column-major `Cᵀ = op(B)ᵀ·op(A)ᵀ`: `b` goes
/// first, each operand's transpose flag becomes its cuBLAS op flag, and each leading dimension
/// is the operand's stored row length. Nothing is copied.
#[cfg(feature = "cublas")]
fn cuda(p: &Product, ordinal: usize, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
    let data_type = match a.dtype() {
        DType::F32 => cudaDataType::CUDA_R_32F,
        DType::F16 => cudaDataType::CUDA_R_16F,
        DType::BF16 => cudaDataType::CUDA_R_16BF,
        dtype @ (DType::F64 | DType::U32 | DType::I64) => {
            return Err(Error::UnsupportedDType { op: p.op, dtype, device: a.device() });
        }
    };
    let op = p.op;
    let (m, n, k) = (blas_int(op, p.m)?, blas_int(op, p.n)?, blas_int(op, p.k)?);
    let batch = blas_int(op, p.batch)?;
    let (a_stored, b_stored) = (p.a_stored(), p.b_stored());
    let lda = blas_int(op, a_stored.1)?;
    let ldb = blas_int(op, b_stored.1)?;
    let stride_a = blas_stride(op, a_stored.0 * a_stored.1)?;
    let stride_b = blas_stride(op, b_stored.0 * b_stored.1)?;
    let stride_c = blas_stride(op, p.m * p.n)?;
    let flag = |transpose| if transpose { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N };

    blas::require_cublas(op)?;
    let device = CudaDevice::get(ordinal)?;
    let stream = device.current_stream();
    let blas_error = |call: &'static str, source: CublasError| Error::Blas {
        op,
        call,
        device: a.device(),
        lhs: a.dims().to_vec(),
        rhs: b.dims().to_vec(),
        source,
    };
    // CUBLAS_COMPUTE_32F takes f32 scaling factors, read from the host before the call returns.
    let (alpha, beta) = (1.0f32, 0.0f32);
    with_cuda_ptrs(op, &stream, &[a, b], &[out], |reads, writes| {
        blas::with_handle(op, &stream, &blas_error, |handle| {
            // SAFETY: `reads` and `writes` point at the first elements of a, b and out on this
            // device, valid while `with_cuda_ptrs` holds them and ordered on `stream`, the
            // handle's stream. With the strides and leading dimensions above, cuBLAS touches
            // exactly batch·m·k elements of a, batch·k·n of b and batch·m·n of out, which is
            // what `Product::new` and the output shape check guarantee each tensor holds; out
            // overlaps neither input (checked), and beta = 0 means out is written, never read.
            // Pointers need only element alignment, which every tensor view has.
            unsafe {
                cublas::gemm_strided_batched_ex(
                    handle,
                    flag(p.transpose_b),
                    flag(p.transpose_a),
                    n,
                    m,
                    k,
                    &alpha as *const f32 as *const c_void,
                    reads[1] as *const c_void,
                    data_type,
                    ldb,
                    stride_b,
                    reads[0] as *const c_void,
                    data_type,
                    lda,
                    stride_a,
                    &beta as *const f32 as *const c_void,
                    writes[0] as *mut c_void,
                    data_type,
                    n,
                    stride_c,
                    batch,
                    cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .map_err(|source| blas_error("cublasGemmStridedBatchedEx", source))?;
            if launch_blocking() {
                stream.raw().synchronize().map_err(|source| Error::KernelFault {
                    kernel: "cublasGemmStridedBatchedEx".into(),
                    device: a.device(),
                    source,
                })?;
            }
            Ok(())
        })
    })
}
