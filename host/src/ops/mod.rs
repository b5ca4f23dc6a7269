//! Operations on tensors. Each op checks its operands, then runs on their device: the CPU half
//! is in [`cpu`](self) on `ndarray`, the CUDA half launches the kernels of `kernels-gpu`.
//!
//! Every elementwise op has two forms: a functional one that returns new tensors
//! (`fused_mul_add`), and an `_into` form that writes into tensors the caller provides
//! (`fused_mul_add_into`). An output may be exactly one of the inputs (in place) but may not
//! partially overlap any operand.
//!
//! Arithmetic runs in f32 for f32, f16 and bf16 (in f64 for f64, CPU only), and results are
//! rounded once to the storage dtype; the CPU and CUDA results are bit-identical for finite
//! inputs, except for `gelu`, `silu` and their backward, whose exponential differs by a few
//! ulps between the two (see [`gelu`]); softmax and the losses, which use `ex2.approx` on CUDA and f64 on the CPU
//! and agree to a few f32 ulps (see [`softmax`]); and the matrix products ([`matmul`], on cuBLAS), which
//! add their products in another order on each device and agree to within f32 rounding.
//!
//! The optimizer steps ([`sgd_step`], [`adam_step`], [`adam_step_device`]) update their tensors
//! in place; [`AdamState`] keeps Adam's step count and learning rate on the device, so that a
//! CUDA graph can record Adam steps.
//!
//! ```
//! # fn main() -> opsmith_host::Result<()> {
//! use opsmith_host::{DType, Device, Tensor, ops};
//! let device = Device::cuda_if_available();
//! let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3], device)?;
//! let y = ops::fused_mul_add(&x, &x, &x)?; // a new tensor: x * x + x
//! let out = Tensor::zeros([3], DType::F32, device)?;
//! ops::fused_mul_add_into(&x, &x, &x, &out)?; // the same, into `out`
//! ops::add_into(&out, &y, &out)?; // in place: out = out + y
//! assert_eq!(out.to_vec::<f32>()?, [4.0, 12.0, 24.0]);
//! # Ok(()) }
//! ```
mod activation;
mod attention;
pub(crate) mod check;
mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
mod elementwise;
pub(crate) mod index;
pub(crate) mod layout;
mod loss;
mod matmul;
mod optim;
mod reduce;
mod softmax;
mod two_layer;

pub use activation::{
    gelu, gelu_backward, gelu_backward_into, gelu_into, relu, relu_backward, relu_backward_into, relu_into, silu,
    silu_backward, silu_backward_into, silu_into,
};
pub use attention::{
    FUSED_ATTENTION_ENV, attention, attention_backward, attention_is_fused, attention_weights, attention_with_lse,
};
pub use index::{
    argmax, broadcast_shape, gather, gather_backward, index_select, index_select_backward, max_dim, sum_dim,
    sum_to_shape,
};
pub use loss::{cross_entropy, cross_entropy_backward, cross_entropy_backward_scalar, mse_loss, mse_loss_backward};
pub use matmul::{SMALL_PRODUCT_MACS, linear, linear_grads, linear_relu, matmul, matmul_into, matmul_t, matmul_t_into};
pub use optim::{
    AdamCoefficients, AdamHyper, AdamProgress, AdamState, AdamStep, AdamTensors, SgdStep, adam_advance_step_group,
    adam_step, adam_step_device, adam_step_device_group, sgd_step,
};
pub use reduce::{add_row, expand_scalar, mean, sum, sum_rows};
pub use softmax::{softmax, softmax_backward};
pub use two_layer::{linear_relu_linear, linear_relu_linear_first_grads};

use crate::{Result, Tensor};
use elementwise::{
    Add, AddMul, AddMulBackward, AddMulBackwardSplit, AddMulBackwardSplitUniform, AddMulBackwardUniform, Affine, Div,
    FusedMulAdd, Mul, Sub, run, run_new,
};

/// `a + b`, elementwise. Shapes broadcast as in NumPy and PyTorch ([`broadcast_shape`]): a
/// `[2, 3]` and a `[3]` give a `[2, 3]`. The same holds for [`sub`], [`mul`] and [`div`]; the
/// `_into` forms take equal shapes only.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let a = Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?;
/// assert_eq!(ops::add(&a, &a)?.to_vec::<f32>()?, [2.0, 4.0]);
/// let column = Tensor::from_vec(vec![10.0f32, 20.0], [2, 1], Device::Cpu)?;
/// assert_eq!(ops::add(&column, &a)?.to_vec::<f32>()?, [11.0, 12.0, 21.0, 22.0]);
/// # Ok(()) }
/// ```
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (a, b) = index::broadcast_pair("add", a, b)?;
    let [out] = run_new(Add, [&a, &b])?;
    Ok(out)
}

/// `out = a + b`, into an existing tensor.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{DType, Device, Tensor, ops};
/// let a = Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?;
/// let out = Tensor::zeros([2], DType::F32, Device::Cpu)?;
/// ops::add_into(&a, &a, &out)?;
/// assert_eq!(out.to_vec::<f32>()?, [2.0, 4.0]);
/// # Ok(()) }
/// ```
pub fn add_into(a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
    run(Add, [a, b], [out])
}

/// `a - b`, elementwise.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let a = Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?;
/// let b = Tensor::from_vec(vec![0.5f32, 4.0], [2], Device::Cpu)?;
/// assert_eq!(ops::sub(&a, &b)?.to_vec::<f32>()?, [0.5, -2.0]);
/// # Ok(()) }
/// ```
pub fn sub(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (a, b) = index::broadcast_pair("sub", a, b)?;
    let [out] = run_new(Sub, [&a, &b])?;
    Ok(out)
}

/// `out = a - b`, into an existing tensor.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{Device, Tensor, ops};
/// let a = Tensor::from_vec(vec![5.0f32, 2.0], [2], Device::Cpu)?;
/// let b = Tensor::from_vec(vec![1.0f32, 3.0], [2], Device::Cpu)?;
/// ops::sub_into(&a, &b, &a)?; // in place
/// assert_eq!(a.to_vec::<f32>()?, [4.0, -1.0]);
/// # Ok(()) }
/// ```
pub fn sub_into(a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
    run(Sub, [a, b], [out])
}

/// `x * alpha + beta` elementwise, with one rounding (an FMA with scalar operands); `alpha` and
/// `beta` are rounded to the arithmetic type (f32, or f64 for f64 tensors).
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, -2.0], [2], Device::Cpu)?;
/// assert_eq!(ops::affine(&x, 3.0, 0.5)?.to_vec::<f32>()?, [3.5, -5.5]);
/// # Ok(()) }
/// ```
pub fn affine(x: &Tensor, alpha: f64, beta: f64) -> Result<Tensor> {
    let [out] = run_new(Affine { alpha, beta }, [x])?;
    Ok(out)
}

/// `out = x * alpha + beta`, into an existing tensor.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{DType, Device, Tensor, ops};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?;
/// let out = Tensor::zeros([2], DType::F32, Device::Cpu)?;
/// ops::affine_into(&x, 0.5, -1.0, &out)?;
/// assert_eq!(out.to_vec::<f32>()?, [-0.5, 0.0]);
/// # Ok(()) }
/// ```
pub fn affine_into(x: &Tensor, alpha: f64, beta: f64, out: &Tensor) -> Result<()> {
    run(Affine { alpha, beta }, [x], [out])
}

/// `-x`.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{Device, Tensor, ops};
/// let x = Tensor::from_vec(vec![1.0f32, -0.0, 0.0], [3], Device::Cpu)?;
/// let y = ops::neg(&x)?.to_vec::<f32>()?;
/// assert_eq!(y, [-1.0, 0.0, -0.0]);
/// assert!(y[1].is_sign_positive() && y[2].is_sign_negative()); // -(-0) = +0, -(+0) = -0
/// # Ok(()) }
/// ```
pub fn neg(x: &Tensor) -> Result<Tensor> {
    scale(x, -1.0)
}

/// `x * alpha` for a scalar `alpha`.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{Device, Tensor, ops};
/// let x = Tensor::from_vec(vec![1.0f32, -2.0], [2], Device::Cpu)?;
/// assert_eq!(ops::scale(&x, 0.25)?.to_vec::<f32>()?, [0.25, -0.5]);
/// # Ok(()) }
/// ```
pub fn scale(x: &Tensor, alpha: f64) -> Result<Tensor> {
    // `x * alpha + (-0)` is exactly `x * alpha`, sign of zero included (`+0` would turn a
    // product of -0 into +0).
    affine(x, alpha, -0.0)
}

/// `x + beta` for a scalar `beta`.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{Device, Tensor, ops};
/// let x = Tensor::from_vec(vec![1.0f32, -2.0], [2], Device::Cpu)?;
/// assert_eq!(ops::add_scalar(&x, 0.5)?.to_vec::<f32>()?, [1.5, -1.5]);
/// # Ok(()) }
/// ```
pub fn add_scalar(x: &Tensor, beta: f64) -> Result<Tensor> {
    affine(x, 1.0, beta)
}

/// `a * b`, elementwise.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let a = Tensor::from_vec(vec![1.5f32, -2.0], [2], Device::Cpu)?;
/// assert_eq!(ops::mul(&a, &a)?.to_vec::<f32>()?, [2.25, 4.0]);
/// # Ok(()) }
/// ```
pub fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (a, b) = index::broadcast_pair("mul", a, b)?;
    let [out] = run_new(Mul, [&a, &b])?;
    Ok(out)
}

/// `out = a * b`, into an existing tensor.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{DType, Device, Tensor, ops};
/// let a = Tensor::from_vec(vec![1.5f32, -2.0], [2], Device::Cpu)?;
/// let out = Tensor::zeros([2], DType::F32, Device::Cpu)?;
/// ops::mul_into(&a, &a, &out)?;
/// assert_eq!(out.to_vec::<f32>()?, [2.25, 4.0]);
/// # Ok(()) }
/// ```
pub fn mul_into(a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
    run(Mul, [a, b], [out])
}

/// `a / b`, elementwise, correctly rounded in the arithmetic type (f32, or f64 for f64
/// tensors) as IEEE 754 says: `x / 0` is `±inf`, `0 / 0` is NaN.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let a = Tensor::from_vec(vec![1.0f32, -3.0, 1.0], [3], Device::Cpu)?;
/// let b = Tensor::from_vec(vec![4.0f32, 2.0, 0.0], [3], Device::Cpu)?;
/// assert_eq!(ops::div(&a, &b)?.to_vec::<f32>()?, [0.25, -1.5, f32::INFINITY]);
/// # Ok(()) }
/// ```
pub fn div(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (a, b) = index::broadcast_pair("div", a, b)?;
    let [out] = run_new(Div, [&a, &b])?;
    Ok(out)
}

/// `a / b`, into an existing tensor.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let a = Tensor::from_vec(vec![1.0f32, 3.0], [2], Device::Cpu)?;
/// let b = Tensor::from_vec(vec![2.0f32, 4.0], [2], Device::Cpu)?;
/// ops::div_into(&a, &b, &a)?; // in place
/// assert_eq!(a.to_vec::<f32>()?, [0.5, 0.75]);
/// # Ok(()) }
/// ```
pub fn div_into(a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
    run(Div, [a, b], [out])
}

/// `d = a * b + c` in one pass, with a single rounding for the multiply-add (a true FMA).
///
/// One read of each input and one write: 4 values moved per element, against 6 for `mul`
/// followed by `add`.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let a = Tensor::from_vec(vec![2.0f32, 3.0], [2], Device::Cpu)?;
/// let b = Tensor::from_vec(vec![4.0f32, 5.0], [2], Device::Cpu)?;
/// let c = Tensor::from_vec(vec![1.0f32, -1.0], [2], Device::Cpu)?;
/// assert_eq!(ops::fused_mul_add(&a, &b, &c)?.to_vec::<f32>()?, [9.0, 14.0]);
/// # Ok(()) }
/// ```
pub fn fused_mul_add(a: &Tensor, b: &Tensor, c: &Tensor) -> Result<Tensor> {
    let [out] = run_new(FusedMulAdd, [a, b, c])?;
    Ok(out)
}

/// `d = a * b + c`, into an existing tensor.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{DType, Device, Tensor, ops};
/// let a = Tensor::from_vec(vec![2.0f32, 3.0], [2], Device::Cpu)?;
/// let d = Tensor::zeros([2], DType::F32, Device::Cpu)?;
/// ops::fused_mul_add_into(&a, &a, &a, &d)?;
/// assert_eq!(d.to_vec::<f32>()?, [6.0, 12.0]);
/// // An output may be exactly an input (in place), but may not partly overlap one.
/// let buf = Tensor::zeros([3], DType::F32, Device::Cpu)?;
/// let (head, tail) = (buf.flat_slice(0, 2)?, buf.flat_slice(1, 2)?);
/// let overlap = ops::fused_mul_add_into(&head, &head, &head, &tail);
/// assert!(matches!(overlap, Err(opsmith_host::Error::Overlap { op: "fused_mul_add", output: 0 })));
/// # Ok(()) }
/// ```
pub fn fused_mul_add_into(a: &Tensor, b: &Tensor, c: &Tensor, d: &Tensor) -> Result<()> {
    run(FusedMulAdd, [a, b, c], [d])
}

/// `z = (x + y) * w` in one pass.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?;
/// let y = Tensor::from_vec(vec![3.0f32, 4.0], [2], Device::Cpu)?;
/// let w = Tensor::from_vec(vec![0.5f32, 2.0], [2], Device::Cpu)?;
/// assert_eq!(ops::add_mul(&x, &y, &w)?.to_vec::<f32>()?, [2.0, 12.0]);
/// # Ok(()) }
/// ```
pub fn add_mul(x: &Tensor, y: &Tensor, w: &Tensor) -> Result<Tensor> {
    let [out] = run_new(AddMul, [x, y, w])?;
    Ok(out)
}

/// `z = (x + y) * w`, into an existing tensor.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{DType, Device, Tensor, ops};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?;
/// let z = Tensor::zeros([2], DType::F32, Device::Cpu)?;
/// ops::add_mul_into(&x, &x, &x, &z)?;
/// assert_eq!(z.to_vec::<f32>()?, [2.0, 8.0]);
/// # Ok(()) }
/// ```
pub fn add_mul_into(x: &Tensor, y: &Tensor, w: &Tensor, z: &Tensor) -> Result<()> {
    run(AddMul, [x, y, w], [z])
}

/// The backward of `z = (x + y) * w` for the upstream gradient `g`, in one pass. Returns
/// `(gxy, gw)`: `gxy = g * w` is the gradient of both `x` and `y`, and `gw = g * (x + y)`.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let t = |v: Vec<f32>| Tensor::from_vec(v, [2], Device::Cpu);
/// let (gxy, gw) = ops::add_mul_backward(&t(vec![1.0, 2.0])?, &t(vec![1.0, 2.0])?, &t(vec![3.0, 4.0])?, &t(vec![0.5, 2.0])?)?;
/// assert_eq!(gxy.to_vec::<f32>()?, [0.5, 4.0]);
/// assert_eq!(gw.to_vec::<f32>()?, [4.0, 12.0]);
/// # Ok(()) }
/// ```
pub fn add_mul_backward(g: &Tensor, x: &Tensor, y: &Tensor, w: &Tensor) -> Result<(Tensor, Tensor)> {
    let [gxy, gw] = run_new(AddMulBackward, [g, x, y, w])?;
    Ok((gxy, gw))
}

/// The backward of `(x + y) * w`, into existing tensors `gxy` and `gw`.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{DType, Device, Tensor, ops};
/// let t = |v: Vec<f32>| Tensor::from_vec(v, [2], Device::Cpu);
/// let (g, x, y, w) = (t(vec![1.0, 2.0])?, t(vec![1.0, 2.0])?, t(vec![3.0, 4.0])?, t(vec![0.5, 2.0])?);
/// let (gxy, gw) = (Tensor::zeros([2], DType::F32, Device::Cpu)?, Tensor::zeros([2], DType::F32, Device::Cpu)?);
/// ops::add_mul_backward_into(&g, &x, &y, &w, &gxy, &gw)?;
/// assert_eq!(gxy.to_vec::<f32>()?, [0.5, 4.0]); // g * w
/// assert_eq!(gw.to_vec::<f32>()?, [4.0, 12.0]); // g * (x + y)
/// # Ok(()) }
/// ```
pub fn add_mul_backward_into(g: &Tensor, x: &Tensor, y: &Tensor, w: &Tensor, gxy: &Tensor, gw: &Tensor) -> Result<()> {
    run(AddMulBackward, [g, x, y, w], [gxy, gw])
}

/// The backward of `z = (x + y) * w` when the upstream gradient is the scalar `g` in every
/// element, as it is under a `sum` or `mean`: `(gxy, gw) = (g * w, g * (x + y))` in one pass that
/// reads no gradient tensor (3 values in and 2 out per element, against 4 and 2 for
/// [`add_mul_backward`]). `g` is rounded to the arithmetic type (f32, or f64 for f64 tensors).
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let t = |v: Vec<f32>| Tensor::from_vec(v, [2], Device::Cpu);
/// let (x, y, w) = (t(vec![1.0, 2.0])?, t(vec![3.0, 4.0])?, t(vec![0.5, 2.0])?);
/// let (gxy, gw) = ops::add_mul_backward_uniform(2.0, &x, &y, &w)?;
/// assert_eq!(gxy.to_vec::<f32>()?, [1.0, 4.0]); // 2 * w
/// assert_eq!(gw.to_vec::<f32>()?, [8.0, 12.0]); // 2 * (x + y)
/// # Ok(()) }
/// ```
pub fn add_mul_backward_uniform(g: f64, x: &Tensor, y: &Tensor, w: &Tensor) -> Result<(Tensor, Tensor)> {
    let [gxy, gw] = run_new(AddMulBackwardUniform { g }, [x, y, w])?;
    Ok((gxy, gw))
}

/// The backward of `z = (x + y) * w` for distinct `x` and `y` that each need a gradient tensor of
/// their own, in one pass: returns `(gx, gy, gw)` with `gx = gy = g * w` (two tensors, equal
/// values) and `gw = g * (x + y)`. One more store per element than [`add_mul_backward`], where
/// handing `x` and `y` separate gradients would otherwise take a copy.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let t = |v: Vec<f32>| Tensor::from_vec(v, [2], Device::Cpu);
/// let (gx, gy, gw) = ops::add_mul_backward_split(&t(vec![1.0, 2.0])?, &t(vec![1.0, 2.0])?, &t(vec![3.0, 4.0])?, &t(vec![0.5, 2.0])?)?;
/// assert_eq!((gx.to_vec::<f32>()?, gy.to_vec::<f32>()?), (vec![0.5, 4.0], vec![0.5, 4.0]));
/// assert!(!gx.shares_storage(&gy));
/// assert_eq!(gw.to_vec::<f32>()?, [4.0, 12.0]);
/// # Ok(()) }
/// ```
pub fn add_mul_backward_split(g: &Tensor, x: &Tensor, y: &Tensor, w: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    let [gx, gy, gw] = run_new(AddMulBackwardSplit, [g, x, y, w])?;
    Ok((gx, gy, gw))
}

/// [`add_mul_backward_split`] for an upstream gradient that is the scalar `g` in every element
/// (under a `sum` or `mean`): `(gx, gy, gw) = (g * w, g * w, g * (x + y))`, reading no gradient
/// tensor.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let t = |v: Vec<f32>| Tensor::from_vec(v, [2], Device::Cpu);
/// let (gx, gy, gw) = ops::add_mul_backward_split_uniform(2.0, &t(vec![1.0, 2.0])?, &t(vec![3.0, 4.0])?, &t(vec![0.5, 2.0])?)?;
/// assert_eq!((gx.to_vec::<f32>()?, gy.to_vec::<f32>()?), (vec![1.0, 4.0], vec![1.0, 4.0]));
/// assert_eq!(gw.to_vec::<f32>()?, [8.0, 12.0]);
/// # Ok(()) }
/// ```
pub fn add_mul_backward_split_uniform(g: f64, x: &Tensor, y: &Tensor, w: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    let [gx, gy, gw] = run_new(AddMulBackwardSplitUniform { g }, [x, y, w])?;
    Ok((gx, gy, gw))
}

/// [`add_mul_backward_split`] into existing tensors `gx`, `gy` and `gw` (three distinct
/// tensors; an output may be exactly an input).
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{DType, Device, Tensor, ops};
/// let t = |v: Vec<f32>| Tensor::from_vec(v, [2], Device::Cpu);
/// let (g, x, y, w) = (t(vec![1.0, 2.0])?, t(vec![1.0, 2.0])?, t(vec![3.0, 4.0])?, t(vec![0.5, 2.0])?);
/// let out = || Tensor::zeros([2], DType::F32, Device::Cpu);
/// let (gx, gy, gw) = (out()?, out()?, out()?);
/// ops::add_mul_backward_split_into(&g, &x, &y, &w, &gx, &gy, &gw)?;
/// assert_eq!((gx.to_vec::<f32>()?, gy.to_vec::<f32>()?), (vec![0.5, 4.0], vec![0.5, 4.0])); // g * w
/// assert_eq!(gw.to_vec::<f32>()?, [4.0, 12.0]); // g * (x + y)
/// # Ok(()) }
/// ```
pub fn add_mul_backward_split_into(
    g: &Tensor,
    x: &Tensor,
    y: &Tensor,
    w: &Tensor,
    gx: &Tensor,
    gy: &Tensor,
    gw: &Tensor,
) -> Result<()> {
    run(AddMulBackwardSplit, [g, x, y, w], [gx, gy, gw])
}

/// [`add_mul_backward_split_uniform`] into existing tensors `gx`, `gy` and `gw`.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{DType, Device, Tensor, ops};
/// let t = |v: Vec<f32>| Tensor::from_vec(v, [2], Device::Cpu);
/// let (x, y, w) = (t(vec![1.0, 2.0])?, t(vec![3.0, 4.0])?, t(vec![0.5, 2.0])?);
/// let out = || Tensor::zeros([2], DType::F32, Device::Cpu);
/// let (gx, gy, gw) = (out()?, out()?, out()?);
/// ops::add_mul_backward_split_uniform_into(-1.0, &x, &y, &w, &gx, &gy, &gw)?;
/// assert_eq!((gx.to_vec::<f32>()?, gy.to_vec::<f32>()?), (vec![-0.5, -2.0], vec![-0.5, -2.0]));
/// assert_eq!(gw.to_vec::<f32>()?, [-4.0, -6.0]);
/// # Ok(()) }
/// ```
pub fn add_mul_backward_split_uniform_into(
    g: f64,
    x: &Tensor,
    y: &Tensor,
    w: &Tensor,
    gx: &Tensor,
    gy: &Tensor,
    gw: &Tensor,
) -> Result<()> {
    run(AddMulBackwardSplitUniform { g }, [x, y, w], [gx, gy, gw])
}

/// [`add_mul_backward_uniform`] into existing tensors `gxy` and `gw`.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{DType, Device, Tensor, ops};
/// let t = |v: Vec<f32>| Tensor::from_vec(v, [2], Device::Cpu);
/// let (x, y, w) = (t(vec![1.0, 2.0])?, t(vec![3.0, 4.0])?, t(vec![0.5, 2.0])?);
/// let (gxy, gw) = (Tensor::zeros([2], DType::F32, Device::Cpu)?, Tensor::zeros([2], DType::F32, Device::Cpu)?);
/// ops::add_mul_backward_uniform_into(-1.0, &x, &y, &w, &gxy, &gw)?;
/// assert_eq!(gxy.to_vec::<f32>()?, [-0.5, -2.0]); // -w
/// assert_eq!(gw.to_vec::<f32>()?, [-4.0, -6.0]); // -(x + y)
/// # Ok(()) }
/// ```
pub fn add_mul_backward_uniform_into(
    g: f64,
    x: &Tensor,
    y: &Tensor,
    w: &Tensor,
    gxy: &Tensor,
    gw: &Tensor,
) -> Result<()> {
    run(AddMulBackwardUniform { g }, [x, y, w], [gxy, gw])
}
