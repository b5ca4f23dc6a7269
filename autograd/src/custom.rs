//! Custom ops with a backward their author writes: the Rust analog of `torch.autograd.Function`.
use crate::onnx::trace::{self, Traced};
use crate::tape::{Var, tracking};
use crate::{Error, Result};
use opsmith_host::{Device, Tensor};
use std::sync::Arc;

/// An op whose forward and backward you write, for the CPU and optionally for CUDA.
///
/// The forward gets the input tensors (all on one device, checked) and returns the output. The
/// backward gets the same inputs, the output, and the output's gradient, and returns one
/// gradient per input (`None` for an input that needs none), each shaped like its input.
/// Inputs and output are saved for backward by the tape; writing them in place before backward
/// makes backward fail with [`Error::SavedTensorModified`].
///
/// CUDA halves default to [`Error::MissingCudaImpl`]. Kernels for them can be Rust kernels in
/// your own kernel crate, built with `opsmith-ptx-builder` from your `build.rs`, or any PTX,
/// loaded with `opsmith_host::cuda::KernelModule::from_ptx`; `examples/custom-op` does the
/// former. For [`crate::gradcheck()`], the CPU forward must also accept f64 tensors.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{CustomOp, Result, Tape, custom, ops};
/// use opsmith_host::{Device, Tensor, ops as host};
/// use std::sync::Arc;
///
/// /// `y = x³`, with `dy/dx = 3x²`, from the host ops (so on every device and dtype).
/// struct Cube;
///
/// impl CustomOp for Cube {
///     fn name(&self) -> &'static str {
///         "cube"
///     }
///     fn num_inputs(&self) -> usize {
///         1
///     }
///     fn cpu_forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
///         let x = inputs[0];
///         Ok(host::mul(&host::mul(x, x)?, x)?)
///     }
///     fn cpu_backward(&self, inputs: &[&Tensor], _output: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
///         let x = inputs[0];
///         let three_x2 = host::scale(&host::mul(x, x)?, 3.0)?;
///         Ok(vec![Some(host::mul(grad, &three_x2)?)])
///     }
/// }
///
/// let cube: Arc<dyn CustomOp> = Arc::new(Cube);
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?);
/// let y = custom(&cube, &[&x])?;
/// assert_eq!(y.value().to_vec::<f32>()?, [1.0, 8.0]);
/// let grads = tape.backward(&ops::sum(&y)?)?;
/// assert_eq!(grads.get(&x).unwrap().to_vec::<f32>()?, [3.0, 12.0]);
/// // Cube has no CUDA half: on a GPU tensor it would return Error::MissingCudaImpl.
/// # Ok(()) }
/// ```
pub trait CustomOp: Send + Sync + 'static {
    /// The op's name, for errors: a literal, like the names of the built-in ops.
    fn name(&self) -> &'static str;
    /// How many inputs it takes.
    fn num_inputs(&self) -> usize;
    /// The forward on the CPU.
    fn cpu_forward(&self, inputs: &[&Tensor]) -> Result<Tensor>;
    /// The backward on the CPU.
    fn cpu_backward(&self, inputs: &[&Tensor], output: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>>;
    /// The forward on CUDA.
    fn cuda_forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        let _ = inputs;
        Err(Error::MissingCudaImpl { op: self.name(), stage: "forward" })
    }
    /// The backward on CUDA.
    fn cuda_backward(&self, inputs: &[&Tensor], output: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let _ = (inputs, output, grad);
        Err(Error::MissingCudaImpl { op: self.name(), stage: "backward" })
    }
    /// For [ONNX export](crate::onnx): the op's node type (domain and name) and what it computes
    /// in standard ONNX ops. Exported models call it as a node of that domain, with the function
    /// next to it, so that any runtime can run it. Without one (the default), exporting a model
    /// that uses the op fails with [`Error::Export`] naming it.
    fn onnx_function(&self) -> Option<crate::onnx::Function> {
        None
    }
}

/// Applies a custom op to variables, recording its backward when an input requires gradients.
///
/// The inputs must number [`CustomOp::num_inputs`] and share one device; the op's CPU or CUDA
/// half runs according to that device.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{CustomOp, Error, Result, Var, custom};
/// use opsmith_host::{Device, Tensor};
/// use std::sync::Arc;
///
/// /// The identity, as the smallest custom op.
/// struct Identity;
///
/// impl CustomOp for Identity {
///     fn name(&self) -> &'static str {
///         "identity"
///     }
///     fn num_inputs(&self) -> usize {
///         1
///     }
///     fn cpu_forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
///         Ok(inputs[0].copy()?)
///     }
///     fn cpu_backward(&self, _: &[&Tensor], _: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
///         Ok(vec![Some(grad.clone())])
///     }
/// }
///
/// let op: Arc<dyn CustomOp> = Arc::new(Identity);
/// let x = Var::constant(Tensor::from_vec(vec![1.0f32], [1], Device::Cpu)?);
/// assert_eq!(custom(&op, &[&x])?.value().to_vec::<f32>()?, [1.0]);
/// assert!(matches!(custom(&op, &[&x, &x]), Err(Error::Arity { expected: 1, actual: 2, .. })));
/// # Ok(()) }
/// ```
pub fn custom(op: &Arc<dyn CustomOp>, inputs: &[&Var]) -> Result<Var> {
    if inputs.len() != op.num_inputs() {
        return Err(Error::Arity { op: op.name(), what: "inputs", expected: op.num_inputs(), actual: inputs.len() });
    }
    let tensors: Vec<&Tensor> = inputs.iter().map(|v| v.value()).collect();
    let device = match tensors.first() {
        Some(t) => t.device(),
        None => Device::Cpu,
    };
    if let Some(t) = tensors.iter().find(|t| t.device() != device) {
        return Err(opsmith_host::Error::DeviceMismatch { op: op.name(), lhs: device, rhs: t.device() }.into());
    }
    let out = match device {
        Device::Cpu => op.cpu_forward(&tensors)?,
        Device::Cuda(_) => op.cuda_forward(&tensors)?,
    };
    let Some(tape) = tracking(op.name(), inputs)? else {
        let var = Var::constant(out);
        trace::note(|| Traced::Custom(Arc::clone(op)), inputs, &var);
        return Ok(var);
    };
    let saved_inputs: Vec<Tensor> = tensors.iter().map(|t| (*t).clone()).collect();
    let saved_output = out.clone();
    let mut keep: Vec<&Tensor> = tensors.clone();
    keep.push(&out);
    let traced_op = Arc::clone(op);
    let op = Arc::clone(op);
    let out_for_record = out.clone();
    let var = tape.record(op.name(), inputs, out_for_record, &keep, move |g| {
        let ins: Vec<&Tensor> = saved_inputs.iter().collect();
        let grads = match device {
            Device::Cpu => op.cpu_backward(&ins, &saved_output, g)?,
            Device::Cuda(_) => op.cuda_backward(&ins, &saved_output, g)?,
        };
        if grads.len() != ins.len() {
            return Err(Error::Arity { op: op.name(), what: "gradients", expected: ins.len(), actual: grads.len() });
        }
        for (k, (gk, input)) in grads.iter().zip(&ins).enumerate() {
            if let Some(gk) = gk
                && gk.dims() != input.dims()
            {
                return Err(Error::GradientShape {
                    op: op.name(),
                    input: k,
                    expected: input.dims().to_vec(),
                    actual: gk.dims().to_vec(),
                });
            }
            // A gradient of another dtype or device would surface steps later, in an
            // optimizer or another op's backward, far from the backward that made it.
            if let Some(gk) = gk
                && (gk.dtype() != input.dtype() || gk.device() != input.device())
            {
                let kind = |t: &Tensor| format!("{} on {}", t.dtype(), t.device());
                return Err(Error::GradientKind { op: op.name(), input: k, expected: kind(input), actual: kind(gk) });
            }
        }
        Ok(grads)
    });
    trace::note(|| Traced::Custom(traced_op), inputs, &var);
    Ok(var)
}
