//! The GPU suite (`--features gpu-tests`; needs a CUDA device): the shared cases on
//! `Device::Cuda(0)`, CPU-vs-GPU agreement, and what only CUDA has (streams, events, alignment,
//! third-party PTX).
mod common;

use common::{CHAIN_RESULT, DTYPES, Op, SIZES, long_chain, random_values, tensor, values};
use opsmith_host::cuda::{CudaDevice, KernelArg, KernelModule, LaunchConfig};
use opsmith_host::{DType, Device, Error, Result, Tensor, ops};
use rand::{SeedableRng, rngs::StdRng};

const GPU: Device = Device::Cuda(0);

shared_cases!(GPU);

/// CUDA and the CPU backend agree bit for bit on the same inputs (f32 arithmetic, one FMA
/// rounding, the same round-to-nearest-even narrowing).
#[test]
fn cuda_matches_cpu_bitwise() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(99);
    for op in Op::ALL {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for n in SIZES {
                let (n_in, _) = op.arity();
                let data: Vec<Vec<f64>> = (0..n_in).map(|_| random_values(&mut rng, n, dtype)).collect();
                let run = |device: Device| -> Result<Vec<Vec<f64>>> {
                    let ins: Vec<Tensor> = data.iter().map(|v| tensor(v, dtype, device)).collect::<Result<_>>()?;
                    let refs: Vec<&Tensor> = ins.iter().collect();
                    op.apply_new(&refs)?.iter().map(values).collect()
                };
                let (cpu, gpu) = (run(Device::Cpu)?, run(GPU)?);
                for (k, (c, g)) in cpu.iter().zip(&gpu).enumerate() {
                    if let Some(i) = (0..n).find(|&i| c[i].to_bits() != g[i].to_bits()) {
                        panic!("{op:?} {dtype} n={n}: output {k}[{i}] cpu {:e} vs cuda {:e}", c[i], g[i]);
                    }
                }
            }
        }
    }
    Ok(())
}

#[test]
fn f64_ops_are_rejected_on_cuda() -> Result<()> {
    let a = Tensor::from_vec(vec![1.0f64, 2.0], [2], GPU)?;
    assert_eq!(a.to_vec::<f64>()?, [1.0, 2.0], "f64 storage itself works on CUDA");
    let err = ops::add(&a, &a).unwrap_err();
    assert!(matches!(err, Error::UnsupportedDType { op: "add", dtype: DType::F64, device: GPU }), "{err}");
    Ok(())
}

#[test]
fn device_mismatch_is_an_error() -> Result<()> {
    let a = Tensor::from_vec(vec![1.0f32, 2.0], [2], GPU)?;
    let b = Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?;
    let err = ops::mul(&a, &b).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "mul", lhs: GPU, rhs: Device::Cpu }), "{err}");
    assert_eq!(a.to_vec::<f32>()?, [1.0, 2.0]);
    Ok(())
}

#[test]
fn views_at_odd_offsets_are_unaligned() -> Result<()> {
    for dtype in DTYPES {
        let t = Tensor::zeros([64], dtype, GPU)?;
        let base = t.device_address().unwrap();
        assert_eq!(base % 16, 0, "allocations are 16-byte aligned");
        let view = t.flat_slice(1, 8)?;
        assert_eq!(view.device_address().unwrap(), base + dtype.size_in_bytes() as u64);
    }
    Ok(())
}

#[test]
fn grid_is_sized_for_the_device() -> Result<()> {
    let dev = CudaDevice::get(0)?;
    let kernel = dev.kernel(opsmith_kernels::names::F32.add.name())?;
    let small = LaunchConfig::grid_stride(&kernel, 1000, 256)?;
    assert_eq!(small.grid, 4);
    let per_sm = kernel.max_active_blocks_per_sm(256)?;
    assert!((1..=dev.max_threads_per_sm() / 256).contains(&per_sm));
    let huge = LaunchConfig::grid_stride(&kernel, 1 << 40, 256)?;
    assert_eq!(huge.grid, dev.sm_count() * per_sm, "one full wave");
    assert!(matches!(LaunchConfig::grid_stride(&kernel, 10, 48), Err(Error::InvalidBlockSize { block: 48, .. })));
    Ok(())
}

#[test]
fn every_kernel_name_resolves_in_the_embedded_module() -> Result<()> {
    let dev = CudaDevice::get(0)?;
    for name in opsmith_kernels::names::all_kernel_names() {
        dev.kernel(name)?;
    }
    assert!(matches!(dev.kernel("no_such_kernel"), Err(Error::KernelNotFound { .. })));
    Ok(())
}

/// Ops follow the current stream; a consumer on another stream is ordered after the producer.
#[test]
fn streams_and_events() -> Result<()> {
    let dev = CudaDevice::get(0)?;
    let (producer, consumer) = (dev.new_stream()?, dev.new_stream()?);
    let (a, produced) = {
        let _on = producer.make_current();
        let start = producer.record_event()?;
        let chain = long_chain(GPU)?;
        let end = producer.record_event()?;
        assert!(start.elapsed_ms(&end)? > 0.0);
        chain
    };
    let consumed = {
        let _on = consumer.make_current();
        ops::add(&produced, &a)?
    };
    let expected = CHAIN_RESULT + 1.5;
    let got = consumed.to_vec::<f32>()?;
    assert!(got.iter().all(|&v| v as f64 == expected), "got {} expected {expected}", got[0]);
    Ok(())
}

/// `Tensor::full` on CUDA (a device memset of the value's bits) holds exactly what the CPU
/// backend's holds, for values that round, signed zeros, subnormals, infinities and NaN.
#[test]
fn full_matches_the_cpu_bit_for_bit() -> Result<()> {
    let values = [1.0, -0.1, 0.0, -0.0, 1e-40, 6e-8, 65504.0, 1e39, f64::INFINITY, f64::NEG_INFINITY, f64::NAN];
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
        for &value in &values {
            for n in [1, 3, 1 << 16] {
                let gpu = Tensor::full(value, [n], dtype, GPU)?.to_vec_f64()?;
                let cpu = Tensor::full(value, [n], dtype, Device::Cpu)?.to_vec_f64()?;
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&gpu), bits(&cpu), "{dtype} {value} n = {n}");
            }
        }
    }
    Ok(())
}

/// Third-party PTX: load hand-written PTX at run time and launch it through the checked path.
#[test]
fn third_party_ptx_module() -> Result<()> {
    const PTX: &str = include_str!("../../examples/ptx/scale.ptx");
    let module = KernelModule::from_ptx(&GPU, "scale", PTX)?;
    let kernel = module.kernel("scale_f32")?;
    let n = 5000;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 7.0).collect();
    let xt = Tensor::from_vec(x.clone(), [n], GPU)?;
    let y = Tensor::full(f64::NAN, [n + 3], DType::F32, GPU)?;
    let y_view = y.flat_slice(1, n)?;
    let cfg = LaunchConfig { grid: (n as u32).div_ceil(128), block: 128, shared_mem_bytes: 0 };
    let len = opsmith_host::cuda::len_as_u32("scale_f32", n)?;
    // SAFETY: scale_f32(const float* x, float* y, float a, u32 n) touches n elements of each.
    unsafe {
        kernel.launch(
            &kernel.device().current_stream(),
            cfg,
            &[KernelArg::Input(&xt), KernelArg::Output(&y_view), KernelArg::F32(-3.0), KernelArg::U32(len)],
        )?;
    }
    let got = y.to_vec::<f32>()?;
    assert!(got[0].is_nan() && got[n + 1].is_nan() && got[n + 2].is_nan(), "wrote outside the view");
    for i in 0..n {
        assert_eq!(got[i + 1], x[i] * -3.0, "element {i}");
    }
    // Bad configurations, bad PTX and bad names are errors, not crashes.
    let bad = LaunchConfig { grid: 1, block: 1000, shared_mem_bytes: 0 };
    // SAFETY: rejected before launch.
    let err = unsafe { kernel.launch(&kernel.device().current_stream(), bad, &[]) }.unwrap_err();
    assert!(matches!(err, Error::InvalidBlockSize { block: 1000, .. }), "{err}");
    let err = KernelModule::from_ptx(&GPU, "broken", ".version 7.0\n.target sm_70\nthis is not ptx").err().unwrap();
    assert!(matches!(&err, Error::ModuleLoad { module, .. } if module == "broken"), "{err}");
    assert!(matches!(module.kernel("scale_f64"), Err(Error::KernelNotFound { .. })));
    Ok(())
}

opsmith_kernels::kernel! {
    /// The declaration of `examples/ptx/scale.ptx`'s kernel, so that it launches typed: a `u32`
    /// length and an `f32` scalar, the two 4-byte parameter kinds.
    ///
    /// # Safety
    /// `x` and `y` are valid for `n` f32.
    pub unsafe fn scale_f32(x: *const [f32; n], #[in_place] y: *mut [f32; n], a: f32, n: u32) {}
}

/// Typed launches: a kernel crate's module loads once per device, 4- and 8-byte scalars reach
/// the kernel intact, in-place is allowed where declared, and wrong tensors are typed errors.
#[test]
fn typed_launches() -> Result<()> {
    use opsmith_host::cuda::{self, Grid, KernelCrate};
    static SCALE: KernelCrate = KernelCrate::new("scale", include_str!("../../examples/ptx/scale.ptx"));
    let dev = CudaDevice::get(0)?;
    assert!(std::sync::Arc::ptr_eq(&SCALE.module(&dev)?, &SCALE.module(&dev)?), "one module per device");

    let n = 5000;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 7.0).collect();
    let xt = Tensor::from_vec(x.clone(), [n], GPU)?;
    let y = Tensor::full(f64::NAN, [n + 3], DType::F32, GPU)?;
    let y_view = y.flat_slice(1, n)?;
    SCALE.launch(scale_f32, Grid::covering(n as u64).with_block(128), (&xt, &y_view, -3.0, n as u32))?;
    let got = y.to_vec::<f32>()?;
    assert!(got[0].is_nan() && got[n + 1].is_nan() && got[n + 2].is_nan(), "wrote outside the view");
    assert!((0..n).all(|i| got[i + 1] == x[i] * -3.0));
    // In place, as declared: x *= 0.5.
    SCALE.launch(scale_f32, Grid::covering(n as u64), (&xt, &xt, 0.5, n as u32))?;
    assert!(xt.to_vec::<f32>()?.iter().zip(&x).all(|(a, b)| *a == b * 0.5));

    // opsmith's own kernels, u64 lengths, f16 buffers.
    let h = Tensor::from_vec((0..n).map(|i| i as f32).collect(), [n], GPU)?.to_dtype(DType::F16)?;
    let sum = Tensor::full(f64::NAN, [n], DType::F16, GPU)?;
    cuda::launch(opsmith_kernels::names::F16.add, Grid::stride((n as u64).div_ceil(8)), (&h, &h, &sum, n as u64))?;
    assert_eq!(values(&sum)?, values(&h)?.iter().map(|v| 2.0 * v).collect::<Vec<_>>()); // doubling is exact

    // The wrong dtype, the wrong length and mixed devices are refused before the driver.
    let err = cuda::launch(opsmith_kernels::names::F32.add, Grid::stride(8), (&h, &h, &sum, n as u64)).unwrap_err();
    assert!(matches!(err, Error::ArgumentDType { kernel: "add_f32", param: "a", actual: DType::F16, .. }), "{err}");
    let err = SCALE.launch(scale_f32, Grid::stride(8), (&xt, &y, 1.0, n as u32)).unwrap_err();
    assert!(matches!(err, Error::ArgumentLength { param: "y", actual, .. } if actual == n as u64 + 3), "{err}");
    let on_cpu = Tensor::zeros([n], DType::F32, Device::Cpu)?;
    let err = SCALE.launch(scale_f32, Grid::stride(8), (&xt, &on_cpu, 1.0, n as u32)).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "scale_f32", .. }), "{err}");
    Ok(())
}
