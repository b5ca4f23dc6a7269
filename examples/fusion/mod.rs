//! What the two fused-op examples (`fused_mul_add`, `add_mul_backward`) share: their flags,
//! random inputs with exact host copies, median timing on either device, the accuracy check
//! against f64, and the table of bytes and times.
#[cfg(feature = "cuda")]
use opsmith::cuda::CudaDevice;
use opsmith::{DType, Device, Tensor};
use rand::{Rng, SeedableRng, rngs::StdRng};

/// The flags both examples take.
#[derive(clap::Parser)]
#[command(about = "A fused op against the same result from unfused ops: bytes moved, median time, GB/s, error")]
struct Flags {
    /// Elements = 2^N [default: 24 on CUDA, 20 on the CPU, 16 with --quick].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=30))]
    log2: Option<u32>,
    /// The element type.
    #[arg(long, value_enum, default_value_t = DTypeFlag::F32)]
    dtype: DTypeFlag,
    /// A small size and few repetitions, for unoptimised builds.
    #[arg(long)]
    quick: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum DTypeFlag {
    F32,
    F16,
    Bf16,
}

/// The parsed flags, with defaults sized for the device.
pub struct Args {
    pub log2: u32,
    pub dtype: DType,
    pub reps: usize,
}

impl Args {
    /// The command line (a bad flag prints clap's message and exits with status 2), with
    /// defaults sized for `device`: 2^24 elements on CUDA (large enough that memory, not launch
    /// overhead, sets the time), 2^20 on the CPU.
    pub fn parse(device: Device) -> Args {
        let flags = <Flags as clap::Parser>::parse();
        let log2 = match flags.log2 {
            Some(log2) => log2,
            None if flags.quick => 16,
            None if device.is_cuda() => 24,
            None => 20,
        };
        let dtype = match flags.dtype {
            DTypeFlag::F32 => DType::F32,
            DTypeFlag::F16 => DType::F16,
            DTypeFlag::Bf16 => DType::BF16,
        };
        Args { log2, dtype, reps: if flags.quick { 5 } else { 21 } }
    }

    pub fn n(&self) -> usize {
        1 << self.log2
    }
}

/// A tensor on the device and its values on the host, exactly (after rounding to the dtype).
pub struct Input {
    pub tensor: Tensor,
    pub host: Vec<f64>,
}

/// `n` values in ±[0.5, 2): no zeros, and products and sums that stay well inside every dtype's
/// range. Rounded to `dtype` on the host first, so `host` holds what the kernels read.
pub fn random_input(n: usize, dtype: DType, seed: u64, device: Device) -> opsmith::Result<Input> {
    let mut rng = StdRng::seed_from_u64(seed);
    let values: Vec<f64> =
        (0..n).map(|_| rng.random_range(0.5..2.0) * if rng.random_bool(0.5) { 1.0 } else { -1.0 }).collect();
    let on_host = Tensor::from_f64(&values, [n], dtype, Device::Cpu)?;
    let host = on_host.to_vec_f64()?;
    Ok(Input { tensor: on_host.to_device(device)?, host })
}

/// "cuda:0 (NVIDIA H200)" or "cpu".
pub fn describe(device: Device) -> opsmith::Result<String> {
    Ok(match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(ordinal) => format!("{device} ({})", CudaDevice::get(ordinal)?.name()?),
        _ => device.to_string(),
    })
}

/// The median milliseconds of `reps` runs of `f`, after 3 untimed ones (first-use costs: module
/// load, pool growth, page faults).
///
/// On CUDA, [`opsmith::cuda::time_runs`]: GPU time between two events on the current stream,
/// with every run queued before the GPU reaches it. On the CPU the ops are synchronous, so a
/// wall clock is right there.
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))] // `device` picks the clock on CUDA
pub fn median_ms<E: From<opsmith::host::Error>>(
    device: Device,
    reps: usize,
    mut f: impl FnMut() -> Result<(), E>,
) -> Result<f64, E> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(ordinal) = device {
        let stream = CudaDevice::get(ordinal)?.current_stream();
        return Ok(opsmith::cuda::time_runs(&stream, 3, reps, f)?.median_ms());
    }
    for _ in 0..3 {
        f()?;
    }
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = std::time::Instant::now();
        f()?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times.get(reps / 2).copied().unwrap_or(f64::NAN))
}

/// One way to compute the result: its kernels (or passes), the values per element it must
/// read plus write, and its measured time.
pub struct Row {
    pub what: &'static str,
    pub kernels: usize,
    pub values_per_element: usize,
    pub ms: f64,
}

/// Prints rows as a Markdown table: bytes each row must move (values per element × n × the
/// dtype's size: the floor on memory traffic, whatever the cache does), the median time, the
/// bandwidth that implies, and the speedup over the last row (the unfused baseline).
pub fn print_table(args: &Args, rows: &[Row]) {
    let baseline = rows.last().map_or(f64::NAN, |r| r.ms);
    println!("| path | kernels | values/element | bytes moved | median time | GB/s | speedup |");
    println!("|---|---|---|---|---|---|---|");
    for r in rows {
        let bytes = (r.values_per_element * args.n() * args.dtype.size_in_bytes()) as f64;
        println!(
            "| {} | {} | {} | {:.1} MB | {:.3} ms | {:.1} | {:.2}x |",
            r.what,
            r.kernels,
            r.values_per_element,
            bytes / 1e6,
            r.ms,
            bytes / r.ms / 1e6,
            baseline / r.ms
        );
    }
}

/// The largest error of `got` against `reference(i)`, in units in the last place of `dtype` at
/// the reference value (one correct rounding is at most 0.5), over two windows of up to 2^15
/// elements: the head and the tail, where a grid-stride loop's first and last iterations write.
pub fn max_error_ulps(got: &Tensor, dtype: DType, reference: impl Fn(usize) -> f64) -> opsmith::Result<f64> {
    let n = got.elem_count();
    let window = n.min(1 << 15);
    let mut worst = 0.0f64;
    for start in [0, n - window] {
        for (k, value) in got.flat_slice(start, window)?.to_vec_f64()?.into_iter().enumerate() {
            let exact = reference(start + k);
            worst = worst.max((value - exact).abs() / ulp(exact, dtype));
        }
    }
    Ok(worst)
}

/// The most a once-rounded result may be off, in ulps of `dtype`: half an ulp, plus ~2^-29 ulp
/// for the f64 reference. The kernels compute in f32, so an f16 or bf16 result is rounded to f32
/// first, which can add half an f32 ulp.
pub fn one_rounding_ulps(dtype: DType) -> f64 {
    match dtype {
        DType::F32 | DType::F64 => 0.5 + 1e-6,
        DType::F16 | DType::BF16 => 0.5 + DType::F32.unit_roundoff() / dtype.unit_roundoff(),
        // Exact integers: a rounding to the nearest is half a step.
        DType::U32 | DType::I64 => 0.5,
    }
}

/// The gap between adjacent `dtype` values at `x` (at the smallest normal exponent for
/// subnormals): 2u · 2^exponent, with u the unit roundoff.
fn ulp(x: f64, dtype: DType) -> f64 {
    let min_exponent = match dtype {
        DType::F16 => -14,
        DType::F64 => -1022,
        DType::F32 | DType::BF16 => -126,
        DType::U32 | DType::I64 => 0,
    };
    let exponent = if x == 0.0 { min_exponent } else { (x.abs().log2().floor() as i32).max(min_exponent) };
    2.0 * dtype.unit_roundoff() * 2f64.powi(exponent)
}
