//! Trains a small MLP to tell two interleaved spirals apart, on CUDA if present, else on the
//! CPU, with the loss shown as it falls; reports the accuracy on held-out points and writes the
//! trained weights as safetensors (the file the `serve` example loads).
//!
//! ```text
//! cargo run --release --example train_mlp                       # CUDA if present
//! cargo run --release --example train_mlp -- --device cpu --out target/mlp.safetensors
//! cargo run --release --example train_mlp -- --graph            # steps replayed as a CUDA graph
//! ```
//!
//! Everything runs through the tape: `Mlp::forward` (GEMM + bias row + ReLU), a fused
//! log-softmax cross-entropy, backward, and one fused Adam kernel for the four parameters. With
//! `--graph`, the first step runs eagerly (it loads the kernels), the second is captured as a CUDA graph,
//! and every later step is one replay of it: the same kernels on the same memory, with Adam's
//! step count and learning rate read from device memory, so the result is the eager one, bit
//! for bit.
use indicatif::{ProgressBar, ProgressStyle};
use opsmith::autograd::nn::{Activation, Mlp};
use opsmith::autograd::optim::{Adam, AdamConfig, Optimizer};
use opsmith::autograd::{Result, Tape, Var, no_grad, ops};
use opsmith::host::Labels;
#[cfg(feature = "cuda")]
use opsmith::host::cuda::{CudaDevice, Graph};
use opsmith::{DType, Device, Tensor};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

#[path = "common/spirals.rs"]
mod spirals;
use spirals::{accuracy, spirals};

/// The accuracy this example promises on held-out points; it exits with an error below it.
const REQUIRED_ACCURACY: f64 = 0.95;

/// Trains a [2, hidden, 2] MLP on two interleaved spirals, reports its held-out accuracy and
/// writes its weights as safetensors (the file `serve` loads).
#[derive(clap::Parser)]
#[command(name = "train_mlp")]
struct Args {
    /// Where to train [default: cuda if there is a GPU, else cpu].
    #[arg(long, value_enum)]
    device: Option<DeviceFlag>,
    /// Training steps.
    #[arg(long, value_name = "N", default_value_t = 600)]
    steps: usize,
    /// Hidden units.
    #[arg(long, value_name = "N", default_value_t = 128)]
    hidden: usize,
    /// Training points (and as many held-out ones).
    #[arg(long, value_name = "N", default_value_t = 1024)]
    points: usize,
    /// Where the trained weights go.
    #[arg(long, value_name = "FILE", default_value = "target/mlp.safetensors")]
    out: PathBuf,
    /// Replay every step after the second as a CUDA graph (needs --device cuda and a GPU).
    #[arg(long)]
    graph: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum DeviceFlag {
    Cpu,
    Cuda,
}

fn main() -> Result<()> {
    let args = <Args as clap::Parser>::parse();
    let device = match args.device {
        Some(DeviceFlag::Cpu) => Device::Cpu,
        Some(DeviceFlag::Cuda) => Device::Cuda(0),
        None => Device::cuda_if_available(),
    };
    if args.graph && !device.is_cuda() {
        <Args as clap::CommandFactory>::command()
            .error(
                clap::error::ErrorKind::ArgumentConflict,
                "--graph replays steps as a CUDA graph and needs --device cuda (and a GPU)",
            )
            .exit();
    }
    println!("training a [2, {}, 2] MLP on {} spiral points, on {device}", args.hidden, args.points);

    let (train_x, train_y) = spirals(args.points, 1);
    let (test_x, test_y) = spirals(args.points, 2);
    let x = Var::constant(Tensor::from_vec(train_x, [args.points, 2], device)?);
    let labels = Labels::new(&train_y, device)?;

    let tape = Tape::new();
    let mlp = Mlp::new(&tape, &[2, args.hidden, 2], Activation::Relu, DType::F32, device, 42)?;
    let mut adam = Adam::new(mlp.parameters(), AdamConfig { lr: 0.02, ..AdamConfig::default() })?;

    // A bar on a terminal; plain lines in logs (CI), ten of them.
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::new(args.steps as u64);
        bar.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} steps  loss {msg}  {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    });
    // One training step; returns the loss. Under --graph it runs eagerly once, is then captured,
    // and the capture's loss tensor holds each replay's loss.
    let mut train_step = || -> Result<Var> {
        let loss = ops::cross_entropy(&mlp.forward(&x)?, &labels)?;
        let grads = tape.backward(&loss)?;
        adam.step(&grads)?;
        Ok(loss)
    };
    #[cfg(feature = "cuda")]
    let mut graph: Option<(Graph, Var)> = None;
    let started = Instant::now();
    let mut first_loss = None;
    let mut last_loss = f64::NAN;
    for step in 1..=args.steps {
        #[cfg(feature = "cuda")]
        let loss = match (&graph, device) {
            (Some((graph, loss)), _) => {
                graph.replay()?;
                loss.clone()
            }
            (None, Device::Cuda(ordinal)) if args.graph && step == 2 => {
                let dev = CudaDevice::get(ordinal)?;
                let (captured, loss) = Graph::capture(&dev, &mut train_step)?;
                captured.replay()?; // the capture recorded step 2; this runs it
                graph = Some((captured, loss.clone()));
                loss
            }
            _ => train_step()?,
        };
        #[cfg(not(feature = "cuda"))]
        let loss = train_step()?;
        // Reading the loss synchronizes; a training loop on a GPU would do it less often.
        if step == 1 || step % 10 == 0 || step == args.steps {
            last_loss = loss.value().to_vec_f64()?[0];
            first_loss.get_or_insert(last_loss);
            match &bar {
                Some(bar) => {
                    bar.set_position(step as u64);
                    bar.set_message(format!("{last_loss:.4}"));
                }
                None if step == 1 || step % (args.steps / 10).max(1) == 0 || step == args.steps => {
                    println!("step {step:>5}/{}  loss {last_loss:.4}", args.steps);
                }
                None => {}
            }
        }
    }
    if let Some(bar) = bar {
        bar.finish();
    }
    let elapsed = started.elapsed();

    let test_logits = {
        let _inference = no_grad();
        mlp.forward(&Var::constant(Tensor::from_vec(test_x, [args.points, 2], device)?))?
    };
    let test_accuracy = accuracy(test_logits.value(), &test_y)?;
    println!(
        "loss {:.4} -> {last_loss:.4} in {} steps ({:.2} ms/step{}); held-out accuracy {:.1}% (promised >= {:.0}%)",
        first_loss.unwrap_or(f64::NAN),
        args.steps,
        elapsed.as_secs_f64() * 1e3 / args.steps as f64,
        if args.graph { ", replayed as a CUDA graph" } else { "" },
        test_accuracy * 100.0,
        REQUIRED_ACCURACY * 100.0
    );

    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| opsmith::autograd::Error::ModelFile {
            path: dir.display().to_string(),
            reason: e.to_string(),
        })?;
    }
    mlp.save_safetensors(&args.out)?;
    println!("wrote the weights to {}", args.out.display());

    if test_accuracy < REQUIRED_ACCURACY {
        eprintln!("accuracy {:.1}% is below the promised {:.0}%", test_accuracy * 100.0, REQUIRED_ACCURACY * 100.0);
        std::process::exit(1);
    }
    Ok(())
}
