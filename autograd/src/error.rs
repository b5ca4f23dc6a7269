//! The autograd error type; host errors convert into it with `?`.

/// `Result` with [`Error`].
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Result, Tape, Var, ops};
/// fn square(x: &Var) -> Result<Var> {
///     ops::mul(x, x)
/// }
/// let tape = Tape::new();
/// let x = tape.var(opsmith_host::Tensor::from_vec(vec![3.0f32], [1], opsmith_host::Device::Cpu)?);
/// assert_eq!(square(&x)?.value().to_vec::<f32>()?, [9.0]);
/// # Ok(()) }
/// ```
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in `opsmith-autograd`.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Error, Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?);
/// let y = ops::mul(&x, &x)?;
/// // A two-element output has no implied gradient: name it with backward_with.
/// assert!(matches!(tape.backward(&y), Err(Error::NonScalarLoss { .. })));
/// // Host errors pass through as Error::Host.
/// let z = tape.var(Tensor::from_vec(vec![1.0f32; 3], [3], Device::Cpu)?);
/// assert!(matches!(ops::add(&x, &z), Err(Error::Host(opsmith_host::Error::ShapeMismatch { .. }))));
/// # Ok(()) }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An error from the tensor runtime (shapes, dtypes, devices, launches, ...).
    #[error(transparent)]
    Host(#[from] opsmith_host::Error),
    /// A tensor saved for backward was written in place between forward and backward.
    #[error(
        "{op}: a tensor saved for backward was modified in place after the forward pass (version {saved} \
         when saved, {now} at backward); gradients would be wrong. Copy it before modifying it"
    )]
    SavedTensorModified {
        /// The op whose saved input changed.
        op: &'static str,
        /// Its storage version when saved.
        saved: u64,
        /// Its storage version at backward.
        now: u64,
    },
    /// A custom op has no CUDA implementation of this stage.
    #[error("custom op `{op}` has no CUDA {stage}: implement CustomOp::cuda_{stage}, or run it on the CPU")]
    MissingCudaImpl {
        /// The custom op.
        op: &'static str,
        /// "forward" or "backward".
        stage: &'static str,
    },
    /// An op got the wrong number of inputs, or a backward the wrong number of gradients.
    #[error("{op}: expected {expected} {what}, got {actual}")]
    Arity {
        /// The op.
        op: &'static str,
        /// "inputs" or "gradients".
        what: &'static str,
        /// How many it takes.
        expected: usize,
        /// How many it got.
        actual: usize,
    },
    /// A backward returned a gradient whose shape differs from its input's.
    #[error("{op}: the gradient of input {input} has shape {actual:?}, the input {expected:?}")]
    GradientShape {
        /// The op.
        op: &'static str,
        /// Which input.
        input: usize,
        /// The input's shape.
        expected: Vec<usize>,
        /// The gradient's shape.
        actual: Vec<usize>,
    },
    /// A backward returned a gradient of another dtype or device than its input's.
    #[error("{op}: the gradient of input {input} is {actual}, the input {expected}")]
    GradientKind {
        /// The op.
        op: &'static str,
        /// Which input.
        input: usize,
        /// The input's dtype and device, as `f32 on cpu`.
        expected: String,
        /// The gradient's.
        actual: String,
    },
    /// `Tape::backward` needs a one-element loss.
    #[error("backward needs a scalar loss, got shape {shape:?}; use Tape::backward_with to pass the output's gradient")]
    NonScalarLoss {
        /// The output's shape.
        shape: Vec<usize>,
    },
    /// The variable does not require gradients (it is a constant, or was made under `no_grad`).
    #[error("{what}: the variable does not require gradients (a constant, or computed under no_grad)")]
    RequiresGrad {
        /// What was attempted.
        what: &'static str,
    },
    /// The variable was recorded on another tape.
    #[error("{op}: variables from different tapes cannot be combined")]
    TapeMismatch {
        /// The op.
        op: &'static str,
    },
    /// An earlier backward already consumed the graph that produced this output.
    #[error("backward: the graph of this output was consumed by an earlier backward; run the forward pass again")]
    GraphConsumed,
    /// gradcheck found an element whose gradients disagree.
    #[error(
        "gradcheck ({check}): input {input}, element {index}: analytic {analytic:e}, reference {reference:e}, \
         |difference| {difference:e} > tolerance {tolerance:e}"
    )]
    GradcheckFailed {
        /// Which comparison ("finite differences" or "cuda vs cpu").
        check: &'static str,
        /// Which input.
        input: usize,
        /// The flat index of the element.
        index: usize,
        /// The gradient being checked.
        analytic: f64,
        /// The reference it was compared with.
        reference: f64,
        /// Their absolute difference.
        difference: f64,
        /// The tolerance it exceeded.
        tolerance: f64,
    },
    /// A model file could not be read or written.
    #[error("{path}: {reason}")]
    ModelFile {
        /// The file.
        path: String,
        /// What went wrong (I/O, format, a missing or misshapen tensor).
        reason: String,
    },
    /// A model file parsed, but a tensor in it cannot make a working model: a missing or
    /// unexpected tensor, a gap in the layer numbering, a shape, dtype or device that does not
    /// fit, or a value that is not finite.
    #[error("{path}: tensor `{tensor}`: {reason}")]
    InvalidModel {
        /// The file (`<memory>` for bytes).
        path: String,
        /// The tensor at fault, as named in the file.
        tensor: String,
        /// What is wrong with it.
        reason: String,
    },
    /// ONNX export failed: what (an op, a name, the tracer) and why.
    #[error("ONNX export: {what}: {reason}")]
    Export {
        /// The op, name or call that could not be exported.
        what: String,
        /// Why.
        reason: String,
    },
    /// A model or optimizer was configured with values it cannot use.
    #[error("{what}: {reason}")]
    InvalidConfig {
        /// The model part or optimizer.
        what: &'static str,
        /// What is wrong with the configuration.
        reason: String,
    },
}

impl Error {
    /// The host error inside, if this is one (a shape, dtype or device check, a launch, a
    /// driver or library problem): what to match on for those.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Error, ops, Var};
    /// use opsmith_host::{Device, Tensor};
    /// let a = Var::constant(Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?);
    /// let b = Var::constant(Tensor::from_vec(vec![1.0f32; 3], [3], Device::Cpu)?);
    /// let err: Error = ops::add(&a, &b).unwrap_err();
    /// assert!(matches!(err.host(), Some(opsmith_host::Error::ShapeMismatch { op: "add", .. })));
    /// # Ok(()) }
    /// ```
    pub fn host(&self) -> Option<&opsmith_host::Error> {
        match self {
            Error::Host(e) => Some(e),
            _ => None,
        }
    }
}
