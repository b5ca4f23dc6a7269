//! The CPU suite: the shared cases on `Device::Cpu`, plus what needs no GPU.
mod common;

#[cfg(feature = "cuda")]
use opsmith_host::cuda::{self, LaunchConfig};
use opsmith_host::{DType, Device, Error, Tensor};

shared_cases!(Device::Cpu);

#[test]
#[cfg(feature = "cuda")]
fn launch_config_is_checked_without_a_device() {
    for block in [0, 31, 100, 1056, 2048] {
        let cfg = LaunchConfig { grid: 1, block, shared_mem_bytes: 0 };
        assert!(matches!(cfg.validate("k"), Err(Error::InvalidBlockSize { block: b, .. }) if b == block));
    }
    for block in [32, 256, 1024] {
        LaunchConfig { grid: 1, block, shared_mem_bytes: 0 }.validate("k").unwrap();
    }
    assert!(matches!(
        LaunchConfig { grid: 0, block: 256, shared_mem_bytes: 0 }.validate("k"),
        Err(Error::InvalidGrid { .. })
    ));
    assert!(
        matches!(cuda::len_as_u32("k", u32::MAX as usize + 1), Err(Error::TooLarge { limit, .. }) if limit == u32::MAX as u64)
    );
    assert_eq!(cuda::len_as_u32("k", 12345).unwrap(), 12345);
}

#[test]
#[cfg(feature = "cuda")]
fn missing_cuda_is_an_error_and_the_cpu_still_works() {
    let asked = Tensor::zeros([4], DType::F32, Device::Cuda(0));
    if cuda::driver_available() {
        // On a GPU machine, ask for a device that does not exist instead.
        let err = Tensor::zeros([4], DType::F32, Device::Cuda(4096)).unwrap_err();
        assert!(matches!(err, Error::NoSuchDevice { ordinal: 4096, .. }), "{err}");
    } else {
        let err = asked.unwrap_err();
        assert!(matches!(err, Error::NoCudaDriver), "{err}");
        assert!(err.to_string().contains("Device::Cpu"), "the message says what to do: {err}");
        assert_eq!(Device::cuda_if_available(), Device::Cpu);
    }
    let a = Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu).unwrap();
    assert_eq!(opsmith_host::ops::add(&a, &a).unwrap().to_vec::<f32>().unwrap(), [2.0, 4.0]);
}

/// Without the `cuda` feature there is no CUDA runtime at all: asking for a GPU is an error that
/// names the feature, and everything on the CPU works.
#[test]
#[cfg(not(feature = "cuda"))]
fn without_the_cuda_feature_cuda_is_an_error_naming_it() {
    assert_eq!(Device::cuda_if_available(), Device::Cpu);
    let err = Tensor::zeros([4], DType::F32, Device::Cuda(0)).unwrap_err();
    assert!(matches!(err, Error::FeatureDisabled { feature: "cuda", device: Device::Cuda(0), .. }), "{err}");
    assert!(err.to_string().contains("`cuda` cargo feature"), "{err}");
    let err = opsmith_host::Labels::new(&[0, 1], Device::Cuda(1)).unwrap_err();
    assert!(matches!(err, Error::FeatureDisabled { op: "Labels::new", feature: "cuda", .. }), "{err}");
    let a = Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu).unwrap();
    assert!(matches!(a.to_device(Device::Cuda(0)), Err(Error::FeatureDisabled { .. })));
    let d = opsmith_host::ops::fused_mul_add(&a, &a, &a).unwrap();
    assert_eq!(d.to_vec::<f32>().unwrap(), [2.0, 6.0]);
}

#[test]
#[cfg(feature = "cuda")]
fn ptx_modules_need_a_cuda_device() {
    let err = cuda::KernelModule::from_ptx(&Device::Cpu, "m", ".version 7.0").err().unwrap();
    assert!(matches!(err, Error::InvalidArgument { op: "KernelModule::from_ptx", .. }), "{err}");
}
