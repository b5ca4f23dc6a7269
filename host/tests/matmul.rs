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
