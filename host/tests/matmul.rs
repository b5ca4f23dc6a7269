//! The CPU matmul suite: the shared matmul cases on `Device::Cpu` (the GPU suite,
//! `gpu_matmul.rs`, runs the same cases on CUDA), and the cuBLAS check that needs no GPU.
mod common;

use opsmith_host::Device;
#[cfg(feature = "cublas")]
use opsmith_host::{Error, cuda};

matmul_cases!(Device::Cpu);

/// Without libcublas, a CUDA matmul is a typed error with the fix, never cudarc's panic.
#[test]
#[cfg(feature = "cublas")]
fn missing_cublas_is_an_error_with_the_fix() {
    match cuda::require_cublas("matmul") {
        Ok(()) => assert!(cuda::cublas_available()),
        Err(e) => {
            assert!(!cuda::cublas_available());
            let Error::LibraryMissing { op: "matmul", lib, ref fix } = e else {
                panic!("expected LibraryMissing, got {e:?}")
            };
            assert_eq!(lib, "libcublas.so");
            assert!(fix.contains("LD_LIBRARY_PATH") && fix.contains("libcublas.so.13"), "{fix}");
            assert!(e.to_string().contains("matmul") && e.to_string().contains("LD_LIBRARY_PATH"), "{e}");
        }
    }
}

/// The normwise relative error of a CPU f32 product with a long inner dimension, against f64:
/// the gradient of `b` in `[256, 512] · [512, 128]` is `aᵀ · g`, k = 256. PyTorch's CPU
/// matmul measured 2.0e-7 on such a product (the issue of 2026-12-03); the bar is to be as
/// accurate (one f32 pass over k gave 2.9e-7 here).
#[test]
fn long_inner_dimension_is_accurate() {
    use rand::{Rng, SeedableRng, rngs::StdRng};
    let mut rng = StdRng::seed_from_u64(256);
    let (k, m, n) = (256, 512, 128);
    let a: Vec<f32> = (0..k * m).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let g: Vec<f32> = (0..k * n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let at = opsmith_host::Tensor::from_vec(a.clone(), [k, m], Device::Cpu).unwrap();
    let gt = opsmith_host::Tensor::from_vec(g.clone(), [k, n], Device::Cpu).unwrap();
    let got = opsmith_host::ops::matmul_t(&at, true, &gt, false).unwrap().to_vec::<f32>().unwrap();
    let (mut err, mut norm) = (0.0f64, 0.0f64);
    for i in 0..m {
        for j in 0..n {
            let exact: f64 = (0..k).map(|r| a[r * m + i] as f64 * g[r * n + j] as f64).sum();
            err += (got[i * n + j] as f64 - exact).powi(2);
            norm += exact * exact;
        }
    }
    let relative = (err / norm).sqrt();
    println!("normwise relative error {relative:.3e}");
    assert!(relative <= 2.0e-7, "normwise relative error {relative:.3e}, worse than PyTorch's 2.0e-7");
}
