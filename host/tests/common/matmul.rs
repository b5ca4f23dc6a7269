//! Matrix-product cases shared by the CPU suite (`matmul.rs`) and the GPU suite
//! (`gpu_matmul.rs`): every case takes a device, and checks against a naive f64 triple loop.
use super::{SENTINEL, padded_view, poison_pool, random_values, supported, tensor, values};
use opsmith_host::{DType, Device, Error, Result, Tensor, ops};
use rand::{SeedableRng, rngs::StdRng};

/// One product's sizes: `op(a) [m, k] · op(b) [k, n]`, as 3-D batches when `batch` is `Some`.
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub batch: Option<usize>,
    pub m: usize,
    pub k: usize,
    pub n: usize,
}

impl Dims {
    pub const fn new(m: usize, k: usize, n: usize) -> Self {
        Self { batch: None, m, k, n }
    }

    pub const fn batched(batch: usize, m: usize, k: usize, n: usize) -> Self {
        Self { batch: Some(batch), m, k, n }
    }

    pub fn count(&self) -> usize {
        self.batch.unwrap_or(1)
    }

    fn with_batch(&self, rows: usize, cols: usize) -> Vec<usize> {
        match self.batch {
            Some(b) => vec![b, rows, cols],
            None => vec![rows, cols],
        }
    }

    /// `a` as stored: `[m, k]`, or `[k, m]` when read transposed.
    pub fn a_dims(&self, transpose: bool) -> Vec<usize> {
        if transpose { self.with_batch(self.k, self.m) } else { self.with_batch(self.m, self.k) }
    }

    /// `b` as stored: `[k, n]`, or `[n, k]` when read transposed.
    pub fn b_dims(&self, transpose: bool) -> Vec<usize> {
        if transpose { self.with_batch(self.n, self.k) } else { self.with_batch(self.k, self.n) }
    }

    pub fn out_dims(&self) -> Vec<usize> {
        self.with_batch(self.m, self.n)
    }
}

/// 1×1×1, a few odd sizes (none a multiple of 8), a k of 1, and batches. On CUDA the products
/// up to `ops::SMALL_PRODUCT_MACS` multiply-adds take opsmith's own kernels, one thread per run
/// of four outputs of a row for k ≤ 32, one warp per run up to k = 256 (k = 33 and 100 here),
/// and beyond a block per four outputs of a row when `b` is read untransposed, else one block
/// per output (k = 1029, with a tail of 5 past the last whole batch of loads; k = 300, 38 slices of the
/// inner dimension rounded up to 40; a weight gradient's shape, [2, 1024] · [1024, 130], whose
/// last tile of columns holds two). The last shape (just over 2^20) takes cuBLAS.
pub const SHAPES: [Dims; 10] = [
    Dims::new(1, 1, 1),
    Dims::new(3, 5, 7),
    Dims::new(17, 1, 9),
    Dims::new(64, 33, 65),
    Dims::batched(4, 5, 6, 3),
    Dims::batched(3, 9, 100, 7),
    Dims::batched(2, 3, 1029, 5),
    Dims::batched(2, 3, 300, 11),
    Dims::new(2, 1024, 130),
    Dims::new(130, 70, 120),
];

/// Element offsets of the operands' views: 0 keeps allocations' alignment, 1 and 3 break 16-byte
/// (and for f16/bf16, 4-byte) alignment.
pub const OFFSETS: [usize; 3] = [0, 1, 3];

pub const TRANSPOSES: [(bool, bool); 4] = [(false, false), (true, false), (false, true), (true, true)];

/// `op(a) · op(b)` by the definition, in f64, with each element's sum of |products| (the scale
/// of its rounding error), for operands stored row-major as [`Dims::a_dims`] and
/// [`Dims::b_dims`] say.
pub fn reference(a: &[f64], ta: bool, b: &[f64], tb: bool, d: Dims) -> (Vec<f64>, Vec<f64>) {
    let (m, k, n) = (d.m, d.k, d.n);
    let mut out = Vec::with_capacity(d.count() * m * n);
    let mut scale = Vec::with_capacity(out.capacity());
    for p in 0..d.count() {
        let (a, b) = (&a[p * m * k..], &b[p * k * n..]);
        for i in 0..m {
            for j in 0..n {
                let (mut sum, mut magnitude) = (0.0, 0.0);
                for l in 0..k {
                    let x = if ta { a[l * m + i] } else { a[i * k + l] };
                    let y = if tb { b[j * k + l] } else { b[l * n + j] };
                    sum += x * y;
                    magnitude += (x * y).abs();
                }
                out.push(sum);
                scale.push(magnitude);
            }
        }
    }
    (out, scale)
}

/// The largest error allowed for an element whose reference is `r` and whose products sum to
/// `scale` in magnitude: k+1 roundings of the arithmetic type on the way (any summation order),
/// one rounding to f16/bf16 at the end, and half the dtype's smallest subnormal.
pub fn tolerance(dtype: DType, k: usize, r: f64, scale: f64) -> f64 {
    let arith = if dtype == DType::F64 { DType::F64 } else { DType::F32 }.unit_roundoff();
    let store = match dtype {
        DType::F16 | DType::BF16 => dtype.unit_roundoff() * r.abs(),
        _ => 0.0,
    };
    (k as f64 + 1.0) * arith * scale * 1.01 + store * 1.01 + super::store_floor(dtype)
}

/// Asserts every element of `got` is within [`tolerance`] of the reference.
pub fn assert_close(got: &[f64], reference: &[f64], scale: &[f64], dtype: DType, k: usize, context: &str) {
    assert_eq!(got.len(), reference.len(), "{context}: element count");
    for (i, ((&g, &r), &s)) in got.iter().zip(reference).zip(scale).enumerate() {
        let tol = tolerance(dtype, k, r, s);
        assert!((g - r).abs() <= tol, "{context}: element {i} = {g:e}, f64 reference {r:e}, tolerance {tol:e}");
    }
}

/// A view of `values` at element `offset` of a larger buffer, with shape `dims`.
pub fn operand(values: &[f64], dims: &[usize], offset: usize, dtype: DType, device: Device) -> Result<Tensor> {
    let mut data = vec![1.0; offset];
    data.extend_from_slice(values);
    tensor(&data, dtype, device)?.flat_slice(offset, values.len())?.reshape(dims.to_vec())
}

/// `matmul`/`matmul_t` (functional), whichever the flags call for.
pub fn product(a: &Tensor, ta: bool, b: &Tensor, tb: bool) -> Result<Tensor> {
    if !ta && !tb { ops::matmul(a, b) } else { ops::matmul_t(a, ta, b, tb) }
}

/// `matmul_into`/`matmul_t_into`, whichever the flags call for.
pub fn product_into(a: &Tensor, ta: bool, b: &Tensor, tb: bool, out: &Tensor) -> Result<()> {
    if !ta && !tb { ops::matmul_into(a, b, out) } else { ops::matmul_t_into(a, ta, b, tb, out) }
}

/// One dtype, shape, transpose pair and offset: random operands at `offset`, the functional form
/// and the `_into` form (into a NaN-poisoned view at `offset` of a sentinel-padded buffer)
/// against f64, nothing written outside the output view, the inputs unchanged.
pub fn check_product(
    device: Device,
    dtype: DType,
    d: Dims,
    (ta, tb): (bool, bool),
    offset: usize,
    seed: u64,
) -> Result<()> {
    let context = format!("{dtype} on {device}, {d:?}, transposes {ta}/{tb}, offset {offset}");
    let mut rng = StdRng::seed_from_u64(seed);
    let a_values = random_values(&mut rng, d.count() * d.m * d.k, dtype);
    let b_values = random_values(&mut rng, d.count() * d.k * d.n, dtype);
    // Different offsets for the two operands, so that aligned and unaligned pointers mix.
    let a = operand(&a_values, &d.a_dims(ta), offset, dtype, device)?;
    let b = operand(&b_values, &d.b_dims(tb), (offset * 2) % 4, dtype, device)?;
    let out_len = d.count() * d.m * d.n;
    let (out_buf, out_view) = padded_view(out_len, offset, f64::NAN, dtype, device)?;
    let out = out_view.reshape(d.out_dims())?;

    if !supported(dtype, device) {
        let err = product(&a, ta, &b, tb).expect_err("f64 has no CUDA matmul");
        assert!(matches!(err, Error::UnsupportedDType { dtype: DType::F64, .. }), "{context}: {err}");
        let err = product_into(&a, ta, &b, tb, &out).expect_err("f64 has no CUDA matmul");
        assert!(matches!(err, Error::UnsupportedDType { dtype: DType::F64, .. }), "{context}: {err}");
        return Ok(());
    }
    let (expected, scale) = reference(&a_values, ta, &b_values, tb, d);

    let fresh = product(&a, ta, &b, tb)?;
    assert_eq!(fresh.dims(), d.out_dims().as_slice(), "{context}");
    assert_eq!(fresh.dtype(), dtype);
    assert_close(&values(&fresh)?, &expected, &scale, dtype, d.k, &format!("{context}, functional"));

    product_into(&a, ta, &b, tb, &out)?;
    assert_close(&values(&out)?, &expected, &scale, dtype, d.k, &format!("{context}, into"));
    let all = values(&out_buf)?;
    assert!(
        all[..offset].iter().chain(&all[offset + out_len..]).all(|&v| v == SENTINEL),
        "{context}: wrote outside its output view"
    );
    assert_eq!(values(&a)?, a_values, "{context}: a changed");
    assert_eq!(values(&b)?, b_values, "{context}: b changed");
    Ok(())
}

/// Every dtype × shape × transpose pair × offset on `device`.
pub fn products_against_f64(device: Device) -> Result<()> {
    let mut seed = 5000;
    for dtype in super::DTYPES {
        for d in SHAPES {
            for transposes in TRANSPOSES {
                for offset in OFFSETS {
                    seed += 1;
                    check_product(device, dtype, d, transposes, offset, seed)?;
                }
            }
        }
    }
    Ok(())
}

/// The product's definition on a case small enough to check by hand, on every dtype.
pub fn small_product_by_hand(device: Device) -> Result<()> {
    for dtype in super::DTYPES.into_iter().filter(|&dt| supported(dt, device)) {
        // [[1, 2, 3], [4, 5, 6]] · [[7, 8], [9, 10], [11, 12]]
        let a = Tensor::from_f64(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3], dtype, device)?;
        let b = Tensor::from_f64(&[7.0, 8.0, 9.0, 10.0, 11.0, 12.0], [3, 2], dtype, device)?;
        assert_eq!(values(&ops::matmul(&a, &b)?)?, [58.0, 64.0, 139.0, 154.0], "{dtype} on {device}");
        // bᵀ · aᵀ = (a · b)ᵀ
        assert_eq!(values(&ops::matmul_t(&b, true, &a, true)?)?, [58.0, 139.0, 64.0, 154.0], "{dtype} on {device}");
    }
    Ok(())
}

/// k = 0 gives zeros of shape [m, n] (an empty sum), also into a poisoned output; an empty m, n
/// or batch gives an empty tensor of the product's shape.
pub fn empty_products(device: Device) -> Result<()> {
    for dtype in super::DTYPES.into_iter().filter(|&dt| supported(dt, device)) {
        for (ta, tb) in TRANSPOSES {
            let zero_k = Dims::new(3, 0, 4);
            let a = Tensor::zeros(zero_k.a_dims(ta), dtype, device)?;
            let b = Tensor::zeros(zero_k.b_dims(tb), dtype, device)?;
            let c = product(&a, ta, &b, tb)?;
            assert_eq!(c.dims(), [3, 4]);
            assert_eq!(values(&c)?, [0.0; 12], "{dtype} on {device}: k = 0 is an empty sum");
            let out = Tensor::full(f64::NAN, [3, 4], dtype, device)?;
            product_into(&a, ta, &b, tb, &out)?;
            assert_eq!(values(&out)?, [0.0; 12], "{dtype} on {device}: k = 0 into a poisoned output");

            for d in [Dims::new(0, 5, 4), Dims::new(3, 5, 0), Dims::batched(0, 2, 3, 4), Dims::batched(2, 0, 0, 3)] {
                let a = Tensor::zeros(d.a_dims(ta), dtype, device)?;
                let b = Tensor::zeros(d.b_dims(tb), dtype, device)?;
                let c = product(&a, ta, &b, tb)?;
                assert_eq!(c.dims(), d.out_dims().as_slice(), "{dtype} on {device}: {d:?}");
                assert_eq!(c.elem_count(), d.count() * d.m * d.n);
                let out = Tensor::zeros(d.out_dims(), dtype, device)?;
                product_into(&a, ta, &b, tb, &out)?;
            }
        }
    }
    Ok(())
}

/// Bad operands are typed errors naming the op and the shapes; nothing is written.
pub fn matmul_errors(device: Device) -> Result<()> {
    let t = |dims: &[usize], dtype: DType| -> Result<Tensor> {
        let n = dims.iter().product::<usize>();
        let values: Vec<f64> = (0..n).map(|i| i as f64 * 0.5 - 1.0).collect();
        Tensor::from_f64(&values, dims.to_vec(), dtype, device)
    };
    let shape_mismatch = |result: Result<Tensor>, op: &str, lhs: &[usize], rhs: &[usize]| match result {
        Err(Error::ShapeMismatch { op: o, lhs: l, rhs: r }) => {
            assert_eq!((o, l.as_slice(), r.as_slice()), (op, lhs, rhs));
        }
        other => panic!("expected a shape mismatch of {lhs:?} and {rhs:?}, got {other:?}"),
    };
    let a = t(&[2, 3], DType::F32)?;
    let a_values = values(&a)?;
    // Inner dimensions.
    shape_mismatch(ops::matmul(&a, &t(&[2, 3], DType::F32)?), "matmul", &[2, 3], &[2, 3]);
    shape_mismatch(ops::matmul_t(&a, true, &t(&[3, 2], DType::F32)?, false), "matmul_t", &[2, 3], &[3, 2]);
    // Rank 2 against rank 3, and batch sizes.
    shape_mismatch(ops::matmul(&a, &t(&[1, 3, 2], DType::F32)?), "matmul", &[2, 3], &[1, 3, 2]);
    shape_mismatch(
        ops::matmul(&t(&[2, 2, 3], DType::F32)?, &t(&[3, 3, 2], DType::F32)?),
        "matmul",
        &[2, 2, 3],
        &[3, 3, 2],
    );
    // Ranks other than 2 and 3.
    for dims in [&[6][..], &[1, 1, 2, 3][..], &[][..]] {
        let odd = t(dims, DType::F32)?;
        match ops::matmul(&odd, &odd) {
            Err(e @ Error::InvalidArgument { op: "matmul", .. }) => {
                assert!(e.to_string().contains(&format!("{dims:?}")), "{e}")
            }
            other => panic!("rank {}: expected InvalidArgument, got {other:?}", dims.len()),
        }
    }
    // Dtypes.
    match ops::matmul(&a, &t(&[3, 2], DType::BF16)?) {
        Err(Error::DTypeMismatch { op: "matmul", lhs: DType::F32, rhs: DType::BF16 }) => {}
        other => panic!("expected a dtype mismatch, got {other:?}"),
    }
    // Outputs: shape, dtype, and memory shared with an input.
    let b = t(&[3, 4], DType::F32)?;
    let out = Tensor::full(f64::NAN, [2, 5], DType::F32, device)?;
    match ops::matmul_into(&a, &b, &out) {
        Err(Error::ShapeMismatch { op: "matmul_into", lhs, rhs }) => assert_eq!((lhs, rhs), (vec![2, 4], vec![2, 5])),
        other => panic!("expected a shape mismatch of the output, got {other:?}"),
    }
    let out_h = Tensor::zeros([2, 4], DType::F16, device)?;
    assert!(matches!(ops::matmul_into(&a, &b, &out_h), Err(Error::DTypeMismatch { op: "matmul_into", .. })));
    let square = t(&[3, 3], DType::F32)?;
    let square_values = values(&square)?;
    match ops::matmul_t_into(&square, true, &square, false, &square) {
        Err(e @ Error::InvalidArgument { op: "matmul_t_into", .. }) => {
            assert!(e.to_string().contains("in place"), "{e}")
        }
        other => panic!("expected an in-place error, got {other:?}"),
    }
    // A disjoint view of the same buffer is a fine output.
    let buf = t(&[2 * 3 + 2 * 4], DType::F32)?;
    let (lhs, dst) = (buf.flat_slice(0, 6)?.reshape([2, 3])?, buf.flat_slice(6, 8)?.reshape([2, 4])?);
    ops::matmul_into(&lhs, &b, &dst)?;
    let (expected, scale) = reference(&values(&lhs)?, false, &values(&b)?, false, Dims::new(2, 3, 4));
    assert_close(&values(&dst)?, &expected, &scale, DType::F32, 3, "disjoint view of the input's buffer");

    assert!(values(&out)?.iter().all(|v| v.is_nan()), "a rejected call wrote its output");
    assert_eq!(values(&a)?, a_values, "an input changed");
    assert_eq!(values(&square)?, square_values, "an input changed");
    Ok(())
}

/// `linear` and `linear_relu` shapes: each small-product mapping on CUDA (k = 2 one thread an
/// output, k = 33 one warp, k = 1029 and 400 a block per four outputs of a row, since the
/// weight is read untransposed), an empty sum (k = 0: the bias alone), and one product just over
/// `ops::SMALL_PRODUCT_MACS`, which takes cuBLAS and the bias kernel.
pub const LINEAR_SHAPES: [Dims; 7] = [
    Dims::new(1, 1, 1),
    Dims::new(17, 2, 9),
    Dims::new(64, 33, 65),
    Dims::new(3, 1029, 5),
    Dims::new(5, 400, 20),
    Dims::new(4, 0, 3),
    Dims::new(130, 70, 120),
];

/// `linear` and `linear_relu` against f64 on every dtype, shape and operand offset: the product
/// plus the bias by column, then the ReLU, within the product's tolerance plus one rounding of
/// the bias's addition and of the product (which the composed path stores before adding).
/// About half of the pre-activations are negative, so the ReLU's zeros are checked too.
pub fn linear_layers_against_f64(device: Device) -> Result<()> {
    let mut seed = 9000;
    for dtype in super::DTYPES {
        for d in LINEAR_SHAPES {
            for offset in OFFSETS {
                seed += 1;
                let context = format!("{dtype} on {device}, {d:?}, offset {offset}");
                let mut rng = StdRng::seed_from_u64(seed);
                let x_values = random_values(&mut rng, d.m * d.k, dtype);
                let w_values = random_values(&mut rng, d.k * d.n, dtype);
                let b_values = random_values(&mut rng, d.n, dtype);
                let x = operand(&x_values, &[d.m, d.k], offset, dtype, device)?;
                let w = operand(&w_values, &[d.k, d.n], (offset * 2) % 4, dtype, device)?;
                let b = operand(&b_values, &[d.n], offset, dtype, device)?;
                if !supported(dtype, device) {
                    for result in [ops::linear(&x, &w, &b), ops::linear_relu(&x, &w, &b)] {
                        assert!(matches!(result, Err(Error::UnsupportedDType { dtype: DType::F64, .. })), "{context}");
                    }
                    continue;
                }
                let (product, scale) = reference(&x_values, false, &w_values, false, d);
                let unit = if dtype == DType::F64 { 0.0 } else { dtype.unit_roundoff() };
                let expected: Vec<f64> = product.iter().enumerate().map(|(i, p)| p + b_values[i % d.n]).collect();
                let tolerance: Vec<f64> = expected
                    .iter()
                    .enumerate()
                    .map(|(i, &r)| {
                        let s = scale[i] + b_values[i % d.n].abs();
                        tolerance(dtype, d.k + 1, r, s) + 1.01 * unit * product[i].abs()
                    })
                    .collect();
                for relu in [false, true] {
                    let got = if relu { ops::linear_relu(&x, &w, &b)? } else { ops::linear(&x, &w, &b)? };
                    assert_eq!(got.dims(), [d.m, d.n], "{context}");
                    assert_eq!(got.dtype(), dtype, "{context}");
                    for (i, g) in values(&got)?.into_iter().enumerate() {
                        let r = if relu { expected[i].max(0.0) } else { expected[i] };
                        assert!(
                            (g - r).abs() <= tolerance[i],
                            "{context}, relu {relu}: element {i} = {g:e}, f64 reference {r:e}, tolerance {:e}",
                            tolerance[i]
                        );
                        if relu && expected[i] < -tolerance[i] {
                            assert_eq!(g.to_bits(), 0.0f64.to_bits(), "{context}: a negative pre-activation gives +0");
                        }
                    }
                }
                assert_eq!(values(&x)?, x_values, "{context}: x changed");
                assert_eq!(values(&b)?, b_values, "{context}: b changed");
            }
        }
    }
    Ok(())
}

/// Bad `linear` operands are typed errors naming the op and the offending shape or dtype.
pub fn linear_errors(device: Device) -> Result<()> {
    let t = |dims: &[usize], dtype: DType| -> Result<Tensor> {
        let n = dims.iter().product::<usize>();
        Tensor::from_f64(&(0..n).map(|i| i as f64 * 0.25 - 1.0).collect::<Vec<_>>(), dims.to_vec(), dtype, device)
    };
    let (x, w) = (t(&[2, 3], DType::F32)?, t(&[3, 4], DType::F32)?);
    match ops::linear(&x, &w, &t(&[3], DType::F32)?) {
        Err(Error::ShapeMismatch { op: "linear", lhs, rhs }) => assert_eq!((lhs, rhs), (vec![4], vec![3])),
        other => panic!("expected a bias shape mismatch, got {other:?}"),
    }
    match ops::linear_relu(&x, &w, &t(&[1, 4], DType::F32)?) {
        Err(Error::ShapeMismatch { op: "linear_relu", lhs, rhs }) => assert_eq!((lhs, rhs), (vec![4], vec![1, 4])),
        other => panic!("expected a bias shape mismatch, got {other:?}"),
    }
    match ops::linear(&x, &t(&[2, 4], DType::F32)?, &t(&[4], DType::F32)?) {
        Err(Error::ShapeMismatch { op: "linear", lhs, rhs }) => assert_eq!((lhs, rhs), (vec![2, 3], vec![2, 4])),
        other => panic!("expected an inner-dimension mismatch, got {other:?}"),
    }
    match ops::linear(&t(&[1, 2, 3], DType::F32)?, &w, &t(&[4], DType::F32)?) {
        Err(e @ Error::InvalidArgument { op: "linear", .. }) => assert!(e.to_string().contains("[1, 2, 3]"), "{e}"),
        other => panic!("expected InvalidArgument for a 3-D x, got {other:?}"),
    }
    match ops::linear_relu(&x, &w, &t(&[4], DType::BF16)?) {
        Err(Error::DTypeMismatch { op: "linear_relu", lhs: DType::F32, rhs: DType::BF16 }) => {}
        other => panic!("expected a dtype mismatch of the bias, got {other:?}"),
    }
    Ok(())
}

/// `linear_grads` shapes `(rows, k, n)`: on CUDA each takes one launch of the column-split
/// kernel (a long sum over four columns or more, `[1024, 2]`ᵀ · `[1024, 128]` as in train_mlp's
/// first layer; a narrow one, 2 columns; odd sizes; a short sum; one row), and the last, just
/// over `ops::SMALL_PRODUCT_MACS`, the composed ops.
pub const GRAD_SHAPES: [(usize, usize, usize); 7] =
    [(1, 1, 1), (1024, 2, 128), (1024, 128, 2), (1029, 3, 5), (33, 5, 9), (300, 7, 11), (1100, 31, 31)];

/// `linear_grads` against f64 on every dtype, shape and operand offset, without and with the
/// ReLU's mask (an output `y` with exact zeros, `-0`, NaN and negative values where the gradient
/// must not count): the weight gradient `xᵀ · g'` and the bias gradient `Σ_rows g'` within the
/// product's tolerance, over outputs from a NaN-poisoned pool.
pub fn linear_grads_against_f64(device: Device) -> Result<()> {
    let mut seed = 11000;
    for dtype in super::DTYPES {
        for (rows, k, n) in GRAD_SHAPES {
            for relu in [false, true] {
                for offset in OFFSETS {
                    seed += 1;
                    let context =
                        format!("{dtype} on {device}, rows {rows}, k {k}, n {n}, relu {relu}, offset {offset}");
                    let mut rng = StdRng::seed_from_u64(seed);
                    let x_values = random_values(&mut rng, rows * k, dtype);
                    let g_values = random_values(&mut rng, rows * n, dtype);
                    let mut y_values = random_values(&mut rng, rows * n, dtype);
                    for (i, y) in y_values.iter_mut().enumerate() {
                        *y = match i % 11 {
                            3 => 0.0,
                            5 => -0.0,
                            7 => f64::NAN,
                            _ => *y,
                        };
                    }
                    let x = operand(&x_values, &[rows, k], offset, dtype, device)?;
                    let g = operand(&g_values, &[rows, n], (offset * 2) % 4, dtype, device)?;
                    let y = operand(&y_values, &[rows, n], offset, dtype, device)?;
                    let mask = relu.then_some(&y);
                    if !supported(dtype, device) {
                        let err = ops::linear_grads(&x, &g, mask).expect_err("f64 has no CUDA product");
                        assert!(matches!(err, Error::UnsupportedDType { dtype: DType::F64, .. }), "{context}: {err}");
                        continue;
                    }
                    let masked: Vec<f64> =
                        g_values.iter().zip(&y_values).map(|(&g, &y)| if !relu || y > 0.0 { g } else { 0.0 }).collect();
                    let (dw_expected, dw_scale) = reference(&x_values, true, &masked, false, Dims::new(k, rows, n));
                    let ones = vec![1.0; rows];
                    let (db_expected, db_scale) = reference(&ones, true, &masked, false, Dims::new(1, rows, n));
                    poison_pool(k * n, dtype, device)?;
                    poison_pool(n, dtype, device)?;
                    let (dw, db) = ops::linear_grads(&x, &g, mask)?;
                    assert_eq!((dw.dims(), db.dims()), (&[k, n][..], &[n][..]), "{context}");
                    assert_close(&values(&dw)?, &dw_expected, &dw_scale, dtype, rows, &format!("{context}, weight"));
                    assert_close(&values(&db)?, &db_expected, &db_scale, dtype, rows, &format!("{context}, bias"));
                    assert_eq!(values(&g)?, g_values, "{context}: g changed");
                }
            }
        }
    }
    Ok(())
}

/// `linear_grads`' errors: mismatched rows, a mask of another shape, dtype or device, and
/// operands that are not matrices, each naming the op.
pub fn linear_grads_errors(device: Device) -> Result<()> {
    let t = |dims: &[usize], dtype: DType| Tensor::full(1.0, dims, dtype, device);
    let (x, g) = (t(&[4, 3], DType::F32)?, t(&[4, 5], DType::F32)?);
    match ops::linear_grads(&x, &t(&[3, 5], DType::F32)?, None) {
        Err(Error::ShapeMismatch { op: "linear_grads", lhs, rhs }) => assert_eq!((lhs, rhs), (vec![4, 3], vec![3, 5])),
        other => panic!("expected a shape mismatch of the rows, got {other:?}"),
    }
    match ops::linear_grads(&x, &g, Some(&t(&[4, 4], DType::F32)?)) {
        Err(Error::ShapeMismatch { op: "linear_grads", lhs, rhs }) => assert_eq!((lhs, rhs), (vec![4, 5], vec![4, 4])),
        other => panic!("expected a shape mismatch of the mask, got {other:?}"),
    }
    match ops::linear_grads(&x, &g, Some(&t(&[4, 5], DType::BF16)?)) {
        Err(Error::DTypeMismatch { op: "linear_grads", .. }) => {}
        other => panic!("expected a dtype mismatch of the mask, got {other:?}"),
    }
    match ops::linear_grads(&t(&[4], DType::F32)?, &g, None) {
        Err(Error::InvalidArgument { op: "linear_grads", .. }) => {}
        other => panic!("expected a rejected 1-D input, got {other:?}"),
    }
    if device.is_cuda() {
        match ops::linear_grads(&x, &g, Some(&Tensor::full(1.0, [4, 5], DType::F32, Device::Cpu)?)) {
            Err(Error::DeviceMismatch { op: "linear_grads", .. }) => {}
            other => panic!("expected a device mismatch of the mask, got {other:?}"),
        }
    }
    Ok(())
}

/// Two-layer block shapes `(m, d_in, hidden, d_out)`: train_mlp's `[1024, 2] → 128 → 2`; one
/// of each; odd sizes; the widest input and output the fused kernels take with more than 1024
/// rows; a hidden layer past the warp mapping's 256; an input and an output too wide for the
/// fused kernels (the composed ops); no input features at all.
pub const TWO_LAYER_SHAPES: [(usize, usize, usize, usize); 8] = [
    (1024, 2, 128, 2),
    (1, 1, 1, 1),
    (37, 3, 70, 5),
    (1029, 4, 33, 8),
    (300, 4, 300, 7),
    (64, 5, 16, 3),
    (50, 2, 20, 9),
    (8, 0, 6, 2),
];

/// Values with exact zeros, `-0`, NaN and negatives where a ReLU's mask must not count.
fn with_mask_cases(mut values: Vec<f64>) -> Vec<f64> {
    for (i, y) in values.iter_mut().enumerate() {
        *y = match i % 11 {
            3 => 0.0,
            5 => -0.0,
            7 => f64::NAN,
            _ => *y,
        };
    }
    values
}

/// Asserts `got` within [`tolerance`] of the reference, widened by one more rounding to the
/// dtype at the size of `scale`: the composed ops store an intermediate in the dtype (a product
/// before its bias is added, `g · w2ᵀ` before its sum), and so does the fused gradient.
fn assert_close_rounded_terms(got: &[f64], reference: &[f64], scale: &[f64], dtype: DType, k: usize, context: &str) {
    assert_eq!(got.len(), reference.len(), "{context}: element count");
    let term = if dtype == DType::F64 { 0.0 } else { dtype.unit_roundoff() * 1.01 };
    for (i, ((&g, &r), &s)) in got.iter().zip(reference).zip(scale).enumerate() {
        let tol = tolerance(dtype, k, r, s) + term * s;
        assert!((g - r).abs() <= tol, "{context}: element {i} = {g:e}, f64 reference {r:e}, tolerance {tol:e}");
    }
}

/// `linear_relu_linear` and `linear_relu_linear_first_grads` against f64 on every dtype, shape
/// and operand offset, over outputs from a NaN-poisoned pool: the hidden layer against
/// `relu(x · w1 + b1)`, the output against the hidden layer the op returned times `w2` plus
/// `b2`, and the first layer's gradients (with a hidden layer holding zeros, `-0`, NaN and
/// negatives) against `xᵀ · d` and `Σ_rows d` for `d = (g · w2ᵀ) · [h > 0]`. On CUDA, where the
/// separate layers' kernels add in the same order (the gradients up to 1024 rows, the output
/// with 33 to 256 hidden units), the results must also have those ops' bits.
pub fn two_layer_against_f64(device: Device) -> Result<()> {
    let mut seed = 12000;
    for dtype in super::DTYPES {
        for (m, d_in, hidden, d_out) in TWO_LAYER_SHAPES {
            for offset in OFFSETS {
                seed += 1;
                let context = format!("{dtype} on {device}, [{m}, {d_in}] -> {hidden} -> {d_out}, offset {offset}");
                let mut rng = StdRng::seed_from_u64(seed);
                let x_values = random_values(&mut rng, m * d_in, dtype);
                let w1_values = random_values(&mut rng, d_in * hidden, dtype);
                let b1_values = random_values(&mut rng, hidden, dtype);
                let w2_values = random_values(&mut rng, hidden * d_out, dtype);
                let b2_values = random_values(&mut rng, d_out, dtype);
                let g_values = random_values(&mut rng, m * d_out, dtype);
                let mask_values = with_mask_cases(random_values(&mut rng, m * hidden, dtype));
                let x = operand(&x_values, &[m, d_in], offset, dtype, device)?;
                let w1 = operand(&w1_values, &[d_in, hidden], (offset * 2) % 4, dtype, device)?;
                let b1 = operand(&b1_values, &[hidden], offset, dtype, device)?;
                let w2 = operand(&w2_values, &[hidden, d_out], offset, dtype, device)?;
                let b2 = operand(&b2_values, &[d_out], (offset * 3) % 4, dtype, device)?;
                let g = operand(&g_values, &[m, d_out], offset, dtype, device)?;
                let mask = operand(&mask_values, &[m, hidden], (offset * 2) % 4, dtype, device)?;
                if !supported(dtype, device) {
                    let err = ops::linear_relu_linear(&x, &w1, &b1, &w2, &b2).expect_err("f64 has no CUDA product");
                    assert!(matches!(err, Error::UnsupportedDType { dtype: DType::F64, .. }), "{context}: {err}");
                    let err = ops::linear_relu_linear_first_grads(&x, &mask, &g, &w2).expect_err("f64 on CUDA");
                    assert!(matches!(err, Error::UnsupportedDType { dtype: DType::F64, .. }), "{context}: {err}");
                    continue;
                }

                // Forward.
                poison_pool(m * hidden, dtype, device)?;
                poison_pool(m * d_out, dtype, device)?;
                let (y, h) = ops::linear_relu_linear(&x, &w1, &b1, &w2, &b2)?;
                assert_eq!((y.dims(), h.dims()), (&[m, d_out][..], &[m, hidden][..]), "{context}");
                let (pre, pre_scale) = reference(&x_values, false, &w1_values, false, Dims::new(m, d_in, hidden));
                let h_expected: Vec<f64> =
                    pre.iter().enumerate().map(|(i, p)| (p + b1_values[i % hidden]).max(0.0)).collect();
                let h_scale: Vec<f64> =
                    pre_scale.iter().enumerate().map(|(i, s)| s + b1_values[i % hidden].abs()).collect();
                let h_got = values(&h)?;
                assert_close_rounded_terms(
                    &h_got,
                    &h_expected,
                    &h_scale,
                    dtype,
                    d_in + 1,
                    &format!("{context}, hidden"),
                );
                let (out, out_scale) = reference(&h_got, false, &w2_values, false, Dims::new(m, hidden, d_out));
                let y_expected: Vec<f64> = out.iter().enumerate().map(|(i, o)| o + b2_values[i % d_out]).collect();
                let y_scale: Vec<f64> =
                    out_scale.iter().enumerate().map(|(i, s)| s + b2_values[i % d_out].abs()).collect();
                let y_got = values(&y)?;
                assert_close_rounded_terms(
                    &y_got,
                    &y_expected,
                    &y_scale,
                    dtype,
                    hidden + 1,
                    &format!("{context}, output"),
                );

                // The first layer's gradients, through a mask with zeros, -0, NaN and negatives.
                poison_pool(d_in * hidden, dtype, device)?;
                poison_pool(hidden, dtype, device)?;
                let (dw1, db1) = ops::linear_relu_linear_first_grads(&x, &mask, &g, &w2)?;
                assert_eq!((dw1.dims(), db1.dims()), (&[d_in, hidden][..], &[hidden][..]), "{context}");
                let (gw, gw_scale) = reference(&g_values, false, &w2_values, true, Dims::new(m, d_out, hidden));
                let keep = |i: usize| mask_values[i] > 0.0;
                let d: Vec<f64> = gw.iter().enumerate().map(|(i, &v)| if keep(i) { v } else { 0.0 }).collect();
                let d_abs: Vec<f64> =
                    gw_scale.iter().enumerate().map(|(i, &s)| if keep(i) { s } else { 0.0 }).collect();
                let x_abs: Vec<f64> = x_values.iter().map(|v| v.abs()).collect();
                let (dw_expected, _) = reference(&x_values, true, &d, false, Dims::new(d_in, m, hidden));
                let (_, dw_scale) = reference(&x_abs, true, &d_abs, false, Dims::new(d_in, m, hidden));
                let ones = vec![1.0; m];
                let (db_expected, _) = reference(&ones, true, &d, false, Dims::new(1, m, hidden));
                let (_, db_scale) = reference(&ones, true, &d_abs, false, Dims::new(1, m, hidden));
                let k = m + d_out;
                assert_close_rounded_terms(
                    &values(&dw1)?,
                    &dw_expected,
                    &dw_scale,
                    dtype,
                    k,
                    &format!("{context}, gw1"),
                );
                assert_close_rounded_terms(
                    &values(&db1)?,
                    &db_expected,
                    &db_scale,
                    dtype,
                    k,
                    &format!("{context}, gb1"),
                );

                // On CUDA, the separate layers' bits where their kernels add in the same order.
                if device.is_cuda() && m <= 1024 {
                    let h_apart = ops::linear_relu(&x, &w1, &b1)?;
                    assert_eq!(h_got, values(&h_apart)?, "{context}: hidden layer, fused and apart");
                    if (33..=256).contains(&hidden) {
                        let y_apart = values(&ops::linear(&h_apart, &w2, &b2)?)?;
                        assert_eq!(y_got, y_apart, "{context}: output, fused and apart");
                    }
                    let (dw_apart, db_apart) =
                        ops::linear_grads(&x, &ops::matmul_t(&g, false, &w2, true)?, Some(&mask))?;
                    assert_eq!(values(&dw1)?, values(&dw_apart)?, "{context}: gw1, fused and apart");
                    assert_eq!(values(&db1)?, values(&db_apart)?, "{context}: gb1, fused and apart");
                }
            }
        }
    }
    Ok(())
}

/// The two-layer ops' errors, each naming the op: inner dimensions that disagree, biases of the
/// wrong length, a dtype or device apart, operands that are not matrices.
pub fn two_layer_errors(device: Device) -> Result<()> {
    let t = |dims: &[usize], dtype: DType| Tensor::full(1.0, dims, dtype, device);
    let f = |dims: &[usize]| t(dims, DType::F32);
    let (x, w1, b1, w2, b2) = (f(&[4, 3])?, f(&[3, 5])?, f(&[5])?, f(&[5, 2])?, f(&[2])?);
    let op = "linear_relu_linear";
    match ops::linear_relu_linear(&x, &f(&[2, 5])?, &b1, &w2, &b2) {
        Err(Error::ShapeMismatch { op: o, lhs, rhs }) if o == op => assert_eq!((lhs, rhs), (vec![4, 3], vec![2, 5])),
        other => panic!("expected a mismatch of x and w1, got {other:?}"),
    }
    match ops::linear_relu_linear(&x, &w1, &b1, &f(&[4, 2])?, &b2) {
        Err(Error::ShapeMismatch { op: o, lhs, rhs }) if o == op => assert_eq!((lhs, rhs), (vec![3, 5], vec![4, 2])),
        other => panic!("expected a mismatch of w1 and w2, got {other:?}"),
    }
    match ops::linear_relu_linear(&x, &w1, &f(&[4])?, &w2, &b2) {
        Err(Error::ShapeMismatch { op: o, lhs, rhs }) if o == op => assert_eq!((lhs, rhs), (vec![5], vec![4])),
        other => panic!("expected a mismatch of b1, got {other:?}"),
    }
    match ops::linear_relu_linear(&x, &w1, &b1, &w2, &f(&[1, 2])?) {
        Err(Error::ShapeMismatch { op: o, lhs, rhs }) if o == op => assert_eq!((lhs, rhs), (vec![2], vec![1, 2])),
        other => panic!("expected a mismatch of b2, got {other:?}"),
    }
    match ops::linear_relu_linear(&x, &w1, &b1, &t(&[5, 2], DType::BF16)?, &b2) {
        Err(Error::DTypeMismatch { op: o, .. }) if o == op => {}
        other => panic!("expected a dtype mismatch, got {other:?}"),
    }
    match ops::linear_relu_linear(&f(&[3])?, &w1, &b1, &w2, &b2) {
        Err(Error::InvalidArgument { op: o, .. }) if o == op => {}
        other => panic!("expected a rejected 1-D input, got {other:?}"),
    }
    let op = "linear_relu_linear_first_grads";
    let (h, g) = (f(&[4, 5])?, f(&[4, 2])?);
    match ops::linear_relu_linear_first_grads(&x, &f(&[4, 4])?, &g, &w2) {
        Err(Error::ShapeMismatch { op: o, lhs, rhs }) if o == op => assert_eq!((lhs, rhs), (vec![4, 5], vec![4, 4])),
        other => panic!("expected a mismatch of h, got {other:?}"),
    }
    match ops::linear_relu_linear_first_grads(&x, &h, &f(&[3, 2])?, &w2) {
        Err(Error::ShapeMismatch { op: o, lhs, rhs }) if o == op => assert_eq!((lhs, rhs), (vec![4, 2], vec![3, 2])),
        other => panic!("expected a mismatch of g, got {other:?}"),
    }
    match ops::linear_relu_linear_first_grads(&x, &h, &g, &t(&[5, 2], DType::F16)?) {
        Err(Error::DTypeMismatch { op: o, .. }) if o == op => {}
        other => panic!("expected a dtype mismatch, got {other:?}"),
    }
    match ops::linear_relu_linear_first_grads(&x, &h, &f(&[8])?, &w2) {
        Err(Error::InvalidArgument { op: o, .. }) if o == op => {}
        other => panic!("expected a rejected 1-D gradient, got {other:?}"),
    }
    if device.is_cuda() {
        let cpu_b2 = Tensor::full(1.0, [2], DType::F32, Device::Cpu)?;
        match ops::linear_relu_linear(&x, &w1, &b1, &w2, &cpu_b2) {
            Err(Error::DeviceMismatch { op: "linear_relu_linear", .. }) => {}
            other => panic!("expected a device mismatch, got {other:?}"),
        }
        let cpu_g = Tensor::full(1.0, [4, 2], DType::F32, Device::Cpu)?;
        match ops::linear_relu_linear_first_grads(&x, &h, &cpu_g, &w2) {
            Err(Error::DeviceMismatch { op: "linear_relu_linear_first_grads", .. }) => {}
            other => panic!("expected a device mismatch, got {other:?}"),
        }
    }
    Ok(())
}

/// Lists the shared matmul cases, for the suites to run.
#[macro_export]
macro_rules! matmul_cases {
    ($device:expr) => {
        #[test]
        fn products_against_f64() -> opsmith_host::Result<()> {
            common::matmul::products_against_f64($device)
        }
        #[test]
        fn small_product_by_hand() -> opsmith_host::Result<()> {
            common::matmul::small_product_by_hand($device)
        }
        #[test]
        fn empty_products() -> opsmith_host::Result<()> {
            common::matmul::empty_products($device)
        }
        #[test]
        fn matmul_errors() -> opsmith_host::Result<()> {
            common::matmul::matmul_errors($device)
        }
        #[test]
        fn linear_layers_against_f64() -> opsmith_host::Result<()> {
            common::matmul::linear_layers_against_f64($device)
        }
        #[test]
        fn linear_errors() -> opsmith_host::Result<()> {
            common::matmul::linear_errors($device)
        }
        #[test]
        fn linear_grads_against_f64() -> opsmith_host::Result<()> {
            common::matmul::linear_grads_against_f64($device)
        }
        #[test]
        fn linear_grads_errors() -> opsmith_host::Result<()> {
            common::matmul::linear_grads_errors($device)
        }
        #[test]
        fn two_layer_against_f64() -> opsmith_host::Result<()> {
            common::matmul::two_layer_against_f64($device)
        }
        #[test]
        fn two_layer_errors() -> opsmith_host::Result<()> {
            common::matmul::two_layer_errors($device)
        }
    };
}
