//! The GPU matmul suite (`--features gpu-tests`; needs a CUDA device and libcublas): the shared
//! matmul cases on `Device::Cuda(0)`, then what only CUDA has: cuBLAS loading, f64 and device
//! errors, unaligned operands, a large product (its TFLOP/s printed, for information), and
//! streams and threads, each with its own cuBLAS handle.
//!
//! The tests that create streams take one lock, so that the handle count they watch is theirs.
mod common;

use common::matmul::{Dims, assert_close, operand, reference};
use common::{random_values, tensor, values};
use opsmith_host::cuda::{self, CudaDevice};
use opsmith_host::{DType, Device, Error, Result, Tensor, ops};
use rand::{Rng, SeedableRng, rngs::StdRng};
use std::sync::Mutex;

const GPU: Device = Device::Cuda(0);
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

matmul_cases!(GPU);

#[test]
fn cublas_loads() {
    if let Err(e) = cuda::require_cublas("gpu_matmul") {
        panic!("{e}");
    }
    assert!(cuda::cublas_available());
}

#[test]
fn f64_matmul_is_rejected_on_cuda() -> Result<()> {
    let a = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], [2, 2], GPU)?;
    let err = ops::matmul(&a, &a).unwrap_err();
    assert!(matches!(err, Error::UnsupportedDType { op: "matmul", dtype: DType::F64, device: GPU }), "{err}");
    assert_eq!(a.to_vec::<f64>()?, [1.0, 2.0, 3.0, 4.0]);
    Ok(())
}

#[test]
fn device_mismatch_is_an_error() -> Result<()> {
    let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2], GPU)?;
    let b = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2], Device::Cpu)?;
    let err = ops::matmul(&a, &b).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "matmul", lhs: GPU, rhs: Device::Cpu }), "{err}");
    let out = Tensor::zeros([2, 2], DType::F32, Device::Cpu)?;
    let err = ops::matmul_into(&a, &a, &out).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "matmul_into", .. }), "{err}");
    Ok(())
}

/// cuBLAS needs only element alignment: operands and outputs at every odd offset (none of them
/// 16-byte aligned) give correct products, with every transpose.
#[test]
fn unaligned_operands_and_outputs() -> Result<()> {
    let d = Dims::new(67, 45, 33);
    let mut rng = StdRng::seed_from_u64(31);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let a_values = random_values(&mut rng, d.m * d.k, dtype);
        let b_values = random_values(&mut rng, d.k * d.n, dtype);
        for (ta, tb) in common::matmul::TRANSPOSES {
            let (expected, scale) = reference(&a_values, ta, &b_values, tb, d);
            for offset in [1, 2, 3, 5] {
                let a = operand(&a_values, &d.a_dims(ta), offset, dtype, GPU)?;
                let b = operand(&b_values, &d.b_dims(tb), 2 * offset + 1, dtype, GPU)?;
                let out_buf = Tensor::full(f64::NAN, [d.m * d.n + offset], dtype, GPU)?;
                let out = out_buf.flat_slice(offset, d.m * d.n)?.reshape(d.out_dims())?;
                for t in [&a, &b, &out] {
                    assert_ne!(t.device_address().unwrap() % 16, 0, "the view must be unaligned");
                }
                ops::matmul_t_into(&a, ta, &b, tb, &out)?;
                let context = format!("{dtype}, transposes {ta}/{tb}, offset {offset}");
                assert_close(&values(&out)?, &expected, &scale, dtype, d.k, &context);
            }
        }
    }
    Ok(())
}

/// The mean time of `reps` products `[n, n] · [n, n]` in `dtype`, in ms, by events on the
/// current stream.
fn time_square(dtype: DType, n: usize, reps: u32) -> Result<f32> {
    let a = Tensor::full(0.5, [n, n], dtype, GPU)?;
    let b = Tensor::full(0.25, [n, n], dtype, GPU)?;
    let out = Tensor::zeros([n, n], dtype, GPU)?;
    for _ in 0..3 {
        ops::matmul_into(&a, &b, &out)?; // handle creation, heuristics, clocks
    }
    let stream = CudaDevice::get(0)?.current_stream();
    let start = stream.record_event()?;
    for _ in 0..reps {
        ops::matmul_into(&a, &b, &out)?;
    }
    let end = stream.record_event()?;
    let ms = start.elapsed_ms(&end)? / reps as f32;
    assert!(values(&out)?.iter().all(|&v| v == 0.125 * n as f64), "{dtype}: wrong product");
    Ok(ms)
}

/// 1024×1024×1024 in f32 against a sampled f64 reference; then the achieved TFLOP/s, printed
/// for information only (run with `--nocapture` to see it).
#[test]
fn large_product_and_its_throughput() -> Result<()> {
    let n = 1024;
    let mut rng = StdRng::seed_from_u64(1024);
    let a_values = random_values(&mut rng, n * n, DType::F32);
    let b_values = random_values(&mut rng, n * n, DType::F32);
    let a = tensor(&a_values, DType::F32, GPU)?.reshape([n, n])?;
    let b = tensor(&b_values, DType::F32, GPU)?.reshape([n, n])?;
    let got = values(&ops::matmul(&a, &b)?)?;
    for _ in 0..4096 {
        let (i, j) = (rng.random_range(0..n), rng.random_range(0..n));
        let (mut sum, mut scale) = (0.0, 0.0);
        for l in 0..n {
            let p = a_values[i * n + l] * b_values[l * n + j];
            sum += p;
            scale += p.abs();
        }
        assert_close(&[got[i * n + j]], &[sum], &[scale], DType::F32, n, &format!("element ({i}, {j})"));
    }

    let name = CudaDevice::get(0)?.name()?;
    let flops = 2.0 * (n as f64).powi(3);
    for dtype in [DType::F32, DType::BF16] {
        let ms = time_square(dtype, n, 20)?;
        println!(
            "matmul {dtype} {n}x{n}x{n} on {name}: {ms:.4} ms, {:.2} TFLOP/s (compute in f32, no TF32)",
            flops / (ms as f64 * 1e-3) / 1e12
        );
    }
    Ok(())
}

/// A product whose inputs are still being written on another stream waits for them.
#[test]
fn a_product_waits_for_its_inputs_on_another_stream() -> Result<()> {
    let _one = lock();
    let dev = CudaDevice::get(0)?;
    let producer = dev.new_stream()?;
    let n = 512;
    let a = {
        let _on = producer.make_current();
        let mut x = Tensor::full(1.0, [n, n], DType::F32, GPU)?;
        let half = Tensor::full(0.5, [n, n], DType::F32, GPU)?;
        for _ in 0..50 {
            x = ops::fused_mul_add(&x, &half, &half)?; // x → x/2 + 1/2: stays 1, takes a while
        }
        ops::add(&x, &x)? // 2
    };
    let b = Tensor::full(0.25, [n, n], DType::F32, GPU)?;
    let c = ops::matmul(&a, &b)?; // on the default stream
    assert!(values(&c)?.iter().all(|&v| v == 0.5 * n as f64));
    Ok(())
}

/// Two threads, each on its own stream (and so its own cuBLAS handle), run products at the same
/// time; every result equals the single-thread result on the default stream, bit for bit.
#[test]
fn two_threads_on_their_own_streams_agree_with_one() -> Result<()> {
    let _one = lock();
    let dev = CudaDevice::get(0)?;
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let d = Dims::batched(3, 200, 300, 150);
        let mut rng = StdRng::seed_from_u64(2);
        let a_values = random_values(&mut rng, d.count() * d.m * d.k, dtype);
        let b_values = random_values(&mut rng, d.count() * d.k * d.n, dtype);
        let a = operand(&a_values, &d.a_dims(false), 0, dtype, GPU)?;
        let b = operand(&b_values, &d.b_dims(true), 0, dtype, GPU)?;
        let single = values(&ops::matmul_t(&a, false, &b, true)?)?;
        let (expected, scale) = reference(&a_values, false, &b_values, true, d);
        assert_close(&single, &expected, &scale, dtype, d.k, &format!("{dtype}, one thread"));

        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..2)
                .map(|t| {
                    let (dev, a, b, single) = (dev.clone(), &a, &b, &single);
                    scope.spawn(move || -> Result<()> {
                        let stream = dev.new_stream()?;
                        let _current = stream.make_current();
                        for round in 0..25 {
                            let c = ops::matmul_t(a, false, b, true)?;
                            let got = values(&c)?;
                            if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != single[i].to_bits()) {
                                panic!(
                                    "{dtype}, thread {t}, round {round}: element {i} {:e} vs {:e}",
                                    got[i], single[i]
                                );
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            for w in workers {
                w.join().expect("worker panicked")?;
            }
            Ok::<(), Error>(())
        })?;
    }
    Ok(())
}

/// Short-lived streams hand their cuBLAS handle on: a hundred streams used one after another
/// create at most one handle (none if an idle one is already there).
#[test]
fn handles_of_dropped_streams_are_reused() -> Result<()> {
    let _one = lock();
    let dev = CudaDevice::get(0)?;
    let a = Tensor::full(0.5, [64, 48], DType::F32, GPU)?;
    let b = Tensor::full(2.0, [48, 32], DType::F32, GPU)?;
    ops::matmul(&a, &b)?; // the default stream's handle
    let before = cuda::cublas_handles();
    for _ in 0..100 {
        let stream = dev.new_stream()?;
        let _current = stream.make_current();
        let c = ops::matmul(&a, &b)?;
        assert!(values(&c)?.iter().all(|&v| v == 48.0));
    }
    let after = cuda::cublas_handles();
    assert!(after <= before + 1, "{before} handles before, {after} after a hundred short-lived streams");
    Ok(())
}
