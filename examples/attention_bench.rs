//! Scaled dot-product attention on CUDA device 0 (issue #20): the forward alone, and forward +
//! backward through the autograd tape, over a grid of shapes, with a correctness spot-check
//! before each shape is timed. Needs a CUDA device.
//!
//! ```text
//! cargo run --release --example attention_bench                       # the whole grid, a table last
//! cargo run --release --example attention_bench -- --quick            # seq 1024 and 4096, fewer runs
//! cargo run --release --example attention_bench -- --seqs 2048 --head-dims 128 --dtype bf16 --no-backward
//! OPSMITH_FUSED_ATTENTION=0 cargo run --release --example attention_bench   # the composed path
//! python3 benches/attention_torch.py                                  # PyTorch's backends, same grid
//! ```
//!
//! Grid: batch 4 × heads 16 (`--batch`, `--heads`), seq_q = seq_k in {1024, 2048, 4096, 8192},
//! head_dim in {64, 128}, bf16 and f16, causal off and on; no mask, scale `1/sqrt(head_dim)`;
//! q, k, v (and the output gradient dO) standard normal.
//!
//! Path: whatever `ops::attention` picks; the fused kernel where it supports the call, unless
//! `OPSMITH_FUSED_ATTENTION=0` (read once per process) forces the composed path (matmul_t,
//! softmax, matmul). The table's first column says which of the two the process ran with.
//!
//! Methodology, the same as `benches/attention_torch.py`: [`opsmith::cuda::time_runs`], that is
//! warm-up runs (5; 2 with `--quick`), then timed runs (20; 5) each between two CUDA events, all
//! queued behind a spin kernel so they run back to back on the GPU; the median run. Forward
//! is one `ops::attention` call. Forward + backward is a fresh tape, `autograd::ops::attention`
//! on q, k, v that require gradients, and `Tape::backward_with(out, dO)` for a fixed random
//! dO, so no loss op is timed.
//!
//! FLOPs, FlashAttention's benchmark convention: forward = 4·b·h·s_q·s_k·d (the two products,
//! the softmax not counted), half that when causal whatever the kernel skips; backward = 2.5 ×
//! forward (five products), so forward + backward = 3.5 × forward. TFLOP/s = FLOPs / median.
//!
//! Check, at seq ≤ 2048 only: the output in the benchmark's dtype against `ops::attention` on the
//! same inputs cast to f32 (f32 always takes the composed path), the largest absolute
//! difference (NaN if either has a NaN). A shape that fails (out of memory, say, on the
//! composed path's `[b, h, s, s]` scores) prints `skipped: <error>` and the run goes on.
use opsmith::autograd::{Tape, ops as ag};
use opsmith::cuda::{self, CudaDevice, Stream};
use opsmith::{DType, Device, Result, Tensor, ops};
use std::fmt;

/// The longest sequence the f32 reference check runs at; its scores are `[b, h, s, s]` f32.
const CHECK_MAX_SEQ: usize = 2048;

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum DtypeFlag {
    Bf16,
    F16,
}

/// Scaled dot-product attention, forward and forward + backward, on CUDA device 0: ms, TFLOP/s
/// and the largest difference from an f32 reference, as a markdown table.
#[derive(clap::Parser)]
#[command(name = "attention_bench")]
struct Args {
    /// seq 1024 and 4096 (unless --seqs), and 2 warm-up + 5 timed runs instead of 5 + 20.
    #[arg(long)]
    quick: bool,
    /// Batch size.
    #[arg(long, value_name = "N", default_value_t = 4)]
    batch: usize,
    /// Heads.
    #[arg(long, value_name = "N", default_value_t = 16)]
    heads: usize,
    /// Sequence lengths, seq_q = seq_k [default: 1024,2048,4096,8192].
    #[arg(long, value_name = "N,..", value_delimiter = ',')]
    seqs: Vec<usize>,
    /// Head sizes.
    #[arg(long, value_name = "D,..", value_delimiter = ',', default_values_t = [64, 128])]
    head_dims: Vec<usize>,
    /// Dtypes.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [DtypeFlag::Bf16, DtypeFlag::F16])]
    dtype: Vec<DtypeFlag>,
    /// The forward only.
    #[arg(long)]
    no_backward: bool,
}

/// One shape of the grid.
#[derive(Clone, Copy)]
struct Case {
    dtype: DType,
    causal: bool,
    head_dim: usize,
    seq: usize,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = if self.causal { "causal" } else { "full" };
        write!(f, "{} {mode} d={} seq={}", self.dtype, self.head_dim, self.seq)
    }
}

/// What the grid shares: the device, the sizes and the repetitions.
struct Bench {
    stream: Stream,
    device: Device,
    batch: usize,
    heads: usize,
    warmup: usize,
    reps: usize,
    backward: bool,
}

impl Bench {
    /// Forward FLOPs of `case`, FlashAttention's convention (see the module docs).
    fn forward_flops(&self, case: Case) -> f64 {
        let full = 4.0 * (self.batch * self.heads) as f64 * (case.seq * case.seq * case.head_dim) as f64;
        if case.causal { full / 2.0 } else { full }
    }

    /// The median ms of `work` ([`cuda::time_runs`]).
    fn time_ms(&self, work: impl FnMut() -> Result<()>) -> Result<f64> {
        Ok(cuda::time_runs(&self.stream, self.warmup, self.reps, work)?.median_ms())
    }
}

/// q, k, v and dO of one case.
struct Inputs {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dout: Option<Tensor>,
    scale: f64,
}

impl Inputs {
    fn new(bench: &Bench, case: Case) -> Result<Inputs> {
        let shape = [bench.batch, bench.heads, case.seq, case.head_dim];
        let randn = |seed| Tensor::randn(shape, case.dtype, bench.device, seed);
        let dout = if bench.backward { Some(randn(4)?) } else { None };
        Ok(Inputs { q: randn(1)?, k: randn(2)?, v: randn(3)?, dout, scale: 1.0 / (case.head_dim as f64).sqrt() })
    }

    fn forward(&self, causal: bool) -> Result<Tensor> {
        Ok(ops::attention(&self.q, &self.k, &self.v, self.scale, causal, None)?)
    }

    /// Forward and backward on a fresh tape; the gradients are dropped.
    fn forward_backward(&self, causal: bool, dout: &Tensor) -> Result<()> {
        let tape = Tape::new();
        let (q, k, v) = (tape.var(self.q.clone()), tape.var(self.k.clone()), tape.var(self.v.clone()));
        let out = ag::attention(&q, &k, &v, self.scale, causal, None)?;
        tape.backward_with(&out, dout.clone())?;
        Ok(())
    }

    /// The largest `|out − reference|`, the reference computed from the same inputs in f32.
    fn max_abs_diff(&self, causal: bool) -> Result<f64> {
        let out = self.forward(causal)?.to_dtype(DType::F32)?;
        let f32s = |t: &Tensor| t.to_dtype(DType::F32);
        let reference = ops::attention(&f32s(&self.q)?, &f32s(&self.k)?, &f32s(&self.v)?, self.scale, causal, None)?;
        let diff = ops::sub(&out, &reference)?.to_vec::<f32>()?;
        // f64::max skips a NaN; here a NaN is the answer.
        Ok(diff.iter().fold(0.0, |m: f64, d| if m.is_nan() || d.is_nan() { f64::NAN } else { m.max(d.abs().into()) }))
    }
}

/// A table cell: not run (`-`), failed (`skipped`) or a value.
#[derive(Clone, Copy)]
enum Measured {
    NotRun,
    Skipped,
    Value(f64),
}

impl Measured {
    fn from_result(case: Case, what: &str, result: Result<f64>) -> Measured {
        match result {
            Ok(v) => Measured::Value(v),
            Err(e) => {
                println!("{case}: {what} skipped: {e}");
                Measured::Skipped
            }
        }
    }

    /// `format(value)`, or `-` or `skipped`.
    fn cell(self, format: impl Fn(f64) -> String) -> String {
        match self {
            Measured::NotRun => "-".into(),
            Measured::Skipped => "skipped".into(),
            Measured::Value(v) => format(v),
        }
    }
}

struct Row {
    case: Case,
    /// The forward's path for this case: "fused" or "composed" (`ops::attention_is_fused`).
    path: &'static str,
    fwd_ms: Measured,
    fwd_bwd_ms: Measured,
    max_diff: Measured,
}

/// Checks and times one case; a failure marks its cells skipped and never stops the run.
fn measure(bench: &Bench, case: Case) -> Row {
    let mut row =
        Row { case, path: "-", fwd_ms: Measured::NotRun, fwd_bwd_ms: Measured::NotRun, max_diff: Measured::NotRun };
    let inputs = match Inputs::new(bench, case) {
        Ok(inputs) => inputs,
        Err(e) => {
            println!("{case}: skipped: {e}");
            row.fwd_ms = Measured::Skipped;
            row.fwd_bwd_ms = if bench.backward { Measured::Skipped } else { Measured::NotRun };
            return row;
        }
    };
    let fused = ops::attention_is_fused(&inputs.q, &inputs.k, &inputs.v, case.causal, None);
    row.path = if fused { "fused" } else { "composed" };
    if case.seq <= CHECK_MAX_SEQ {
        row.max_diff = Measured::from_result(case, "check", inputs.max_abs_diff(case.causal));
    }
    let forward = bench.time_ms(|| inputs.forward(case.causal).map(drop));
    row.fwd_ms = Measured::from_result(case, "forward", forward);
    if let Some(dout) = &inputs.dout {
        let both = bench.time_ms(|| inputs.forward_backward(case.causal, dout));
        row.fwd_bwd_ms = Measured::from_result(case, "forward+backward", both);
    }
    let flops = bench.forward_flops(case);
    let rate = |flops| move |v| format!("{} ms, {} TFLOP/s", ms(v), tflops(flops)(v));
    println!(
        "{case}: fwd {}; fwd+bwd {}; max |out - f32 reference| {}",
        row.fwd_ms.cell(rate(flops)),
        row.fwd_bwd_ms.cell(rate(3.5 * flops)),
        row.max_diff.cell(diff)
    );
    row
}

fn ms(v: f64) -> String {
    format!("{v:.3}")
}

fn diff(v: f64) -> String {
    format!("{v:.2e}")
}

/// TFLOP/s of `flops` done in `ms` milliseconds.
fn tflops(flops: f64) -> impl Fn(f64) -> String {
    move |ms| format!("{:.1}", flops / ms / 1e9)
}

fn main() -> Result<()> {
    let args = <Args as clap::Parser>::parse();
    let dev = match CudaDevice::get(0) {
        Ok(dev) => dev,
        Err(e) => {
            eprintln!("attention_bench needs a CUDA device: {e}");
            std::process::exit(2);
        }
    };
    let path = match std::env::var("OPSMITH_FUSED_ATTENTION").as_deref() {
        Ok("0") => "composed",
        _ => "default",
    };
    let seqs = match (args.seqs.is_empty(), args.quick) {
        (false, _) => args.seqs.clone(),
        (true, false) => vec![1024, 2048, 4096, 8192],
        (true, true) => vec![1024, 4096],
    };
    let (warmup, reps) = if args.quick { (2, 5) } else { (5, 20) };
    let bench = Bench {
        stream: dev.current_stream(),
        device: dev.device(),
        batch: args.batch,
        heads: args.heads,
        warmup,
        reps,
        backward: !args.no_backward,
    };
    let gpu = dev.name()?;
    println!("{gpu} ({} SMs), opsmith attention, {path} path", dev.sm_count());

    let mut rows = Vec::new();
    for dtype in &args.dtype {
        let dtype = match dtype {
            DtypeFlag::Bf16 => DType::BF16,
            DtypeFlag::F16 => DType::F16,
        };
        for causal in [false, true] {
            for &head_dim in &args.head_dims {
                for &seq in &seqs {
                    rows.push(measure(&bench, Case { dtype, causal, head_dim, seq }));
                }
            }
        }
    }

    println!(
        "\nattention_bench ({path} path) on {gpu}: batch {}, heads {}, median of {reps} runs after {warmup} \
         warm-up; FLOPs fwd = 4·b·h·s²·d (/2 causal), fwd+bwd = 3.5 × fwd; max abs diff: against f32, seq ≤ {CHECK_MAX_SEQ}",
        bench.batch, bench.heads
    );
    println!(
        "| path | dtype | causal | head_dim | seq | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | max abs diff |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for row in &rows {
        let Case { dtype, causal, head_dim, seq } = row.case;
        let flops = bench.forward_flops(row.case);
        println!(
            "| {} | {dtype} | {causal} | {head_dim} | {seq} | {} | {} | {} | {} | {} |",
            row.path,
            row.fwd_ms.cell(ms),
            row.fwd_ms.cell(tflops(flops)),
            row.fwd_bwd_ms.cell(ms),
            row.fwd_bwd_ms.cell(tflops(3.5 * flops)),
            row.max_diff.cell(diff)
        );
    }
    if !rows.iter().any(|r| matches!(r.fwd_ms, Measured::Value(_))) {
        eprintln!("attention_bench: every shape was skipped");
        std::process::exit(1);
    }
    Ok(())
}
