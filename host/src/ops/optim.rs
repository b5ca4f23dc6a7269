//! Optimizer steps that update parameters in place on their device: SGD (plain or with
//! momentum) and Adam (AdamW with weight decay). Each is one fused kernel on CUDA and one pass on
//! the CPU, and both run the formulas of `opsmith_kernels::optim` with the same operations (FMA,
//! multiply, divide, square root, all correctly rounded), so CUDA and the CPU give the same bits
//! for f32.
//!
//! Parameter, gradient and state share one dtype, shape and device: f32 on CUDA, f32 or f64 on
//! the CPU. Every tensor written (parameter, momentum buffer, moments) has its version bumped,
//! so autograd notices a saved tensor updated before backward.
use super::{Elementwise, check, run};
use crate::{DType, Device, Error, Result, Tensor};
use opsmith_kernels::optim::AdamCoefficients;

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
    pub(crate) fn uses_buffer(&self) -> bool {
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
    pub(crate) fn coefficients(&self) -> AdamCoefficients<f64> {
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
    let op = Elementwise::Sgd(*step);
    step.validate()?;
    let (inputs, outputs) = match (momentum_buf, step.uses_buffer()) {
        (Some(buf), true) => (vec![param, grad, buf], vec![param, buf]),
        (None, false) => (vec![param, grad], vec![param]),
        (Some(_), false) => {
            return Err(Error::InvalidArgument {
                op: op.name(),
                reason: "a momentum buffer was given, but momentum is 0".into(),
            });
        }
        (None, true) => {
            return Err(Error::InvalidArgument {
                op: op.name(),
                reason: format!("momentum {} needs a momentum buffer", step.momentum),
            });
        }
    };
    check_operands(op.name(), &inputs)?;
    run(op, &inputs, &outputs)
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
    let op = Elementwise::Adam(*step);
    step.validate()?;
    check_operands(op.name(), &[param, grad, m, v])?;
    run(op, &[param, grad, m, v], &[param, m, v])
}
