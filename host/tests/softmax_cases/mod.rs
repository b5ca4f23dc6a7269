//! Test bodies for softmax, cross-entropy and the squared error, shared by the CPU suite
//! (`softmax.rs`) and the GPU suite (`gpu_softmax.rs`): each takes a device, and checks every
//! result against an f64 reference written here, with a tolerance from the error analysis of
//! the f32 arithmetic (exact inputs; the rounding of `scale * x + mask`, whose error `exp`
//! magnifies by the logit's magnitude; the sums; the final rounding to the dtype).
#![allow(dead_code)]

pub use crate::common::{poison_pool, random_values, round_to, supported};
use opsmith_host::{DType, Device, Error, Labels, Result, Tensor, ops};
use opsmith_kernels::names::loss::THREAD_ROW_MAX_COLS;
use rand::{Rng, SeedableRng, rngs::StdRng};

pub const DTYPES: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::F64];

/// Row lengths: below, at and above a warp and a 16-byte pack; at and around each register
/// capacity of the CUDA kernels (256 to 1024 values a row in one warp, then blocks of 32 to
/// 1024 threads holding 512 values a warp, up to 16384), and past it (the two-pass kernels).
pub const COLS: [usize; 20] =
    [1, 3, 8, 31, 32, 33, 255, 256, 257, 1000, 1024, 1025, 1537, 2048, 2049, 4095, 4096, 9000, 16384, 16385];

/// The f32 unit roundoff: the scale of every arithmetic error below.
const U: f64 = f32::EPSILON as f64 / 2.0;

/// A tensor of `values` and `shape` whose first element sits `offset` elements into its buffer
/// (a view), so that an odd offset breaks 16-byte alignment on CUDA.
pub fn tensor_at(values: &[f64], shape: &[usize], offset: usize, dtype: DType, device: Device) -> Result<Tensor> {
    let mut data = vec![1.0; offset];
    data.extend_from_slice(values);
    Tensor::from_f64(&data, data.len(), dtype, device)?.flat_slice(offset, values.len())?.reshape(shape.to_vec())
}

/// Rounding to `dtype` (relative) and the absolute floor below which results are subnormal.
fn storage_error(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (0.0, 2f64.powi(-120)),
        DType::F16 => (dtype.unit_roundoff() * 1.01, 2f64.powi(-24)),
        DType::BF16 => (dtype.unit_roundoff() * 1.01, 2f64.powi(-120)),
        DType::F64 => (0.0, 1e-300),
        DType::U32 | DType::I64 => unreachable!("{dtype} is not a float dtype"),
    }
}

/// The unit roundoff of the arithmetic type (f64 for f64 tensors, else f32).
fn arith_roundoff(dtype: DType) -> f64 {
    if dtype == DType::F64 { f64::EPSILON / 2.0 } else { U }
}

fn assert_close(got: f64, want: f64, tol: f64, what: impl Fn() -> String) {
    assert!((got - want).abs() <= tol, "{}: got {got:e}, f64 reference {want:e}, tolerance {tol:e}", what());
}

/// The f64 softmax of `scale * x + mask` for each row; also, per element, `|z| + |max z|`, the
/// magnitude that scales the rounding error of the logits.
pub fn softmax_reference(x: &[f64], mask: Option<&[f64]>, cols: usize, scale: f64) -> (Vec<f64>, Vec<f64>) {
    let mut y = Vec::with_capacity(x.len());
    let mut magnitude = Vec::with_capacity(x.len());
    for (r, row) in x.chunks(cols).enumerate() {
        let z: Vec<f64> = match mask {
            Some(m) => {
                let start = (r * cols) % m.len();
                row.iter().zip(&m[start..start + cols]).map(|(x, m)| scale * x + m).collect()
            }
            None => row.iter().map(|x| scale * x).collect(),
        };
        let max = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if max == f64::NEG_INFINITY {
            // Every term masked out: defined as zeros.
            y.extend(z.iter().map(|_| 0.0));
            magnitude.extend(z.iter().map(|_| 0.0));
            continue;
        }
        let sum: f64 = z.iter().map(|v| (v - max).exp()).sum();
        y.extend(z.iter().map(|v| (v - max).exp() / sum));
        magnitude.extend(z.iter().map(|v| v.abs() + max.abs()));
    }
    (y, magnitude)
}

/// The bound on a softmax output's error: the logit's rounding magnified by `exp` (relative
/// `|z| + |max|` units, doubled for f64, whose reference rounds as much as the result), `ex2.approx`
/// and the products (a few units), the sum of `cols` exponentials (in 32 lanes), then the
/// rounding to the dtype.
fn softmax_tolerance(dtype: DType, r: f64, magnitude: f64, cols: usize) -> f64 {
    let (store, floor) = storage_error(dtype);
    let arith = arith_roundoff(dtype) * (16.0 + 4.0 * magnitude + 2.0 * cols as f64 / 32.0);
    r * (arith + store) + floor
}

/// One softmax call: `softmax(scale * x + mask)` of `x` of `shape`, the views starting at
/// `offset` (the mask at twice that).
struct SoftmaxCase<'a> {
    label: &'a str,
    shape: &'a [usize],
    x: &'a [f64],
    mask: Option<(&'a [usize], &'a [f64])>,
    scale: f64,
    offset: usize,
}

/// Checks one case against [`softmax_reference`], and masked-out values (and fully masked rows)
/// against exact zeros.
fn check_softmax(device: Device, dtype: DType, case: SoftmaxCase<'_>) -> Result<()> {
    let SoftmaxCase { label, shape, x, mask, scale, offset } = case;
    let cols = *shape.last().unwrap();
    let xt = tensor_at(x, shape, offset, dtype, device)?;
    let mt = match mask {
        Some((mshape, m)) => Some(tensor_at(m, mshape, 2 * offset, dtype, device)?),
        None => None,
    };
    let y = ops::softmax(&xt, scale, mt.as_ref())?;
    assert_eq!(y.dims(), shape);
    assert_eq!(y.dtype(), dtype);
    let got = y.to_vec_f64()?;
    let (want, magnitude) = softmax_reference(x, mask.map(|(_, m)| m), cols, scale);
    for i in 0..x.len() {
        let what = || format!("softmax {label} {dtype} on {device}, shape {shape:?}, offset {offset}, element {i}");
        if magnitude[i].is_infinite() || (want[i] == 0.0 && magnitude[i] == 0.0) {
            assert_eq!(got[i], 0.0, "{}: masked out", what());
        } else {
            assert_close(got[i], want[i], softmax_tolerance(dtype, want[i], magnitude[i], cols), what);
        }
    }
    Ok(())
}

/// `softmax` against f64 for every dtype, row length and mask form: none; a `[cols]` row with
/// `-inf` entries; a full `[rows, cols]` mask with one row wholly `-inf`; `[heads, cols]` for a
/// 3-D `x`; large logits (`scale * x` near 1000, which overflow without the maximum subtracted);
/// and views at odd offsets.
pub fn softmax_against_f64(device: Device) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(5);
    for dtype in DTYPES {
        if !supported(dtype, device) {
            let x = Tensor::from_f64(&[1.0, 2.0], [2], dtype, device)?;
            let err = ops::softmax(&x, 1.0, None).unwrap_err();
            assert!(matches!(err, Error::UnsupportedDType { op: "softmax", .. }), "{err}");
            continue;
        }
        for cols in COLS {
            let rows = 3;
            let n = rows * cols;
            let x = random_values(&mut rng, n, dtype);
            check_softmax(
                device,
                dtype,
                SoftmaxCase { label: "no mask", shape: &[rows, cols], x: &x, mask: None, scale: 1.0, offset: 0 },
            )?;

            // A row mask with some values masked out (never all of them).
            let mut row_mask = random_values(&mut rng, cols, dtype);
            for (c, m) in row_mask.iter_mut().enumerate() {
                if c % 5 == 1 || c % 7 == 3 {
                    *m = f64::NEG_INFINITY;
                }
            }
            check_softmax(
                device,
                dtype,
                SoftmaxCase {
                    label: "row mask",
                    shape: &[rows, cols],
                    x: &x,
                    mask: Some((&[cols], &row_mask)),
                    scale: 0.125,
                    offset: 0,
                },
            )?;

            // A full mask whose middle row is all -inf.
            let mut full = random_values(&mut rng, n, dtype);
            full[cols..2 * cols].iter_mut().for_each(|m| *m = f64::NEG_INFINITY);
            check_softmax(
                device,
                dtype,
                SoftmaxCase {
                    label: "full mask",
                    shape: &[rows, cols],
                    x: &x,
                    mask: Some((&[rows, cols], &full)),
                    scale: -1.5,
                    offset: 0,
                },
            )?;

            // x [2, heads, cols] with a mask of x's two trailing dims.
            let heads = 3;
            let x3 = random_values(&mut rng, 2 * heads * cols, dtype);
            let m3 = random_values(&mut rng, heads * cols, dtype);
            check_softmax(
                device,
                dtype,
                SoftmaxCase {
                    label: "3-D",
                    shape: &[2, heads, cols],
                    x: &x3,
                    mask: Some((&[heads, cols], &m3)),
                    scale: 3.0,
                    offset: 0,
                },
            )?;

            // Logits near 1000: exp overflows f32 (and f64 past 710) without the max subtracted.
            let big: Vec<f64> = (0..n).map(|_| round_to(dtype, 4.0 + rng.random_range(-0.02..0.02))).collect();
            check_softmax(
                device,
                dtype,
                SoftmaxCase {
                    label: "large logits",
                    shape: &[rows, cols],
                    x: &big,
                    mask: None,
                    scale: 250.0,
                    offset: 0,
                },
            )?;

            // Unaligned views of x and the mask: the scalar path of the kernels.
            check_softmax(
                device,
                dtype,
                SoftmaxCase {
                    label: "offset views",
                    shape: &[rows, cols],
                    x: &x,
                    mask: Some((&[cols], &row_mask)),
                    scale: 1.0,
                    offset: 1,
                },
            )?;
        }
    }
    Ok(())
}

/// The f64 backward `scale * y * (g - sum(g * y))`, and per element the error bound of the f32
/// arithmetic: the dot product's (`cols` terms in 32 lanes), the subtraction's, the products'.
fn softmax_backward_reference(g: &[f64], y: &[f64], cols: usize, scale: f64, dtype: DType) -> Vec<(f64, f64)> {
    let u = arith_roundoff(dtype);
    let (store, floor) = storage_error(dtype);
    let mut out = Vec::with_capacity(y.len());
    for (gr, yr) in g.chunks(cols).zip(y.chunks(cols)) {
        let dot: f64 = gr.iter().zip(yr).map(|(g, y)| g * y).sum();
        let dot_abs: f64 = gr.iter().zip(yr).map(|(g, y)| (g * y).abs()).sum();
        for (g, y) in gr.iter().zip(yr) {
            let r = scale * y * (g - dot);
            let arith = (scale * y).abs() * u * ((cols as f64 / 32.0 + 8.0) * dot_abs + 3.0 * (g.abs() + dot.abs()));
            out.push((r, arith + store * r.abs() + floor));
        }
    }
    out
}

/// `softmax_backward` against f64 for every dtype and row length, with `y` a softmax output
/// (rows summing to 1), several scales, and unaligned views.
pub fn softmax_backward_against_f64(device: Device) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(6);
    for dtype in DTYPES {
        if !supported(dtype, device) {
            let t = Tensor::from_f64(&[1.0, 2.0], [2], dtype, device)?;
            let err = ops::softmax_backward(&t, &t, 1.0).unwrap_err();
            assert!(matches!(err, Error::UnsupportedDType { op: "softmax_backward", .. }), "{err}");
            continue;
        }
        for cols in COLS {
            let rows = 3;
            let n = rows * cols;
            let logits = random_values(&mut rng, n, DType::F64);
            let y: Vec<f64> =
                softmax_reference(&logits, None, cols, 1.0).0.iter().map(|&v| round_to(dtype, v)).collect();
            let g = random_values(&mut rng, n, dtype);
            for (scale, offset) in [(1.0, 0), (-1.5, 0), (0.125, 1)] {
                let gt = tensor_at(&g, &[rows, cols], offset, dtype, device)?;
                let yt = tensor_at(&y, &[rows, cols], 3 * offset, dtype, device)?;
                let got = ops::softmax_backward(&gt, &yt, scale)?.to_vec_f64()?;
                for (i, (r, tol)) in softmax_backward_reference(&g, &y, cols, scale, dtype).into_iter().enumerate() {
                    assert_close(got[i], r, tol, || {
                        format!(
                            "softmax_backward {dtype} on {device}, cols {cols}, scale {scale}, offset {offset}, element {i}"
                        )
                    });
                }
            }
        }
    }
    Ok(())
}

/// Rows of a single value, and a row of `-inf` except one value, give 1 (within the rounding
/// of the one exponential, `2^(z log2 e - max log2 e)`, and its reciprocal) and exact zeros.
pub fn softmax_exact_cases(device: Device) -> Result<()> {
    let near_one = |y: f64| (y - 1.0).abs() <= 4.0 * U;
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let x = Tensor::from_f64(&[3.0, -2.0, 0.5], [3, 1], dtype, device)?;
        let y = ops::softmax(&x, 7.0, None)?.to_vec_f64()?;
        assert!(y.iter().all(|&y| near_one(y)), "{dtype} on {device}: {y:?}");
        let inf = f64::NEG_INFINITY;
        let x = Tensor::from_f64(&[inf, 5.0, inf, inf], [1, 4], dtype, device)?;
        let y = ops::softmax(&x, 1.0, None)?.to_vec_f64()?;
        assert!(near_one(y[1]) && [y[0], y[2], y[3]] == [0.0; 3], "{dtype} on {device}: {y:?}");
        let x = Tensor::from_f64(&[inf; 40], [2, 20], dtype, device)?;
        assert_eq!(ops::softmax(&x, 1.0, None)?.to_vec_f64()?, [0.0; 40], "{dtype} on {device}: all -inf gives 0");
        // NaN poisons its row only.
        let x = Tensor::from_f64(&[1.0, f64::NAN, 1.0, 1.0], [2, 2], dtype, device)?;
        let y = ops::softmax(&x, 1.0, None)?.to_vec_f64()?;
        assert!(y[0].is_nan() && y[1].is_nan(), "{dtype} on {device}: {y:?}");
        assert_eq!(y[2..], [0.5, 0.5], "{dtype} on {device}");
        // Empty tensors give empty results.
        let e = Tensor::zeros([0, 5], dtype, device)?;
        assert_eq!(ops::softmax(&e, 1.0, None)?.dims(), [0, 5]);
        assert_eq!(ops::softmax_backward(&e, &e, 1.0)?.dims(), [0, 5]);
    }
    Ok(())
}

/// The mean cross-entropy in f64 and the bound on the f32 error of the computed one: each row's
/// logsumexp (the sum of `classes` exponentials, each magnified by the logits' magnitude), the
/// mean of `rows` losses, the rounding to the dtype. Every label is below `classes`.
pub fn cross_entropy_reference(x: &[f64], labels: &[u32], classes: usize, dtype: DType) -> (f64, f64) {
    let rows = labels.len();
    let (mut total, mut abs_total, mut worst) = (0.0, 0.0, 0.0f64);
    for (row, &label) in x.chunks(classes).zip(labels) {
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
        total += lse - row[label as usize];
        abs_total += (lse - row[label as usize]).abs();
        worst = worst.max(4.0 * max.abs() + classes as f64 / 32.0);
    }
    let mean = total / rows as f64;
    let u = arith_roundoff(dtype);
    let (store, floor) = storage_error(dtype);
    let tol =
        u * (worst + 40.0) + u * (rows as f64 / 32.0 + 8.0) * abs_total / rows as f64 + store * mean.abs() + floor;
    (mean, tol)
}

fn random_labels(rng: &mut StdRng, rows: usize, classes: usize) -> Vec<u32> {
    (0..rows).map(|_| rng.random_range(0..classes as u32)).collect()
}

/// `cross_entropy` and its backward against f64 for every dtype and class count (one class,
/// a few, the register-sized rows and the long ones), with unaligned views.
pub fn cross_entropy_against_f64(device: Device) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(7);
    for dtype in DTYPES {
        if !supported(dtype, device) {
            let x = Tensor::from_f64(&[1.0, 2.0], [1, 2], dtype, device)?;
            let err = ops::cross_entropy(&x, &Labels::new(&[1], device)?).unwrap_err();
            assert!(matches!(err, Error::UnsupportedDType { op: "cross_entropy", .. }), "{err}");
            continue;
        }
        for (rows, classes) in [(1, 1), (5, 3), (70, 10), (33, 1000), (4, 1024), (3, 4097), (2, 9000)] {
            for offset in [0, 1] {
                let x = random_values(&mut rng, rows * classes, dtype);
                let labels = random_labels(&mut rng, rows, classes);
                let xt = tensor_at(&x, &[rows, classes], offset, dtype, device)?;
                let lt = Labels::new(&labels, device)?;
                let what = || format!("cross_entropy {dtype} on {device}, [{rows}, {classes}], offset {offset}");
                let loss = ops::cross_entropy(&xt, &lt)?;
                assert_eq!(loss.dims(), [0usize; 0]);
                assert_eq!(loss.dtype(), dtype);
                let (want, tol) = cross_entropy_reference(&x, &labels, classes, dtype);
                assert_close(loss.to_vec_f64()?[0], want, tol, what);

                let g0 = round_to(dtype, 1.75);
                let g = Tensor::from_f64(&[g0], [], dtype, device)?;
                let got = ops::cross_entropy_backward(&g, &xt, &lt)?.to_vec_f64()?;
                check_cross_entropy_gradient(&got, &x, &labels, classes, dtype, g0 / rows as f64, what);
                check_scalar_gradient_path(&xt, &lt, &[1.0, -0.3001], what)?;
            }
        }
    }
    Ok(())
}

/// `cross_entropy_backward_scalar(g)` against `cross_entropy_backward` of `g` filled into a
/// one-element tensor of the logits' dtype (rounded there), bit for bit, over poisoned memory:
/// for each `g` of `values`, some of which the dtype cannot hold exactly.
pub fn check_scalar_gradient_path(xt: &Tensor, lt: &Labels, values: &[f64], what: impl Fn() -> String) -> Result<()> {
    let (dtype, device) = (xt.dtype(), xt.device());
    for &value in values {
        let g = Tensor::from_f64(&[value], [], dtype, device)?;
        poison_pool(xt.elem_count(), dtype, device)?;
        let filled = ops::cross_entropy_backward(&g, xt, lt)?.to_vec_f64()?;
        poison_pool(xt.elem_count(), dtype, device)?;
        let scalar = ops::cross_entropy_backward_scalar(value, xt, lt)?;
        assert_eq!((scalar.dims(), scalar.dtype()), (xt.dims(), dtype), "{}: g = {value}", what());
        let scalar = scalar.to_vec_f64()?;
        let differ = filled.iter().zip(&scalar).position(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(
            differ.map(|i| (i, filled[i], scalar[i])),
            None,
            "{}: g = {value}, the scalar path differs from the filled tensor's at (index, filled, scalar)",
            what()
        );
    }
    Ok(())
}

/// Checks a cross-entropy gradient `got` against `(softmax(x) - onehot(labels)) * coef` in f64
/// (a label of `classes` or more has no one-hot term); a value of `-inf` must give
/// `-onehot * coef`, rounded (so exactly 0 off the label).
pub fn check_cross_entropy_gradient(
    got: &[f64],
    x: &[f64],
    labels: &[u32],
    classes: usize,
    dtype: DType,
    coef: f64,
    what: impl Fn() -> String,
) {
    assert_eq!(got.len(), x.len(), "{}", what());
    let (p, magnitude) = softmax_reference(x, None, classes, 1.0);
    let (store, floor) = storage_error(dtype);
    for i in 0..x.len() {
        let target = if i % classes == labels[i / classes] as usize { 1.0 } else { 0.0 };
        let r = (p[i] - target) * coef;
        let what = || format!("{} backward, element {i}", what());
        if x[i] == f64::NEG_INFINITY {
            assert!((got[i] - r).abs() <= (store + 2.0 * arith_roundoff(dtype)) * r.abs(), "{}: {}", what(), got[i]);
            continue;
        }
        let tol = coef.abs() * softmax_tolerance(dtype, p[i], magnitude[i], classes)
            + 4.0 * arith_roundoff(dtype) * r.abs()
            + store * r.abs()
            + floor;
        assert_close(got[i], r, tol, what);
    }
}

/// The class counts around the one-thread-per-row cross-entropy kernels' limit: each size of
/// the copy of the row a thread holds (1, 2, 4, 8, 16) and one past it, the limit and one past
/// it (a warp per row), and a longer row.
pub fn small_row_classes() -> Vec<usize> {
    let limit = THREAD_ROW_MAX_COLS as usize;
    let mut classes = vec![1, 2, 3, 4, 5, 8, 9, 15, limit - 1, limit, limit + 1, 100];
    classes.sort_unstable();
    classes.dedup();
    classes
}

/// Logits of `rows × classes` that each test one edge, by row: random (`r % 5 == 0`), huge
/// (`±1e4`, alternating, which overflow `exp` unless the maximum is subtracted), one value
/// `-inf` (not the label's), every value but the label's `-inf` (a loss of exactly 0), random
/// times 1000. With `extremes` off, all random.
pub fn small_row_logits(rng: &mut StdRng, labels: &[u32], classes: usize, dtype: DType, extremes: bool) -> Vec<f64> {
    let mut x = random_values(rng, labels.len() * classes, dtype);
    if !extremes {
        return x;
    }
    for (r, (row, &label)) in x.chunks_mut(classes).zip(labels).enumerate() {
        let label = label as usize;
        match r % 5 {
            1 => row.iter_mut().enumerate().for_each(|(c, v)| *v = if c % 2 == 0 { 1e4 } else { -1e4 }),
            2 if classes > 1 => row[(label + 1) % classes] = f64::NEG_INFINITY,
            3 => row.iter_mut().enumerate().filter(|&(c, _)| c != label).for_each(|(_, v)| *v = f64::NEG_INFINITY),
            4 => row.iter_mut().for_each(|v| *v *= 1000.0),
            _ => {}
        }
        row.iter_mut().for_each(|v| *v = round_to(dtype, *v));
    }
    x
}

/// `cross_entropy` and its backward against f64 for few classes, over poisoned outputs: at
/// and around the one-thread-per-row kernels' limit, 1000 rows (not a whole number of blocks),
/// aligned and unaligned, random logits and the edges of [`small_row_logits`]; then rows whose
/// exact answers are known, with logits that overflow a naive `exp`.
pub fn cross_entropy_small_rows(device: Device) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(9);
    let rows = 1000;
    for dtype in DTYPES.into_iter().filter(|&d| supported(d, device)) {
        for classes in small_row_classes() {
            for (offset, extremes) in [(0, false), (1, false), (0, true)] {
                let labels = random_labels(&mut rng, rows, classes);
                let x = small_row_logits(&mut rng, &labels, classes, dtype, extremes);
                let xt = tensor_at(&x, &[rows, classes], offset, dtype, device)?;
                let lt = Labels::new(&labels, device)?;
                let what = || {
                    format!(
                        "cross_entropy {dtype} on {device}, [{rows}, {classes}], offset {offset}, extremes {extremes}"
                    )
                };
                poison_pool(rows, DType::F32, device)?;
                let (want, tol) = cross_entropy_reference(&x, &labels, classes, dtype);
                assert_close(ops::cross_entropy(&xt, &lt)?.to_vec_f64()?[0], want, tol, what);

                let g0 = round_to(dtype, -0.625);
                let g = Tensor::from_f64(&[g0], [], dtype, device)?;
                poison_pool(rows * classes, dtype, device)?;
                let got = ops::cross_entropy_backward(&g, &xt, &lt)?.to_vec_f64()?;
                check_cross_entropy_gradient(&got, &x, &labels, classes, dtype, g0 / rows as f64, what);
                check_scalar_gradient_path(&xt, &lt, &[1.0, -0.6251, 3.0e-5], what)?;
            }
        }

        // Exact answers, one row each so that the mean is the row's loss: two equal huge logits
        // (ln 2, and a gradient of ±1/2), three equal huge negative ones (ln 3), a huge and a huge
        // negative one with a -inf (0, and a gradient of 0), the label at -1e4 against 1e4 (2e4).
        let (h, inf) = (round_to(dtype, 1e4), f64::NEG_INFINITY);
        let (ln2, ln3) = (std::f64::consts::LN_2, 3f64.ln());
        let cases: [(&[f64], u32, f64, &[f64]); 4] = [
            (&[h, h], 1, ln2, &[0.5, -0.5]),
            (&[-h, -h, -h], 0, ln3, &[-2.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0]),
            (&[h, -h, inf], 0, 0.0, &[0.0, 0.0, 0.0]),
            (&[-h, h], 0, 2.0 * h, &[-1.0, 1.0]),
        ];
        for (row, label, loss, grad) in cases {
            let what = format!("cross_entropy {dtype} on {device}, row {row:?}, label {label}");
            let xt = Tensor::from_f64(row, [1, row.len()], dtype, device)?;
            let lt = Labels::new(&[label], device)?;
            let got = ops::cross_entropy(&xt, &lt)?.to_vec_f64()?[0];
            // The maximum times log2(e) is rounded in f32: an error of about 2^-24 * 1e4 in each
            // exponent.
            let tol = 1e-3 + 8.0 * arith_roundoff(dtype) * loss + storage_error(dtype).0 * loss;
            assert!((got - loss).abs() <= tol, "{what}: loss {got}, want {loss}");
            let g = Tensor::from_f64(&[1.0], [], dtype, device)?;
            let got = ops::cross_entropy_backward(&g, &xt, &lt)?.to_vec_f64()?;
            for (c, (&got, &want)) in got.iter().zip(grad).enumerate() {
                assert!((got - want).abs() <= 2e-3, "{what}: gradient {c} is {got}, want {want}");
            }
        }
    }
    Ok(())
}

/// `mse_loss` and its backward against f64 for every dtype and a range of sizes, with unaligned
/// views.
pub fn mse_against_f64(device: Device) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(8);
    for dtype in DTYPES {
        if !supported(dtype, device) {
            let t = Tensor::from_f64(&[1.0, 2.0], [2], dtype, device)?;
            let err = ops::mse_loss(&t, &t).unwrap_err();
            assert!(matches!(err, Error::UnsupportedDType { op: "mse_loss", .. }), "{err}");
            continue;
        }
        let u = arith_roundoff(dtype);
        let (store, floor) = storage_error(dtype);
        for n in [1usize, 3, 8, 1000, 4099, (1 << 20) + 3] {
            for offset in [0, 1] {
                let (p, t) = (random_values(&mut rng, n, dtype), random_values(&mut rng, n, dtype));
                let (pt, tt) = (tensor_at(&p, &[n], offset, dtype, device)?, tensor_at(&t, &[n], 0, dtype, device)?);
                let want = p.iter().zip(&t).map(|(p, t)| (p - t).powi(2)).sum::<f64>() / n as f64;
                // One rounding of each difference (twice its relative error once squared), the
                // f32 sums (fewer terms in a row than sqrt(n) plus the warps' partials), the dtype.
                let tol = u * (16.0 + 2.0 * (n as f64).sqrt()) * want + store * want + floor;
                let got = ops::mse_loss(&pt, &tt)?.to_vec_f64()?[0];
                assert_close(got, want, tol, || format!("mse_loss {dtype} on {device}, n {n}, offset {offset}"));

                let g0 = round_to(dtype, -0.75);
                let g = Tensor::from_f64(&[g0], [1], dtype, device)?;
                let gp = ops::mse_loss_backward(&g, &pt, &tt)?;
                assert_eq!(gp.dims(), [n]);
                let got = gp.to_vec_f64()?;
                for i in 0..n {
                    let r = 2.0 * (p[i] - t[i]) * g0 / n as f64;
                    let tol = 4.0 * u * r.abs() + store * r.abs() + floor;
                    assert_close(got[i], r, tol, || {
                        format!("mse_loss_backward {dtype} on {device}, n {n}, element {i}")
                    });
                }
            }
        }
    }
    Ok(())
}

/// Every operand check returns its typed error, naming the op and the offending values.
pub fn loss_and_softmax_errors(device: Device) -> Result<()> {
    let t = |v: &[f64], shape: &[usize]| Tensor::from_f64(v, shape.to_vec(), DType::F32, device);
    let x = t(&[1.0; 6], &[2, 3])?;
    // softmax: a scalar, masks that are not trailing dims, a mask of another dtype.
    let scalar = t(&[1.0], &[])?;
    assert!(matches!(ops::softmax(&scalar, 1.0, None), Err(Error::InvalidArgument { op: "softmax", .. })));
    for bad in [&[4][..], &[3, 3], &[1, 2, 3], &[]] {
        let n = bad.iter().product();
        let mask = t(&vec![0.0; n], bad)?;
        match ops::softmax(&x, 1.0, Some(&mask)) {
            Err(Error::ShapeMismatch { op: "softmax", lhs, rhs }) => assert_eq!((lhs, rhs), (vec![2, 3], bad.to_vec())),
            other => panic!("mask {bad:?}: expected a shape mismatch, got {other:?}"),
        }
    }
    let mask16 = Tensor::from_f64(&[0.0; 3], [3], DType::F16, device)?;
    assert!(matches!(
        ops::softmax(&x, 1.0, Some(&mask16)),
        Err(Error::DTypeMismatch { op: "softmax", lhs: DType::F32, rhs: DType::F16 })
    ));
    let y = t(&[1.0; 6], &[3, 2])?;
    assert!(matches!(ops::softmax_backward(&x, &y, 1.0), Err(Error::ShapeMismatch { op: "softmax_backward", .. })));

    // cross_entropy: a label past the class count, too few labels, logits not a matrix, no rows.
    let err = ops::cross_entropy(&x, &Labels::new(&[0, 3], device)?).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { op: "cross_entropy", .. }), "{err}");
    assert!(err.to_string().contains("label 3") && err.to_string().contains("3 classes"), "{err}");
    match ops::cross_entropy(&x, &Labels::new(&[0], device)?) {
        Err(Error::ShapeMismatch { op: "cross_entropy", lhs, rhs }) => assert_eq!((lhs, rhs), (vec![2], vec![1])),
        other => panic!("expected a shape mismatch, got {other:?}"),
    }
    let flat = t(&[1.0; 3], &[3])?;
    assert!(matches!(
        ops::cross_entropy(&flat, &Labels::new(&[0, 1, 2], device)?),
        Err(Error::InvalidArgument { op: "cross_entropy", .. })
    ));
    let none = Tensor::zeros([0, 3], DType::F32, device)?;
    assert!(matches!(
        ops::cross_entropy(&none, &Labels::new(&[], device)?),
        Err(Error::InvalidArgument { op: "cross_entropy", .. })
    ));
    let labels = Labels::new(&[2, 0], device)?;
    let g2 = t(&[1.0, 1.0], &[2])?;
    assert!(matches!(
        ops::cross_entropy_backward(&g2, &x, &labels),
        Err(Error::ShapeMismatch { op: "cross_entropy_backward", .. })
    ));
    let g16 = Tensor::from_f64(&[1.0], [], DType::F16, device)?;
    assert!(matches!(
        ops::cross_entropy_backward(&g16, &x, &labels),
        Err(Error::DTypeMismatch { op: "cross_entropy_backward", .. })
    ));
    assert!(matches!(
        ops::cross_entropy_backward(&t(&[1.0], &[])?, &x, &Labels::new(&[5, 0], device)?),
        Err(Error::InvalidArgument { op: "cross_entropy_backward", .. })
    ));

    // mse: shapes, dtypes, empty.
    assert!(matches!(ops::mse_loss(&x, &y), Err(Error::ShapeMismatch { op: "mse_loss", .. })));
    let x16 = Tensor::from_f64(&[1.0; 6], [2, 3], DType::F16, device)?;
    assert!(matches!(ops::mse_loss(&x, &x16), Err(Error::DTypeMismatch { op: "mse_loss", .. })));
    let empty = t(&[], &[0])?;
    assert!(matches!(ops::mse_loss(&empty, &empty), Err(Error::InvalidArgument { op: "mse_loss", .. })));
    assert!(matches!(ops::mse_loss_backward(&g2, &x, &x), Err(Error::ShapeMismatch { op: "mse_loss_backward", .. })));
    // Inputs untouched by the failed calls.
    assert_eq!(x.to_vec_f64()?, [1.0; 6]);
    Ok(())
}

/// `Labels` round trips and reports its length, device and maximum.
pub fn labels_round_trip(device: Device) -> Result<()> {
    let labels = Labels::new(&[4, 0, 7, 2], device)?;
    assert_eq!((labels.len(), labels.is_empty(), labels.device(), labels.max()), (4, false, device, Some(7)));
    assert_eq!(labels.to_vec()?, [4, 0, 7, 2]);
    let copy = labels.clone();
    assert_eq!(copy.to_vec()?, [4, 0, 7, 2]);
    let empty = Labels::new(&[], device)?;
    assert_eq!((empty.len(), empty.is_empty(), empty.max()), (0, true, None));
    assert_eq!(empty.to_vec()?, Vec::<u32>::new());
    Ok(())
}

/// Lists every shared case, for the suites to run.
#[macro_export]
macro_rules! softmax_cases {
    ($device:expr) => {
        #[test]
        fn softmax_against_f64() -> opsmith_host::Result<()> {
            softmax_cases::softmax_against_f64($device)
        }
        #[test]
        fn softmax_backward_against_f64() -> opsmith_host::Result<()> {
            softmax_cases::softmax_backward_against_f64($device)
        }
        #[test]
        fn softmax_exact_cases() -> opsmith_host::Result<()> {
            softmax_cases::softmax_exact_cases($device)
        }
        #[test]
        fn cross_entropy_against_f64() -> opsmith_host::Result<()> {
            softmax_cases::cross_entropy_against_f64($device)
        }
        #[test]
        fn cross_entropy_small_rows() -> opsmith_host::Result<()> {
            softmax_cases::cross_entropy_small_rows($device)
        }
        #[test]
        fn mse_against_f64() -> opsmith_host::Result<()> {
            softmax_cases::mse_against_f64($device)
        }
        #[test]
        fn loss_and_softmax_errors() -> opsmith_host::Result<()> {
            softmax_cases::loss_and_softmax_errors($device)
        }
        #[test]
        fn labels_round_trip() -> opsmith_host::Result<()> {
            softmax_cases::labels_round_trip($device)
        }
    };
}
