//! Training steps captured once as CUDA graphs and replayed, against the same steps run
//! eagerly: the n = 1024 tape step (`(x + y)·w`, sum, backward) and train_mlp's step (a
//! [2, 128, 2] MLP, cross-entropy, Adam). Needs a CUDA device. A last row replays a chain of 7
//! one-element adds, the floor under a graph's depth (the MLP step's is 4): what a node in a row
//! costs when its kernel does next to nothing; the same chain of 2^22-element adds, eager and
//! replayed, shows what launching kernels early (`OPSMITH_DEPENDENT_LAUNCH`) does to big ones.
//!
//! ```text
//! cargo run --release --example graph_step            # prints a table last
//! cargo run --release --example graph_step -- --quick # fewer repeats
//! python3 benches/torch_graph.py                      # PyTorch's eager and torch.cuda.graph, same steps
//! ```
//!
//! Methodology, the same as `benches/torch_graph.py`: after a warm-up, blocks of K back-to-back
//! steps (K = 1000 for n = 1024, 500 for the MLP) between two events, with the host's wall time
//! over the same block (ending with a synchronize); the median per step of 7 blocks. Eager steps
//! are bound by the host's launches, so both columns agree there; a replay is one launch.
//! Before timing, the example checks that replays give the same bits as eager steps.
use opsmith::autograd::nn::{Activation, Mlp};
use opsmith::autograd::optim::{Adam, AdamConfig, Optimizer};
use opsmith::autograd::{Error, Result, Tape, Var, ops};
use opsmith::host::Labels;
use opsmith::host::cuda::{CudaDevice, Graph, Stream};
use opsmith::{DType, Device, Tensor};
use std::time::Instant;

#[path = "common/spirals.rs"]
mod spirals;

/// Per-step medians of one mode: (µs by events, µs by wall time).
fn time_blocks(
    stream: &Stream,
    steps_per_block: usize,
    blocks: usize,
    mut step: impl FnMut() -> Result<()>,
) -> Result<(f64, f64)> {
    for _ in 0..100 {
        step()?;
    }
    stream.synchronize()?;
    let (mut events, mut wall) = (Vec::new(), Vec::new());
    for _ in 0..blocks {
        let started = Instant::now();
        let start = stream.record_event()?;
        for _ in 0..steps_per_block {
            step()?;
        }
        let end = stream.record_event()?;
        end.synchronize()?;
        wall.push(started.elapsed().as_secs_f64() * 1e6 / steps_per_block as f64);
        events.push(start.elapsed_ms(&end)? as f64 * 1e3 / steps_per_block as f64);
    }
    Ok((median(events), median(wall)))
}

/// The host's time to queue one replay (µs): 200 replays queued after a synchronize, without
/// waiting for them. Below the replay's GPU time, the step is GPU-bound.
fn host_queue_us(stream: &Stream, graph: &Graph) -> Result<f64> {
    stream.synchronize()?;
    let started = Instant::now();
    for _ in 0..200 {
        graph.replay()?;
    }
    let us = started.elapsed().as_secs_f64() * 1e6 / 200.0;
    stream.synchronize()?;
    Ok(us)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn random(n: usize, seed: u64, device: Device) -> Result<Tensor> {
    let mut state = seed | 1;
    let values: Vec<f32> = (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0) as f32
        })
        .collect();
    Ok(Tensor::from_vec(values, [n], device)?)
}

/// The bits of every tensor, for comparing runs exactly.
fn bits(ts: &[&Tensor]) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for t in ts {
        out.extend(t.to_vec::<f32>()?.iter().map(|v| v.to_bits()));
    }
    Ok(out)
}

/// The n = 1024 tape step; returns the gradients of x, y and w.
fn tape_step(x: &Tensor, y: &Tensor, w: &Tensor) -> Result<[Tensor; 3]> {
    let tape = Tape::new();
    let (xv, yv, wv) = (tape.var(x.clone()), tape.var(y.clone()), tape.var(w.clone()));
    let loss = ops::sum(&ops::add_mul(&xv, &yv, &wv)?)?;
    let grads = tape.backward(&loss)?;
    let grad = |v: &Var| {
        grads.get(v).cloned().ok_or_else(|| {
            Error::from(opsmith::host::Error::InvalidArgument {
                op: "graph_step",
                reason: "a leaf got no gradient".into(),
            })
        })
    };
    Ok([grad(&xv)?, grad(&yv)?, grad(&wv)?])
}

struct Row {
    step: &'static str,
    mode: &'static str,
    events_us: f64,
    wall_us: f64,
}

/// Writes `graph` as `name.dot` into `dir`, if given.
fn dot(dir: Option<&std::path::Path>, name: &str, graph: &Graph) -> Result<()> {
    if let Some(dir) = dir {
        graph.write_dot(dir.join(format!("{name}.dot")))?;
    }
    Ok(())
}

fn small_step(dev: &CudaDevice, blocks: usize, dot_dir: Option<&std::path::Path>, rows: &mut Vec<Row>) -> Result<()> {
    let device = dev.device();
    let stream = dev.current_stream();
    let n = 1024;
    let (x, y, w) = (random(n, 1, device)?, random(n, 2, device)?, random(n, 3, device)?);
    let fresh = [random(n, 4, device)?, random(n, 5, device)?, random(n, 6, device)?];

    // Eager and replayed gradients must be the same bits, on the inputs and on new ones.
    let eager = tape_step(&x, &y, &w)?;
    let (graph, grads) = Graph::capture(dev, || tape_step(&x, &y, &w))?;
    dot(dot_dir, "n1024-step", &graph)?;
    graph.replay()?;
    assert_same("n = 1024 step", &eager, &grads)?;
    for (input, new) in [&x, &y, &w].into_iter().zip(&fresh) {
        input.copy_from_(new)?;
    }
    graph.replay()?;
    assert_same("n = 1024 step, new inputs", &tape_step(&fresh[0], &fresh[1], &fresh[2])?, &grads)?;
    println!(
        "check: n = 1024 graph gradients equal eager's bit for bit (static and copied-in inputs; graph of {} nodes, \
         {} in a row, {} edges of which {} programmatic)",
        graph.node_count(),
        graph.depth(),
        graph.edge_count(),
        graph.programmatic_edges()
    );

    let k = 1000;
    let (e, wl) = time_blocks(&stream, k, blocks, || tape_step(&x, &y, &w).map(drop))?;
    rows.push(Row { step: "n=1024 step", mode: "eager", events_us: e, wall_us: wl });
    let (e, wl) = time_blocks(&stream, k, blocks, || Ok(graph.replay()?))?;
    rows.push(Row { step: "n=1024 step", mode: "graph", events_us: e, wall_us: wl });
    println!("n = 1024 step: the host queues one replay in {:.2} µs", host_queue_us(&stream, &graph)?);
    let (e, wl) = time_blocks(&stream, k, blocks, || {
        for (input, new) in [&x, &y, &w].into_iter().zip(&fresh) {
            input.copy_from_(new)?;
        }
        Ok(graph.replay()?)
    })?;
    rows.push(Row { step: "n=1024 step", mode: "graph + copy_ of new inputs", events_us: e, wall_us: wl });
    Ok(())
}

fn assert_same(what: &str, eager: &[Tensor; 3], replayed: &[Tensor; 3]) -> Result<()> {
    let (a, b) = (bits(&eager.each_ref())?, bits(&replayed.each_ref())?);
    if a != b {
        let differ = a.iter().zip(&b).filter(|(p, q)| p != q).count();
        return Err(opsmith::host::Error::InvalidArgument {
            op: "graph_step",
            reason: format!("{what}: the replay differs from the eager step in {differ} of {} values", a.len()),
        }
        .into());
    }
    Ok(())
}

/// train_mlp's model and data, built the same way every time.
struct Mlp2 {
    tape: Tape,
    mlp: Mlp,
    adam: Adam,
    x: Var,
    labels: Labels,
}

impl Mlp2 {
    fn new(device: Device) -> Result<Self> {
        let points = 1024;
        let (features, classes) = spirals::spirals(points, 1);
        let tape = Tape::new();
        let mlp = Mlp::new(&tape, &[2, 128, 2], Activation::Relu, DType::F32, device, 42)?;
        let adam = Adam::new(mlp.parameters(), AdamConfig { lr: 0.02, ..AdamConfig::default() })?;
        let x = Var::constant(Tensor::from_vec(features, [points, 2], device)?);
        Ok(Mlp2 { tape, mlp, adam, x, labels: Labels::new(&classes, device)? })
    }

    /// One step; returns the loss.
    fn step(&mut self) -> Result<Tensor> {
        let loss = ops::cross_entropy(&self.mlp.forward(&self.x)?, &self.labels)?;
        let grads = self.tape.backward(&loss)?;
        self.adam.step(&grads)?;
        Ok(loss.value().clone())
    }

    fn parameter_bits(&self) -> Result<Vec<u32>> {
        let params = self.mlp.parameters();
        bits(&params.iter().map(Var::value).collect::<Vec<_>>())
    }
}

fn mlp_step(dev: &CudaDevice, blocks: usize, dot_dir: Option<&std::path::Path>, rows: &mut Vec<Row>) -> Result<()> {
    let device = dev.device();
    let stream = dev.current_stream();
    // 1 eager step (the warm-up before capture), then 100 replays, against 101 eager steps.
    let mut eager = Mlp2::new(device)?;
    let mut eager_losses = Vec::new();
    for _ in 0..101 {
        eager_losses.push(eager.step()?.to_vec::<f32>()?[0].to_bits());
    }
    let mut graphed = Mlp2::new(device)?;
    let mut graphed_losses = vec![graphed.step()?.to_vec::<f32>()?[0].to_bits()];
    let (graph, loss) = Graph::capture(dev, || graphed.step())?;
    dot(dot_dir, "mlp-step", &graph)?;
    for _ in 0..100 {
        graph.replay()?;
        graphed_losses.push(loss.to_vec::<f32>()?[0].to_bits());
    }
    if eager_losses != graphed_losses || eager.parameter_bits()? != graphed.parameter_bits()? {
        return Err(opsmith::host::Error::InvalidArgument {
            op: "graph_step",
            reason: "101 MLP steps: the replayed losses or parameters differ from the eager ones".into(),
        }
        .into());
    }
    println!(
        "check: MLP, 1 eager step + 100 replays equal 101 eager steps bit for bit (losses and parameters; \
         graph of {} nodes, {} in a row, {} edges of which {} programmatic, {} KiB pool)",
        graph.node_count(),
        graph.depth(),
        graph.edge_count(),
        graph.programmatic_edges(),
        graph.pool_bytes() / 1024
    );

    let k = 500;
    let (e, wl) = time_blocks(&stream, k, blocks, || eager.step().map(drop))?;
    rows.push(Row { step: "mlp step", mode: "eager", events_us: e, wall_us: wl });
    let (e, wl) = time_blocks(&stream, k, blocks, || Ok(graph.replay()?))?;
    rows.push(Row { step: "mlp step", mode: "graph", events_us: e, wall_us: wl });
    println!("mlp step: the host queues one replay in {:.2} µs", host_queue_us(&stream, &graph)?);
    let new_x = random(1024 * 2, 7, device)?.reshape([1024, 2])?;
    let (e, wl) = time_blocks(&stream, k, blocks, || {
        graphed.x.value().copy_from_(&new_x)?;
        Ok(graph.replay()?)
    })?;
    rows.push(Row { step: "mlp step", mode: "graph + copy_ of new inputs", events_us: e, wall_us: wl });
    Ok(())
}

/// Training steps captured as CUDA graphs and replayed, checked bit for bit against eager
/// steps, then timed against them (needs a CUDA device).
#[derive(clap::Parser)]
#[command(name = "graph_step")]
struct Args {
    /// 3 timed blocks per row instead of 7.
    #[arg(long)]
    quick: bool,
    /// Write each captured graph (nodes and edges) as DOT files into this folder.
    #[arg(long, value_name = "DIR")]
    dot: Option<std::path::PathBuf>,
}

/// The depth of the chain rows: enough nodes in a row to read the cost of one from.
const CHAIN_DEPTH: usize = 7;

/// `x` added to itself [`CHAIN_DEPTH`] times, each add reading the one before.
fn add_chain(x: &Tensor) -> Result<Tensor> {
    let mut y = x.clone();
    for _ in 0..CHAIN_DEPTH {
        y = opsmith::host::ops::add(&y, x)?;
    }
    Ok(y)
}

/// The floor under a replay's depth: a graph of [`CHAIN_DEPTH`] one-element adds, each reading
/// the one before, so that it runs as a chain of nodes doing next to no work.
fn chain_floor(dev: &CudaDevice, blocks: usize, rows: &mut Vec<Row>) -> Result<()> {
    let x = random(1, 9, dev.device())?;
    let run = || add_chain(&x);
    run()?;
    let (graph, _out) = Graph::capture(dev, run)?;
    println!(
        "chain: {} nodes, {} in a row, {} edges of which {} programmatic",
        graph.node_count(),
        graph.depth(),
        graph.edge_count(),
        graph.programmatic_edges()
    );
    let (e, wl) = time_blocks(&dev.current_stream(), 1000, blocks, || Ok(graph.replay()?))?;
    rows.push(Row { step: "chain of 7 one-element adds", mode: "graph", events_us: e, wall_us: wl });
    Ok(())
}

/// The same chain on 2^22-element tensors, eager and replayed: multi-wave kernels, each
/// bound by memory, where launching a kernel before its predecessor ends must not cost time.
fn wide_chain(dev: &CudaDevice, blocks: usize, rows: &mut Vec<Row>) -> Result<()> {
    let x = random(1 << 22, 10, dev.device())?;
    let run = || add_chain(&x);
    run()?;
    let stream = dev.current_stream();
    let (e, wl) = time_blocks(&stream, 20, blocks, || run().map(drop))?;
    rows.push(Row { step: "chain of 7 adds of 2^22 f32", mode: "eager", events_us: e, wall_us: wl });
    let (graph, _out) = Graph::capture(dev, run)?;
    let (e, wl) = time_blocks(&stream, 20, blocks, || Ok(graph.replay()?))?;
    rows.push(Row { step: "chain of 7 adds of 2^22 f32", mode: "graph", events_us: e, wall_us: wl });
    Ok(())
}

fn main() -> Result<()> {
    let args = <Args as clap::Parser>::parse();
    let blocks = if args.quick { 3 } else { 7 };
    let dev = match CudaDevice::get(0) {
        Ok(dev) => dev,
        Err(e) => {
            eprintln!("graph_step needs a CUDA device: {e}");
            std::process::exit(2);
        }
    };
    println!("{} ({} SMs)", dev.name()?, dev.sm_count());
    let early = dev.kernel("add_f32")?.dependent_launch();
    println!("dependent launch (sm_90 kernels start before their predecessor ends): {early}");
    let mut rows = Vec::new();
    small_step(&dev, blocks, args.dot.as_deref(), &mut rows)?;
    mlp_step(&dev, blocks, args.dot.as_deref(), &mut rows)?;
    chain_floor(&dev, blocks, &mut rows)?;
    wide_chain(&dev, blocks, &mut rows)?;

    println!("\nper step, median of {blocks} blocks; speedup: eager's µs/step (events) over the row's");
    println!("| step | mode | µs/step (events) | µs/step (wall) | speedup vs eager |");
    println!("|---|---|---|---|---|");
    for row in &rows {
        let eager = rows.iter().find(|r| r.step == row.step && r.mode == "eager");
        // The chain has no eager row to compare with.
        let speedup = eager.map_or("–".to_string(), |e| format!("{:.2}×", e.events_us / row.events_us));
        println!("| {} | {} | {:.2} | {:.2} | {speedup} |", row.step, row.mode, row.events_us, row.wall_us);
    }
    Ok(())
}
