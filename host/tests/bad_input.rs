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

/// Host allocations that cannot be made are errors, never an abort or a panic: a tensor of
/// 2^40 f32 (4 TiB, more than this machine has), 2^62 (more than an allocation can address),
/// and outputs that are huge though their inputs are empty. (2^40 is refused by Linux's default
/// overcommit heuristic, since it exceeds RAM and swap; the address-space case always is.)
#[test]
fn host_allocations_that_cannot_be_made_are_errors() {
    let too_big = |e: &Error| matches!(e, Error::OutOfMemory { device: Device::Cpu, .. } | Error::TooLarge { .. });
    for n in [1usize << 40, 1 << 46, 1 << 62] {
        let err = Tensor::zeros([n], DType::F32, Device::Cpu).unwrap_err();
        assert!(too_big(&err), "zeros([{n}]): {err}");
        let err = Tensor::full(1.5, [n], DType::BF16, Device::Cpu).unwrap_err();
        assert!(too_big(&err), "full([{n}]): {err}");
    }
    assert!(matches!(Tensor::zeros([1usize << 62], DType::F32, Device::Cpu), Err(Error::TooLarge { .. })));
    let one = Tensor::from_vec(vec![2.0f32], [], Device::Cpu).unwrap();
    let err = ops::expand_scalar(&one, [1usize << 40], 1.0).unwrap_err();
    assert!(too_big(&err), "expand_scalar: {err}");
    let empty_rows = Tensor::zeros([0, 1usize << 40], DType::F32, Device::Cpu).unwrap();
    let err = ops::sum_rows(&empty_rows).unwrap_err();
    assert!(too_big(&err), "sum_rows: {err}");
    let (a, b) = (
        Tensor::zeros([1usize << 20, 0], DType::F32, Device::Cpu).unwrap(),
        Tensor::zeros([0, 1usize << 20], DType::F32, Device::Cpu).unwrap(),
    );
    let err = ops::matmul(&a, &b).unwrap_err();
    assert!(too_big(&err), "matmul: {err}");
    // The process is still fine: a small tensor works.
    assert_eq!(Tensor::full(3.0, [2], DType::F32, Device::Cpu).unwrap().to_vec::<f32>().unwrap(), [3.0, 3.0]);
}

/// A broadcast whose output cannot be allocated is `OutOfMemory` naming the op, as for every
/// other host allocation, not an abort: 2^20 × 2^20 f32 is 4 TiB from two 4 MiB operands.
#[test]
fn broadcasts_too_large_for_memory_are_errors_naming_the_op() {
    let b = 1usize << 20;
    let col = Tensor::zeros([b, 1], DType::F32, Device::Cpu).unwrap();
    let row = Tensor::zeros([1, b], DType::F32, Device::Cpu).unwrap();
    let results = [
        ("add", ops::add(&col, &row)),
        ("sub", ops::sub(&col, &row)),
        ("mul", ops::mul(&col, &row)),
        ("div", ops::div(&col, &row)),
        ("add", &col + &row),
        ("sub", &col - &row),
        ("mul", &col * &row),
        ("div", &col / &row),
        ("Tensor::broadcast_as", col.broadcast_as([b, b])),
    ];
    for (name, result) in results {
        match result {
            Err(err @ Error::OutOfMemory { op, device: Device::Cpu, bytes }) => {
                assert_eq!((op, bytes), (name, 4 << 40), "{err}");
                assert_eq!(
                    err.to_string(),
                    format!("{name}: out of memory on cpu: allocating {} bytes failed", 4u64 << 40)
                );
            }
            other => panic!("{name}: expected OutOfMemory, got {:?}", other.map(|t| t.dims().to_vec())),
        }
    }
    // The process is still fine, and a small broadcast still gives the right values.
    let col = Tensor::from_vec(vec![1.0f32, 2.0], [2, 1], Device::Cpu).unwrap();
    let row = Tensor::from_vec(vec![10.0f32, 20.0, 30.0], [1, 3], Device::Cpu).unwrap();
    assert_eq!(ops::add(&col, &row).unwrap().to_vec::<f32>().unwrap(), [11.0, 21.0, 31.0, 12.0, 22.0, 32.0]);
}

/// A random fill whose byte count overflows is `TooLarge`, as `zeros` of that size is, not an
/// allocation of the wrapped-around byte count.
#[test]
fn random_fills_whose_bytes_overflow_are_too_large() {
    let n = 1usize << 62;
    let limit = (isize::MAX as usize / 4) as u64;
    for (name, result) in [
        ("Tensor::randn", Tensor::randn([n], DType::F32, Device::Cpu, 0)),
        ("Tensor::rand", Tensor::rand([n], DType::F32, Device::Cpu, 0)),
    ] {
        match result {
            Err(Error::TooLarge { op, elements, limit: l }) => assert_eq!((op, elements, l), (name, n as u64, limit)),
            other => panic!("{name}: expected TooLarge, got {:?}", other.map(|t| t.dims().to_vec())),
        }
    }
    match Tensor::zeros([n], DType::F32, Device::Cpu) {
        Err(Error::TooLarge { elements, limit: l, .. }) => assert_eq!((elements, l), (n as u64, limit)),
        other => panic!("zeros: expected TooLarge, got {:?}", other.map(|t| t.dims().to_vec())),
    }
}

/// `narrow` of a tensor with no elements, along any dim: the empty result of the right shape
/// (the offset of `start` along a dim can pass the end of an empty tensor).
#[test]
fn narrow_of_an_empty_tensor_is_empty() {
    let z = |dims: &[usize]| Tensor::zeros(dims.to_vec(), DType::F32, Device::Cpu).unwrap();
    for (dims, dim, start, len, want) in [
        (vec![0, 5], 1, 2, 3, vec![0, 3]),
        (vec![0, 5], 1, 5, 0, vec![0, 0]),
        (vec![0, 5], 0, 0, 0, vec![0, 5]),
        (vec![2, 0], 0, 1, 1, vec![1, 0]),
        (vec![0, usize::MAX], 1, 1, 3, vec![0, 3]),
        (vec![3, 0, 4], 2, 1, 2, vec![3, 0, 2]),
    ] {
        let got = z(&dims).narrow(dim, start, len).unwrap();
        assert_eq!((got.dims(), got.elem_count()), (&want[..], 0), "{dims:?}.narrow({dim}, {start}, {len})");
    }
    // Past the end is still an error, empty or not.
    assert!(matches!(z(&[0, 5]).narrow(1, 4, 2), Err(Error::InvalidArgument { op: "Tensor::narrow", .. })));
}

/// `cat` refuses sizes along the joined dim whose sum overflows, rather than wrapping around to a
/// wrong shape.
#[test]
fn cat_sizes_that_overflow_are_errors() {
    let m = usize::MAX;
    let z = |dims: &[usize]| Tensor::zeros(dims.to_vec(), DType::F32, Device::Cpu).unwrap();
    for (parts, dim) in [
        (vec![vec![0, m], vec![0, 1]], 1),
        (vec![vec![m, 0], vec![m, 0]], 0),
        (vec![vec![0, m], vec![0, m], vec![0, 2]], 1),
    ] {
        let parts: Vec<Tensor> = parts.iter().map(|d| z(d)).collect();
        let err = Tensor::cat(&parts.iter().collect::<Vec<_>>(), dim).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { op: "Tensor::cat", .. }), "{err}");
        assert!(err.to_string().contains(&format!("along dim {dim}")), "{err}");
    }
    // Sizes that add up to exactly usize::MAX make a valid empty shape.
    assert_eq!(Tensor::cat(&[&z(&[0, m - 1]), &z(&[0, 1])], 1).unwrap().dims(), [0, m]);
    assert_eq!(Tensor::cat(&[&z(&[2, 0]), &z(&[3, 0])], 0).unwrap().dims(), [5, 0]);
}

/// Reductions along a dim of a tensor with no elements but a huge dim: the right empty (or
/// zero) result, at once, rather than a loop of 2^64 empty iterations (in a debug build).
#[test]
fn dim_reductions_of_empty_tensors_with_huge_dims() {
    let m = usize::MAX;
    let z = |dims: &[usize]| Tensor::zeros(dims.to_vec(), DType::F32, Device::Cpu).unwrap();
    assert_eq!(ops::sum_dim(&z(&[m, 0]), 0, false).unwrap().dims(), [0]);
    assert_eq!(ops::sum_dim(&z(&[m, 0]), 0, true).unwrap().dims(), [1, 0]);
    assert_eq!(ops::sum_dim(&z(&[1, m, 0]), 1, false).unwrap().dims(), [1, 0]);
    let (values, indices) = ops::max_dim(&z(&[m, 1, 0]), 1, false).unwrap();
    assert_eq!((values.dims(), indices.dims()), (&[m, 0][..], &[m, 0][..]));
    // Summing an empty dim gives zeros (a sum of nothing), with the other dims kept.
    let sums = ops::sum_dim(&z(&[3, 0]), 1, false).unwrap();
    assert_eq!(sums.to_vec::<f32>().unwrap(), [0.0; 3]);
}

/// A shape with a zero dim holds nothing, but one whose other dims overflow when multiplied is
/// still too large (its strides would overflow), in any order of the dims.
#[test]
fn shapes_whose_dims_overflow_are_too_large_even_with_a_zero() {
    for dims in [[0, usize::MAX, usize::MAX], [usize::MAX, 0, usize::MAX], [usize::MAX, usize::MAX, 0]] {
        let err = Tensor::zeros(dims.to_vec(), DType::F32, Device::Cpu).unwrap_err();
        assert!(matches!(err, Error::TooLarge { .. }), "{dims:?}: {err}");
        assert!(err.to_string().contains("element count overflows"), "{dims:?}: {err}");
    }
    assert_eq!(Tensor::zeros([0, usize::MAX], DType::F32, Device::Cpu).unwrap().elem_count(), 0);
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
        matches!(&err, Error::TooLarge { op, elements, limit } if *op == "my_kernel" && *elements == 1 << 33 && *limit == u32::MAX as u64)
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
    let (lo, hi) = (buf.flat_slice(0, 3).unwrap(), buf.flat_slice(1, 3).unwrap());
    let err = ops::mul_into(&lo, &lo, &hi).unwrap_err();
    assert!(matches!(err, Error::Overlap { op: "mul", output: 0 }), "{err}");
    unchanged(&buf, &B);
}

#[test]
fn out_of_range_view_and_wrong_element_type() {
    let a = t(&A, DType::F16);
    assert!(matches!(
        a.flat_slice(1, 5),
        Err(Error::OutOfRange { op: "Tensor::flat_slice", start: 1, end: 6, len: 3 })
    ));
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

#[test]
fn integer_tensors_are_refused_by_arithmetic() {
    for dtype in [DType::U32, DType::I64] {
        let x = Tensor::from_f64(&[1.0, 2.0, 3.0, 4.0], [2, 2], dtype, Device::Cpu).unwrap();
        let results: [(&str, opsmith_host::Result<Tensor>); 16] = [
            ("relu", ops::relu(&x)),
            ("gelu", ops::gelu(&x)),
            ("silu", ops::silu(&x)),
            ("mse_loss", ops::mse_loss(&x, &x)),
            ("matmul", ops::matmul(&x, &x)),
            ("add", ops::add(&x, &x)),
            ("sub", ops::sub(&x, &x)),
            ("mul", ops::mul(&x, &x)),
            ("div", ops::div(&x, &x)),
            ("affine", ops::affine(&x, 2.0, 1.0)),
            ("fused_mul_add", ops::fused_mul_add(&x, &x, &x)),
            ("add_mul", ops::add_mul(&x, &x, &x)),
            ("sum", ops::sum(&x)),
            ("mean", ops::mean(&x)),
            ("sum_rows", ops::sum_rows(&x)),
            ("softmax", ops::softmax(&x, 1.0, None)),
        ];
        for (name, result) in results {
            match result {
                Err(Error::UnsupportedDType { op, dtype: d, device: Device::Cpu }) => {
                    assert_eq!((op, d), (name, dtype), "{name}")
                }
                other => panic!("{name} on {dtype}: {:?}", other.map(|t| t.dims().to_vec())),
            }
        }
        unchanged(&x, &[1.0, 2.0, 3.0, 4.0]);
    }
}

#[test]
fn index_ops_with_sizes_that_overflow_are_too_large() {
    let x = Tensor::zeros([2, 3], DType::F32, Device::Cpu).unwrap();
    let g = Tensor::from_vec(vec![1.0f32; 6], [2, 3], Device::Cpu).unwrap();
    let index = Tensor::from_vec(vec![0i64, 1, 2], [3], Device::Cpu).unwrap();
    let err = ops::index_select_backward(&g, 1, &index, usize::MAX).unwrap_err();
    assert!(matches!(err, Error::TooLarge { op: "index_select_backward", .. }), "{err}");
    // An index past a dim of size 2 is refused before anything is written.
    assert!(matches!(x.index_select(0, &index), Err(Error::InvalidArgument { op: "index_select", .. })));
    unchanged(&g, &[1.0; 6]);
}
