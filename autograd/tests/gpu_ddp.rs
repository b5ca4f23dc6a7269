//! Data-parallel training on GPUs: replicas that average gradients with NCCL take the same
//! steps as one replica on the whole batch. Needs the `gpu-tests` feature; the two-GPU test
//! skips, saying so, where fewer GPUs are visible.
use opsmith_autograd::data_parallel::DataParallel;
use opsmith_autograd::nn::{Activation, Mlp};
use opsmith_autograd::optim::{Adam, AdamConfig, Optimizer};
use opsmith_autograd::{Result, Tape, Var, ops};
use opsmith_host::dist::{Communicator, UniqueId};
use opsmith_host::{DType, Device, Labels, Tensor, cuda};

const SIZES: [usize; 3] = [3, 24, 4];
const BATCH: usize = 64;
const STEPS: usize = 5;

fn batch() -> (Vec<f32>, Vec<u32>) {
    let x = (0..BATCH * SIZES[0]).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect();
    let y = (0..BATCH).map(|i| (i * 7 % SIZES[2]) as u32).collect();
    (x, y)
}

/// Trains `STEPS` Adam steps on rows `rows` of the batch, averaging gradients through `comm`
/// when given; returns the parameters.
fn train(device: Device, rows: std::ops::Range<usize>, comm: Option<Communicator>) -> Result<Vec<Vec<f64>>> {
    let tape = Tape::new();
    // Different seeds per replica: DataParallel::new must make them equal.
    let seed = if comm.as_ref().map(|c| c.rank()).unwrap_or(0) == 0 { 5 } else { 99 };
    let mlp = Mlp::new(&tape, &SIZES, Activation::Gelu, DType::F32, device, seed)?;
    let dp = comm.map(|c| DataParallel::new(c, mlp.parameters())).transpose()?;
    let mut adam = Adam::new(mlp.parameters(), AdamConfig { lr: 0.01, ..AdamConfig::default() })?;
    let (x, y) = batch();
    let f = SIZES[0];
    let xs = Var::constant(Tensor::from_vec(x[rows.start * f..rows.end * f].to_vec(), [rows.len(), f], device)?);
    let ys = Labels::new(&y[rows], device)?;
    for _ in 0..STEPS {
        let grads = tape.backward(&ops::cross_entropy(&mlp.forward(&xs)?, &ys)?)?;
        if let Some(dp) = &dp {
            dp.average_gradients(&grads)?;
        }
        adam.step(&grads)?;
    }
    mlp.parameters().iter().map(|p| Ok(p.value().to_vec_f64()?)).collect()
}

/// With one rank, the all-reduce is the identity: the same bits as training without it.
#[test]
fn one_rank_through_nccl_equals_plain_training() -> Result<()> {
    let device = Device::Cuda(0);
    let plain = train(device, 0..BATCH, None)?;
    let comm = Communicator::new(device, 0, 1, &UniqueId::new()?)?;
    let ddp = train(device, 0..BATCH, Some(comm))?;
    assert_eq!(plain, ddp);
    Ok(())
}

/// Two ranks, each on half the batch, against one GPU on all of it. The all-reduce adds the
/// two half-batch means in another order than the single-GPU mean, so the parameters agree to
/// f32 rounding amplified by a few Adam steps: within 1e-5 absolute (parameters are O(0.1–1)).
#[test]
fn two_ranks_equal_one_gpu_on_the_concatenated_batch() -> Result<()> {
    let gpus = cuda::device_count()?;
    if gpus < 2 {
        println!("SKIPPED: the two-GPU equivalence test needs 2 GPUs; {gpus} visible");
        return Ok(());
    }
    let reference = train(Device::Cuda(0), 0..BATCH, None)?;
    let id = UniqueId::new()?;
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || -> Result<Vec<Vec<f64>>> {
                let device = Device::Cuda(rank);
                let comm = Communicator::new(device, rank, 2, &id)?;
                let half = BATCH / 2;
                train(device, rank * half..(rank + 1) * half, Some(comm))
            })
        })
        .collect();
    let results: Vec<Vec<Vec<f64>>> =
        ranks.into_iter().map(|h| h.join().expect("rank panicked")).collect::<Result<_>>()?;
    assert_eq!(results[0], results[1], "replicas stay bit-identical");
    let mut worst = 0.0f64;
    for (p, r) in results[0].iter().zip(&reference) {
        for (a, b) in p.iter().zip(r) {
            worst = worst.max((a - b).abs());
        }
    }
    println!("two ranks vs one GPU: max |parameter difference| after {STEPS} steps = {worst:e}");
    assert!(worst < 1e-5, "max difference {worst:e}");
    Ok(())
}
