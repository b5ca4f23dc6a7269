//! The CPU half of the elementwise ops: one pass per op over the tensors' memory, fused where
//! the GPU kernel is fused, arithmetic in `Element::Acc` like the kernels.
use super::elementwise::ElementwiseOp;
use crate::dtype::with_float_type;
use crate::tensor::storage::{CpuBuffer, Storage, StorageData};
use crate::{DType, Element, Error, Result, Tensor};
use half::f16;
use parking_lot::{RwLockReadGuard, RwLockWriteGuard};
use smallvec::SmallVec;
use std::sync::Arc;

pub(super) fn elementwise<Op: ElementwiseOp<I, O>, const I: usize, const O: usize>(
    op: Op,
    inputs: [&Tensor; I],
    outputs: [&Tensor; O],
) -> Result<()> {
    with_float_type!(inputs[0].dtype(), op.name(), inputs[0].device(), T => run::<T, Op, I, O>(op, inputs, outputs))
}

// Without CUDA every storage is on the CPU, and `op` names no error.
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn cpu_buffer<'t>(op: &'static str, t: &'t Tensor) -> Result<&'t parking_lot::RwLock<CpuBuffer>> {
    match &t.storage.data {
        StorageData::Cpu(buf) => Ok(buf),
        #[cfg(feature = "cuda")]
        StorageData::Cuda { .. } => Err(Error::DeviceMismatch { op, lhs: crate::Device::Cpu, rhs: t.device() }),
    }
}

fn run<T: Element, Op: ElementwiseOp<I, O>, const I: usize, const O: usize>(
    op: Op,
    inputs: [&Tensor; I],
    outputs: [&Tensor; O],
) -> Result<()> {
    let shares_memory = outputs
        .iter()
        .enumerate()
        .any(|(k, o)| inputs.iter().chain(&outputs[..k]).any(|t| Arc::ptr_eq(&t.storage, &o.storage)));
    if shares_memory {
        // In place, or outputs that are views of one buffer: compute into fresh memory, then copy.
        let fresh: Vec<Tensor> =
            outputs.iter().map(|o| Tensor::zeros(o.shape().clone(), o.dtype(), o.device())).collect::<Result<_>>()?;
        run::<T, Op, I, O>(op, inputs, std::array::from_fn(|k| &fresh[k]))?;
        for (out, value) in outputs.iter().zip(&fresh) {
            out.copy_from_(value)?;
        }
        return Ok(());
    }

    // Every storage is locked in address order, the order every op takes (`with_cuda_ptrs`
    // too), so that threads writing each other's inputs cannot deadlock. Inputs and outputs
    // share no storage here (that case went through fresh memory above).
    let mut order: SmallVec<[(*const Storage, bool, usize); 8]> = SmallVec::new();
    order.extend(inputs.iter().enumerate().map(|(i, t)| (Arc::as_ptr(&t.storage), false, i)));
    order.extend(outputs.iter().enumerate().map(|(i, t)| (Arc::as_ptr(&t.storage), true, i)));
    order.sort_by_key(|&(storage, write, _)| (storage as usize, write));
    let mut in_guards: SmallVec<[Option<RwLockReadGuard<'_, CpuBuffer>>; 4]> = inputs.iter().map(|_| None).collect();
    let mut out_guards: SmallVec<[Option<RwLockWriteGuard<'_, CpuBuffer>>; 3]> = outputs.iter().map(|_| None).collect();
    for (_, write, i) in order {
        if write {
            out_guards[i] = Some(cpu_buffer(op.name(), outputs[i])?.write());
            outputs[i].storage.bump_version();
        } else {
            in_guards[i] = Some(cpu_buffer(op.name(), inputs[i])?.read_recursive());
        }
    }
    let in_guards: SmallVec<[RwLockReadGuard<'_, CpuBuffer>; 4]> = in_guards.into_iter().flatten().collect();
    let mut out_guards: SmallVec<[RwLockWriteGuard<'_, CpuBuffer>; 3]> = out_guards.into_iter().flatten().collect();
    let mut ins: SmallVec<[&[T]; 4]> = SmallVec::new();
    for (t, g) in inputs.iter().zip(&in_guards) {
        let actual = g.dtype();
        let s = T::cpu_slice(g).ok_or(Error::ElementType { op: op.name(), requested: T::DTYPE, actual })?;
        ins.push(&s[t.offset..t.offset + t.elem_count()]);
    }
    let mut outs: SmallVec<[&mut [T]; 3]> = SmallVec::new();
    for (t, g) in outputs.iter().zip(out_guards.iter_mut()) {
        let actual = g.dtype();
        let s = T::cpu_slice_mut(g).ok_or(Error::ElementType { op: op.name(), requested: T::DTYPE, actual })?;
        outs.push(&mut s[t.offset..t.offset + t.elem_count()]);
    }
    let ins: [&[T]; I] = std::array::from_fn(|k| ins[k]);
    let mut outs = outs.into_iter();
    let mut outs: [&mut [T]; O] = std::array::from_fn(|_| outs.next().unwrap_or_default());
    compute_dispatch::<T, Op, I, O>(op, ins, &mut outs);
    Ok(())
}

/// Runs [`compute`] compiled for the CPU's fused multiply-add when it has one. Without the
/// `fma` target feature, `mul_add` is a library call per element that also blocks
/// vectorisation; with it, the fused ops become vector FMA instructions. The results are the
/// same either way: `mul_add` is correctly rounded in both.
fn compute_dispatch<T: Element, Op: ElementwiseOp<I, O>, const I: usize, const O: usize>(
    op: Op,
    ins: [&[T]; I],
    outs: &mut [&mut [T]; O],
) {
    if T::DTYPE == DType::F16 {
        return compute_f16_in_chunks(op, ins, outs);
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports the features this function is compiled for (checked above).
            return unsafe { compute_avx2_fma(op, ins, outs) };
        }
    }
    compute(op, ins, outs)
}

/// Elements per chunk of [`compute_f16_in_chunks`]: 16 KiB of f32 per operand, in L1/L2.
const F16_CHUNK: usize = 4096;

/// f16 ops a chunk at a time: the inputs widened to f32, the f32 arithmetic (which is what f16
/// computes in anyway), the outputs rounded back to f16 once, so the results are bit for bit
/// those of converting element by element. The `half` crate converts single values in software
/// but whole slices with F16C when the CPU has it (checked at run time).
fn compute_f16_in_chunks<T: Element, Op: ElementwiseOp<I, O>, const I: usize, const O: usize>(
    op: Op,
    ins: [&[T]; I],
    outs: &mut [&mut [T]; O],
) {
    use half::slice::HalfFloatSliceExt;
    let ins: [&[f16]; I] = ins.map(|s| bytemuck::cast_slice::<T, f16>(s));
    let mut outs: SmallVec<[&mut [f16]; 3]> = outs.iter_mut().map(|s| bytemuck::cast_slice_mut::<T, f16>(s)).collect();
    let len = outs.first().map_or(0, |o| o.len());
    let chunk = len.clamp(1, F16_CHUNK); // small tensors get small buffers
    let mut wide_in = vec![0f32; chunk * I];
    let mut wide_out = vec![0f32; chunk * O];
    for start in (0..len).step_by(chunk) {
        let end = (start + chunk).min(len);
        let m = end - start;
        for (x, wide) in ins.iter().zip(wide_in.chunks_mut(chunk)) {
            x[start..end].convert_to_f32_slice(&mut wide[..m]);
        }
        {
            let mut wide_ins = wide_in.chunks(chunk).map(|c| &c[..m]);
            let views: [&[f32]; I] = std::array::from_fn(|_| wide_ins.next().unwrap_or_default());
            let mut wide_outs = wide_out.chunks_mut(chunk).map(|c| &mut c[..m]);
            let mut out_views: [&mut [f32]; O] = std::array::from_fn(|_| wide_outs.next().unwrap_or_default());
            compute_dispatch::<f32, Op, I, O>(op, views, &mut out_views);
        }
        for (o, wide) in outs.iter_mut().zip(wide_out.chunks(chunk)) {
            o[start..end].convert_from_f32_slice(&wide[..m]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn compute_avx2_fma<T: Element, Op: ElementwiseOp<I, O>, const I: usize, const O: usize>(
    op: Op,
    ins: [&[T]; I],
    outs: &mut [&mut [T]; O],
) {
    compute(op, ins, outs)
}

/// The op's arithmetic over equally long slices, one element at a time in the arithmetic type,
/// rounded once to the storage dtype.
///
/// Inlined into [`compute_avx2_fma`], so that it is compiled (and vectorised) with its target
/// features; the slices are cut to one length first, so the loop has no bounds checks.
#[inline(always)]
fn compute<T: Element, Op: ElementwiseOp<I, O>, const I: usize, const O: usize>(
    op: Op,
    ins: [&[T]; I],
    outs: &mut [&mut [T]; O],
) {
    let len = outs.iter().map(|o| o.len()).chain(ins.iter().map(|i| i.len())).min().unwrap_or(0);
    let ins = ins.map(|s| &s[..len]);
    for k in 0..len {
        let y = op.compute::<T::Acc>(std::array::from_fn(|j| ins[j][k].to_acc()));
        for (out, y) in outs.iter_mut().zip(y) {
            out[k] = T::from_acc(y);
        }
    }
}
