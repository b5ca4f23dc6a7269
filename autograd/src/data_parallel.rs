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
    /// that the replicas start equal whatever their initialisation.
    pub fn new(comm: Communicator, params: Vec<Var>) -> Result<DataParallel> {
        for p in &params {
            comm.broadcast_(p.value(), 0)?;
        }
        Ok(DataParallel { comm, params })
    }

    /// Replaces each parameter's gradient in `grads` by its mean over the ranks, in place, in
    /// one NCCL group. Every rank must call it after each backward, with gradients for the same
    /// parameters.
    pub fn average_gradients(&self, grads: &Gradients) -> Result<()> {
        let tensors: Vec<&Tensor> = self.params.iter().filter_map(|p| grads.get(p)).collect();
        Ok(self.comm.all_reduce_mean_(&tensors)?)
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
