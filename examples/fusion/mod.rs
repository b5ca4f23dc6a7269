//! What the two fused-op examples (`fused_mul_add`, `add_mul_backward`) share: their flags,
//! random inputs with exact host copies, median timing on either device, the accuracy check
//! against f64, and the table of bytes and times.
#[cfg(feature = "cuda")]
use opsmith::cuda::CudaDevice;
use opsmith::{DType, Device, Tensor};
use rand::{Rng, SeedableRng, rngs::StdRng};

/// `--log2 N` (elements = 2^N), `--dtype f32|f16|bf16`, `--quick` (a small size and few
/// repetitions, for unoptimised builds).
pub struct Args {
    pub log2: u32,
    pub dtype: DType,
    pub reps: usize,
}

impl Args {
    /// The flags, with defaults sized for `device`: 2^24 elements on CUDA (large enough that
    /// memory, not launch overhead, sets the time), 2^20 on the CPU.
    pub fn parse(device: Device) -> opsmith::Result<Args> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1));
        let bad = |reason: String| {
            opsmith::Error::from(opsmith::host::Error::InvalidArgument { op: "example flags", reason })
        };
        let quick = args.iter().any(|a| a == "--quick");
        let log2 = match value("--log2") {
            Some(v) => v.parse().ok().filter(|&l| l <= 30).ok_or_else(|| bad(format!("--log2 {v}: want 0..=30")))?,
            None if quick => 16,
            None if device.is_cuda() => 24,
            None => 20,
        };
        let dtype = match value("--dtype").map(String::as_str) {
            None | Some("f32") => DType::F32,
            Some("f16") => DType::F16,
            Some("bf16") => DType::BF16,
            Some(other) => return Err(bad(format!("--dtype {other}: want f32, f16 or bf16"))),
        };
        Ok(Args { log2, dtype, reps: if quick { 5 } else { 21 } })
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
