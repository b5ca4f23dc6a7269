//! Data-parallel training: one replica of the model per GPU, gradients averaged over the
//! replicas with NCCL after each backward (see [`opsmith_host::dist`] for the communicator and
//! its TCP bootstrap).
//!
//! With every rank holding an equal share of the batch and the loss a mean over its share, the
//! averaged gradient is the gradient of the mean loss over the whole batch, so each step equals
//! one step of single-GPU training on the concatenated batch (up to the order of additions).
use crate::Result;
use crate::tape::{Gradients, Var};
use opsmith_host::Tensor;
use opsmith_host::dist::Communicator;
use std::collections::HashSet;

/// Keeps replicas in step: the same initial weights, averaged gradients.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// # if !opsmith_host::Device::cuda_if_available().is_cuda() || !opsmith_host::dist::nccl_available() { return Ok(()); }
/// use opsmith_autograd::data_parallel::DataParallel;
/// use opsmith_autograd::nn::{Activation, Mlp};
/// use opsmith_autograd::optim::{Adam, AdamConfig, Optimizer};
/// use opsmith_autograd::{Tape, Var, ops};
/// use opsmith_host::dist::{Communicator, UniqueId};
/// use opsmith_host::{DType, Device, Labels, Tensor};
/// // One thread or process per GPU; here rank 0 of a world of 1.
/// let (rank, world) = (0, 1);
/// let device = Device::Cuda(rank);
/// let comm = Communicator::new(device, rank, world, &UniqueId::new()?)?;
/// let tape = Tape::new();
/// let mlp = Mlp::new(&tape, &[2, 32, 2], Activation::Relu, DType::F32, device, 1)?;
/// let dp = DataParallel::new(comm, mlp.parameters())?; // replicas start from rank 0's weights
/// let mut adam = Adam::new(mlp.parameters(), AdamConfig::default())?;
/// let x = Var::constant(Tensor::from_vec(vec![0.5f32, -0.5], [1, 2], device)?); // this rank's share
/// let loss = ops::cross_entropy(&mlp.forward(&x)?, &Labels::new(&[1], device)?)?;
/// let grads = tape.backward(&loss)?;
/// dp.average_gradients(&grads)?;
/// adam.step(&grads)?;
/// # Ok(()) }
/// ```
pub struct DataParallel {
    comm: Communicator,
    params: Vec<Var>,
}

impl DataParallel {
    /// Takes over `comm` for `params`, and overwrites every rank's parameters with rank 0's, so
    /// that the replicas start equal whatever their initialisation. A parameter listed twice
    /// counts once.
    pub fn new(comm: Communicator, params: Vec<Var>) -> Result<DataParallel> {
        let params = distinct(params);
        for p in &params {
            comm.broadcast_(p.value(), 0)?;
        }
        Ok(DataParallel { comm, params })
    }

    /// Replaces each parameter's gradient in `grads` by its mean over the ranks, in place, in
    /// one NCCL group. Every rank must call it after each backward, with gradients for the same
    /// parameters.
    pub fn average_gradients(&self, grads: &Gradients) -> Result<()> {
        Ok(self.comm.all_reduce_mean_(&gradients_of(&self.params, grads))?)
    }

    /// The mean of a one-element value (a loss) over the ranks, for reporting.
    pub fn mean_scalar(&self, value: &Tensor) -> Result<f64> {
        let copy = value.copy()?;
        self.comm.all_reduce_mean_(&[&copy])?;
        Ok(copy.to_vec_f64()?[0])
    }

    /// The communicator.
    pub fn communicator(&self) -> &Communicator {
        &self.comm
    }
}

/// `params` without repeats, in order: the all-reduce must not see one gradient twice.
fn distinct(mut params: Vec<Var>) -> Vec<Var> {
    let mut seen = HashSet::new();
    params.retain(|p| seen.insert(p.id()));
    params
}

/// The gradients of `params` that `grads` holds, as handed to the all-reduce, which rejects two
/// that share memory: distinct parameters have distinct gradients ([`crate::Tape::backward`]).
fn gradients_of<'a>(params: &[Var], grads: &'a Gradients) -> Vec<&'a Tensor> {
    params.iter().filter_map(|p| grads.get(p)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Tape, ops};
    use opsmith_host::Device;

    /// What `average_gradients` hands NCCL, checked on the CPU: `add` gives its upstream
    /// gradient to both parameters, and `b` is listed twice; no two tensors may share memory
    /// (NCCL's all-reduce fails with `Overlap` if they do), and each is still the right gradient.
    #[test]
    fn the_all_reduce_gets_disjoint_gradients() -> Result<()> {
        let tape = Tape::new();
        let t = |v: Vec<f32>| Tensor::from_vec(v, [3], Device::Cpu);
        let (a, b) = (tape.var(t(vec![1.0, 2.0, 3.0])?), tape.var(t(vec![-1.0, 0.5, 4.0])?));
        let w = tape.var(t(vec![0.5, -2.0, 1.5])?);
        let grads = tape.backward(&ops::sum(&ops::mul(&ops::add(&a, &b)?, &w)?)?)?;
        let params = distinct(vec![a.clone(), b.clone(), w.clone(), b.clone()]);
        assert_eq!(params.iter().map(Var::id).collect::<Vec<_>>(), [a.id(), b.id(), w.id()]);
        let tensors = gradients_of(&params, &grads);
        assert_eq!(tensors.len(), 3);
        for (i, ti) in tensors.iter().enumerate() {
            for tj in &tensors[i + 1..] {
                assert!(!ti.shares_storage(tj), "gradients {i} and a later one share memory");
            }
        }
        // d/da = d/db = w, d/dw = a + b.
        assert_eq!(tensors[0].to_vec::<f32>()?, [0.5, -2.0, 1.5]);
        assert_eq!(tensors[1].to_vec::<f32>()?, [0.5, -2.0, 1.5]);
        assert_eq!(tensors[2].to_vec::<f32>()?, [0.0, 2.5, 7.0]);
        Ok(())
    }
}
