//! The CPU half of the elementwise ops, on `ndarray`: one pass per op, fused where the GPU
//! kernel is fused, arithmetic in `Element::Acc` like the kernels.
use super::Elementwise;
use crate::dtype::{Accumulator, with_element_type};
use crate::tensor::storage::{CpuBuffer, StorageData};
use crate::{Element, Error, Result, Tensor};
use ndarray::{ArrayView1, ArrayViewMut1, Zip};
use parking_lot::RwLockReadGuard;
use std::sync::Arc;

pub(super) fn elementwise(op: Elementwise, inputs: &[&Tensor], outputs: &[&Tensor]) -> Result<()> {
    with_element_type!(inputs[0].dtype(), T => run::<T>(op, inputs, outputs))
}

fn cpu_buffer(t: &Tensor) -> Result<&parking_lot::RwLock<CpuBuffer>> {
    match &t.storage.data {
        StorageData::Cpu(buf) => Ok(buf),
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

    let in_guards: Vec<RwLockReadGuard<'_, CpuBuffer>> =
        inputs.iter().map(|t| cpu_buffer(t).map(|b| b.read_recursive())).collect::<Result<_>>()?;
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
    let mut out_guards = Vec::with_capacity(outputs.len());
    for t in outputs {
        out_guards.push(cpu_buffer(t)?.write());
        t.storage.bump_version();
    }
    let mut outs: Vec<ArrayViewMut1<'_, T>> = Vec::with_capacity(outputs.len());
    for (t, g) in outputs.iter().zip(out_guards.iter_mut()) {
        let actual = g.dtype();
        let s = T::cpu_slice_mut(g).ok_or(Error::ElementType { op: "cpu op", requested: T::DTYPE, actual })?;
        outs.push(ArrayViewMut1::from(&mut s[t.offset..t.offset + t.elem_count()]));
    }
    compute::<T>(op, &ins, &mut outs);
    Ok(())
}

/// The arithmetic of each op over validated, equally long views.
fn compute<T: Element>(op: Elementwise, ins: &[ArrayView1<'_, T>], outs: &mut [ArrayViewMut1<'_, T>]) {
    let acc = |x: &T| x.to_acc();
    match (op, outs) {
        (Elementwise::Add, [out]) => {
            Zip::from(out).and(&ins[0]).and(&ins[1]).for_each(|o, a, b| *o = T::from_acc(acc(a) + acc(b)))
        }
        (Elementwise::Sub, [out]) => {
            Zip::from(out).and(&ins[0]).and(&ins[1]).for_each(|o, a, b| *o = T::from_acc(acc(a) - acc(b)))
        }
        (Elementwise::Affine { alpha, beta }, [out]) => {
            let (alpha, beta) = (T::Acc::from_f64(alpha), T::Acc::from_f64(beta));
            Zip::from(out).and(&ins[0]).for_each(|o, x| *o = T::from_acc(Accumulator::fma(acc(x), alpha, beta)))
        }
        (Elementwise::Mul, [out]) => {
            Zip::from(out).and(&ins[0]).and(&ins[1]).for_each(|o, a, b| *o = T::from_acc(acc(a) * acc(b)))
        }
        (Elementwise::FusedMulAdd, [out]) => Zip::from(out)
            .and(&ins[0])
            .and(&ins[1])
            .and(&ins[2])
            .for_each(|o, a, b, c| *o = T::from_acc(Accumulator::fma(acc(a), acc(b), acc(c)))),
        (Elementwise::AddMul, [out]) => Zip::from(out)
            .and(&ins[0])
            .and(&ins[1])
            .and(&ins[2])
            .for_each(|o, x, y, w| *o = T::from_acc((acc(x) + acc(y)) * acc(w))),
        (Elementwise::AddMulBackward, [gxy, gw]) => {
            Zip::from(gxy).and(gw).and(&ins[0]).and(&ins[1]).and(&ins[2]).and(&ins[3]).for_each(
                |gxy, gw, g, x, y, w| {
                    *gxy = T::from_acc(acc(g) * acc(w));
                    *gw = T::from_acc(acc(g) * (acc(x) + acc(y)));
                },
            )
        }
        // `check::elementwise` fixed the arity before we got here.
        _ => {}
    }
}
