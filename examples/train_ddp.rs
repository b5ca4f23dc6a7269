//! Data-parallel training of the `train_mlp` model on every visible GPU: one replica per GPU,
//! each on its share of the batch, gradients averaged with NCCL after every backward.
//!
//! ```text
//! cargo run --release --example train_ddp                      # one thread per visible GPU
//! ```
//!
//! Across processes or hosts, start one process per GPU with the same address of rank 0
//! (reachable from every host) and its own rank; the unique id goes over TCP the same way:
//!
//! ```text
//! # host A (2 GPUs)                                   # host B (2 GPUs)
//! OPSMITH_DIST_ADDR=hostA:29500 OPSMITH_WORLD_SIZE=4   OPSMITH_DIST_ADDR=hostA:29500 OPSMITH_WORLD_SIZE=4
//!   OPSMITH_RANK=0 OPSMITH_LOCAL_RANK=0 train_ddp &      OPSMITH_RANK=2 OPSMITH_LOCAL_RANK=0 train_ddp &
//!   OPSMITH_RANK=1 OPSMITH_LOCAL_RANK=1 train_ddp        OPSMITH_RANK=3 OPSMITH_LOCAL_RANK=1 train_ddp
//! ```
//!
//! Each variable has a flag that wins over it: `--dist-addr`, `--world-size`, `--rank`,
//! `--local-rank` (`--help` lists them).
//!
//! Without a GPU it trains one replica on the CPU (nothing to average) and says so. NCCL's
//! NVLink multicast stays off (`NCCL_NVLS_ENABLE=0`) unless the environment sets it.
use opsmith::autograd::data_parallel::DataParallel;
use opsmith::autograd::nn::{Activation, Mlp};
use opsmith::autograd::optim::{Adam, AdamConfig, Optimizer};
use opsmith::autograd::{Result, Tape, Var, no_grad, ops};
use opsmith::host::Labels;
use opsmith::host::dist::{ADDR_ENV, Communicator, bootstrap_tcp};
use opsmith::{DType, Device, Tensor, cuda};
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

#[path = "common/spirals.rs"]
mod spirals;
use spirals::{accuracy, spirals};

const STEPS: usize = 600;
const HIDDEN: usize = 128;
/// The global batch, split evenly over the ranks.
const POINTS: usize = 1024;
const REQUIRED_ACCURACY: f64 = 0.95;

/// What one rank reports at the end.
struct Report {
    rank: usize,
    first_loss: f64,
    last_loss: f64,
    ms_per_step: f64,
    accuracy: Option<f64>,
}

/// Data-parallel training of train_mlp's model over every visible GPU, or one process per GPU
/// across hosts (set --rank and --world-size, or their environment variables).
#[derive(clap::Parser)]
#[command(name = "train_ddp")]
struct Args {
    /// This process's rank, when one process runs per GPU (needs --world-size).
    #[arg(long, env = "OPSMITH_RANK", value_name = "N", requires = "world_size")]
    rank: Option<usize>,
    /// How many processes in all (needs --rank).
    #[arg(long, env = "OPSMITH_WORLD_SIZE", value_name = "N", requires = "rank")]
    world_size: Option<usize>,
    /// The GPU this process trains on [default: its rank].
    #[arg(long, env = "OPSMITH_LOCAL_RANK", value_name = "N")]
    local_rank: Option<usize>,
    /// Rank 0's address, reachable from every host [default: 127.0.0.1:29500 across processes,
    /// a free loopback port within one].
    #[arg(long, env = ADDR_ENV, value_name = "HOST:PORT")]
    dist_addr: Option<String>,
}

/// `host:port` to an address (a host name is looked up).
fn resolve(text: &str) -> Result<SocketAddr> {
    let invalid = |reason: String| opsmith::autograd::Error::InvalidConfig { what: "train_ddp", reason };
    text.to_socket_addrs()
        .map_err(|e| invalid(format!("--dist-addr {text:?} is not a host:port address: {e}")))?
        .next()
        .ok_or_else(|| invalid(format!("--dist-addr {text:?} resolves to no address")))
}

/// Trains rank `rank` of `world` on `device`; the communicator is made through the TCP
/// bootstrap at `addr` (None: a single replica without NCCL, on the CPU).
fn train_rank(rank: usize, world: usize, device: Device, addr: Option<SocketAddr>) -> Result<Report> {
    let tape = Tape::new();
    let mlp = Mlp::new(&tape, &[2, HIDDEN, 2], Activation::Relu, DType::F32, device, 42)?;
    let dp = match addr {
        Some(addr) => {
            let id = bootstrap_tcp(rank, world, addr, Duration::from_secs(120))?;
            Some(DataParallel::new(Communicator::new(device, rank, world, &id)?, mlp.parameters())?)
        }
        None => None,
    };
    let mut adam = Adam::new(mlp.parameters(), AdamConfig { lr: 0.02, ..AdamConfig::default() })?;

    // This rank's share of the global batch.
    let (features, labels) = spirals(POINTS, 1);
    let share = POINTS / world;
    let rows = rank * share..(rank + 1) * share;
    let x = Var::constant(Tensor::from_vec(features[rows.start * 2..rows.end * 2].to_vec(), [share, 2], device)?);
    let y = Labels::new(&labels[rows], device)?;

    let started = Instant::now();
    let (mut first_loss, mut last_loss) = (f64::NAN, f64::NAN);
    for step in 1..=STEPS {
        let loss = ops::cross_entropy(&mlp.forward(&x)?, &y)?;
        let grads = tape.backward(&loss)?;
        if let Some(dp) = &dp {
            dp.average_gradients(&grads)?;
        }
        adam.step(&grads)?;
        if step == 1 || step % (STEPS / 10) == 0 {
            // The mean over ranks is the loss on the whole batch.
            last_loss = match &dp {
                Some(dp) => dp.mean_scalar(loss.value())?,
                None => loss.value().to_vec_f64()?[0],
            };
            if step == 1 {
                first_loss = last_loss;
            }
            if rank == 0 {
                println!("step {step:>4}/{STEPS}  loss {last_loss:.4}");
            }
        }
    }
    let ms_per_step = started.elapsed().as_secs_f64() * 1e3 / STEPS as f64;
    let accuracy = if rank == 0 {
        let (test_x, test_y) = spirals(POINTS, 2);
        let _inference = no_grad();
        let logits = mlp.forward(&Var::constant(Tensor::from_vec(test_x, [POINTS, 2], device)?))?;
        std::fs::create_dir_all("target").ok();
        mlp.save_safetensors("target/mlp-ddp.safetensors")?;
        Some(accuracy(logits.value(), &test_y)?)
    } else {
        None
    };
    Ok(Report { rank, first_loss, last_loss, ms_per_step, accuracy })
}

fn run(args: Args) -> Result<Vec<Report>> {
    // Launched per process (several hosts): the launcher gives each its rank.
    if let (Some(rank), Some(world)) = (args.rank, args.world_size) {
        let local = args.local_rank.unwrap_or(rank);
        let addr = resolve(args.dist_addr.as_deref().unwrap_or("127.0.0.1:29500"))?;
        println!("rank {rank} of {world} on cuda:{local}, rank 0 at {addr}");
        return Ok(vec![train_rank(rank, world, Device::Cuda(local), Some(addr))?]);
    }
    let gpus = if cuda::driver_available() { cuda::device_count().unwrap_or(0) } else { 0 };
    if gpus == 0 {
        println!("no CUDA device: training one replica on the CPU (nothing to all-reduce)");
        return Ok(vec![train_rank(0, 1, Device::Cpu, None)?]);
    }
    // One thread per GPU, through the same TCP bootstrap as separate processes would use.
    let addr = match &args.dist_addr {
        Some(addr) => resolve(addr)?,
        None => free_loopback_port()?,
    };
    println!("data-parallel over {gpus} GPU(s), {} points per GPU, one thread each", POINTS / gpus);
    let threads: Vec<_> = (0..gpus)
        .map(|rank| std::thread::spawn(move || train_rank(rank, gpus, Device::Cuda(rank), Some(addr))))
        .collect();
    threads
        .into_iter()
        .map(|t| {
            t.join().unwrap_or_else(|_| {
                Err(opsmith::autograd::Error::InvalidConfig { what: "train_ddp", reason: "a rank panicked".into() })
            })
        })
        .collect()
}

fn free_loopback_port() -> Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| opsmith::autograd::Error::InvalidConfig {
        what: "train_ddp",
        reason: format!("no free loopback port: {e}"),
    })?;
    listener
        .local_addr()
        .map_err(|e| opsmith::autograd::Error::InvalidConfig { what: "train_ddp", reason: e.to_string() })
}

fn main() {
    match run(<Args as clap::Parser>::parse()) {
        Ok(reports) => {
            for r in &reports {
                println!(
                    "rank {}: loss {:.4} -> {:.4}, {:.2} ms/step{}",
                    r.rank,
                    r.first_loss,
                    r.last_loss,
                    r.ms_per_step,
                    r.accuracy
                        .map(|a| format!(
                            ", held-out accuracy {:.1}% (weights in target/mlp-ddp.safetensors)",
                            a * 100.0
                        ))
                        .unwrap_or_default()
                );
            }
            if let Some(a) = reports.iter().find_map(|r| r.accuracy)
                && a < REQUIRED_ACCURACY
            {
                eprintln!("accuracy {:.1}% is below the promised {:.0}%", a * 100.0, REQUIRED_ACCURACY * 100.0);
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("train_ddp: {e}");
            std::process::exit(1);
        }
    }
}
