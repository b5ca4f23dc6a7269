//! The typed launcher's run-time checks, on tensors it refuses before any driver call, so the
//! test runs without a GPU. (The compile-time half, a wrong argument kind or order, is the
//! `compile_fail` doctest on `KernelCrate::launch`; the GPU half is in tests/gpu.rs.)
#![cfg(feature = "cuda")]

use opsmith_host::cuda::{self, Grid, KernelCrate};
use opsmith_host::{DType, Device, Error, Tensor};
use opsmith_kernels::decl::ElemKind;
use opsmith_kernels::names;

opsmith_kernels::kernel! {
    /// A 2-D kernel whose buffers' lengths are products of its parameters.
    ///
    /// # Safety
    /// `x` is valid for `rows * cols` f32, `y` for `rows`.
    pub unsafe fn row_sums_f32(x: *const [f32; rows * cols], y: *mut [f32; rows], rows: u32, cols: u32) {}
}

static TEST_KERNELS: KernelCrate = KernelCrate::new("typed-launch-test", "");

fn ramp(n: usize, dtype: DType) -> Tensor {
    let values: Vec<f32> = (0..n).map(|i| 0.5 + i as f32).collect();
    Tensor::from_slice(&values, [n], Device::Cpu).unwrap().to_dtype(dtype).unwrap()
}

#[test]
fn a_buffer_of_another_dtype_is_refused_naming_kernel_and_parameter() {
    let (a, out) = (ramp(8, DType::F32), ramp(8, DType::F32));
    let b = ramp(8, DType::F16);
    let err = cuda::launch(names::F32.add, Grid::stride(8), (&a, &b, &out, 8)).unwrap_err();
    match err {
        Error::ArgumentDType { kernel, param, expected, actual } => {
            assert_eq!((kernel, param, expected, actual), ("add_f32", "b", ElemKind::F32, DType::F16));
        }
        other => panic!("expected ArgumentDType, got {other:?}"),
    }
    // The f16 kernel takes exactly those f16 tensors and refuses the f32 one.
    let err = cuda::launch(names::F16.add, Grid::stride(8), (&b, &b, &a, 8)).unwrap_err();
    assert!(matches!(err, Error::ArgumentDType { kernel: "add_f16", param: "out", .. }), "{err:?}");
    assert!(err.to_string().contains("add_f16"), "{err}");
}

#[test]
fn lengths_are_checked_against_the_declared_expressions() {
    let (a, b, out) = (ramp(8, DType::F32), ramp(8, DType::F32), ramp(8, DType::F32));
    for n in [0u64, 7, 9, u64::MAX] {
        let err = cuda::launch(names::F32.add, Grid::stride(8), (&a, &b, &out, n)).unwrap_err();
        assert!(
            matches!(err, Error::ArgumentLength { kernel: "add_f32", param: "a", actual: 8, .. }),
            "n = {n}: {err:?}"
        );
    }

    // rows * cols elements for x, rows for y: 3 × 4 = 12 and 3 fit, 4 × 3 does not fit y.
    let (x, y) = (ramp(12, DType::F32), ramp(3, DType::F32));
    let err = TEST_KERNELS.launch(row_sums_f32, Grid::stride(3), (&x, &y, 4, 3)).unwrap_err();
    assert!(matches!(err, Error::ArgumentLength { param: "y", expected: Some(4), actual: 3, .. }), "{err:?}");
    // A product that overflows is a length no tensor has.
    let err = TEST_KERNELS.launch(row_sums_f32, Grid::stride(3), (&x, &y, u32::MAX, u32::MAX)).unwrap_err();
    assert!(matches!(err, Error::ArgumentLength { param: "x", actual: 12, .. }), "{err:?}");
}

#[test]
fn outputs_overlap_only_what_the_kernel_allows() {
    let whole = ramp(16, DType::F32);
    let (a, b) = (whole.flat_slice(0, 8).unwrap(), whole.flat_slice(8, 8).unwrap());
    // Half of `out` is `a`: a partial overlap.
    let out = whole.flat_slice(4, 8).unwrap();
    let err = cuda::launch(names::F32.add, Grid::stride(8), (&a, &b, &out, 8)).unwrap_err();
    assert!(matches!(err, Error::Overlap { op: "add_f32", output: 0 }), "{err:?}");

    // `out` exactly `a` is what `#[in_place]` allows: the checks pass and only the device is wrong.
    let err = cuda::launch(names::F32.add, Grid::stride(8), (&a, &b, &a, 8)).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument { op: "add_f32", reason } if reason.contains("CUDA kernel")),
        "{err:?}"
    );

    // Without `#[in_place]`, an output may not be an input at all.
    let x = ramp(12, DType::F32);
    let y = x.flat_slice(0, 3).unwrap();
    let err = TEST_KERNELS.launch(row_sums_f32, Grid::stride(3), (&x, &y, 3, 4)).unwrap_err();
    assert!(matches!(err, Error::Overlap { op: "row_sums_f32", output: 0 }), "{err:?}");
}

#[test]
fn cpu_tensors_are_refused_by_a_cuda_kernel() {
    let (a, b, out) = (ramp(4, DType::F32), ramp(4, DType::F32), ramp(4, DType::F32));
    let err = cuda::launch(names::F32.add, Grid::stride(4), (&a, &b, &out, 4)).unwrap_err();
    assert!(matches!(&err, Error::InvalidArgument { op: "add_f32", reason } if reason.contains("cpu")), "{err:?}");
}
