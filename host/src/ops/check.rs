//! Small reusable operand checks. Each returns the typed error naming the op and the offending
//! value; callers chain them with `?`.
use crate::{Error, Result, Tensor};
use std::sync::Arc;

/// `Err(Error::Capture)` when this thread is capturing a CUDA graph: the CPU half of an op
/// calls it first, as CPU work would run once, at capture, and never in a replay.
pub(crate) fn cpu_work(op: &'static str) -> Result<()> {
    #[cfg(feature = "cuda")]
    crate::cuda::graph::refuse_while_capturing(op, crate::cuda::graph::CPU_WORK)?;
    #[cfg(not(feature = "cuda"))]
    let _ = op;
    Ok(())
}

/// All tensors are on the first one's device.
pub(crate) fn same_device(op: &'static str, ts: &[&Tensor]) -> Result<()> {
    let first = ts[0].device();
    match ts.iter().find(|t| t.device() != first) {
        Some(t) => Err(Error::DeviceMismatch { op, lhs: first, rhs: t.device() }),
        None => Ok(()),
    }
}

/// All tensors have the first one's dtype.
pub(crate) fn same_dtype(op: &'static str, ts: &[&Tensor]) -> Result<()> {
    let first = ts[0].dtype();
    match ts.iter().find(|t| t.dtype() != first) {
        Some(t) => Err(Error::DTypeMismatch { op, lhs: first, rhs: t.dtype() }),
        None => Ok(()),
    }
}

/// The first tensor's dtype is a float (the others match it, by [`same_dtype`]): arithmetic
/// has no integer kernels.
pub(crate) fn float(op: &'static str, t: &Tensor) -> Result<()> {
    match t.dtype() {
        dtype if !dtype.is_float() => Err(Error::UnsupportedDType { op, dtype, device: t.device() }),
        _ => Ok(()),
    }
}

/// All tensors have the first one's shape.
pub(crate) fn same_shape(op: &'static str, ts: &[&Tensor]) -> Result<()> {
    let first = ts[0].dims();
    match ts.iter().find(|t| t.dims() != first) {
        Some(t) => Err(Error::ShapeMismatch { op, lhs: first.to_vec(), rhs: t.dims().to_vec() }),
        None => Ok(()),
    }
}

/// Device, dtype and shape all agree.
pub(crate) fn same_layout(op: &'static str, ts: &[&Tensor]) -> Result<()> {
    same_device(op, ts)?;
    same_dtype(op, ts)?;
    same_shape(op, ts)
}

pub(crate) fn overlaps(a: &Tensor, b: &Tensor) -> bool {
    Arc::ptr_eq(&a.storage, &b.storage) && a.offset < b.offset + b.elem_count() && b.offset < a.offset + a.elem_count()
}

pub(crate) fn identical(a: &Tensor, b: &Tensor) -> bool {
    Arc::ptr_eq(&a.storage, &b.storage) && a.offset == b.offset && a.elem_count() == b.elem_count()
}

/// Each output is exactly an input or overlaps no input, and outputs do not overlap each other.
pub(crate) fn no_partial_overlap(op: &'static str, inputs: &[&Tensor], outputs: &[&Tensor]) -> Result<()> {
    for (k, out) in outputs.iter().enumerate() {
        if inputs.iter().any(|i| overlaps(out, i) && !identical(out, i))
            || outputs[..k].iter().any(|o| overlaps(out, o))
        {
            return Err(Error::Overlap { op, output: k });
        }
    }
    Ok(())
}

/// The full check of an elementwise op: one device, dtype and shape for every operand, then
/// aliasing.
pub(crate) fn elementwise(op: &'static str, inputs: &[&Tensor], outputs: &[&Tensor]) -> Result<()> {
    let all: smallvec::SmallVec<[&Tensor; 8]> = inputs.iter().chain(outputs).copied().collect();
    same_layout(op, &all)?;
    float(op, all[0])?;
    no_partial_overlap(op, inputs, outputs)
}
