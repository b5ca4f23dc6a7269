//! Device affinity, copies between GPUs and NCCL collectives (`--features gpu-tests`).
//!
//! With one GPU: two streams of one device, the CUDA-vs-CPU mismatch error, and a world-size-1
//! NCCL communicator found through the TCP bootstrap. With two or more GPUs, also: copies
//! between devices, the mixed-ordinal mismatch error, and an all-reduce with one thread per GPU;
//! on one GPU those print why they are skipped. The NCCL tests skip when NCCL cannot be loaded,
//! unless `OPSMITH_REQUIRE_NCCL=1`.
mod common;

use common::{CHAIN_RESULT, DTYPES, long_chain, random_values, tensor, values};
use opsmith_host::cuda::{self, CudaDevice};
use opsmith_host::dist::{self, Communicator, UniqueId};
use opsmith_host::{DType, Device, Error, Result, Tensor, ops};
use rand::{SeedableRng, rngs::StdRng};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

const GPU: Device = Device::Cuda(0);
const N: usize = (1 << 16) + 3;

/// The number of GPUs when there are at least two, else `None` after saying why.
fn two_gpus(test: &str) -> Option<usize> {
    let count = cuda::device_count().unwrap_or(0);
    if count < 2 {
        println!("skipped {test}: needs two GPUs, found {count}");
        return None;
    }
    Some(count)
}

/// The NCCL tests run one at a time: communicators of different tests share GPU 0, and
/// collectives of two communicators interleaved on one device are how NCCL programs deadlock.
static ONE_COMMUNICATOR_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The NCCL lock when NCCL loads, else `None` after saying why; fails the test instead of
/// skipping it when `OPSMITH_REQUIRE_NCCL=1`.
fn nccl(test: &str) -> Option<MutexGuard<'static, ()>> {
    if dist::nccl_available() {
        return Some(ONE_COMMUNICATOR_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner()));
    }
    let why = dist::nccl_version().err().map(|e| e.to_string()).unwrap_or_default();
    assert!(std::env::var("OPSMITH_REQUIRE_NCCL").as_deref() != Ok("1"), "NCCL is required: {why}");
    println!("skipped {test}: {why}");
    None
}

fn loopback() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

fn bits(t: &Tensor) -> Result<Vec<u64>> {
    Ok(match t.dtype() {
        DType::F32 => t.to_vec::<f32>()?.into_iter().map(|v| v.to_bits() as u64).collect(),
        DType::F16 => t.to_vec::<half::f16>()?.into_iter().map(|v| v.to_bits() as u64).collect(),
        DType::BF16 => t.to_vec::<half::bf16>()?.into_iter().map(|v| v.to_bits() as u64).collect(),
        DType::F64 => t.to_vec::<f64>()?.into_iter().map(f64::to_bits).collect(),
        DType::U32 => t.to_vec::<u32>()?.into_iter().map(u64::from).collect(),
        DType::I64 => t.to_vec::<i64>()?.into_iter().map(|v| v as u64).collect(),
    })
}

/// Ops on two streams of one device give exact results, and the streams order themselves:
/// a read on one stream finishes before a later in-place write on the other, and a consumer
/// waits for its producer.
#[test]
fn two_streams_of_one_device_give_exact_results() -> Result<()> {
    let dev = CudaDevice::get(0)?;
    let (s1, s2) = (dev.new_stream()?, dev.new_stream()?);
    // On s1: a long chain that reads `a` at every step.
    let (a, x) = {
        let _on = s1.make_current();
        long_chain(GPU)?
    };
    // On s2, while s1 may still run: overwrite `a` in place, then consume `x`.
    let y = {
        let _on = s2.make_current();
        ops::affine_into(&a, 0.0, 4.0, &a)?; // a = 4
        ops::add(&x, &a)?
    };
    assert!(x.to_vec::<f32>()?.iter().all(|&v| v as f64 == CHAIN_RESULT), "s1 saw the write from s2");
    assert!(y.to_vec::<f32>()?.iter().all(|&v| v as f64 == CHAIN_RESULT + 4.0));
    assert!(a.to_vec::<f32>()?.iter().all(|&v| v == 4.0));
    // The same ops, each stream on its own thread at once, agree with an f64 reference.
    let mut rng = StdRng::seed_from_u64(8);
    let (u, v) = (random_values(&mut rng, N, DType::F32), random_values(&mut rng, N, DType::F32));
    let (tu, tv) = (tensor(&u, DType::F32, GPU)?, tensor(&v, DType::F32, GPU)?);
    let results = std::thread::scope(|scope| {
        let jobs = [(&s1, 1.0), (&s2, -1.0)].map(|(stream, sign)| {
            let (tu, tv) = (&tu, &tv);
            scope.spawn(move || -> Result<Vec<f64>> {
                let _on = stream.make_current();
                values(&ops::fused_mul_add(tu, &ops::scale(tv, sign)?, tu)?)
            })
        });
        jobs.map(|j| j.join().unwrap())
    });
    for (result, sign) in results.into_iter().zip([1.0, -1.0]) {
        // f32's own fused multiply-add rounds once, as the kernel does.
        let expected: Vec<f64> =
            (0..N).map(|i| (u[i] as f32).mul_add((sign * v[i]) as f32, u[i] as f32) as f64).collect();
        assert_eq!(result?, expected);
    }
    Ok(())
}

/// Memory freed while another stream still reads it is not handed out again before that read
/// ends: the stream that allocated it, which frees it, first waits for the reader.
#[test]
fn memory_freed_during_a_read_on_another_stream_is_not_reused_early() -> Result<()> {
    let dev = CudaDevice::get(0)?;
    let (home, reader) = (dev.new_stream()?, dev.new_stream()?);
    let n = 1 << 22;
    let (a, b) = {
        let _on = home.make_current();
        (Tensor::full(1.5, [n], DType::F32, GPU)?, Tensor::full(2.0, [n], DType::F32, GPU)?)
    };
    home.synchronize()?;
    // On `reader`: 21 launches that read `a` and `b`, as in `long_chain`.
    let x = {
        let _on = reader.make_current();
        let mut x = ops::mul(&a, &b)?;
        for _ in 0..20 {
            x = ops::fused_mul_add(&x, &b, &a)?;
        }
        x
    };
    // Freed on `home` while `reader` may still run; `home` at once allocates (most likely the
    // same memory, from its pool) and overwrites it.
    drop((a, b));
    let reused = {
        let _on = home.make_current();
        (0..4).map(|_| Tensor::full(-7.0, [n], DType::F32, GPU)).collect::<Result<Vec<_>>>()?
    };
    assert!(x.to_vec::<f32>()?.iter().all(|&v| v as f64 == CHAIN_RESULT), "the reader saw reused memory");
    for t in &reused {
        assert!(t.to_vec::<f32>()?.iter().all(|&v| v == -7.0));
    }
    Ok(())
}

/// Mixing a GPU tensor with a CPU one is an error before anything is touched.
#[test]
fn cuda_and_cpu_operands_are_a_device_mismatch() -> Result<()> {
    let gpu = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2], GPU)?;
    let cpu = Tensor::from_vec(vec![5.0f32, 6.0, 7.0, 8.0], [2, 2], Device::Cpu)?;
    let out = Tensor::full(f64::NAN, [2, 2], DType::F32, GPU)?;
    let cpu_out = Tensor::full(f64::NAN, [2, 2], DType::F32, Device::Cpu)?;
    let row = Tensor::from_vec(vec![1.0f32, 1.0], [2], Device::Cpu)?;
    let versions = [gpu.version(), cpu.version(), out.version(), cpu_out.version()];
    let mismatch = |r: Result<()>, op: &str, lhs: Device, rhs: Device| match r {
        Err(Error::DeviceMismatch { op: o, lhs: l, rhs: r }) => assert_eq!((o, l, r), (op, lhs, rhs)),
        other => panic!("{op}: expected a device mismatch, got {other:?}"),
    };
    mismatch(ops::add(&gpu, &cpu).map(drop), "add", GPU, Device::Cpu);
    mismatch(ops::fused_mul_add(&gpu, &gpu, &cpu).map(drop), "fused_mul_add", GPU, Device::Cpu);
    mismatch(ops::add_into(&gpu, &gpu, &cpu_out), "add", GPU, Device::Cpu);
    mismatch(ops::mul_into(&cpu, &cpu, &out), "mul", Device::Cpu, GPU);
    mismatch(ops::add_row(&gpu, &row).map(drop), "add_row", GPU, Device::Cpu);
    mismatch(out.copy_from_(&cpu), "Tensor::copy_from_", GPU, Device::Cpu);
    assert_eq!([gpu.version(), cpu.version(), out.version(), cpu_out.version()], versions);
    assert_eq!(gpu.to_vec::<f32>()?, [1.0, 2.0, 3.0, 4.0]);
    assert_eq!(cpu.to_vec::<f32>()?, [5.0, 6.0, 7.0, 8.0]);
    assert!(out.to_vec::<f32>()?.iter().all(|v| v.is_nan()));
    assert!(cpu_out.to_vec::<f32>()?.iter().all(|v| v.is_nan()));
    Ok(())
}

/// A world of one, found through the TCP bootstrap: the mean and the sum over one rank are the
/// rank's own values, bit for bit, in every dtype, on the default stream and on another one.
#[test]
fn a_world_of_one_leaves_values_unchanged() -> Result<()> {
    let Some(_one) = nccl("a_world_of_one_leaves_values_unchanged") else { return Ok(()) };
    let id = dist::bootstrap_tcp(0, 1, loopback(), Duration::from_secs(10))?;
    let comm = Communicator::new(GPU, 0, 1, &id)?;
    assert_eq!((comm.rank(), comm.world_size(), comm.device()), (0, 1, GPU));
    let side = CudaDevice::get(0)?.new_stream()?;
    let mut rng = StdRng::seed_from_u64(1);
    for dtype in DTYPES {
        let xs = random_values(&mut rng, N, dtype);
        let a = tensor(&xs, dtype, GPU)?;
        let b = tensor(&xs[..7], dtype, GPU)?;
        let empty = Tensor::zeros([0], dtype, GPU)?;
        let before = (bits(&a)?, a.version());
        comm.all_reduce_mean_(&[&a, &b, &empty])?;
        assert_eq!(bits(&a)?, before.0, "{dtype} mean");
        assert!(a.version() > before.1, "an in-place write bumps the version");
        assert_eq!(values(&b)?, xs[..7]);
        comm.all_reduce_sum_(&[&a])?;
        assert_eq!(bits(&a)?, before.0, "{dtype} sum");
        comm.broadcast_(&a, 0)?;
        assert_eq!(bits(&a)?, before.0, "{dtype} broadcast");
        if dtype == DType::F64 {
            continue; // no CUDA ops for f64 to produce it on a side stream
        }
        // On another stream, right after the op that writes the tensor there.
        let _on = side.make_current();
        let doubled = ops::add(&a, &a)?;
        comm.all_reduce_mean_(&[&doubled])?;
        let expected: Vec<f64> = xs.iter().map(|&x| 2.0 * x).collect(); // exact in every dtype
        assert_eq!(values(&doubled)?, expected, "{dtype} on a side stream");
    }
    Ok(())
}

/// Bad operands fail before NCCL sees them.
#[test]
fn collective_operand_errors() -> Result<()> {
    let Some(_one) = nccl("collective_operand_errors") else { return Ok(()) };
    let comm = Communicator::new(GPU, 0, 1, &UniqueId::new()?)?;
    let gpu = Tensor::full(1.0, [8], DType::F32, GPU)?;
    let cpu = Tensor::full(1.0, [8], DType::F32, Device::Cpu)?;
    let err = comm.all_reduce_mean_(&[&gpu, &cpu]).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "all_reduce_mean_", lhs: GPU, rhs: Device::Cpu }), "{err}");
    let err = comm.all_reduce_sum_(&[&gpu, &gpu.flat_slice(2, 4)?]).unwrap_err();
    assert!(matches!(err, Error::Overlap { op: "all_reduce_sum_", output: 1 }), "{err}");
    let err = comm.broadcast_(&gpu, 1).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { op: "broadcast_", .. }), "{err}");
    let err = Communicator::new(GPU, 1, 1, &UniqueId::new()?).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { op: "Communicator::new", .. }), "{err}");
    assert_eq!(gpu.to_vec::<f32>()?, [1.0; 8]);
    Ok(())
}

/// Cuda(0) → Cuda(1) → Cuda(0) is bitwise exact in every dtype, from views at odd offsets too,
/// ordered after the source's producer on a side stream and before the result's consumer.
#[test]
fn copies_between_gpus_are_bitwise_exact() -> Result<()> {
    let Some(_) = two_gpus("copies_between_gpus_are_bitwise_exact") else { return Ok(()) };
    println!("peer access 0→1: {}, 1→0: {}", cuda::can_access_peer(0, 1)?, cuda::can_access_peer(1, 0)?);
    let mut rng = StdRng::seed_from_u64(2);
    for dtype in DTYPES {
        let xs = random_values(&mut rng, N + 3, dtype);
        let whole = tensor(&xs, dtype, GPU)?;
        for src in [whole.clone(), whole.flat_slice(3, N)?] {
            let there = src.to_device(Device::Cuda(1))?;
            assert_eq!(there.device(), Device::Cuda(1));
            let back = there.to_device(GPU)?;
            assert_eq!(bits(&there)?, bits(&src)?, "{dtype} to cuda:1");
            assert_eq!(bits(&back)?, bits(&src)?, "{dtype} back to cuda:0");
        }
    }
    // Ordering: the source is still being written on a side stream of cuda:0 when the copy is
    // queued, and the copy's result is consumed at once on a side stream of cuda:1.
    let (s0, s1) = (CudaDevice::get(0)?.new_stream()?, CudaDevice::get(1)?.new_stream()?);
    let (_, x) = {
        let _on = s0.make_current();
        long_chain(GPU)?
    };
    let there = x.to_device(Device::Cuda(1))?; // on cuda:1's default stream
    let y = {
        let _on = s1.make_current();
        ops::add_scalar(&there, 1.0)?
    };
    assert!(y.to_vec::<f32>()?.iter().all(|&v| v as f64 == CHAIN_RESULT + 1.0));
    // And the reverse: a write to the source right after the copy does not reach the copy.
    let src = Tensor::full(3.0, [1 << 22], DType::F32, GPU)?;
    let copy = src.to_device(Device::Cuda(1))?;
    ops::affine_into(&src, 0.0, -1.0, &src)?;
    assert!(copy.to_vec::<f32>()?.iter().all(|&v| v == 3.0));
    Ok(())
}

/// Operands on two GPUs are a device mismatch, before anything is touched.
#[test]
fn operands_on_two_gpus_are_a_device_mismatch() -> Result<()> {
    let Some(_) = two_gpus("operands_on_two_gpus_are_a_device_mismatch") else { return Ok(()) };
    let (d0, d1) = (Device::Cuda(0), Device::Cuda(1));
    let a = Tensor::from_vec(vec![1.0f32, 2.0], [2], d0)?;
    let b = Tensor::from_vec(vec![3.0f32, 4.0], [2], d1)?;
    let out = Tensor::full(f64::NAN, [2], DType::F32, d1)?;
    let err = ops::add(&a, &b).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "add", lhs, rhs } if lhs == d0 && rhs == d1), "{err}");
    let err = ops::mul_into(&b, &b, &a).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "mul", lhs, rhs } if lhs == d1 && rhs == d0), "{err}");
    let err = out.copy_from_(&a).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { .. }), "{err}");
    assert_eq!(a.to_vec::<f32>()?, [1.0, 2.0]);
    assert_eq!(b.to_vec::<f32>()?, [3.0, 4.0]);
    assert!(out.to_vec::<f32>()?.iter().all(|v| v.is_nan()));
    Ok(())
}

/// One thread per GPU, each with its own values: after the all-reduce every rank holds the f64
/// mean (and sum) of all ranks' values, within the roundings of the dtype; a broadcast gives
/// every rank the root's values exactly.
#[test]
fn all_reduce_over_every_gpu_matches_the_f64_mean() -> Result<()> {
    let Some(world) = two_gpus("all_reduce_over_every_gpu_matches_the_f64_mean") else { return Ok(()) };
    let Some(_one) = nccl("all_reduce_over_every_gpu_matches_the_f64_mean") else { return Ok(()) };
    let addr = loopback();
    let inputs: Vec<Vec<Vec<f64>>> = (0..world)
        .map(|rank| {
            let mut rng = StdRng::seed_from_u64(100 + rank as u64);
            DTYPES.iter().map(|&d| random_values(&mut rng, N, d)).collect()
        })
        .collect();
    let results: Vec<Result<Vec<[Vec<f64>; 3]>>> = std::thread::scope(|scope| {
        let ranks: Vec<_> = (0..world)
            .map(|rank| {
                let inputs = &inputs[rank];
                scope.spawn(move || -> Result<Vec<[Vec<f64>; 3]>> {
                    let id = dist::bootstrap_tcp(rank, world, addr, Duration::from_secs(60))?;
                    let device = Device::Cuda(rank);
                    let comm = Communicator::new(device, rank, world, &id)?;
                    let mut out = Vec::new();
                    for (dtype, xs) in DTYPES.iter().zip(inputs) {
                        let mean = tensor(xs, *dtype, device)?;
                        let sum = tensor(xs, *dtype, device)?;
                        comm.all_reduce_mean_(&[&mean])?;
                        comm.all_reduce_sum_(&[&sum])?;
                        let root = tensor(xs, *dtype, device)?;
                        comm.broadcast_(&root, world - 1)?;
                        out.push([values(&mean)?, values(&sum)?, values(&root)?]);
                    }
                    Ok(out)
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for (rank, result) in results.into_iter().enumerate() {
        for (k, [mean, sum, root]) in result?.into_iter().enumerate() {
            let dtype = DTYPES[k];
            // Each rank's term rounds once (scaled or added), and the result once more.
            let u = dtype.unit_roundoff().max(DType::F32.unit_roundoff());
            for i in 0..N {
                let terms: Vec<f64> = (0..world).map(|r| inputs[r][k][i]).collect();
                let exact_sum: f64 = terms.iter().sum();
                let magnitude: f64 = terms.iter().map(|t| t.abs()).sum();
                let tol = (world as f64 + 1.0) * u * magnitude;
                let exact_mean = exact_sum / world as f64;
                assert!(
                    (mean[i] - exact_mean).abs() <= tol / world as f64,
                    "rank {rank} {dtype} mean[{i}]: {} vs {exact_mean}",
                    mean[i]
                );
                assert!((sum[i] - exact_sum).abs() <= tol, "rank {rank} {dtype} sum[{i}]: {} vs {exact_sum}", sum[i]);
            }
            assert_eq!(root, inputs[world - 1][k], "rank {rank} {dtype} broadcast");
        }
    }
    Ok(())
}
