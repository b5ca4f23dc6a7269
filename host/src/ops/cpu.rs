//! The CPU half of the elementwise ops, on `ndarray`: one pass per op, fused where the GPU
//! kernel is fused, arithmetic in `Element::Acc` like the kernels.
use super::{Activation, Elementwise};
use crate::dtype::{Accumulator, with_element_type};
use crate::tensor::storage::{CpuBuffer, Storage, StorageData};
use crate::{DType, Element, Error, Result, Tensor};
use half::f16;
use ndarray::{ArrayView1, ArrayViewMut1};
use opsmith_kernels::{activation, optim};
use parking_lot::{RwLockReadGuard, RwLockWriteGuard};
use smallvec::SmallVec;
use std::sync::Arc;

pub(super) fn elementwise(op: Elementwise, inputs: &[&Tensor], outputs: &[&Tensor]) -> Result<()> {
    with_element_type!(inputs[0].dtype(), T => run::<T>(op, inputs, outputs))
}

fn cpu_buffer(t: &Tensor) -> Result<&parking_lot::RwLock<CpuBuffer>> {
    match &t.storage.data {
        StorageData::Cpu(buf) => Ok(buf),
        #[cfg(feature = "cuda")]
        StorageData::Cuda { .. } => {
            Err(Error::DeviceMismatch { op: "cpu op", lhs: crate::Device::Cpu, rhs: t.device() })
        }
    }
}

fn run<T: Element>(op: Elementwise, inputs: &[&Tensor], outputs: &[&Tensor]) -> Result<()> {
    let shares_memory = outputs
        .iter()
        .enumerate()
        .any(|(k, o)| inputs.iter().chain(&outputs[..k]).any(|t| Arc::ptr_eq(&t.storage, &o.storage)));
    if shares_memory {
        // In place, or outputs that are views of one buffer: compute into fresh memory, then copy.
        let fresh: Vec<Tensor> =
            outputs.iter().map(|o| Tensor::zeros(o.shape().clone(), o.dtype(), o.device())).collect::<Result<_>>()?;
        let refs: Vec<&Tensor> = fresh.iter().collect();
        run::<T>(op, inputs, &refs)?;
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
            out_guards[i] = Some(cpu_buffer(outputs[i])?.write());
            outputs[i].storage.bump_version();
        } else {
            in_guards[i] = Some(cpu_buffer(inputs[i])?.read_recursive());
        }
    }
    let in_guards: SmallVec<[RwLockReadGuard<'_, CpuBuffer>; 4]> = in_guards.into_iter().flatten().collect();
    let mut out_guards: SmallVec<[RwLockWriteGuard<'_, CpuBuffer>; 3]> = out_guards.into_iter().flatten().collect();
    let ins: Vec<ArrayView1<'_, T>> = inputs
        .iter()
        .zip(&in_guards)
        .map(|(t, g)| {
            let actual = g.dtype();
            T::cpu_slice(g)
                .map(|s| ArrayView1::from(&s[t.offset..t.offset + t.elem_count()]))
                .ok_or(Error::ElementType { op: "cpu op", requested: T::DTYPE, actual })
        })
        .collect::<Result<_>>()?;
    let mut outs: Vec<ArrayViewMut1<'_, T>> = Vec::with_capacity(outputs.len());
    for (t, g) in outputs.iter().zip(out_guards.iter_mut()) {
        let actual = g.dtype();
        let s = T::cpu_slice_mut(g).ok_or(Error::ElementType { op: "cpu op", requested: T::DTYPE, actual })?;
        outs.push(ArrayViewMut1::from(&mut s[t.offset..t.offset + t.elem_count()]));
    }
    compute_dispatch::<T>(op, &ins, &mut outs);
    Ok(())
}

/// Runs [`compute`] compiled for the CPU's fused multiply-add when it has one. Without the
/// `fma` target feature, `mul_add` is a library call per element that also blocks
/// vectorisation; with it, the fused ops become vector FMA instructions. The results are the
/// same either way: `mul_add` is correctly rounded in both.
fn compute_dispatch<T: Element>(op: Elementwise, ins: &[ArrayView1<'_, T>], outs: &mut [ArrayViewMut1<'_, T>]) {
    if T::DTYPE == DType::F16 {
        return compute_f16_in_chunks(op, ins, outs);
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports the features this function is compiled for (checked above).
            return unsafe { compute_avx2_fma::<T>(op, ins, outs) };
        }
    }
    compute::<T>(op, ins, outs)
}

/// Elements per chunk of [`compute_f16_in_chunks`]: 16 KiB of f32 per operand, in L1/L2.
const F16_CHUNK: usize = 4096;

/// f16 ops a chunk at a time: the inputs widened to f32, the f32 arithmetic (which is what f16
/// computes in anyway), the outputs rounded back to f16 once, so the results are bit for bit
/// those of converting element by element. The `half` crate converts single values in software
/// (a few ns each: hardware conversion would have to be enabled for the whole build) but whole
/// slices with F16C when the CPU has it (checked at run time), which made f16 ops several times
/// faster and let the fused ones beat the unfused ones by their byte ratio.
fn compute_f16_in_chunks<T: Element>(op: Elementwise, ins: &[ArrayView1<'_, T>], outs: &mut [ArrayViewMut1<'_, T>]) {
    use half::slice::HalfFloatSliceExt;
    let ins: SmallVec<[&[f16]; 4]> =
        ins.iter().map(|v| bytemuck::cast_slice::<T, f16>(v.as_slice().unwrap_or(&[]))).collect();
    let mut outs: SmallVec<[&mut [f16]; 3]> =
        outs.iter_mut().map(|v| bytemuck::cast_slice_mut(v.as_slice_mut().unwrap_or(&mut []))).collect();
    let len = outs.first().map_or(0, |o| o.len());
    let chunk = len.clamp(1, F16_CHUNK); // small tensors get small buffers
    let mut wide_in = vec![0f32; chunk * ins.len()];
    let mut wide_out = vec![0f32; chunk * outs.len()];
    for start in (0..len).step_by(chunk) {
        let end = (start + chunk).min(len);
        let m = end - start;
        for (x, wide) in ins.iter().zip(wide_in.chunks_mut(chunk)) {
            x[start..end].convert_to_f32_slice(&mut wide[..m]);
        }
        {
            let views: SmallVec<[ArrayView1<'_, f32>; 4]> =
                wide_in.chunks(chunk).map(|c| ArrayView1::from(&c[..m])).collect();
            let mut out_views: SmallVec<[ArrayViewMut1<'_, f32>; 3]> =
                wide_out.chunks_mut(chunk).map(|c| ArrayViewMut1::from(&mut c[..m])).collect();
            compute_dispatch::<f32>(op, &views, &mut out_views);
        }
        for (o, wide) in outs.iter_mut().zip(wide_out.chunks(chunk)) {
            o[start..end].convert_from_f32_slice(&wide[..m]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn compute_avx2_fma<T: Element>(op: Elementwise, ins: &[ArrayView1<'_, T>], outs: &mut [ArrayViewMut1<'_, T>]) {
    compute::<T>(op, ins, outs)
}

/// The arithmetic of each op over validated, equally long views.
///
/// Plain loops over the views' (always contiguous) slices rather than `Zip`, so that the whole
/// loop is inlined into [`compute_avx2_fma`] and compiled with its target features.
#[inline(always)]
fn compute<T: Element>(op: Elementwise, ins: &[ArrayView1<'_, T>], outs: &mut [ArrayViewMut1<'_, T>]) {
    let ins: Vec<&[T]> = ins.iter().filter_map(|v| v.as_slice()).collect();
    let mut outs: Vec<&mut [T]> = outs.iter_mut().filter_map(|v| v.as_slice_mut()).collect();
    let acc = |x: &T| x.to_acc();
    match (op, &mut outs[..]) {
        (Elementwise::Add, [out]) => {
            for ((o, a), b) in out.iter_mut().zip(ins[0]).zip(ins[1]) {
                *o = T::from_acc(acc(a) + acc(b));
            }
        }
        (Elementwise::Sub, [out]) => {
            for ((o, a), b) in out.iter_mut().zip(ins[0]).zip(ins[1]) {
                *o = T::from_acc(acc(a) - acc(b));
            }
        }
        (Elementwise::Mul, [out]) => {
            for ((o, a), b) in out.iter_mut().zip(ins[0]).zip(ins[1]) {
                *o = T::from_acc(acc(a) * acc(b));
            }
        }
        (Elementwise::Affine { alpha, beta }, [out]) => {
            let (alpha, beta) = (T::Acc::from_f64(alpha), T::Acc::from_f64(beta));
            for (o, x) in out.iter_mut().zip(ins[0]) {
                *o = T::from_acc(Accumulator::fma(acc(x), alpha, beta));
            }
        }
        (Elementwise::FusedMulAdd, [out]) => {
            for (((o, a), b), c) in out.iter_mut().zip(ins[0]).zip(ins[1]).zip(ins[2]) {
                *o = T::from_acc(Accumulator::fma(acc(a), acc(b), acc(c)));
            }
        }
        (Elementwise::AddMul, [out]) => {
            for (((o, x), y), w) in out.iter_mut().zip(ins[0]).zip(ins[1]).zip(ins[2]) {
                *o = T::from_acc((acc(x) + acc(y)) * acc(w));
            }
        }
        (Elementwise::AddMulBackward, [gxy, gw]) => {
            let inputs = ins[0].iter().zip(ins[1]).zip(ins[2]).zip(ins[3]);
            for ((gxy, gw), (((g, x), y), w)) in gxy.iter_mut().zip(gw.iter_mut()).zip(inputs) {
                *gxy = T::from_acc(acc(g) * acc(w));
                *gw = T::from_acc(acc(g) * (acc(x) + acc(y)));
            }
        }
        (Elementwise::AddMulBackwardUniform { g }, [gxy, gw]) => {
            let g = T::Acc::from_f64(g);
            let inputs = ins[0].iter().zip(ins[1]).zip(ins[2]);
            for ((gxy, gw), ((x, y), w)) in gxy.iter_mut().zip(gw.iter_mut()).zip(inputs) {
                *gxy = T::from_acc(g * acc(w));
                *gw = T::from_acc(g * (acc(x) + acc(y)));
            }
        }
        (Elementwise::Activation(f), [out]) => match f {
            Activation::Relu => map1(out, ins[0], activation::relu),
            Activation::Gelu => map1(out, ins[0], activation::gelu),
            Activation::Silu => map1(out, ins[0], activation::silu),
        },
        (Elementwise::ActivationBackward(f), [gx]) => match f {
            Activation::Relu => map2(gx, ins[0], ins[1], activation::relu_backward),
            Activation::Gelu => map2(gx, ins[0], ins[1], activation::gelu_backward),
            Activation::Silu => map2(gx, ins[0], ins[1], activation::silu_backward),
        },
        (Elementwise::Sgd(step), [p_out]) => {
            let (lr, wd) = (T::Acc::from_f64(step.lr), T::Acc::from_f64(step.weight_decay));
            map2(p_out, ins[0], ins[1], |p, g| optim::sgd(p, g, lr, wd));
        }
        (Elementwise::Sgd(step), [p_out, buf_out]) => {
            let [lr, momentum, wd] = [step.lr, step.momentum, step.weight_decay].map(T::Acc::from_f64);
            let inputs = ins[0].iter().zip(ins[1]).zip(ins[2]);
            for ((p_out, buf_out), ((p, g), buf)) in p_out.iter_mut().zip(buf_out.iter_mut()).zip(inputs) {
                let (p, buf) = optim::sgd_momentum(acc(p), acc(g), acc(buf), lr, momentum, wd);
                (*p_out, *buf_out) = (T::from_acc(p), T::from_acc(buf));
            }
        }
        (Elementwise::Adam(step), [p_out, m_out, v_out]) => {
            let c = step.coefficients().map(T::Acc::from_f64);
            let inputs = ins[0].iter().zip(ins[1]).zip(ins[2]).zip(ins[3]);
            let outputs = p_out.iter_mut().zip(m_out.iter_mut()).zip(v_out.iter_mut());
            for (((p_out, m_out), v_out), (((p, g), m), v)) in outputs.zip(inputs) {
                let (p, m, v) = optim::adam(acc(p), acc(g), acc(m), acc(v), &c);
                (*p_out, *m_out, *v_out) = (T::from_acc(p), T::from_acc(m), T::from_acc(v));
            }
        }
        // `check::elementwise` fixed the arity before we got here.
        _ => {}
    }
}

/// `out[i] = f(x[i])` in the arithmetic type, rounded once.
#[inline(always)]
fn map1<T: Element>(out: &mut [T], x: &[T], f: impl Fn(T::Acc) -> T::Acc) {
    for (o, x) in out.iter_mut().zip(x) {
        *o = T::from_acc(f(x.to_acc()));
    }
}

/// `out[i] = f(a[i], b[i])` in the arithmetic type, rounded once.
#[inline(always)]
fn map2<T: Element>(out: &mut [T], a: &[T], b: &[T], f: impl Fn(T::Acc, T::Acc) -> T::Acc) {
    for ((o, a), b) in out.iter_mut().zip(a).zip(b) {
        *o = T::from_acc(f(a.to_acc(), b.to_acc()));
    }
}
