//! `BiasGeluResidual`: `y = gelu(x + b) + r`, the bias, GeLU (tanh approximation) and residual
//! that ends a transformer MLP block, fused into one kernel with a fused backward, as a custom
//! autograd op on the CPU and on CUDA, for f32, f16 and bf16.
//!
//! Built like the custom-op example: kernels in `kernels/`, each declared once with
//! `opsmith_kernels::kernel!`, launched here through [`KernelCrate`] with tensors.
use bias_gelu_kernels as kernels;
use opsmith::autograd::{CustomOp, Result};
use opsmith::cuda::{Grid, KernelCrate};
use opsmith::{DType, Error, Tensor, ops};

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
        let dx = Tensor::empty(x.dims(), x.dtype(), x.device())?;
        let kernel = match x.dtype() {
            DType::F32 => kernels::bias_gelu_residual_backward_f32,
            DType::F16 => kernels::bias_gelu_residual_backward_f16,
            DType::BF16 => kernels::bias_gelu_residual_backward_bf16,
            dtype => return Err(Error::UnsupportedDType { op: self.name(), dtype, device: x.device() }.into()),
        };
        KERNELS.launch(kernel, Grid::stride(rows * cols), (g, x, b, &dx, rows, cols))?;
        // b's gradient sums dx over the rows; r's is g itself.
        let db = ops::sum_rows(&dx)?;
        Ok(vec![Some(dx), Some(db), Some(g.clone())])
    }
}
