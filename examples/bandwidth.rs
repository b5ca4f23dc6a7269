//! Measures the elementwise ops and softmax against the device-to-device copy bandwidth of the
//! same GPU, in one run: median of event-timed launches after warm-up, bytes each op must move,
//! GB/s, and that as a share of the copy.
//!
//! It also measures host overhead at n = 1024 (wall time per op and per tape step, with the
//! queue drained once at the end), writes every row to a CSV file, and plots GB/s against size,
//! with the copy ceiling drawn, to an SVG file.
//!
//! ```text
//! cargo run --release --example bandwidth                      # sizes 2^20 .. 2^28
//! cargo run --release --example bandwidth -- --quick           # 2^20 and 2^24 only
//! cargo run --release --example bandwidth -- --log2 28         # one size (for a profiler)
//! cargo run --release --example bandwidth -- --softmax         # the softmax section only
//! cargo run --release --example bandwidth -- --out DIR         # bandwidth.csv, bandwidth.svg in DIR
//! cargo run --release --example bandwidth -- --ptx other.ptx   # also time other PTX builds of the kernels
//! cargo run --release --example bandwidth -- --ptx other.ptx --grid cover/1 --block 512   # one launch shape
//! cargo run --release --example bandwidth -- --host-only   # only the host time at n = 1024
//! ```
use opsmith::autograd::{self, Tape};
use opsmith::cuda::{CudaDevice, DEFAULT_BLOCK, KernelArg, KernelModule, LaunchConfig};
use opsmith::{DType, Device, Element, Result, Tensor, bf16, f16, ops};

const WARMUP: usize = 5;
const REPS: usize = 30;

/// Median milliseconds of `REPS` event-timed runs of `f` after `WARMUP` untimed ones, every run
/// queued before the GPU reaches it ([`opsmith::cuda::time_runs`]).
fn time_ms<E: From<opsmith::host::Error>>(
    dev: &CudaDevice,
    f: impl FnMut() -> std::result::Result<(), E>,
) -> std::result::Result<f64, E> {
    Ok(opsmith::cuda::time_runs(&dev.current_stream(), WARMUP, REPS, f)?.median_ms())
}

/// Values in ±[0.5, 2) from a fixed-seed generator, so timings never run on zeros.
fn random_tensor<T: Element>(n: usize, seed: u64, device: Device) -> Result<Tensor> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let data: Vec<T> = (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let unit = (state >> 40) as f64 / (1u64 << 24) as f64; // [0, 1)
            let sign = if state & 1 == 0 { 1.0 } else { -1.0 };
            T::from_f64(sign * (0.5 + 1.5 * unit))
        })
        .collect();
    Ok(Tensor::from_vec(data, [n], device)?)
}

fn random(dtype: DType, n: usize, seed: u64, device: Device) -> Result<Tensor> {
    match dtype {
        DType::F32 => random_tensor::<f32>(n, seed, device),
        DType::F16 => random_tensor::<f16>(n, seed, device),
        DType::BF16 => random_tensor::<bf16>(n, seed, device),
        DType::F64 => random_tensor::<f64>(n, seed, device),
        DType::U32 | DType::I64 => {
            Err(opsmith::host::Error::UnsupportedDType { op: "bandwidth", dtype, device: Device::Cpu }.into())
        }
    }
}

struct Row {
    what: String,
    dtype: DType,
    log2n: u32,
    ms: f64,
    bytes: f64,
}

/// The GPU bandwidth report: every op against the device's copy bandwidth, as a table, a CSV
/// and an SVG plot.
#[derive(clap::Parser)]
#[command(name = "bandwidth")]
struct Args {
    /// Two sizes (2^20 and 2^24) and fewer shapes, instead of 2^20 .. 2^28.
    #[arg(long)]
    quick: bool,
    /// One size only, 2^N elements (for a profiler).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=32))]
    log2: Option<u32>,
    /// The softmax and sum sections only.
    #[arg(long)]
    softmax: bool,
    /// Only the host-overhead table at n = 1024.
    #[arg(long)]
    host_only: bool,
    /// Where bandwidth.csv and bandwidth.svg go.
    #[arg(long, value_name = "DIR", default_value = ".")]
    out: std::path::PathBuf,
    /// Also time the kernels of another PTX build of opsmith's kernels (repeatable).
    #[arg(long, value_name = "FILE")]
    ptx: Vec<String>,
    /// The grid shapes --ptx times: wave, cover/1, cover/2, cover/4 (repeatable; all when not given).
    #[arg(long, value_name = "SHAPE")]
    grid: Vec<String>,
    /// The block sizes --ptx times (repeatable).
    #[arg(long, value_name = "N", default_values_t = [DEFAULT_BLOCK])]
    block: Vec<u32>,
}

fn main() -> Result<()> {
    let args = <Args as clap::Parser>::parse();
    let quick = args.quick;
    let extra_ptx = args.ptx;
    let grids = (args.grid, args.block);
    let device = Device::cuda_if_available();
    let Device::Cuda(ordinal) = device else {
        println!(
            "bandwidth: no CUDA device found; this report measures GPU memory bandwidth, so there is nothing to do."
        );
        return Ok(());
    };
    let dev = CudaDevice::get(ordinal)?;
    let (cc_major, cc_minor) = dev.compute_capability()?;
    println!(
        "{} (sm_{cc_major}{cc_minor}, {} SMs), kernels from the {}",
        dev.name()?,
        dev.sm_count(),
        opsmith::cuda::prebuilt::choose_image(cc_major, cc_minor)
    );
    // `--host-only`: just the host-overhead table (quick, for repeated runs beside torch's).
    if args.host_only {
        return small_tensor_overhead(&dev, device);
    }
    let sizes: Vec<u32> = match args.log2 {
        Some(n) => vec![n],
        None if quick => vec![20, 24],
        None => vec![20, 22, 24, 26, 28],
    };
    let out_dir = args.out;

    // The ceiling: a device-to-device copy of the largest size, counting bytes read plus written.
    let copy_log2 = sizes.last().copied().unwrap_or(24);
    let n = 1usize << copy_log2;
    let src = random(DType::F32, n, 1, device)?;
    let dst = Tensor::zeros([n], DType::F32, device)?;
    let copy_ms = time_ms(&dev, || dst.copy_from_(&src))?;
    let copy_gbs = 2.0 * (n * 4) as f64 / copy_ms / 1e6;
    drop((src, dst));
    println!("device-to-device copy, 2^{copy_log2} f32: {copy_ms:.3} ms, {copy_gbs:.0} GB/s (read + write)");

    let softmax_only = args.softmax;
    let mut rows = Vec::new();
    let mut copy_at = Vec::new();
    for &log2n in sizes.iter().filter(|_| !softmax_only) {
        let n = 1usize << log2n;
        let (src, dst) = (random(DType::F32, n, 2, device)?, Tensor::zeros([n], DType::F32, device)?);
        let ms = time_ms(&dev, || dst.copy_from_(&src))?;
        copy_at.push((log2n, 2.0 * (n * 4) as f64 / ms / 1e6));
        drop((src, dst));
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let size = dtype.size_in_bytes() as f64;
            let t: Vec<Tensor> = (0..4).map(|k| random(dtype, n, 10 + k, device)).collect::<Result<_>>()?;
            let (o1, o2) = (Tensor::zeros([n], dtype, device)?, Tensor::zeros([n], dtype, device)?);
            let mut row = |what: &str, values_moved: f64, ms: f64| {
                rows.push(Row { what: what.into(), dtype, log2n, ms, bytes: values_moved * n as f64 * size })
            };
            row("add", 3.0, time_ms(&dev, || ops::add_into(&t[0], &t[1], &o1))?);
            row("mul", 3.0, time_ms(&dev, || ops::mul_into(&t[0], &t[1], &o1))?);
            row("fused_mul_add", 4.0, time_ms(&dev, || ops::fused_mul_add_into(&t[0], &t[1], &t[2], &o1))?);
            row(
                "mul+add (unfused)",
                6.0,
                time_ms(&dev, || {
                    ops::mul_into(&t[0], &t[1], &o1)?;
                    ops::add_into(&o1, &t[2], &o2)
                })?,
            );
            row("add_mul", 4.0, time_ms(&dev, || ops::add_mul_into(&t[0], &t[1], &t[2], &o1))?);
            row(
                "add_mul_backward",
                6.0,
                time_ms(&dev, || ops::add_mul_backward_into(&t[0], &t[1], &t[2], &t[3], &o1, &o2))?,
            );
            // Through the tape: forward (x, y, w in; z out) and backward from a given gradient
            // (g, x, y, w in; one gradient shared by x and y, and gw, out): 10 values an element.
            row(
                "tape add_mul fwd+bwd",
                10.0,
                time_ms(&dev, || {
                    let tape = Tape::new();
                    let (x, y, w) = (tape.var(t[0].clone()), tape.var(t[1].clone()), tape.var(t[2].clone()));
                    let z = autograd::ops::add_mul(&x, &y, &w)?;
                    tape.backward_with(&z, t[3].clone())?;
                    Ok::<(), opsmith::Error>(())
                })?,
            );
            for path in &extra_ptx {
                if dtype != DType::BF16 {
                    other_ptx_rows(&dev, device, path, &grids, dtype, &t, [&o1, &o2], &mut row)?;
                }
            }
        }
    }

    if args.log2.is_none() {
        softmax_section(&dev, device, quick, &mut rows)?;
        sum_section(&dev, device, quick, &mut rows)?;
    }

    println!("\n| op | dtype | n | median ms | bytes moved | GB/s | % of copy | % of same-size copy |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut csv = String::from("op,dtype,log2n,median_ms,bytes,gb_per_s,share_of_copy,share_of_same_size_copy\n");
    for r in &rows {
        let gbs = r.bytes / r.ms / 1e6;
        let same = copy_at.iter().find(|(l, _)| *l == r.log2n).map_or(f64::NAN, |(_, c)| gbs / c);
        println!(
            "| {} | {} | 2^{} | {:.4} | {:.3e} | {:.0} | {:.1}% | {:.1}% |",
            r.what,
            r.dtype,
            r.log2n,
            r.ms,
            r.bytes,
            gbs,
            100.0 * gbs / copy_gbs,
            100.0 * same
        );
        csv +=
            &format!("{},{},{},{},{},{},{},{}\n", r.what, r.dtype, r.log2n, r.ms, r.bytes, gbs, gbs / copy_gbs, same);
    }
    let csv_path = out_dir.join("bandwidth.csv");
    std::fs::write(&csv_path, csv).map_err(|e| opsmith::host::Error::InvalidArgument {
        op: "bandwidth",
        reason: format!("{}: {e}", csv_path.display()),
    })?;
    let svg_path = out_dir.join("bandwidth.svg");
    plot(&svg_path, &rows, copy_gbs, &dev.name()?).map_err(|e| opsmith::host::Error::InvalidArgument {
        op: "bandwidth",
        reason: format!("plotting {}: {e}", svg_path.display()),
    })?;
    println!("\nwrote {} and {}", csv_path.display(), svg_path.display());

    if let Some(r) = rows.iter().find(|r| r.what == SOFTMAX_TARGET && r.dtype == DType::F32) {
        let gbs = r.bytes / r.ms / 1e6;
        println!(
            "\n{SOFTMAX_TARGET} f32: {:.1} µs, {gbs:.0} GB/s = {:.1}% of copy (the target, 85%, is {:.1} µs)",
            r.ms * 1e3,
            100.0 * gbs / copy_gbs,
            r.bytes / (0.85 * copy_gbs) / 1e3
        );
    }
    if !softmax_only {
        small_tensor_overhead(&dev, device)?;
    }
    println!("\ncopy ceiling: {copy_gbs:.0} GB/s ({WARMUP} warm-up runs, median of {REPS})");
    Ok(())
}

/// Times `fused_mul_add` and `add_mul_backward` of `dtype` from another build of the kernels
/// (`--ptx FILE`), at four grid shapes: one wave of resident blocks that grid-stride
/// (`LaunchConfig::grid_stride`), and grids that cover every 16-byte pack with 1 (what opsmith
/// launches, `LaunchConfig::covering`), 2 or 4 packs a thread.
#[allow(clippy::too_many_arguments)]
fn other_ptx_rows(
    dev: &CudaDevice,
    device: Device,
    path: &str,
    (grids, blocks): &(Vec<String>, Vec<u32>),
    dtype: DType,
    t: &[Tensor],
    [o1, o2]: [&Tensor; 2],
    row: &mut impl FnMut(&str, f64, f64),
) -> Result<()> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| opsmith::host::Error::InvalidArgument { op: "bandwidth --ptx", reason: format!("{path}: {e}") })?;
    let module = KernelModule::from_ptx(&device, path, &text)?;
    let names = if dtype == DType::F32 { opsmith::kernels::names::F32 } else { opsmith::kernels::names::F16 };
    let n = t[0].elem_count() as u64;
    let packs = n.div_ceil((16 / dtype.size_in_bytes()) as u64);
    let stream = dev.current_stream();
    let file = std::path::Path::new(path).file_name().map_or(path.into(), |f| f.to_string_lossy());
    let kernels = [(names.fused_mul_add.name(), 4.0), (names.add_mul_backward.name(), 6.0)];
    for ((name, values), &block) in kernels.into_iter().flat_map(|k| blocks.iter().map(move |b| (k, b))) {
        let kernel = module.kernel(name)?;
        let wave = LaunchConfig::grid_stride(&kernel, packs, block)?;
        let cover = |per_thread: u64| LaunchConfig {
            grid: u32::try_from(packs.div_ceil(block as u64 * per_thread)).unwrap_or(u32::MAX),
            ..wave
        };
        let shapes = [("wave", wave), ("cover/1", cover(1)), ("cover/2", cover(2)), ("cover/4", cover(4))];
        for (shape, cfg) in shapes.into_iter().filter(|(s, _)| grids.is_empty() || grids.iter().any(|g| g == s)) {
            let ms = time_ms(dev, || {
                let args: Vec<KernelArg> = if values == 4.0 {
                    vec![
                        KernelArg::Input(&t[0]),
                        KernelArg::Input(&t[1]),
                        KernelArg::Input(&t[2]),
                        KernelArg::Output(o1),
                    ]
                } else {
                    let inputs = t[..4].iter().map(KernelArg::Input);
                    inputs.chain([KernelArg::Output(o1), KernelArg::Output(o2)]).collect()
                };
                let args: Vec<KernelArg> = args.into_iter().chain([KernelArg::U64(n)]).collect();
                // SAFETY: fused_mul_add(a, b, c, d, n) and add_mul_backward(g, x, y, w, gxy, gw, n)
                // of opsmith-kernels, every tensor n elements of `dtype`; any grid is correct.
                unsafe { kernel.launch(&stream, cfg, &args) }
            })?;
            row(&format!("{name} [{file}, {shape}, {} blocks of {block}]", cfg.grid), values, ms);
        }
    }
    Ok(())
}

/// The softmax row the target is stated for.
const SOFTMAX_TARGET: &str = "softmax fwd, full mask [4096x4096]";

/// `softmax(scale * x + mask)` along rows of `(rows, cols)` matrices: square ones, and 2^24
/// elements as rows of 1024, 4096, 16384 and 32768 values (the last past the block kernels:
/// the two-pass one-warp kernel).
const SOFTMAX_SHAPES: [(usize, usize); 6] =
    [(1024, 1024), (4096, 4096), (8192, 8192), (16384, 1024), (1024, 16384), (512, 32768)];

/// Whole-tensor `sum` of f32 (two launches: compensated partials per warp, then one warp),
/// which reads each element once.
fn sum_section(dev: &CudaDevice, device: Device, quick: bool, rows: &mut Vec<Row>) -> Result<()> {
    let sizes: &[u32] = if quick { &[24] } else { &[24, 26, 28] };
    for &log2n in sizes {
        let n = 1usize << log2n;
        let x = random(DType::F32, n, 70, device)?;
        let ms = time_ms(dev, || ops::sum(&x).map(drop))?;
        rows.push(Row { what: "sum (whole tensor)".into(), dtype: DType::F32, log2n, ms, bytes: 4.0 * n as f64 });
    }
    Ok(())
}

/// Softmax forward with a full additive mask (x and the mask read, y written: 12 bytes an f32
/// element) and without one (8 bytes), its backward (g and y read, gx written: 12 bytes), and
/// both in a row (24 bytes): f32 at every shape, f16 and bf16 at 4096 x 4096.
fn softmax_section(dev: &CudaDevice, device: Device, quick: bool, rows: &mut Vec<Row>) -> Result<()> {
    let shapes = if quick { &SOFTMAX_SHAPES[1..2] } else { &SOFTMAX_SHAPES[..] };
    let scale = 0.125;
    for &(r, c) in shapes {
        let dtypes: &[DType] =
            if (r, c) == (4096, 4096) { &[DType::F32, DType::F16, DType::BF16] } else { &[DType::F32] };
        for &dtype in dtypes {
            let n = r * c;
            let [x, mask, g] =
                [60, 61, 62].map(|seed| random(dtype, n, seed, device).and_then(|t| Ok(t.reshape([r, c])?)));
            let (x, mask, g) = (x?, mask?, g?);
            let y = ops::softmax(&x, scale, Some(&mask))?;
            let size = dtype.size_in_bytes() as f64;
            let mut row = |what: &str, values_moved: f64, ms: f64| {
                rows.push(Row {
                    what: format!("softmax {what} [{r}x{c}]"),
                    dtype,
                    log2n: n.ilog2(),
                    ms,
                    bytes: values_moved * n as f64 * size,
                })
            };
            row("fwd, full mask", 3.0, time_ms(dev, || ops::softmax(&x, scale, Some(&mask)).map(drop))?);
            row("fwd, no mask", 2.0, time_ms(dev, || ops::softmax(&x, scale, None).map(drop))?);
            row("bwd", 3.0, time_ms(dev, || ops::softmax_backward(&g, &y, scale).map(drop))?);
            row(
                "fwd+bwd, full mask",
                6.0,
                time_ms(dev, || {
                    let y = ops::softmax(&x, scale, Some(&mask))?;
                    ops::softmax_backward(&g, &y, scale).map(drop)
                })?,
            );
        }
    }
    Ok(())
}

/// GB/s against log2(n) for the fused ops, one line per op and dtype, with the copy ceiling.
fn plot(
    path: &std::path::Path,
    rows: &[Row],
    copy_gbs: f64,
    gpu: &str,
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1100, 650)).into_drawing_area();
    root.fill(&WHITE)?;
    let (lo, hi) = rows.iter().fold((u32::MAX, 0), |(lo, hi), r| (lo.min(r.log2n), hi.max(r.log2n)));
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("opsmith elementwise ops on {gpu}: achieved bandwidth"), ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(lo as f64..hi as f64, 0f64..copy_gbs * 1.1)?;
    chart.configure_mesh().x_desc("log2(elements)").y_desc("GB/s (bytes the op must move / median time)").draw()?;
    chart
        .draw_series(LineSeries::new([(lo as f64, copy_gbs), (hi as f64, copy_gbs)], BLACK.stroke_width(2)))?
        .label(format!("device-to-device copy, {copy_gbs:.0} GB/s"))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.stroke_width(2)));
    let ops = ["fused_mul_add", "add_mul", "add_mul_backward", "tape add_mul fwd+bwd", "mul+add (unfused)"];
    let dtypes = [DType::F32, DType::F16, DType::BF16];
    for (i, op) in ops.iter().enumerate() {
        for (j, dtype) in dtypes.iter().enumerate() {
            let points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.what == *op && r.dtype == *dtype)
                .map(|r| (r.log2n as f64, r.bytes / r.ms / 1e6))
                .collect();
            if points.is_empty() {
                continue;
            }
            let color = Palette99::pick(i * 3 + j).to_rgba();
            let style = if j == 0 { color.stroke_width(2) } else { color.stroke_width(1) };
            chart
                .draw_series(LineSeries::new(points.clone(), style))?
                .label(format!("{op} {dtype}"))
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
            chart.draw_series(points.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Host time per op and per tape step at n = 1024, where launch and bookkeeping dominate:
/// `ITER` calls back to back, one synchronize at the end, wall time divided by `ITER`. The first
/// rows split an op's cost into its parts: a launch with no tensor arguments, an allocation
/// with its free, and a fill.
fn small_tensor_overhead(dev: &CudaDevice, device: Device) -> Result<()> {
    const ITER: u32 = 2000;
    let n = 1024;
    let t: Vec<Tensor> = (0..4).map(|k| random(DType::F32, n, 40 + k, device)).collect::<Result<_>>()?;
    let out = Tensor::zeros([n], DType::F32, device)?;
    let per_call_us = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        for _ in 0..50 {
            f()?;
        }
        dev.synchronize()?;
        let start = std::time::Instant::now();
        for _ in 0..ITER {
            f()?;
        }
        dev.synchronize()?;
        Ok(start.elapsed().as_secs_f64() * 1e6 / ITER as f64)
    };
    let spin = dev.kernel(opsmith::kernels::names::SPIN)?;
    let stream = dev.current_stream();
    let one_warp = LaunchConfig { grid: 1, block: 32, shared_mem_bytes: 0 };
    // SAFETY: `spin_ns(ns: u64)` takes one 64-bit parameter and touches no memory.
    let launch = per_call_us(&mut || Ok(unsafe { spin.launch(&stream, one_warp, &[KernelArg::U64(0)]) }?))?;
    let fill = per_call_us(&mut || Ok(Tensor::full(1.0, [n], DType::F32, device).map(drop)?))?;
    let into = per_call_us(&mut || Ok(ops::fused_mul_add_into(&t[0], &t[1], &t[2], &out)?))?;
    let alloc = per_call_us(&mut || Ok(ops::fused_mul_add(&t[0], &t[1], &t[2]).map(drop)?))?;
    let step = per_call_us(&mut || {
        let tape = Tape::new();
        let (x, y, w) = (tape.var(t[0].clone()), tape.var(t[1].clone()), tape.var(t[2].clone()));
        let z = autograd::ops::add_mul(&x, &y, &w)?;
        let loss = autograd::ops::sum(&z)?;
        tape.backward(&loss)?;
        Ok(())
    })?;
    println!("\nhost overhead at n = 1024, f32 (wall time per call, {ITER} calls, one synchronize):");
    println!("| what | µs per call |");
    println!("|---|---|");
    println!("| launch of an empty kernel, no tensor arguments | {launch:.2} |");
    println!("| Tensor::full (allocate, fill, free) | {fill:.2} |");
    println!("| fused_mul_add_into (output given) | {into:.2} |");
    println!("| fused_mul_add (allocates its output) | {alloc:.2} |");
    println!("| tape step: add_mul, sum, backward (3 launches, 4 allocations) | {step:.2} |");
    Ok(())
}
