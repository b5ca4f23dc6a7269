//! Optimizer steps that update parameters in place on their device: SGD (plain or with
//! momentum) and Adam (AdamW with weight decay). Each is one fused kernel on CUDA and one pass on
//! the CPU, and both run the formulas of `opsmith_kernels::optim` with the same operations (FMA,
//! multiply, divide, square root, all correctly rounded), so CUDA and the CPU give the same bits
//! for f32.
//!
//! Parameter, gradient and state share one dtype, shape and device: f32 on CUDA, f32 or f64 on
//! the CPU. Every tensor written (parameter, momentum buffer, moments) has its version bumped,
//! so autograd notices a saved tensor updated before backward.
//!
//! Adam comes in two forms. [`adam_step`] takes the step number and learning rate from the
//! caller and passes the step's scalars to its kernel. [`adam_step_device`] reads them from an
//! [`AdamState`] kept on the tensors' device, which [`AdamState::advance`] moves on one step
//! there: on CUDA both are kernel launches and nothing else, so they can be recorded into a
//! CUDA graph whose replays keep counting steps and see a learning rate changed between
//! replays ([`AdamState::set_lr`]).
use super::check;
#[cfg(feature = "cuda")]
use super::cuda::Launch;
use super::elementwise::{ElementwiseOp, run};
use crate::dtype::Accumulator;
use crate::{DType, Device, Error, Result, Tensor};
use opsmith_kernels::optim::{self as formula};
pub use opsmith_kernels::optim::{AdamCoefficients, AdamHyper, AdamProgress};
use parking_lot::Mutex;
#[cfg(feature = "cuda")]
use std::sync::atomic::{AtomicBool, Ordering};

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
        let hyper = AdamHyper { beta1: self.beta1, beta2: self.beta2, eps: self.eps, weight_decay: self.weight_decay };
        validate_hyper(op, &hyper)?;
        if self.step == 0 {
            return Err(Error::InvalidArgument { op, reason: "step counts from 1, got 0".into() });
        }
        Ok(())
    }

    /// The per-step scalars, in f64; each device rounds them to its arithmetic type.
    fn coefficients(&self) -> AdamCoefficients<f64> {
        let t = self.step as f64;
        let hyper = AdamHyper { beta1: self.beta1, beta2: self.beta2, eps: self.eps, weight_decay: self.weight_decay };
        AdamCoefficients::from_powers(&hyper, self.lr, self.beta1.powf(t), self.beta2.powf(t))
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

/// An Adam step by its per-step scalars (computed once, not per element): inputs
/// `[param, grad, m, v]`, outputs `[param, m, v]`. `op` is the public function that runs it.
#[derive(Clone, Copy)]
struct Adam {
    op: &'static str,
    coefficients: AdamCoefficients<f64>,
}

impl ElementwiseOp<4, 3> for Adam {
    fn name(&self) -> &'static str {
        self.op
    }
    #[inline(always)]
    fn compute<A: Accumulator>(&self, [p, g, m, v]: [A; 4]) -> [A; 3] {
        let (p, m, v) = formula::adam(p, g, m, v, &self.coefficients.map(A::from_f64));
        [p, m, v]
    }
    #[cfg(feature = "cuda")]
    fn launch(&self, on: Launch, [p, g, m, v]: [&Tensor; 4], [p_out, m_out, v_out]: [&Tensor; 3]) -> Result<()> {
        let [b1, one_minus_b1, b2, one_minus_b2, eps, lr_wd, step_size, inv_sqrt_bias2] =
            self.coefficients.to_array().map(|c| c as f32);
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
    run(Adam { op: "adam_step", coefficients: step.coefficients() }, [param, grad, m, v], [param, m, v])
}

/// The scalars that an Adam step takes from one step to the next, kept on one device: the
/// step count, the running powers β1^step and β2^step and the learning rate
/// ([`AdamProgress`], in f64), and the coefficients of the current step
/// ([`AdamCoefficients`], each rounded to f32 on CUDA). [`adam_step_device`] reads the
/// coefficients there; [`advance`](Self::advance) makes the next step's from the progress.
///
/// This is what makes Adam *capturable* (as PyTorch's `capturable=True`): on CUDA, `advance`
/// and `adam_step_device` launch kernels on the device's current stream and do nothing else (no
/// host read or copy, no synchronization, no allocation), so a CUDA graph records them, and
/// each replay advances the step count on the device and uses the learning rate last written
/// with [`set_lr`](Self::set_lr).
///
/// The CPU runs the same arithmetic ([`AdamProgress::advance`]) and rounds the coefficients the
/// same way, so f32 parameters get the same bits on both devices.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::ops::{self, AdamHyper, AdamState};
/// use opsmith_host::{Device, Tensor};
/// let device = Device::cuda_if_available();
/// let p = Tensor::from_vec(vec![1.0f32, -1.0], [2], device)?;
/// let g = Tensor::from_vec(vec![0.5f32, -3.0], [2], device)?;
/// let (m, v) = (Tensor::from_vec(vec![0.0f32; 2], [2], device)?, Tensor::from_vec(vec![0.0f32; 2], [2], device)?);
/// let hyper = AdamHyper { beta1: 0.9, beta2: 0.999, eps: 0.0, weight_decay: 0.0 };
/// let state = AdamState::new(0.125, device)?;
/// state.advance(&hyper)?; // step 1
/// ops::adam_step_device(&p, &g, &m, &v, &state)?;
/// // The first bias-corrected step moves each parameter by lr against its gradient's sign.
/// let after_one = p.to_vec::<f32>()?;
/// assert!((after_one[0] - 0.875).abs() < 1e-6 && (after_one[1] + 0.875).abs() < 1e-6);
/// state.set_lr(0.0)?; // from the next step on
/// state.advance(&hyper)?;
/// ops::adam_step_device(&p, &g, &m, &v, &state)?;
/// assert_eq!(p.to_vec::<f32>()?, after_one);
/// assert_eq!((state.step()?, state.lr()?), (2, 0.0));
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct AdamState {
    device: Device,
    place: Place,
}

/// Where an [`AdamState`] keeps its values.
#[derive(Debug)]
enum Place {
    /// In host memory.
    Cpu(Mutex<CpuAdam>),
    /// In device memory: `progress` an f64 tensor of 4 elements ([`AdamProgress`] in field
    /// order), `coefficients` an f32 tensor of 8 ([`AdamCoefficients`] in field order).
    /// `advanced` says, without reading the device, whether `coefficients` was written yet.
    /// `empty` is an f32 tensor of no elements, for the unused slots of a grouped step.
    #[cfg(feature = "cuda")]
    Cuda { progress: Tensor, coefficients: Tensor, advanced: AtomicBool, empty: Tensor },
}

#[derive(Debug)]
struct CpuAdam {
    progress: AdamProgress,
    /// The current step's, in f64 (f32 steps round them as the GPU's do); `None` before the
    /// first step.
    coefficients: Option<AdamCoefficients<f64>>,
}

/// Coefficients that leave `p`, `m` and `v` as they are (`m' = m`, `v' = v`, a denominator of
/// 1 and a step size of 0): what the device holds until the first `advance` has run, so that a
/// step that comes too early (after a capture that recorded the advance, before any replay)
/// changes nothing.
#[cfg(feature = "cuda")]
const NO_STEP: AdamCoefficients<f32> = AdamCoefficients {
    beta1: 1.0,
    one_minus_beta1: 0.0,
    beta2: 1.0,
    one_minus_beta2: 0.0,
    eps: 1.0,
    lr_weight_decay: 0.0,
    step_size: 0.0,
    inv_sqrt_bias2: 0.0,
};

impl AdamState {
    /// The state before the first step, with learning rate `lr` (finite, non-negative), on
    /// `device`. On CUDA this allocates its two small tensors and loads the optimizer kernels,
    /// so it belongs before a graph capture, not inside one.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, ops::AdamState};
    /// let state = AdamState::new(1e-3, Device::Cpu)?;
    /// assert_eq!((state.step()?, state.lr()?), (0, 1e-3));
    /// assert!(AdamState::new(f64::NAN, Device::Cpu).is_err());
    /// # Ok(()) }
    /// ```
    pub fn new(lr: f64, device: Device) -> Result<AdamState> {
        let op = "AdamState::new";
        non_negative(op, "lr", lr)?;
        let progress = AdamProgress::start(lr);
        let place = match device {
            Device::Cpu => Place::Cpu(Mutex::new(CpuAdam { progress, coefficients: None })),
            #[cfg(feature = "cuda")]
            Device::Cuda(ordinal) => {
                // Loaded now, so that the first step does not load a module (in a capture, say).
                crate::cuda::CudaDevice::get(ordinal)?.module(opsmith_kernels::Family::Optimizer)?;
                Place::Cuda {
                    progress: Tensor::from_vec(progress.to_array().to_vec(), [4], device)?,
                    coefficients: Tensor::from_vec(NO_STEP.to_array().to_vec(), [8], device)?,
                    advanced: AtomicBool::new(false),
                    empty: Tensor::empty([0], DType::F32, device)?,
                }
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => return Err(Error::cuda_disabled(op, device)),
        };
        Ok(AdamState { device, place })
    }

    /// The device the state lives on; [`adam_step_device`] takes tensors on this device only.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Moves the state on one step with the hyperparameters `hyper` (betas in [0, 1), `eps` and
    /// `weight_decay` finite and non-negative): counts the step, multiplies the betas into
    /// their powers, and makes the step's coefficients from them and the current learning
    /// rate ([`AdamProgress::advance`]). Call it once per optimizer step, before the
    /// [`adam_step_device`] calls of that step.
    ///
    /// On CUDA this is one kernel launch on the current stream (capturable); on the CPU it
    /// runs at once. The bias corrections assume the same betas every step.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, ops::{AdamHyper, AdamState}};
    /// let state = AdamState::new(0.5, Device::Cpu)?;
    /// let hyper = AdamHyper { beta1: 0.5, beta2: 0.75, eps: 1e-8, weight_decay: 0.25 };
    /// state.advance(&hyper)?;
    /// let c = state.coefficients()?.expect("advanced once");
    /// assert_eq!((c.step_size, c.inv_sqrt_bias2, c.lr_weight_decay), (1.0, 2.0, 0.125));
    /// assert!(state.advance(&AdamHyper { beta1: 1.0, ..hyper }).is_err());
    /// # Ok(()) }
    /// ```
    pub fn advance(&self, hyper: &AdamHyper) -> Result<()> {
        let op = "AdamState::advance";
        validate_hyper(op, hyper)?;
        match &self.place {
            Place::Cpu(cpu) => {
                check::cpu_work(op)?;
                let mut cpu = cpu.lock();
                let coefficients = cpu.progress.advance(hyper);
                cpu.coefficients = Some(coefficients);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Place::Cuda { progress, coefficients, advanced, .. } => {
                launch_advance(progress, coefficients, hyper)?;
                advanced.store(true, Ordering::Release);
                Ok(())
            }
        }
    }

    /// Sets the learning rate (finite, non-negative) of the steps after the next
    /// [`advance`](Self::advance). On CUDA it copies 8 bytes to the device, ordered after the
    /// work queued before it: call it between graph replays, not inside a capture (where it
    /// fails with `Error::Capture`).
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, ops::AdamState};
    /// let state = AdamState::new(1e-3, Device::Cpu)?;
    /// state.set_lr(5e-4)?;
    /// assert_eq!(state.lr()?, 5e-4);
    /// assert!(state.set_lr(-1.0).is_err());
    /// # Ok(()) }
    /// ```
    pub fn set_lr(&self, lr: f64) -> Result<()> {
        non_negative("AdamState::set_lr", "lr", lr)?;
        match &self.place {
            Place::Cpu(cpu) => {
                cpu.lock().progress.lr = lr;
                Ok(())
            }
            // The learning rate is the last of the four values.
            #[cfg(feature = "cuda")]
            Place::Cuda { progress, .. } => progress.flat_slice(3, 1)?.write_values(&[lr]),
        }
    }

    /// The progress: steps taken, the betas' running powers, the learning rate. On CUDA this
    /// reads the device, so it waits for the work queued before it (and fails inside a graph
    /// capture).
    pub fn progress(&self) -> Result<AdamProgress> {
        match &self.place {
            Place::Cpu(cpu) => Ok(cpu.lock().progress),
            #[cfg(feature = "cuda")]
            Place::Cuda { progress, .. } => {
                let values = progress.to_vec::<f64>()?;
                let array = <[f64; 4]>::try_from(values).map_err(|v| Error::InvalidArgument {
                    op: "AdamState::progress",
                    reason: format!("the state holds {} values, not 4", v.len()),
                })?;
                Ok(AdamProgress::from_array(array))
            }
        }
    }

    /// The steps taken: the [`advance`](Self::advance) calls so far, including those replayed
    /// in a CUDA graph. Reads the device, as [`progress`](Self::progress).
    pub fn step(&self) -> Result<u64> {
        // Exact: an f64 counts steps exactly up to 2^53.
        Ok(self.progress()?.step as u64)
    }

    /// The learning rate of the next step. Reads the device, as [`progress`](Self::progress).
    pub fn lr(&self) -> Result<f64> {
        Ok(self.progress()?.lr)
    }

    /// The coefficients an f32 step uses now, each rounded from f64 to f32 (as CUDA keeps
    /// them); `None` before the first [`advance`](Self::advance). Reads the device, as
    /// [`progress`](Self::progress).
    pub fn coefficients(&self) -> Result<Option<AdamCoefficients<f32>>> {
        match &self.place {
            Place::Cpu(cpu) => Ok(cpu.lock().coefficients.map(|c| c.map(|x| x as f32))),
            #[cfg(feature = "cuda")]
            Place::Cuda { coefficients, advanced, .. } => {
                if !advanced.load(Ordering::Acquire) {
                    return Ok(None);
                }
                let values = coefficients.to_vec::<f32>()?;
                let array = <[f32; 8]>::try_from(values).map_err(|v| Error::InvalidArgument {
                    op: "AdamState::coefficients",
                    reason: format!("the state holds {} coefficients, not 8", v.len()),
                })?;
                Ok(Some(AdamCoefficients::from_array(array)))
            }
        }
    }
}

/// The betas in [0, 1), `eps` and `weight_decay` finite and non-negative.
fn validate_hyper(op: &'static str, hyper: &AdamHyper) -> Result<()> {
    non_negative(op, "eps", hyper.eps)?;
    non_negative(op, "weight_decay", hyper.weight_decay)?;
    for (name, beta) in [("beta1", hyper.beta1), ("beta2", hyper.beta2)] {
        if !(0.0..1.0).contains(&beta) {
            return Err(Error::InvalidArgument { op, reason: format!("{name} must be in [0, 1), got {beta}") });
        }
    }
    Ok(())
}

/// Launches `adam_advance` over `progress` (f64, 4) and `coefficients` (f32, 8), on one thread.
#[cfg(feature = "cuda")]
fn launch_advance(progress: &Tensor, coefficients: &Tensor, hyper: &AdamHyper) -> Result<()> {
    use crate::cuda::{Grid, LaunchConfig};
    let AdamHyper { beta1, beta2, eps, weight_decay } = *hyper;
    let one_warp = Grid::Config(LaunchConfig { grid: 1, block: 32, shared_mem_bytes: 0 });
    crate::cuda::launch(
        opsmith_kernels::names::optim::F32.adam_advance,
        one_warp,
        (progress, coefficients, beta1, beta2, eps, weight_decay),
    )
}

/// One Adam (AdamW) step in one fused pass, in place, with its per-step scalars taken from
/// `state` (on the tensors' device): updates `param` and the moments `m` and `v` (zeros before
/// the first step) from `grad`, as [`adam_step`] does, with the step count and learning rate
/// that `state` holds. Call [`AdamState::advance`] once per step before it; each parameter of
/// the step then calls this.
///
/// On CUDA this is one kernel launch that reads the coefficients from device memory
/// (capturable: see [`AdamState`]). f32 parameters get the same bits on the CPU and on CUDA.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::ops::{self, AdamHyper, AdamState};
/// use opsmith_host::{Device, Error, Tensor};
/// let p = Tensor::from_vec(vec![1.0f64, -1.0], [2], Device::Cpu)?;
/// let g = Tensor::from_vec(vec![0.5f64, -3.0], [2], Device::Cpu)?;
/// let (m, v) = (Tensor::from_vec(vec![0.0f64; 2], [2], Device::Cpu)?, Tensor::from_vec(vec![0.0f64; 2], [2], Device::Cpu)?);
/// let state = AdamState::new(0.1, Device::Cpu)?;
/// // No step before the first advance.
/// let err = ops::adam_step_device(&p, &g, &m, &v, &state).unwrap_err();
/// assert!(matches!(err, Error::InvalidArgument { op: "adam_step_device", .. }));
/// state.advance(&AdamHyper { beta1: 0.9, beta2: 0.999, eps: 0.0, weight_decay: 0.0 })?;
/// ops::adam_step_device(&p, &g, &m, &v, &state)?;
/// let p = p.to_vec::<f64>()?;
/// assert!((p[0] - 0.9).abs() < 1e-12 && (p[1] + 0.9).abs() < 1e-12);
/// # Ok(()) }
/// ```
pub fn adam_step_device(param: &Tensor, grad: &Tensor, m: &Tensor, v: &Tensor, state: &AdamState) -> Result<()> {
    let op = "adam_step_device";
    check_operands(op, &[param, grad, m, v])?;
    if param.device() != state.device {
        return Err(Error::DeviceMismatch { op, lhs: param.device(), rhs: state.device });
    }
    let not_advanced =
        || Error::InvalidArgument { op, reason: "its AdamState has no step yet: call AdamState::advance first".into() };
    match &state.place {
        Place::Cpu(cpu) => {
            let coefficients = cpu.lock().coefficients.ok_or_else(not_advanced)?;
            run(Adam { op, coefficients }, [param, grad, m, v], [param, m, v])
        }
        #[cfg(feature = "cuda")]
        Place::Cuda { coefficients, advanced, .. } => {
            if !advanced.load(Ordering::Acquire) {
                return Err(not_advanced());
            }
            check::elementwise(op, &[param, grad, m, v], &[param, m, v])?;
            super::cuda::over_elements(op, param, |on| {
                on.run(on.optimizer()?.adam_device, (param, grad, m, v, param, m, v, coefficients, on.n))
            })
        }
    }
}

/// One parameter's operands in a grouped Adam step ([`adam_step_device_group`]): the parameter,
/// its gradient and its two moments, all updated in place but the gradient.
#[derive(Clone, Copy, Debug)]
pub struct AdamTensors<'a> {
    /// The parameter, updated in place.
    pub param: &'a Tensor,
    /// Its gradient, read.
    pub grad: &'a Tensor,
    /// The first moment, updated in place.
    pub m: &'a Tensor,
    /// The second moment, updated in place.
    pub v: &'a Tensor,
}

/// Parameters per launch of the grouped Adam kernel.
#[cfg(feature = "cuda")]
const GROUP_SLOTS: usize = 4;

/// [`adam_step_device`] for several parameters at once, with the same results bit for bit. On
/// CUDA each group of up to four parameters is one kernel launch instead of four, which is most
/// of the update's cost for a model of small tensors (in a replayed CUDA graph, one node instead
/// of four). The parameters may differ in shape; each one's tensors are checked as
/// [`adam_step_device`] checks them, and no two parameters may share memory
/// ([`Error::Overlap`]). Nothing runs unless every check passes.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::ops::{self, AdamHyper, AdamState, AdamTensors};
/// use opsmith_host::{DType, Device, Tensor};
/// let device = Device::cuda_if_available();
/// let w = Tensor::from_vec(vec![1.0f32, -1.0, 0.5, 2.0], [2, 2], device)?;
/// let b = Tensor::from_vec(vec![0.25f32], [1], device)?;
/// let (gw, gb) = (Tensor::from_vec(vec![0.5f32, -3.0, 1.0, 0.0], [2, 2], device)?, Tensor::from_vec(vec![-1.0f32], [1], device)?);
/// let zeros = |like: &Tensor| Tensor::zeros(like.dims(), DType::F32, device);
/// let (mw, vw, mb, vb) = (zeros(&w)?, zeros(&w)?, zeros(&b)?, zeros(&b)?);
/// let state = AdamState::new(0.125, device)?;
/// state.advance(&AdamHyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 })?;
/// ops::adam_step_device_group(
///     &[AdamTensors { param: &w, grad: &gw, m: &mw, v: &vw }, AdamTensors { param: &b, grad: &gb, m: &mb, v: &vb }],
///     &state,
/// )?;
/// // The first step moves each parameter by about lr against its gradient's sign (a zero
/// // gradient: not at all, as ε keeps 0 / 0 away).
/// let moved: Vec<f32> = w.to_vec::<f32>()?.iter().zip([1.0f32, -1.0, 0.5, 2.0]).map(|(a, b)| a - b).collect();
/// assert!(moved.iter().zip([-0.125f32, 0.125, -0.125, 0.0]).all(|(a, b)| (a - b).abs() < 1e-6));
/// assert!((b.to_vec::<f32>()?[0] - 0.375).abs() < 1e-6);
/// # Ok(()) }
/// ```
pub fn adam_step_device_group(slots: &[AdamTensors<'_>], state: &AdamState) -> Result<()> {
    let op = "adam_step_device_group";
    check_group(op, slots, state)?;
    let not_advanced =
        || Error::InvalidArgument { op, reason: "its AdamState has no step yet: call AdamState::advance first".into() };
    match &state.place {
        Place::Cpu(cpu) => {
            let coefficients = cpu.lock().coefficients.ok_or_else(not_advanced)?;
            slots
                .iter()
                .try_for_each(|s| run(Adam { op, coefficients }, [s.param, s.grad, s.m, s.v], [s.param, s.m, s.v]))
        }
        #[cfg(feature = "cuda")]
        Place::Cuda { coefficients, advanced, empty, .. } => {
            if !advanced.load(Ordering::Acquire) {
                return Err(not_advanced());
            }
            for group in slots.chunks(GROUP_SLOTS) {
                launch_group(op, group, coefficients, empty)?;
            }
            Ok(())
        }
    }
}

/// A whole Adam step: [`AdamState::advance`] with `hyper`, then [`adam_step_device_group`] over
/// `slots`, with the same results bit for bit. On CUDA, parameters that fit one launch of the
/// grouped kernel and one block (at most four, of at most 1024 packs of 4 f32 together, each
/// parameter rounded up to whole packs: up to 4096 elements, a small model's) take a single
/// launch for both, which in a captured graph is one node instead of two;
/// others take the two calls' launches. Every check of both calls comes first: on an error the
/// state has not moved either. An empty `slots` advances the state only.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::ops::{self, AdamHyper, AdamState, AdamTensors};
/// use opsmith_host::{DType, Device, Tensor};
/// let device = Device::cuda_if_available();
/// let w = Tensor::from_vec(vec![1.0f32, -1.0, 0.5], [3], device)?;
/// let g = Tensor::from_vec(vec![0.5f32, -3.0, 0.0], [3], device)?;
/// let (m, v) = (Tensor::zeros([3], DType::F32, device)?, Tensor::zeros([3], DType::F32, device)?);
/// let state = AdamState::new(0.125, device)?;
/// let hyper = AdamHyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };
/// ops::adam_advance_step_group(&[AdamTensors { param: &w, grad: &g, m: &m, v: &v }], &state, &hyper)?;
/// assert_eq!(state.step()?, 1);
/// // The first step moves each parameter by about lr against its gradient's sign.
/// let moved: Vec<f32> = w.to_vec::<f32>()?.iter().zip([1.0f32, -1.0, 0.5]).map(|(a, b)| a - b).collect();
/// assert!(moved.iter().zip([-0.125f32, 0.125, 0.0]).all(|(a, b)| (a - b).abs() < 1e-6));
/// # Ok(()) }
/// ```
pub fn adam_advance_step_group(slots: &[AdamTensors<'_>], state: &AdamState, hyper: &AdamHyper) -> Result<()> {
    let op = "adam_advance_step_group";
    validate_hyper(op, hyper)?;
    check_group(op, slots, state)?;
    #[cfg(feature = "cuda")]
    if let Place::Cuda { progress, coefficients, advanced, empty } = &state.place {
        let packs = group_packs(op, slots)?;
        if slots.is_empty() || slots.len() > GROUP_SLOTS || packs > ONE_BLOCK_PACKS {
            launch_advance(progress, coefficients, hyper)?;
            advanced.store(true, Ordering::Release);
            return slots.chunks(GROUP_SLOTS).try_for_each(|group| launch_group(op, group, coefficients, empty));
        }
        launch_group_advance(slots, packs, (progress, coefficients, empty), hyper)?;
        advanced.store(true, Ordering::Release);
        return Ok(());
    }
    state.advance(hyper)?;
    adam_step_device_group(slots, state)
}

/// The checks of a grouped step: each parameter's operands as [`adam_step_device`] checks
/// them, and no two parameters sharing memory.
fn check_group(op: &'static str, slots: &[AdamTensors<'_>], state: &AdamState) -> Result<()> {
    for AdamTensors { param, grad, m, v } in slots {
        check_operands(op, &[param, grad, m, v])?;
        if param.device() != state.device {
            return Err(Error::DeviceMismatch { op, lhs: param.device(), rhs: state.device });
        }
        check::elementwise(op, &[param, grad, m, v], &[param, m, v])?;
    }
    // Distinct parameters: what one slot writes overlaps nothing of another slot.
    for (k, slot) in slots.iter().enumerate() {
        for other in &slots[..k] {
            let clash = |writer: &AdamTensors<'_>, reader: &AdamTensors<'_>| {
                [writer.param, writer.m, writer.v]
                    .iter()
                    .any(|w| [reader.param, reader.grad, reader.m, reader.v].iter().any(|r| check::overlaps(w, r)))
            };
            if clash(slot, other) || clash(other, slot) {
                return Err(Error::Overlap { op, output: k });
            }
        }
    }
    Ok(())
}

/// The most 16-byte packs (4 f32 each) a whole step in one launch takes: one block, a thread a
/// pack.
#[cfg(feature = "cuda")]
const ONE_BLOCK_PACKS: u64 = 1024;

/// The 16-byte packs of a group's checked f32 parameters, each one's last possibly partial.
#[cfg(feature = "cuda")]
fn group_packs(op: &'static str, group: &[AdamTensors<'_>]) -> Result<u64> {
    let mut packs = 0u64;
    for s in group {
        packs += super::cuda::check_launch_len(op, s.param.elem_count(), DType::F32)?.div_ceil(4);
    }
    Ok(packs)
}

/// One launch of `adam_device_group_advance` over up to four checked f32 parameters of `packs`
/// packs (at most [`ONE_BLOCK_PACKS`]): one block, a thread a pack. `empty` fills the unused
/// slots.
#[cfg(feature = "cuda")]
fn launch_group_advance(
    group: &[AdamTensors<'_>],
    packs: u64,
    (progress, coefficients, empty): (&Tensor, &Tensor, &Tensor),
    hyper: &AdamHyper,
) -> Result<()> {
    use crate::cuda::{Grid, LaunchConfig};
    let unused = AdamTensors { param: empty, grad: empty, m: empty, v: empty };
    let slot = |k: usize| group.get(k).copied().unwrap_or(unused);
    let [a, b, c, d] = [slot(0), slot(1), slot(2), slot(3)];
    let len = |s: AdamTensors<'_>| s.param.elem_count() as u64;
    // A whole number of warps, 32 to 1024 threads (`packs <= ONE_BLOCK_PACKS`).
    let block = (packs.div_ceil(32) * 32).clamp(32, ONE_BLOCK_PACKS) as u32;
    let AdamHyper { beta1, beta2, eps, weight_decay } = *hyper;
    crate::cuda::launch(
        opsmith_kernels::names::optim::F32.adam_device_group_advance,
        Grid::Config(LaunchConfig { grid: 1, block, shared_mem_bytes: 0 }),
        (
            a.param,
            a.grad,
            a.m,
            a.v,
            len(a),
            b.param,
            b.grad,
            b.m,
            b.v,
            len(b),
            c.param,
            c.grad,
            c.m,
            c.v,
            len(c),
            d.param,
            d.grad,
            d.m,
            d.v,
            len(d),
            progress,
            coefficients,
            beta1,
            beta2,
            eps,
            weight_decay,
        ),
    )
}

/// One launch of `adam_device_group` over up to four checked f32 parameters; `empty` fills the
/// unused slots.
#[cfg(feature = "cuda")]
fn launch_group(op: &'static str, group: &[AdamTensors<'_>], coefficients: &Tensor, empty: &Tensor) -> Result<()> {
    let unused = AdamTensors { param: empty, grad: empty, m: empty, v: empty };
    let slot = |k: usize| group.get(k).copied().unwrap_or(unused);
    let [a, b, c, d] = [slot(0), slot(1), slot(2), slot(3)];
    // One thread per 16-byte pack of the group (each parameter's last pack may be partial): the
    // kernel numbers the slots' packs one after another and gives each thread one of them.
    let packs = group_packs(op, group)?;
    let len = |s: AdamTensors<'_>| s.param.elem_count() as u64;
    crate::cuda::launch(
        opsmith_kernels::names::optim::F32.adam_device_group,
        crate::cuda::Grid::covering(packs.max(1)),
        (
            a.param,
            a.grad,
            a.m,
            a.v,
            len(a),
            b.param,
            b.grad,
            b.m,
            b.v,
            len(b),
            c.param,
            c.grad,
            c.m,
            c.v,
            len(c),
            d.param,
            d.grad,
            d.m,
            d.v,
            len(d),
            coefficients,
        ),
    )
}
