//! The elementwise ops, one descriptor each.
//!
//! An [`ElementwiseOp`] says everything opsmith needs to run an op on either device: its name
//! (for errors), its arithmetic per element (which the CPU runs, in f32 or f64), and its CUDA
//! launch (one typed launch of its kernel from `kernels-gpu`). [`run`] and [`run_new`] do the
//! rest for every op alike: operand checks, the device dispatch, output allocation.
//!
//! Adding an op is its kernel formula in `kernels-gpu`, one descriptor here (or beside its
//! public function, as the activations and optimizer steps have theirs), its autograd rule and
//! its tests.
#[cfg(feature = "cuda")]
use super::cuda::Launch;
use super::{check, cpu};
use crate::dtype::Accumulator;
use crate::{Device, Error, Result, Tensor};

/// One elementwise op with `I` inputs and `O` outputs, all of one shape, dtype and device.
pub(crate) trait ElementwiseOp<const I: usize, const O: usize>: Copy {
    /// The op's name in errors.
    fn name(&self) -> &'static str;

    /// One element's outputs from its inputs, in the arithmetic type (f32 for f32, f16 and
    /// bf16 tensors, f64 for f64), before the one rounding to the storage dtype. The kernel
    /// computes the same, operation for operation.
    fn compute<A: Accumulator>(&self, inputs: [A; I]) -> [A; O];

    /// The op's kernel, launched over every element.
    #[cfg(feature = "cuda")]
    fn launch(&self, on: Launch, inputs: [&Tensor; I], outputs: [&Tensor; O]) -> Result<()>;
}

/// Runs `op` into `outputs`, each of which may be exactly one of the inputs (in place) but may
/// not partially overlap any operand.
pub(crate) fn run<Op: ElementwiseOp<I, O>, const I: usize, const O: usize>(
    op: Op,
    inputs: [&Tensor; I],
    outputs: [&Tensor; O],
) -> Result<()> {
    check::elementwise(op.name(), &inputs, &outputs)?;
    dispatch(op, inputs, outputs)
}

/// Runs `op` on its operands' device, once they are checked.
fn dispatch<Op: ElementwiseOp<I, O>, const I: usize, const O: usize>(
    op: Op,
    inputs: [&Tensor; I],
    outputs: [&Tensor; O],
) -> Result<()> {
    match inputs[0].device() {
        Device::Cpu => {
            check::cpu_work(op.name())?;
            cpu::elementwise(op, inputs, outputs)
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => super::cuda::elementwise(op, inputs, outputs),
        #[cfg(not(feature = "cuda"))]
        device @ Device::Cuda(_) => Err(Error::cuda_disabled(op.name(), device)),
    }
}

/// Runs `op` into new tensors shaped like its first input.
pub(crate) fn run_new<Op: ElementwiseOp<I, O>, const I: usize, const O: usize>(
    op: Op,
    inputs: [&Tensor; I],
) -> Result<[Tensor; O]> {
    check::elementwise(op.name(), &inputs, &[])?;
    let first = inputs[0];
    let mut outputs = Vec::with_capacity(O);
    for _ in 0..O {
        outputs.push(Tensor::empty(first.shape().clone(), first.dtype(), first.device())?);
    }
    let outputs: [Tensor; O] = outputs
        .try_into()
        .map_err(|_| Error::InvalidArgument { op: op.name(), reason: format!("could not make its {O} outputs") })?;
    // Fresh outputs of the checked inputs' shape, dtype and device overlap nothing: no second check.
    dispatch(op, inputs, outputs.each_ref())?;
    Ok(outputs)
}

/// `a + b`.
#[derive(Clone, Copy)]
pub(crate) struct Add;

impl ElementwiseOp<2, 1> for Add {
    fn name(&self) -> &'static str {
        "add"
    }
    #[inline(always)]
    fn compute<A: Accumulator>(&self, [a, b]: [A; 2]) -> [A; 1] {
        [a + b]
    }
    #[cfg(feature = "cuda")]
    fn launch(&self, on: Launch, [a, b]: [&Tensor; 2], [out]: [&Tensor; 1]) -> Result<()> {
        on.run(on.elementwise()?.add, (a, b, out, on.n))
    }
}

/// `a - b`.
#[derive(Clone, Copy)]
pub(crate) struct Sub;

impl ElementwiseOp<2, 1> for Sub {
    fn name(&self) -> &'static str {
        "sub"
    }
    #[inline(always)]
    fn compute<A: Accumulator>(&self, [a, b]: [A; 2]) -> [A; 1] {
        [a - b]
    }
    #[cfg(feature = "cuda")]
    fn launch(&self, on: Launch, [a, b]: [&Tensor; 2], [out]: [&Tensor; 1]) -> Result<()> {
        on.run(on.elementwise()?.sub, (a, b, out, on.n))
    }
}

/// `a / b`.
#[derive(Clone, Copy)]
pub(crate) struct Div;

impl ElementwiseOp<2, 1> for Div {
    fn name(&self) -> &'static str {
        "div"
    }
    #[inline(always)]
    fn compute<A: Accumulator>(&self, [a, b]: [A; 2]) -> [A; 1] {
        [a / b]
    }
    #[cfg(feature = "cuda")]
    fn launch(&self, on: Launch, [a, b]: [&Tensor; 2], [out]: [&Tensor; 1]) -> Result<()> {
        on.run(on.elementwise()?.div, (a, b, out, on.n))
    }
}

/// `a * b`.
#[derive(Clone, Copy)]
pub(crate) struct Mul;

impl ElementwiseOp<2, 1> for Mul {
    fn name(&self) -> &'static str {
        "mul"
    }
    #[inline(always)]
    fn compute<A: Accumulator>(&self, [a, b]: [A; 2]) -> [A; 1] {
        [a * b]
    }
    #[cfg(feature = "cuda")]
    fn launch(&self, on: Launch, [a, b]: [&Tensor; 2], [out]: [&Tensor; 1]) -> Result<()> {
        on.run(on.elementwise()?.mul, (a, b, out, on.n))
    }
}

/// `x * alpha + beta`, one rounding.
#[derive(Clone, Copy)]
pub(crate) struct Affine {
    pub(crate) alpha: f64,
    pub(crate) beta: f64,
}

impl ElementwiseOp<1, 1> for Affine {
    fn name(&self) -> &'static str {
        "affine"
    }
    #[inline(always)]
    fn compute<A: Accumulator>(&self, [x]: [A; 1]) -> [A; 1] {
        [A::fma(x, A::from_f64(self.alpha), A::from_f64(self.beta))]
    }
    #[cfg(feature = "cuda")]
    fn launch(&self, on: Launch, [x]: [&Tensor; 1], [out]: [&Tensor; 1]) -> Result<()> {
        on.run(on.elementwise()?.affine, (x, out, self.alpha as f32, self.beta as f32, on.n))
    }
}

/// `a * b + c`, one rounding.
#[derive(Clone, Copy)]
pub(crate) struct FusedMulAdd;

impl ElementwiseOp<3, 1> for FusedMulAdd {
    fn name(&self) -> &'static str {
        "fused_mul_add"
    }
    #[inline(always)]
    fn compute<A: Accumulator>(&self, [a, b, c]: [A; 3]) -> [A; 1] {
        [A::fma(a, b, c)]
    }
    #[cfg(feature = "cuda")]
    fn launch(&self, on: Launch, [a, b, c]: [&Tensor; 3], [d]: [&Tensor; 1]) -> Result<()> {
        on.run(on.elementwise()?.fused_mul_add, (a, b, c, d, on.n))
    }
}

/// `(x + y) * w`.
#[derive(Clone, Copy)]
pub(crate) struct AddMul;

impl ElementwiseOp<3, 1> for AddMul {
    fn name(&self) -> &'static str {
        "add_mul"
    }
    #[inline(always)]
    fn compute<A: Accumulator>(&self, [x, y, w]: [A; 3]) -> [A; 1] {
        [(x + y) * w]
    }
    #[cfg(feature = "cuda")]
    fn launch(&self, on: Launch, [x, y, w]: [&Tensor; 3], [z]: [&Tensor; 1]) -> Result<()> {
        on.run(on.elementwise()?.add_mul, (x, y, w, z, on.n))
    }
}

/// The backward of `(x + y) * w`: inputs `[g, x, y, w]`, outputs `[g * w, g * (x + y)]`.
#[derive(Clone, Copy)]
pub(crate) struct AddMulBackward;

impl ElementwiseOp<4, 2> for AddMulBackward {
    fn name(&self) -> &'static str {
        "add_mul_backward"
    }
    #[inline(always)]
    fn compute<A: Accumulator>(&self, [g, x, y, w]: [A; 4]) -> [A; 2] {
        [g * w, g * (x + y)]
    }
    #[cfg(feature = "cuda")]
    fn launch(&self, on: Launch, [g, x, y, w]: [&Tensor; 4], [gxy, gw]: [&Tensor; 2]) -> Result<()> {
        on.run(on.elementwise()?.add_mul_backward, (g, x, y, w, gxy, gw, on.n))
    }
}

/// [`AddMulBackward`] for a gradient that is `g` everywhere: inputs `[x, y, w]`.
#[derive(Clone, Copy)]
pub(crate) struct AddMulBackwardUniform {
    pub(crate) g: f64,
}

impl ElementwiseOp<3, 2> for AddMulBackwardUniform {
    fn name(&self) -> &'static str {
        "add_mul_backward_uniform"
    }
    #[inline(always)]
    fn compute<A: Accumulator>(&self, [x, y, w]: [A; 3]) -> [A; 2] {
        let g = A::from_f64(self.g);
        [g * w, g * (x + y)]
    }
    #[cfg(feature = "cuda")]
    fn launch(&self, on: Launch, [x, y, w]: [&Tensor; 3], [gxy, gw]: [&Tensor; 2]) -> Result<()> {
        on.run(on.elementwise()?.add_mul_backward_uniform, (x, y, w, gxy, gw, self.g as f32, on.n))
    }
}

/// The backward of `(x + y) * w` with `x`'s and `y`'s gradients in tensors of their own: inputs
/// `[g, x, y, w]`, outputs `[g * w, g * w, g * (x + y)]`.
#[derive(Clone, Copy)]
pub(crate) struct AddMulBackwardSplit;

impl ElementwiseOp<4, 3> for AddMulBackwardSplit {
    fn name(&self) -> &'static str {
        "add_mul_backward_split"
    }
    #[inline(always)]
    fn compute<A: Accumulator>(&self, [g, x, y, w]: [A; 4]) -> [A; 3] {
        [g * w, g * w, g * (x + y)]
    }
    #[cfg(feature = "cuda")]
    fn launch(&self, on: Launch, [g, x, y, w]: [&Tensor; 4], [gx, gy, gw]: [&Tensor; 3]) -> Result<()> {
        on.run(on.elementwise()?.add_mul_backward_split, (g, x, y, w, gx, gy, gw, on.n))
    }
}

/// [`AddMulBackwardSplit`] for a gradient that is `g` everywhere: inputs `[x, y, w]`.
#[derive(Clone, Copy)]
pub(crate) struct AddMulBackwardSplitUniform {
    pub(crate) g: f64,
}

impl ElementwiseOp<3, 3> for AddMulBackwardSplitUniform {
    fn name(&self) -> &'static str {
        "add_mul_backward_split_uniform"
    }
    #[inline(always)]
    fn compute<A: Accumulator>(&self, [x, y, w]: [A; 3]) -> [A; 3] {
        let g = A::from_f64(self.g);
        [g * w, g * w, g * (x + y)]
    }
    #[cfg(feature = "cuda")]
    fn launch(&self, on: Launch, [x, y, w]: [&Tensor; 3], [gx, gy, gw]: [&Tensor; 3]) -> Result<()> {
        on.run(on.elementwise()?.add_mul_backward_split_uniform, (x, y, w, gx, gy, gw, self.g as f32, on.n))
    }
}
