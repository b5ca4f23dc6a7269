//! Optimizer steps that update parameters in place on their device: SGD (plain or with
//! momentum) and Adam (AdamW with weight decay). Each is one fused kernel on CUDA and one pass on
//! the CPU, and both run the formulas of `opsmith_kernels::optim` with the same operations (FMA,
//! multiply, divide, square root, all correctly rounded), so CUDA and the CPU give the same bits
//! for f32.
//!
//! Parameter, gradient and state share one dtype, shape and device: f32 on CUDA, f32 or f64 on
//! the CPU. Every tensor written (parameter, momentum buffer, moments) has its version bumped,
//! so autograd notices a saved tensor updated before backward.
use super::check;
#[cfg(feature = "cuda")]
use super::cuda::Launch;
use super::elementwise::{ElementwiseOp, run};
use crate::dtype::Accumulator;
use crate::{DType, Device, Error, Result, Tensor};
use opsmith_kernels::optim::{self as formula, AdamCoefficients};

/// One step of SGD: with momentum `μ > 0`, `buf = μ·buf + (grad + wd·p)` then `p -= lr·buf`;
/// without (`μ = 0`, no buffer), `p -= lr·(grad + wd·p)`.
///
/// Every field must be finite and non-negative.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdStep {
    /// The learning rate.
    pub lr: f64,
    /// The momentum factor μ; 0 for plain SGD.
    pub momentum: f64,
    /// L2 weight decay, added to the gradient as `wd·p`.
    pub weight_decay: f64,
}

impl SgdStep {
    /// Whether the step keeps a momentum buffer.
    fn uses_buffer(&self) -> bool {
        self.momentum != 0.0
    }

    fn validate(&self) -> Result<()> {
        let op = "sgd_step";
        non_negative(op, "lr", self.lr)?;
        non_negative(op, "momentum", self.momentum)?;
        non_negative(op, "weight_decay", self.weight_decay)
    }
}

/// One step of Adam, bias-corrected with `step` (1-based): AdamW when `weight_decay > 0`, with
/// the decoupled decay `p -= lr·wd·p` (from the parameter before this step's update).
///
/// ```text
/// m = β1·m + (1 − β1)·grad          v = β2·v + (1 − β2)·grad²
/// p = p − lr·wd·p − lr / (1 − β1^step) · m / (√v / √(1 − β2^step) + ε)
/// ```
///
/// `lr`, `eps` and `weight_decay` must be finite and non-negative, the betas in [0, 1), and
/// `step` at least 1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamStep {
    /// The learning rate.
    pub lr: f64,
    /// The first moment's decay β1 (typically 0.9).
    pub beta1: f64,
    /// The second moment's decay β2 (typically 0.999).
    pub beta2: f64,
    /// ε, added to the bias-corrected `√v` (typically 1e-8).
    pub eps: f64,
    /// Decoupled weight decay; 0 for plain Adam.
    pub weight_decay: f64,
    /// The step number, from 1: the bias corrections use it.
    pub step: u64,
}

impl AdamStep {
    fn validate(&self) -> Result<()> {
        let op = "adam_step";
        non_negative(op, "lr", self.lr)?;
        non_negative(op, "eps", self.eps)?;
        non_negative(op, "weight_decay", self.weight_decay)?;
        for (name, beta) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&beta) {
                return Err(Error::InvalidArgument { op, reason: format!("{name} must be in [0, 1), got {beta}") });
            }
        }
        if self.step == 0 {
            return Err(Error::InvalidArgument { op, reason: "step counts from 1, got 0".into() });
        }
        Ok(())
    }

    /// The per-step scalars, in f64; each device rounds them to its arithmetic type.
    fn coefficients(&self) -> AdamCoefficients<f64> {
        let t = self.step as f64;
        AdamCoefficients {
            beta1: self.beta1,
            one_minus_beta1: 1.0 - self.beta1,
            beta2: self.beta2,
            one_minus_beta2: 1.0 - self.beta2,
            eps: self.eps,
            lr_weight_decay: self.lr * self.weight_decay,
            step_size: self.lr / (1.0 - self.beta1.powf(t)),
            inv_sqrt_bias2: 1.0 / (1.0 - self.beta2.powf(t)).sqrt(),
        }
    }
}

fn non_negative(op: &'static str, name: &str, value: f64) -> Result<()> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(Error::InvalidArgument { op, reason: format!("{name} must be finite and non-negative, got {value}") })
    }
}

// The steps as elementwise maps over (parameter, gradient, state), in place: the CPU runs the
// formulas of `opsmith_kernels::optim`, CUDA the kernels made from them.

impl ElementwiseOp<2, 1> for SgdStep {
    fn name(&self) -> &'static str {
        "sgd_step"
    }
    #[inline(always)]
    fn compute<A: Accumulator>(&self, [p, g]: [A; 2]) -> [A; 1] {
        [formula::sgd(p, g, A::from_f64(self.lr), A::from_f64(self.weight_decay))]
    }
    #[cfg(feature = "cuda")]
    fn launch(&self, on: Launch, [p, g]: [&Tensor; 2], [p_out]: [&Tensor; 1]) -> Result<()> {
        let (lr, wd) = (self.lr as f32, self.weight_decay as f32);
        on.run(on.optimizer()?.sgd, (p, g, p_out, lr, wd, on.n))
    }
}

/// [`SgdStep`] with a momentum buffer: inputs `[param, grad, buf]`, outputs `[param, buf]`.
#[derive(Clone, Copy)]
struct SgdMomentum(SgdStep);

impl ElementwiseOp<3, 2> for SgdMomentum {
    fn name(&self) -> &'static str {
        "sgd_step"
    }
    #[inline(always)]
    fn compute<A: Accumulator>(&self, [p, g, buf]: [A; 3]) -> [A; 2] {
        let [lr, momentum, wd] = [self.0.lr, self.0.momentum, self.0.weight_decay].map(A::from_f64);
        let (p, buf) = formula::sgd_momentum(p, g, buf, lr, momentum, wd);
        [p, buf]
    }
    #[cfg(feature = "cuda")]
    fn launch(&self, on: Launch, [p, g, buf]: [&Tensor; 3], [p_out, buf_out]: [&Tensor; 2]) -> Result<()> {
        let [lr, momentum, wd] = [self.0.lr, self.0.momentum, self.0.weight_decay].map(|v| v as f32);
        on.run(on.optimizer()?.sgd_momentum, (p, g, buf, p_out, buf_out, lr, momentum, wd, on.n))
    }
}

/// An [`AdamStep`] by its per-step scalars (computed once, not per element): inputs
/// `[param, grad, m, v]`, outputs `[param, m, v]`.
#[derive(Clone, Copy)]
struct Adam(AdamCoefficients<f64>);

impl ElementwiseOp<4, 3> for Adam {
    fn name(&self) -> &'static str {
        "adam_step"
    }
    #[inline(always)]
    fn compute<A: Accumulator>(&self, [p, g, m, v]: [A; 4]) -> [A; 3] {
        let (p, m, v) = formula::adam(p, g, m, v, &self.0.map(A::from_f64));
        [p, m, v]
    }
    #[cfg(feature = "cuda")]
    fn launch(&self, on: Launch, [p, g, m, v]: [&Tensor; 4], [p_out, m_out, v_out]: [&Tensor; 3]) -> Result<()> {
        let [b1, one_minus_b1, b2, one_minus_b2, eps, lr_wd, step_size, inv_sqrt_bias2] =
            self.0.to_array().map(|c| c as f32);
        let adam = on.optimizer()?.adam;
        on.run(
            adam,
            (
                p,
                g,
                m,
                v,
                p_out,
                m_out,
                v_out,
                b1,
                one_minus_b1,
                b2,
                one_minus_b2,
                eps,
                lr_wd,
                step_size,
                inv_sqrt_bias2,
                on.n,
            ),
        )
    }
}

/// One layout for every operand, in a dtype the optimizers implement on that device.
fn check_operands(op: &'static str, tensors: &[&Tensor]) -> Result<()> {
    check::same_layout(op, tensors)?;
    let (dtype, device) = (tensors[0].dtype(), tensors[0].device());
    match (dtype, device) {
        (DType::F32, _) | (DType::F64, Device::Cpu) => Ok(()),
        _ => Err(Error::UnsupportedDType { op, dtype, device }),
    }
}

/// One SGD step, in place: updates `param` (and `momentum_buf`, which `step.momentum > 0`
/// requires and `momentum == 0` forbids) from `grad`.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let p = Tensor::from_vec(vec![1.0f32, -2.0], [2], Device::Cpu)?;
/// let g = Tensor::from_vec(vec![0.5f32, 0.25], [2], Device::Cpu)?;
/// let buf = Tensor::from_vec(vec![0.0f32; 2], [2], Device::Cpu)?;
/// let step = ops::SgdStep { lr: 0.5, momentum: 0.9, weight_decay: 0.0 };
/// ops::sgd_step(&p, &g, Some(&buf), &step)?;
/// assert_eq!(buf.to_vec::<f32>()?, [0.5, 0.25]);
/// assert_eq!(p.to_vec::<f32>()?, [0.75, -2.125]);
/// # Ok(()) }
/// ```
pub fn sgd_step(param: &Tensor, grad: &Tensor, momentum_buf: Option<&Tensor>, step: &SgdStep) -> Result<()> {
    let op = step.name();
    step.validate()?;
    match (momentum_buf, step.uses_buffer()) {
        (Some(buf), true) => {
            check_operands(op, &[param, grad, buf])?;
            run(SgdMomentum(*step), [param, grad, buf], [param, buf])
        }
        (None, false) => {
            check_operands(op, &[param, grad])?;
            run(*step, [param, grad], [param])
        }
        (Some(_), false) => {
            Err(Error::InvalidArgument { op, reason: "a momentum buffer was given, but momentum is 0".into() })
        }
        (None, true) => {
            Err(Error::InvalidArgument { op, reason: format!("momentum {} needs a momentum buffer", step.momentum) })
        }
    }
}

/// One Adam (AdamW) step in one fused pass, in place: updates `param` and the moments `m` and
/// `v` (zeros before the first step) from `grad`.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let p = Tensor::from_vec(vec![1.0f64, -1.0], [2], Device::Cpu)?;
/// let g = Tensor::from_vec(vec![0.5f64, -3.0], [2], Device::Cpu)?;
/// let (m, v) = (Tensor::from_vec(vec![0.0f64; 2], [2], Device::Cpu)?, Tensor::from_vec(vec![0.0f64; 2], [2], Device::Cpu)?);
/// let step = ops::AdamStep { lr: 0.1, beta1: 0.9, beta2: 0.999, eps: 0.0, weight_decay: 0.0, step: 1 };
/// ops::adam_step(&p, &g, &m, &v, &step)?;
/// // The first bias-corrected step moves each parameter by lr against its gradient's sign.
/// let p = p.to_vec::<f64>()?;
/// assert!((p[0] - 0.9).abs() < 1e-12 && (p[1] + 0.9).abs() < 1e-12);
/// # Ok(()) }
/// ```
pub fn adam_step(param: &Tensor, grad: &Tensor, m: &Tensor, v: &Tensor, step: &AdamStep) -> Result<()> {
    step.validate()?;
    check_operands("adam_step", &[param, grad, m, v])?;
    run(Adam(step.coefficients()), [param, grad, m, v], [param, m, v])
}
