//! Activations and their backward: `relu`, `gelu` (tanh form) and `silu`, each one fused kernel
//! on CUDA (f32, f16, bf16) and one pass on the CPU (also f64). The backward takes the upstream
//! gradient `g` and the forward's input `x` and returns `g · f'(x)` in one pass.
//!
//! Both devices run the formulas of `opsmith_kernels::activation` in the same order of
//! operations, in f32 (f64 for f64) with one rounding to the storage dtype. They differ only in
//! the exponential inside gelu and silu: the CPU's is `std`'s, CUDA's is built from
//! `ex2.approx.f32` and is within a few ulps, so for those two ops (and their backward) CUDA and
//! the CPU agree to a few f32 ulps rather than bit for bit. relu is exact on both.
//!
//! At ±inf gelu and silu return their limits (+inf and −0; the derivatives 1 and 0) rather than
//! the NaN of `inf · 0`; NaN gives NaN, except that `relu_backward` passes no gradient where x is
//! NaN (`x > 0` is false there, as in PyTorch).
#[cfg(feature = "cuda")]
use super::cuda::Launch;
use super::elementwise::{ElementwiseOp, run, run_new};
use crate::dtype::Accumulator;
use crate::{Result, Tensor};
use opsmith_kernels::activation as formula;

/// The descriptors of an activation and of its backward: the formulas of
/// `opsmith_kernels::activation` and the kernels of the same names.
macro_rules! activation_ops {
    ($($forward:ident $backward:ident: $f:ident, $f_backward:ident;)*) => {$(
        #[derive(Clone, Copy)]
        struct $forward;

        impl ElementwiseOp<1, 1> for $forward {
            fn name(&self) -> &'static str {
                stringify!($f)
            }
            #[inline(always)]
            fn compute<A: Accumulator>(&self, [x]: [A; 1]) -> [A; 1] {
                [formula::$f(x)]
            }
            #[cfg(feature = "cuda")]
            fn launch(&self, on: Launch, [x]: [&Tensor; 1], [out]: [&Tensor; 1]) -> Result<()> {
                on.run(on.activation()?.$f, (x, out, on.n))
            }
        }

        #[derive(Clone, Copy)]
        struct $backward;

        impl ElementwiseOp<2, 1> for $backward {
            fn name(&self) -> &'static str {
                stringify!($f_backward)
            }
            #[inline(always)]
            fn compute<A: Accumulator>(&self, [g, x]: [A; 2]) -> [A; 1] {
                [formula::$f_backward(g, x)]
            }
            #[cfg(feature = "cuda")]
            fn launch(&self, on: Launch, [g, x]: [&Tensor; 2], [gx]: [&Tensor; 1]) -> Result<()> {
                on.run(on.activation()?.$f_backward, (g, x, gx, on.n))
            }
        }
    )*};
}

activation_ops! {
    Relu ReluBackward: relu, relu_backward;
    Gelu GeluBackward: gelu, gelu_backward;
    Silu SiluBackward: silu, silu_backward;
}

/// `max(x, 0)` elementwise; `relu(−0) = +0`, and NaN stays NaN.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let x = Tensor::from_vec(vec![-2.0f32, -0.0, 0.5, 3.0], [4], Device::Cpu)?;
/// assert_eq!(ops::relu(&x)?.to_vec::<f32>()?, [0.0, 0.0, 0.5, 3.0]);
/// # Ok(()) }
/// ```
pub fn relu(x: &Tensor) -> Result<Tensor> {
    let [out] = run_new(Relu, [x])?;
    Ok(out)
}

/// `out = relu(x)`, into an existing tensor (`out` may be `x` itself).
pub fn relu_into(x: &Tensor, out: &Tensor) -> Result<()> {
    run(Relu, [x], [out])
}

/// The backward of [`relu`]: `g` where `x > 0`, else 0 (also where `x` is NaN).
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let g = Tensor::from_vec(vec![5.0f32, 5.0, 5.0], [3], Device::Cpu)?;
/// let x = Tensor::from_vec(vec![-1.0f32, 0.0, 2.0], [3], Device::Cpu)?;
/// assert_eq!(ops::relu_backward(&g, &x)?.to_vec::<f32>()?, [0.0, 0.0, 5.0]);
/// # Ok(()) }
/// ```
pub fn relu_backward(g: &Tensor, x: &Tensor) -> Result<Tensor> {
    let [gx] = run_new(ReluBackward, [g, x])?;
    Ok(gx)
}

/// `gx = relu_backward(g, x)`, into an existing tensor (`gx` may be `g` or `x` itself).
pub fn relu_backward_into(g: &Tensor, x: &Tensor, gx: &Tensor) -> Result<()> {
    run(ReluBackward, [g, x], [gx])
}

/// gelu, tanh form: `0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))`.
///
/// Computed as the equal `x · σ(2u)` (u the tanh's argument), which keeps full relative
/// precision for negative x, where `1 + tanh(u)` would cancel. On CUDA the exponential is
/// within a few ulps, so results can differ from the CPU's by a few f32 ulps.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let x = Tensor::from_vec(vec![-1.0f64, 0.0, 2.0], [3], Device::Cpu)?;
/// let y = ops::gelu(&x)?.to_vec::<f64>()?;
/// let tanh_form = |x: f64| 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh());
/// for (y, x) in y.iter().zip([-1.0, 0.0, 2.0]) {
///     assert!((y - tanh_form(x)).abs() < 1e-15);
/// }
/// # Ok(()) }
/// ```
pub fn gelu(x: &Tensor) -> Result<Tensor> {
    let [out] = run_new(Gelu, [x])?;
    Ok(out)
}

/// `out = gelu(x)`, into an existing tensor (`out` may be `x` itself).
pub fn gelu_into(x: &Tensor, out: &Tensor) -> Result<()> {
    run(Gelu, [x], [out])
}

/// The backward of [`gelu`] in one pass: `g · gelu'(x)`.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let g = Tensor::from_vec(vec![2.0f64], [1], Device::Cpu)?;
/// let x = Tensor::from_vec(vec![0.0f64], [1], Device::Cpu)?;
/// assert_eq!(ops::gelu_backward(&g, &x)?.to_vec::<f64>()?, [1.0]); // gelu'(0) = 1/2
/// # Ok(()) }
/// ```
pub fn gelu_backward(g: &Tensor, x: &Tensor) -> Result<Tensor> {
    let [gx] = run_new(GeluBackward, [g, x])?;
    Ok(gx)
}

/// `gx = gelu_backward(g, x)`, into an existing tensor (`gx` may be `g` or `x` itself).
pub fn gelu_backward_into(g: &Tensor, x: &Tensor, gx: &Tensor) -> Result<()> {
    run(GeluBackward, [g, x], [gx])
}

/// silu (swish): `x · σ(x)`. On CUDA the exponential is within a few ulps, so results can
/// differ from the CPU's by a few f32 ulps.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let x = Tensor::from_vec(vec![-1.0f64, 0.0, 2.0], [3], Device::Cpu)?;
/// let y = ops::silu(&x)?.to_vec::<f64>()?;
/// for (y, x) in y.iter().zip([-1.0f64, 0.0, 2.0]) {
///     assert!((y - x / (1.0 + (-x).exp())).abs() < 1e-15);
/// }
/// # Ok(()) }
/// ```
pub fn silu(x: &Tensor) -> Result<Tensor> {
    let [out] = run_new(Silu, [x])?;
    Ok(out)
}

/// `out = silu(x)`, into an existing tensor (`out` may be `x` itself).
pub fn silu_into(x: &Tensor, out: &Tensor) -> Result<()> {
    run(Silu, [x], [out])
}

/// The backward of [`silu`] in one pass: `g · σ(x) · (1 + x · (1 − σ(x)))`.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let g = Tensor::from_vec(vec![3.0f32], [1], Device::Cpu)?;
/// let x = Tensor::from_vec(vec![0.0f32], [1], Device::Cpu)?;
/// assert_eq!(ops::silu_backward(&g, &x)?.to_vec::<f32>()?, [1.5]); // silu'(0) = 1/2
/// # Ok(()) }
/// ```
pub fn silu_backward(g: &Tensor, x: &Tensor) -> Result<Tensor> {
    let [gx] = run_new(SiluBackward, [g, x])?;
    Ok(gx)
}

/// `gx = silu_backward(g, x)`, into an existing tensor (`gx` may be `g` or `x` itself).
pub fn silu_backward_into(g: &Tensor, x: &Tensor, gx: &Tensor) -> Result<()> {
    run(SiluBackward, [g, x], [gx])
}
