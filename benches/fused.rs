//! `cargo bench`: fused against unfused, on the CPU always and on CUDA when a device is present.
//!
//! Pairs, each in f32, f16 and bf16 at 2^10 … 2^26 elements:
//! * `fused_mul_add` against `mul` then `add`;
//! * `add_mul` against `add` then `mul`;
//! * `tape_add_mul` (forward + backward through the tape, one fused kernel each way) against
//!   `tape_add_then_mul` (the same math from unfused `add` and `mul` nodes).
//!
//! Names read `cuda/fused_mul_add/f32/2^24`. Throughput is the bytes each version must move.
//! CUDA timings come from events around `iters` launches, so no host clock reads a queue that
//! has not finished.
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use opsmith::autograd::{self, Tape};
use opsmith::cuda::CudaDevice;
use opsmith::{DType, Device, Result, Tensor, ops};
use std::time::Duration;

const SIZES: [u32; 5] = [10, 14, 18, 22, 26];
const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Values in ±[0.5, 2), never zeros.
fn random(n: usize, seed: u64, dtype: DType, device: Device) -> Tensor {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let values: Vec<f32> = (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let v = 0.5 + 1.5 * ((state >> 40) as f32 / (1u64 << 24) as f32);
            if state & 1 == 0 { v } else { -v }
        })
        .collect();
    let t = Tensor::from_vec(values, [n], Device::Cpu).expect("host tensor");
    t.to_dtype(dtype).and_then(|t| t.to_device(device)).expect("bench inputs")
}

/// One benchmarked computation: a name, the values it moves per element, and the work.
struct Case<'a> {
    name: &'static str,
    values_per_element: u64,
    run: Box<dyn Fn() -> Result<()> + 'a>,
}

fn cases<'a>(t: &'a [Tensor], o: &'a [Tensor]) -> Vec<Case<'a>> {
    let tape_step = |fused: bool| {
        move || -> Result<()> {
            let tape = Tape::new();
            let (x, y, w) = (tape.var(t[0].clone()), tape.var(t[1].clone()), tape.var(t[2].clone()));
            let z = if fused {
                autograd::ops::add_mul(&x, &y, &w)
            } else {
                autograd::ops::add(&x, &y).and_then(|s| autograd::ops::mul(&s, &w))
            };
            let z = z?;
            tape.backward_with(&z, t[3].clone())?;
            Ok(())
        }
    };
    vec![
        Case {
            name: "fused_mul_add",
            values_per_element: 4,
            run: Box::new(|| Ok(ops::fused_mul_add_into(&t[0], &t[1], &t[2], &o[0])?)),
        },
        Case {
            name: "mul_then_add",
            values_per_element: 6,
            run: Box::new(|| {
                ops::mul_into(&t[0], &t[1], &o[0])?;
                Ok(ops::add_into(&o[0], &t[2], &o[1])?)
            }),
        },
        Case {
            name: "add_mul",
            values_per_element: 4,
            run: Box::new(|| Ok(ops::add_mul_into(&t[0], &t[1], &t[2], &o[0])?)),
        },
        Case {
            name: "add_then_mul",
            values_per_element: 6,
            run: Box::new(|| {
                ops::add_into(&t[0], &t[1], &o[0])?;
                Ok(ops::mul_into(&o[0], &t[2], &o[1])?)
            }),
        },
        // fwd: x, y, w → z; bwd: g, x, y, w → g·w (shared by x and y), g·(x+y).
        Case { name: "tape_add_mul", values_per_element: 10, run: Box::new(tape_step(true)) },
        // fwd: add (3) and mul (3); bwd: mul's two products (6), add passes g through.
        Case { name: "tape_add_then_mul", values_per_element: 12, run: Box::new(tape_step(false)) },
    ]
}

fn bench_device(c: &mut Criterion, device: Device) {
    let prefix = if device.is_cuda() { "cuda" } else { "cpu" };
    let cuda = match device {
        Device::Cuda(n) => Some(CudaDevice::get(n).expect("cuda device")),
        Device::Cpu => None,
    };
    for dtype in DTYPES {
        for log2 in SIZES {
            let n = 1usize << log2;
            let t: Vec<Tensor> = (0..4).map(|k| random(n, 7 + k, dtype, device)).collect();
            let o: Vec<Tensor> = (0..2).map(|_| Tensor::zeros([n], dtype, device).expect("outputs")).collect();
            for case in cases(&t, &o) {
                let mut group = c.benchmark_group(format!("{prefix}/{}/{dtype}", case.name));
                if log2 >= 22 {
                    group
                        .sample_size(10)
                        .measurement_time(Duration::from_secs(2))
                        .warm_up_time(Duration::from_millis(500));
                }
                group.throughput(Throughput::Bytes(case.values_per_element * n as u64 * dtype.size_in_bytes() as u64));
                group.bench_function(BenchmarkId::from_parameter(format!("2^{log2}")), |b| match &cuda {
                    None => b.iter(|| (case.run)().expect("op")),
                    Some(dev) => b.iter_custom(|iters| {
                        let stream = dev.current_stream();
                        let start = stream.record_event().expect("event");
                        for _ in 0..iters {
                            (case.run)().expect("op");
                        }
                        let end = stream.record_event().expect("event");
                        Duration::from_secs_f64(start.elapsed_ms(&end).expect("elapsed") as f64 / 1e3)
                    }),
                });
                group.finish();
            }
        }
    }
}

fn benches(c: &mut Criterion) {
    bench_device(c, Device::Cpu);
    match Device::cuda_if_available() {
        Device::Cpu => eprintln!("no CUDA device: only the cpu/ groups ran"),
        device => bench_device(c, device),
    }
}

criterion_group! {
    name = fused;
    // 180 benchmarks in all: short windows keep a full run to a few minutes. Filter with
    // `cargo bench --bench fused -- cuda/` (or `cpu/fused_mul_add/f32`) to run fewer.
    config = Criterion::default().warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1)).sample_size(20);
    targets = benches
}
criterion_main!(fused);
