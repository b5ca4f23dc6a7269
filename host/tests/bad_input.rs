//! One test per error class of the runtime: each asserts the typed error (op and offending
//! values) and that the inputs are unchanged afterwards. Device mismatch needs a GPU and is in
//! `gpu.rs`; the autograd classes (custom-op arity, backward without requires-grad, backward
//! twice) are in `autograd/tests/bad_input.rs`.
#[cfg(feature = "cuda")]
use opsmith_host::cuda::{self, LaunchConfig};
use opsmith_host::{DType, Device, Error, Tensor, ops};

fn t(values: &[f64], dtype: DType) -> Tensor {
    Tensor::from_f64(values, values.len(), dtype, Device::Cpu).unwrap()
}

fn unchanged(tensor: &Tensor, values: &[f64]) {
    assert_eq!(tensor.to_vec_f64().unwrap(), values, "an input changed");
}

const A: [f64; 3] = [1.5, -2.0, 0.25];
const B: [f64; 4] = [4.0, 0.5, -1.0, 8.0];

#[test]
fn shape_mismatch() {
    let (a, b) = (t(&A, DType::F32), t(&B, DType::F32));
    let err = ops::fused_mul_add(&a, &a, &b).unwrap_err();
    assert!(
        matches!(&err, Error::ShapeMismatch { op: "fused_mul_add", lhs, rhs } if lhs == &[3] && rhs == &[4]),
        "{err}"
    );
    assert!(
        err.to_string().contains("fused_mul_add") && err.to_string().contains("[3]") && err.to_string().contains("[4]")
    );
    unchanged(&a, &A);
    unchanged(&b, &B);
}

#[test]
fn dtype_mismatch() {
    let (a, h) = (t(&A, DType::F32), t(&A, DType::BF16));
    let err = ops::add_mul(&a, &h, &a).unwrap_err();
    assert!(matches!(err, Error::DTypeMismatch { op: "add_mul", lhs: DType::F32, rhs: DType::BF16 }), "{err}");
    assert!(err.to_string().contains("bf16"));
    unchanged(&a, &A);
    unchanged(&h, &A);
}

#[test]
fn non_contiguous_input_is_made_contiguous() {
    // opsmith tensors are always contiguous: an ndarray view in another layout is copied into
    // row-major order on the way in, so no op ever meets a strided input.
    let m = ndarray::array![[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]];
    let transposed = m.t();
    assert!(!transposed.is_standard_layout());
    let tensor = Tensor::from_array(&transposed, Device::Cpu).unwrap();
    assert_eq!(tensor.dims(), [3, 2]);
    assert_eq!(tensor.to_vec::<f32>().unwrap(), [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    assert_eq!(m, ndarray::array![[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]], "the source array is unchanged");
}

#[test]
fn empty_where_empty_is_not_allowed() {
    let empty = t(&[], DType::F32);
    let err = ops::mean(&empty).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { op: "mean", .. }), "{err}");
    assert_eq!(empty.elem_count(), 0);
    // Empty is allowed where it has a meaning: elementwise ops and sums of nothing.
    assert_eq!(ops::add(&empty, &empty).unwrap().elem_count(), 0);
    assert_eq!(ops::sum(&empty).unwrap().to_vec::<f32>().unwrap(), [0.0]);
}

#[test]
fn too_large_for_one_launch() {
    let err = Tensor::zeros([usize::MAX / 2, 4], DType::F32, Device::Cpu).unwrap_err();
    assert!(matches!(err, Error::TooLarge { .. }), "{err}");
}

#[test]
#[cfg(feature = "cuda")]
fn too_large_for_a_32_bit_length() {
    let err = cuda::len_as_u32("my_kernel", 1 << 33).unwrap_err();
    assert!(
        matches!(&err, Error::TooLarge { op, elements, limit } if op == "my_kernel" && *elements == 1 << 33 && *limit == u32::MAX as u64)
    );
}

#[test]
#[cfg(feature = "cuda")]
fn invalid_block_size() {
    for block in [0, 16, 48, 1000, 2048] {
        let err = LaunchConfig { grid: 4, block, shared_mem_bytes: 0 }.validate("my_kernel").unwrap_err();
        assert!(
            matches!(&err, Error::InvalidBlockSize { kernel, block: b } if kernel == "my_kernel" && *b == block),
            "{err}"
        );
    }
}

#[test]
fn partial_overlap_of_output_and_input() {
    let buf = t(&B, DType::F32);
    let (lo, hi) = (buf.narrow(0, 3).unwrap(), buf.narrow(1, 3).unwrap());
    let err = ops::mul_into(&lo, &lo, &hi).unwrap_err();
    assert!(matches!(err, Error::Overlap { op: "mul", output: 0 }), "{err}");
    unchanged(&buf, &B);
}

#[test]
fn out_of_range_view_and_wrong_element_type() {
    let a = t(&A, DType::F16);
    assert!(matches!(a.narrow(1, 5), Err(Error::OutOfRange { op: "Tensor::narrow", start: 1, end: 6, len: 3 })));
    assert!(matches!(a.to_vec::<f32>(), Err(Error::ElementType { requested: DType::F32, actual: DType::F16, .. })));
    assert!(matches!(
        Tensor::from_vec(vec![1.0f32; 5], [2, 2], Device::Cpu),
        Err(Error::ElementCount { expected: 4, actual: 5, .. })
    ));
    unchanged(&a, &A);
}

#[test]
#[cfg(feature = "cuda")]
fn no_cuda_device() {
    let a = t(&A, DType::F32);
    let err = if cuda::driver_available() { a.to_device(Device::Cuda(4096)) } else { a.to_device(Device::Cuda(0)) }
        .unwrap_err();
    assert!(matches!(err, Error::NoCudaDriver | Error::NoSuchDevice { ordinal: 4096, .. }), "{err}");
    unchanged(&a, &A);
}
