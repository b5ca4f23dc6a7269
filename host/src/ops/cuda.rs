//! The CUDA half of the elementwise ops: one typed launch of the op's kernel from `kernels-gpu`.
use super::elementwise::ElementwiseOp;
use crate::cuda::{self, Grid, KernelParams};
use crate::{DType, Error, Result, Tensor};
use opsmith_kernels::decl::KernelDecl;
use opsmith_kernels::names::{self, ActivationKernels, ElementwiseKernels, OptimizerKernels, activation, optim};

/// The kernel table for `t`'s dtype, from a family's tables for f32, f16 and bf16; f64 and the
/// integers have no kernels.
pub(crate) fn dtype_table<K>(op: &'static str, t: &Tensor, [f32, f16, bf16]: [K; 3]) -> Result<K> {
    match t.dtype() {
        DType::F32 => Ok(f32),
        DType::F16 => Ok(f16),
        DType::BF16 => Ok(bf16),
        dtype @ (DType::F64 | DType::U32 | DType::I64) => {
            Err(Error::UnsupportedDType { op, dtype, device: t.device() })
        }
    }
}

/// The most elements one launch may cover: every byte offset must fit an `isize` (Rust's rule
/// for pointer arithmetic, which the kernels use).
pub(crate) fn check_launch_len(op: &'static str, n: usize, dtype: DType) -> Result<u64> {
    let limit = (isize::MAX as u64) / dtype.size_in_bytes() as u64;
    let n = n as u64;
    if n > limit {
        return Err(Error::TooLarge { op, elements: n, limit });
    }
    Ok(n)
}

/// What an elementwise op's [`launch`](ElementwiseOp::launch) needs: its operands' element
/// count, the grid for it, and the kernel tables of their dtype.
#[derive(Clone, Copy)]
pub(crate) struct Launch<'t> {
    op: &'static str,
    first: &'t Tensor,
    /// Elements per operand.
    pub(crate) n: u64,
    grid: Grid,
}

impl Launch<'_> {
    /// The elementwise family's kernels for the operands' dtype.
    pub(crate) fn elementwise(&self) -> Result<ElementwiseKernels> {
        dtype_table(self.op, self.first, [names::F32, names::F16, names::BF16])
    }

    /// The activation family's kernels for the operands' dtype.
    pub(crate) fn activation(&self) -> Result<ActivationKernels> {
        dtype_table(self.op, self.first, [activation::F32, activation::F16, activation::BF16])
    }

    /// The optimizer family's kernels for the operands' dtype (f32 only).
    pub(crate) fn optimizer(&self) -> Result<OptimizerKernels> {
        match self.first.dtype() {
            DType::F32 => Ok(optim::F32),
            dtype => Err(Error::UnsupportedDType { op: self.op, dtype, device: self.first.device() }),
        }
    }

    /// Launches `kernel` over the operands.
    pub(crate) fn run<P: KernelParams>(&self, kernel: KernelDecl<P>, args: P::Args<'_>) -> Result<()> {
        cuda::launch(kernel, self.grid, args)
    }
}

pub(super) fn elementwise<Op: ElementwiseOp<I, O>, const I: usize, const O: usize>(
    op: Op,
    inputs: [&Tensor; I],
    outputs: [&Tensor; O],
) -> Result<()> {
    over_elements(op.name(), inputs[0], |on| op.launch(on, inputs, outputs))
}

/// Runs `launch` with the [`Launch`] over the elements of `first` (each elementwise operand has
/// as many), for the ops whose kernel also takes a buffer that is not an elementwise operand:
/// the capturable Adam step reads its coefficients from one.
pub(super) fn over_elements(op: &'static str, first: &Tensor, launch: impl FnOnce(Launch) -> Result<()>) -> Result<()> {
    let n = check_launch_len(op, first.elem_count(), first.dtype())?;
    // One 16-byte pack per thread.
    let lanes = (16 / first.dtype().size_in_bytes()) as u64;
    launch(Launch { op, first, n, grid: Grid::covering(n.div_ceil(lanes)) })
}
