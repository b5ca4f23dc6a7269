//! Optimizers that update parameters in place on their device: [`Sgd`] (with optional momentum)
//! and [`Adam`] (AdamW with weight decay), each one fused kernel per parameter on CUDA.
//!
//! In-place updates bump the parameters' storage versions, so a tape that still holds the old
//! values for a backward reports [`Error::SavedTensorModified`](crate::Error) instead of
//! computing wrong gradients.
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
use opsmith_host::{Tensor, ops};

/// What every optimizer does: one update from the gradients of a backward.
pub trait Optimizer {
    /// Updates every parameter that has a gradient in `grads`; parameters without one are left
    /// as they are.
    fn step(&mut self, grads: &Gradients) -> Result<()>;

    /// The parameters it updates.
    fn parameters(&self) -> &[Var];
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

/// Adam over a set of parameters, one fused kernel per parameter and step (it reads `p`, `g`,
/// `m`, `v` and writes `p`, `m`, `v` in one pass). See [`AdamConfig`].
pub struct Adam {
    params: Vec<Var>,
    moments: Vec<(Tensor, Tensor)>,
    config: AdamConfig,
    step: u64,
}

impl Adam {
    /// Adam for `params`, with zeroed moments on the parameters' devices.
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
        check_hyper("Adam", "eps", config.eps, config.eps > 0.0)?;
        check_hyper("Adam", "weight_decay", config.weight_decay, config.weight_decay >= 0.0)?;
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
        Ok(Adam { params, moments, config, step: 0 })
    }

    /// Steps taken so far.
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
}

impl Optimizer for Adam {
    fn step(&mut self, grads: &Gradients) -> Result<()> {
        self.step += 1;
        let c = self.config;
        let step = ops::AdamStep {
            lr: c.lr,
            beta1: c.beta1,
            beta2: c.beta2,
            eps: c.eps,
            weight_decay: c.weight_decay,
            step: self.step,
        };
        for (p, (m, v)) in self.params.iter().zip(&self.moments) {
            if let Some(g) = grads.get(p) {
                ops::adam_step(p.value(), g, m, v, &step)?;
            }
        }
        Ok(())
    }

    fn parameters(&self) -> &[Var] {
        &self.params
    }
}
