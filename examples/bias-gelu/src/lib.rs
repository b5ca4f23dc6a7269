//! `BiasGeluResidual`: `y = gelu(x + b) + r`, the bias, GeLU (tanh approximation) and residual
//! that ends a transformer MLP block, fused into one kernel with a fused backward, as a custom
//! autograd op on the CPU and on CUDA, for f32, f16 and bf16.
//!
//! Built like the custom-op example: kernels in `kernels/`, each declared once with
//! `opsmith_kernels::kernel!`, launched here through [`KernelCrate`] with tensors.
use bias_gelu_kernels as kernels;
use opsmith::autograd::{CustomOp, Result};
use opsmith::cuda::{Grid, KernelCrate};
use opsmith::host::Error;
use opsmith::{DType, Tensor};

mod cpu;

/// The example's kernels as PTX, built by `build.rs` from `kernels/`.
#[cfg(feature = "build-kernels")]
pub const PTX: &str = include_str!(env!("BIAS_GELU_PTX"));

/// The example's kernels as PTX: the committed file, made from `kernels/` by
/// `cargo xtask kernels` (CI checks it is current).
#[cfg(not(feature = "build-kernels"))]
pub const PTX: &str = include_str!("../bias_gelu.ptx");

static KERNELS: KernelCrate = KernelCrate::new("bias-gelu-kernels", PTX);

/// The op. Inputs: `x` of shape `[rows, cols]`, the bias `b` of shape `[cols]`, the residual
/// `r` of `x`'s shape, all of one dtype. Output: `y` of `x`'s shape.
pub struct BiasGeluResidual;

/// `(rows, cols)` after checking the three shapes against each other.
fn dims(x: &Tensor, b: &Tensor, r: &Tensor) -> Result<(u64, u64)> {
    let op = "bias_gelu_residual";
    let [rows, cols] = *x.dims() else {
        return Err(Error::InvalidArgument { op, reason: format!("x must be [rows, cols], got {:?}", x.dims()) }.into());
    };
    if b.dims() != [cols] {
        return Err(Error::ShapeMismatch { op, lhs: x.dims().to_vec(), rhs: b.dims().to_vec() }.into());
    }
    if r.dims() != x.dims() {
        return Err(Error::ShapeMismatch { op, lhs: x.dims().to_vec(), rhs: r.dims().to_vec() }.into());
    }
    Ok((rows as u64, cols as u64))
}

impl CustomOp for BiasGeluResidual {
    fn name(&self) -> &'static str {
        "bias_gelu_residual"
    }
    fn num_inputs(&self) -> usize {
        3
    }
    fn cpu_forward(&self, i: &[&Tensor]) -> Result<Tensor> {
        dims(i[0], i[1], i[2])?;
        cpu::forward(i[0], i[1], i[2])
    }
    fn cpu_backward(&self, i: &[&Tensor], _y: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
        dims(i[0], i[1], g)?;
        Ok(cpu::backward(i[0], i[1], g)?.map(Some).into())
    }
    fn cuda_forward(&self, i: &[&Tensor]) -> Result<Tensor> {
        let ((rows, cols), (x, b, r)) = (dims(i[0], i[1], i[2])?, (i[0], i[1], i[2]));
        let y = Tensor::empty(x.dims(), x.dtype(), x.device())?;
        let kernel = match x.dtype() {
            DType::F32 => kernels::bias_gelu_residual_f32,
            DType::F16 => kernels::bias_gelu_residual_f16,
            DType::BF16 => kernels::bias_gelu_residual_bf16,
            dtype => return Err(Error::UnsupportedDType { op: self.name(), dtype, device: x.device() }.into()),
        };
        KERNELS.launch(kernel, Grid::stride(rows * cols), (x, b, r, &y, rows, cols))?;
        Ok(y)
    }
    fn cuda_backward(&self, i: &[&Tensor], _y: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let ((rows, cols), (x, b)) = (dims(i[0], i[1], g)?, (i[0], i[1]));
        let (backward, sum_bands) = match x.dtype() {
            DType::F32 => (kernels::bias_gelu_residual_backward_f32, kernels::bias_gelu_sum_bands_f32),
            DType::F16 => (kernels::bias_gelu_residual_backward_f16, kernels::bias_gelu_sum_bands_f16),
            DType::BF16 => (kernels::bias_gelu_residual_backward_bf16, kernels::bias_gelu_sum_bands_bf16),
            dtype => return Err(Error::UnsupportedDType { op: self.name(), dtype, device: x.device() }.into()),
        };
        let units = column_units(cols, x.dtype());
        let bands = band_count(rows, units);
        let dx = Tensor::empty(x.dims(), x.dtype(), x.device())?;
        let db_bands = Tensor::empty([bands as usize, cols as usize], DType::F32, x.device())?;
        let db = Tensor::empty(b.dims(), b.dtype(), b.device())?;
        KERNELS.launch(backward, Grid::stride(bands * units), (g, x, b, &dx, &db_bands, rows, cols, bands))?;
        KERNELS.launch(sum_bands, Grid::stride(cols), (&db_bands, &db, bands, cols))?;
        // r's gradient is g itself.
        Ok(vec![Some(dx), Some(db), Some(g.clone())])
    }
}

/// The backward kernel's unit of work across a row: a 16-byte pack when a row is whole packs,
/// else one column.
fn column_units(cols: u64, dtype: DType) -> u64 {
    let lanes = 16 / dtype.size_in_bytes() as u64;
    if cols.is_multiple_of(lanes) { cols / lanes } else { cols }
}

/// How many bands of rows the backward splits the bias gradient into: enough (band, unit) pairs
/// to fill an H100/H200-sized GPU at full occupancy (132 SMs × 2048 threads), but bands of at
/// least 16 rows, so that the f32 partial sums (`bands × cols`) stay small next to the
/// activations. At least one band, so that `db` is written (zeros) even with no rows.
fn band_count(rows: u64, units: u64) -> u64 {
    const THREADS: u64 = 132 * 2048;
    THREADS.div_ceil(units.max(1)).min(rows.div_ceil(16)).max(1)
}
