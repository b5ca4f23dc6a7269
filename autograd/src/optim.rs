//! Optimizers that update parameters in place on their device: [`Sgd`] (with optional momentum)
//! and [`Adam`] (AdamW with weight decay), each one fused kernel per parameter on CUDA.
//!
//! In-place updates bump the parameters' storage versions, so a tape that still holds the old
//! values for a backward reports [`Error::SavedTensorModified`](crate::Error) instead of
//! computing wrong gradients.
//!
//! [`Adam`] is capturable (as PyTorch's `capturable=True`): its step count and learning rate
//! live on the parameters' device ([`AdamState`]), and a step is kernel launches only, so a
//! training step recorded into a CUDA graph replays correct Adam steps, step 1000 as step 1,
//! and picks up a learning rate changed with [`Adam::set_lr`] between replays. Eager steps run
//! the very same arithmetic as replayed ones.
//!
//! ```
//! # fn main() -> opsmith_autograd::Result<()> {
//! use opsmith_autograd::optim::{Adam, AdamConfig, Optimizer};
//! use opsmith_autograd::{Tape, ops};
//! use opsmith_host::{Device, Tensor};
//! let tape = Tape::new();
//! let w = tape.var(Tensor::from_vec(vec![3.0f32, -2.0], [2], Device::Cpu)?);
//! let mut adam = Adam::new(vec![w.clone()], AdamConfig { lr: 0.1, ..AdamConfig::default() })?;
//! for _ in 0..100 {
//!     let loss = ops::sum(&ops::mul(&w, &w)?)?; // minimum at 0
//!     let grads = tape.backward(&loss)?;
//!     adam.step(&grads)?;
//! }
//! assert!(w.value().to_vec::<f32>()?.iter().all(|v| v.abs() < 0.1));
//! # Ok(()) }
//! ```
use crate::tape::{Gradients, Var};
use crate::{Error, Result};
use opsmith_host::ops::{AdamHyper, AdamState, AdamTensors};
use opsmith_host::{Device, Tensor, ops};

/// What every optimizer does: one update from the gradients of a backward.
pub trait Optimizer {
    /// Updates every parameter that has a gradient in `grads`; parameters without one are left
    /// as they are.
    fn step(&mut self, grads: &Gradients) -> Result<()>;

    /// The parameters it updates.
    fn parameters(&self) -> &[Var];
}

/// The parameters an optimizer may update: floating-point tensors, each listed once (a
/// parameter listed twice would be stepped twice a step, or, for a grouped launch, written by
/// two threads at once).
fn check_parameters(what: &'static str, params: &[Var]) -> Result<()> {
    for (i, p) in params.iter().enumerate() {
        let dtype = p.value().dtype();
        if !dtype.is_float() {
            return Err(Error::InvalidConfig {
                what,
                reason: format!("parameter {i} is a {dtype} tensor; only floating-point parameters can be trained"),
            });
        }
        if let Some(j) = params[..i].iter().position(|q| q.id() == p.id() || q.value().shares_storage(p.value())) {
            return Err(Error::InvalidConfig {
                what,
                reason: format!("parameters {j} and {i} are the same tensor or share memory; list each parameter once"),
            });
        }
    }
    Ok(())
}

fn check_hyper(what: &'static str, name: &str, value: f64, ok: bool) -> Result<()> {
    if value.is_finite() && ok {
        Ok(())
    } else {
        Err(Error::InvalidConfig { what, reason: format!("{name} = {value} is out of range") })
    }
}

/// Stochastic gradient descent: `p -= lr·(g + wd·p)`, or with momentum `μ`:
/// `buf = μ·buf + (g + wd·p)`, `p -= lr·buf`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdConfig {
    /// Learning rate.
    pub lr: f64,
    /// Momentum `μ` in `[0, 1)`; 0 turns it off.
    pub momentum: f64,
    /// L2 weight decay added to the gradient.
    pub weight_decay: f64,
}

impl Default for SgdConfig {
    fn default() -> Self {
        SgdConfig { lr: 0.01, momentum: 0.0, weight_decay: 0.0 }
    }
}

/// SGD over a set of parameters; see [`SgdConfig`].
///
/// Its learning rate, momentum and weight decay are kernel parameters: a CUDA graph that
/// captures an SGD step (`opsmith_host::cuda::Graph`) replays it with the values it had then.
/// To change the learning rate between replays, capture again, or use [`Adam`], which keeps its
/// learning rate and step count in device memory.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::optim::{Optimizer, Sgd, SgdConfig};
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let w = tape.var(Tensor::from_vec(vec![1.0f32], [1], Device::Cpu)?);
/// let mut sgd = Sgd::new(vec![w.clone()], SgdConfig { lr: 0.25, ..SgdConfig::default() })?;
/// let grads = tape.backward(&ops::sum(&ops::mul(&w, &w)?)?)?; // d/dw w² = 2
/// sgd.step(&grads)?;
/// assert_eq!(w.value().to_vec::<f32>()?, [0.5]);
/// # Ok(()) }
/// ```
pub struct Sgd {
    params: Vec<Var>,
    momentum: Vec<Option<Tensor>>,
    config: SgdConfig,
}

impl Sgd {
    /// SGD for `params` (their momentum buffers, if any, are allocated on their devices).
    /// `Error::InvalidConfig` for a hyperparameter out of range, a parameter that is not
    /// floating-point, or one listed twice (or sharing memory with another).
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, optim::{Sgd, SgdConfig}};
    /// use opsmith_host::{Device, Tensor};
    /// let w = Tape::new().var(Tensor::from_vec(vec![1.0f32], [1], Device::Cpu)?);
    /// assert!(Sgd::new(vec![w.clone()], SgdConfig { momentum: 0.9, ..SgdConfig::default() }).is_ok());
    /// assert!(Sgd::new(vec![w], SgdConfig { lr: -1.0, ..SgdConfig::default() }).is_err());
    /// # Ok(()) }
    /// ```
    pub fn new(params: Vec<Var>, config: SgdConfig) -> Result<Sgd> {
        check_hyper("Sgd", "lr", config.lr, config.lr >= 0.0)?;
        check_hyper("Sgd", "momentum", config.momentum, (0.0..1.0).contains(&config.momentum))?;
        check_hyper("Sgd", "weight_decay", config.weight_decay, config.weight_decay >= 0.0)?;
        check_parameters("Sgd", &params)?;
        let momentum = params
            .iter()
            .map(|p| {
                let t = p.value();
                (config.momentum > 0.0).then(|| Tensor::zeros(t.shape().clone(), t.dtype(), t.device())).transpose()
            })
            .collect::<opsmith_host::Result<_>>()?;
        Ok(Sgd { params, momentum, config })
    }
}

impl Optimizer for Sgd {
    fn step(&mut self, grads: &Gradients) -> Result<()> {
        let step =
            ops::SgdStep { lr: self.config.lr, momentum: self.config.momentum, weight_decay: self.config.weight_decay };
        for (p, buf) in self.params.iter().zip(&self.momentum) {
            if let Some(g) = grads.get(p) {
                ops::sgd_step(p.value(), g, buf.as_ref(), &step)?;
            }
        }
        Ok(())
    }

    fn parameters(&self) -> &[Var] {
        &self.params
    }
}

/// Adam's hyperparameters; `weight_decay > 0` makes it AdamW (decoupled decay).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamConfig {
    /// Learning rate.
    pub lr: f64,
    /// Decay of the first moment, in `[0, 1)`.
    pub beta1: f64,
    /// Decay of the second moment, in `[0, 1)`.
    pub beta2: f64,
    /// Added to the root of the second moment.
    pub eps: f64,
    /// Decoupled weight decay (`p -= lr·wd·p`).
    pub weight_decay: f64,
}

impl Default for AdamConfig {
    /// PyTorch's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, no weight decay.
    fn default() -> Self {
        AdamConfig { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 }
    }
}

/// Adam over a set of parameters, fused: each parameter's update reads `p`, `g`, `m`, `v` and
/// writes `p`, `m`, `v` in one pass, and one kernel updates up to four parameters. See
/// [`AdamConfig`].
///
/// Adam is capturable: its step count and learning rate live on the device, in one
/// [`AdamState`] per device that holds parameters. A step advances each state once (one tiny
/// kernel: the step count, the betas' powers and that step's coefficients, all on the device),
/// then runs one fused kernel per four parameters that reads the coefficients from device memory;
/// a device whose parameters are four or fewer and small (a small model's) takes one kernel for
/// both. No step reads the device or copies to it, so a CUDA graph can record it, and each replay is
/// a correct next step. [`set_lr`](Adam::set_lr) writes the learning rate on the device for the
/// next step, eager or replayed.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::optim::{Adam, AdamConfig, Optimizer};
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let w = tape.var(Tensor::from_vec(vec![1.0f32, -1.0], [2], Device::cuda_if_available())?);
/// let mut adam = Adam::new(vec![w.clone()], AdamConfig { lr: 0.1, ..AdamConfig::default() })?;
/// let grads = tape.backward(&ops::sum(&ops::mul(&w, &w)?)?)?;
/// adam.step(&grads)?;
/// // A schedule lowers the learning rate; the device state follows.
/// adam.set_lr(0.0)?;
/// let before = w.value().to_vec::<f32>()?;
/// adam.step(&grads)?;
/// assert_eq!(w.value().to_vec::<f32>()?, before);
/// // The count kept on the device, which graph replays advance too.
/// assert_eq!((adam.steps(), adam.device_steps()?), (2, 2));
/// # Ok(()) }
/// ```
pub struct Adam {
    params: Vec<Var>,
    moments: Vec<(Tensor, Tensor)>,
    /// One per device that holds parameters, in order of first appearance.
    states: Vec<AdamState>,
    /// For each parameter, the index of its device's state.
    state_of: Vec<usize>,
    config: AdamConfig,
    step: u64,
}

impl Adam {
    /// Adam for `params`, with zeroed moments on the parameters' devices and a step state
    /// ([`AdamState`]) on each of those devices. `Error::InvalidConfig` for a hyperparameter
    /// out of range (an `eps` that is 0 in f32, where the kernels add it, included), a parameter
    /// that is not floating-point, or one listed twice (or sharing memory with another).
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, optim::{Adam, AdamConfig}};
    /// use opsmith_host::{Device, Tensor};
    /// let w = Tape::new().var(Tensor::from_vec(vec![1.0f32], [1], Device::Cpu)?);
    /// let adam = Adam::new(vec![w], AdamConfig { weight_decay: 0.01, ..AdamConfig::default() })?;
    /// assert_eq!(adam.steps(), 0);
    /// # Ok(()) }
    /// ```
    pub fn new(params: Vec<Var>, config: AdamConfig) -> Result<Adam> {
        check_hyper("Adam", "lr", config.lr, config.lr >= 0.0)?;
        check_hyper("Adam", "beta1", config.beta1, (0.0..1.0).contains(&config.beta1))?;
        check_hyper("Adam", "beta2", config.beta2, (0.0..1.0).contains(&config.beta2))?;
        // The kernels add eps in f32: one that rounds to 0 there divides 0 by 0 for a
        // parameter whose gradient has been 0 so far.
        check_hyper("Adam", "eps", config.eps, config.eps > 0.0 && config.eps as f32 > 0.0)?;
        check_hyper("Adam", "weight_decay", config.weight_decay, config.weight_decay >= 0.0)?;
        check_parameters("Adam", &params)?;
        let moments = params
            .iter()
            .map(|p| {
                let t = p.value();
                Ok((
                    Tensor::zeros(t.shape().clone(), t.dtype(), t.device())?,
                    Tensor::zeros(t.shape().clone(), t.dtype(), t.device())?,
                ))
            })
            .collect::<Result<_>>()?;
        let mut devices: Vec<Device> = Vec::new();
        let state_of = params
            .iter()
            .map(|p| {
                let device = p.value().device();
                devices.iter().position(|&d| d == device).unwrap_or_else(|| {
                    devices.push(device);
                    devices.len() - 1
                })
            })
            .collect();
        let states = devices.into_iter().map(|d| AdamState::new(config.lr, d)).collect::<opsmith_host::Result<_>>()?;
        Ok(Adam { params, moments, states, state_of, config, step: 0 })
    }

    /// Steps taken so far, counted on the host: the [`step`](Optimizer::step) calls. A CUDA
    /// graph that recorded a step replays it without calling `step`, so under graph replay
    /// this counts only the eager steps and the one captured; [`device_steps`](Self::device_steps)
    /// is the authoritative count.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, ops, optim::{Adam, AdamConfig, Optimizer}};
    /// use opsmith_host::{Device, Tensor};
    /// let tape = Tape::new();
    /// let w = tape.var(Tensor::from_vec(vec![1.0f32], [1], Device::Cpu)?);
    /// let mut adam = Adam::new(vec![w.clone()], AdamConfig::default())?;
    /// adam.step(&tape.backward(&ops::sum(&w)?)?)?;
    /// assert_eq!(adam.steps(), 1);
    /// # Ok(()) }
    /// ```
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// Steps taken so far, counted on the device: eager steps and graph replays alike (on the
    /// first device, when the parameters are on several). It reads the device, so it waits for
    /// the work queued before it (and fails inside a graph capture). With no parameters, the
    /// host's count.
    pub fn device_steps(&self) -> Result<u64> {
        match self.states.first() {
            Some(state) => Ok(state.step()?),
            None => Ok(self.step),
        }
    }

    /// The hyperparameters; `lr` is the one last set.
    pub fn config(&self) -> &AdamConfig {
        &self.config
    }

    /// Sets the learning rate (finite, non-negative) from the next step on, in the config and
    /// on every device. On CUDA it copies the value to the device: call it between graph
    /// replays (or eager steps), not inside a capture.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Error, Tape, optim::{Adam, AdamConfig}};
    /// use opsmith_host::{Device, Tensor};
    /// let w = Tape::new().var(Tensor::from_vec(vec![1.0f32], [1], Device::Cpu)?);
    /// let mut adam = Adam::new(vec![w], AdamConfig::default())?;
    /// adam.set_lr(1e-4)?;
    /// assert_eq!(adam.config().lr, 1e-4);
    /// assert!(matches!(adam.set_lr(f64::INFINITY), Err(Error::InvalidConfig { what: "Adam", .. })));
    /// # Ok(()) }
    /// ```
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        check_hyper("Adam", "lr", lr, lr >= 0.0)?;
        for state in &self.states {
            state.set_lr(lr)?;
        }
        self.config.lr = lr;
        Ok(())
    }
}

impl Optimizer for Adam {
    /// Advances each device's [`AdamState`] one step and updates every parameter that has a
    /// gradient from it ([`ops::adam_advance_step_group`]): on CUDA one launch for both when
    /// the device's parameters are few and small (at most four, of at most 1024 packs of 4
    /// elements, each parameter rounded up to whole packs), else an advance and a launch per
    /// four parameters.
    fn step(&mut self, grads: &Gradients) -> Result<()> {
        let c = self.config;
        let hyper = AdamHyper { beta1: c.beta1, beta2: c.beta2, eps: c.eps, weight_decay: c.weight_decay };
        for (k, state) in self.states.iter().enumerate() {
            let slots: Vec<AdamTensors<'_>> = self
                .params
                .iter()
                .zip(&self.moments)
                .zip(&self.state_of)
                .filter(|&(_, &of)| of == k)
                .filter_map(|((p, (m, v)), _)| grads.get(p).map(|grad| AdamTensors { param: p.value(), grad, m, v }))
                .collect();
            ops::adam_advance_step_group(&slots, state, &hyper)?;
        }
        // Counted once every state has moved: a refused step leaves the count where it was.
        self.step += 1;
        Ok(())
    }

    fn parameters(&self) -> &[Var] {
        &self.params
    }
}
