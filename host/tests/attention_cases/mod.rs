//! Test bodies for `ops::attention`, `attention_with_lse` and `attention_weights`, shared by the
//! CPU suite (`attention.rs`) and the GPU suite (`gpu_attention.rs`): each takes a device and
//! checks every result against an f64 reference written here with plain loops.
//!
//! The tolerance follows the composed path's roundings: the scores are rounded to the storage
//! dtype (unit roundoff `u`), an error the softmax turns into a relative error of up to about
//! `2·u·|scale·s|` in each probability; then the probabilities and the output are rounded to the
//! dtype, and the sums add errors of the arithmetic type (f32, or f64 for f64) that grow with
//! the head size and the number of keys.
#![allow(dead_code)]

use opsmith_host::{DType, Device, Error, Result, Tensor, ops};
use rand::{Rng, SeedableRng, rngs::StdRng};

pub const DTYPES: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::F64];

/// Whether `dtype` runs on `device` (CUDA has no f64 kernels).
pub fn supported(dtype: DType, device: Device) -> bool {
    !(dtype == DType::F64 && device.is_cuda())
}

/// The unit roundoff of the arithmetic: f64 for f64 tensors, f32 otherwise.
fn arith_roundoff(dtype: DType) -> f64 {
    if dtype == DType::F64 { f64::EPSILON / 2.0 } else { f32::EPSILON as f64 / 2.0 }
}

/// `[batch, heads, seq_q, seq_k, head_dim, head_dim_v]`.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub batch: usize,
    pub heads: usize,
    pub seq_q: usize,
    pub seq_k: usize,
    pub head_dim: usize,
    pub head_dim_v: usize,
}

impl Shape {
    pub fn new(batch: usize, heads: usize, seq_q: usize, seq_k: usize, head_dim: usize) -> Shape {
        Shape { batch, heads, seq_q, seq_k, head_dim, head_dim_v: head_dim }
    }
    pub fn q(&self) -> [usize; 4] {
        [self.batch, self.heads, self.seq_q, self.head_dim]
    }
    pub fn k(&self) -> [usize; 4] {
        [self.batch, self.heads, self.seq_k, self.head_dim]
    }
    pub fn v(&self) -> [usize; 4] {
        [self.batch, self.heads, self.seq_k, self.head_dim_v]
    }
    pub fn scores(&self) -> [usize; 4] {
        [self.batch, self.heads, self.seq_q, self.seq_k]
    }
}

/// Which mask a case adds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaskKind {
    None,
    /// `[seq_k]`: the last key removed for every query (key padding).
    Keys,
    /// `[seq_q, seq_k]`: random values with some `-inf`.
    Square,
    /// `[heads, seq_q, seq_k]`.
    PerHead,
    /// `[batch, heads, seq_q, seq_k]`.
    Full,
}

pub const MASKS: [MaskKind; 5] = [MaskKind::None, MaskKind::Keys, MaskKind::Square, MaskKind::PerHead, MaskKind::Full];

impl MaskKind {
    fn dims(self, s: &Shape) -> Option<Vec<usize>> {
        let scores = s.scores();
        match self {
            MaskKind::None => None,
            MaskKind::Keys => Some(scores[3..].to_vec()),
            MaskKind::Square => Some(scores[2..].to_vec()),
            MaskKind::PerHead => Some(scores[1..].to_vec()),
            MaskKind::Full => Some(scores.to_vec()),
        }
    }

    /// Values in [-2, 2] with about one in five `-inf`, but key 0 never removed (so no row is
    /// fully masked, even under the causal mask); for `Keys`, only the last key removed.
    fn values(self, s: &Shape, rng: &mut StdRng, dtype: DType) -> Option<(Vec<f64>, Vec<usize>)> {
        let dims = self.dims(s)?;
        let n: usize = dims.iter().product();
        let values = (0..n)
            .map(|i| {
                let j = i % s.seq_k;
                match self {
                    MaskKind::Keys => {
                        if j + 1 == s.seq_k && j > 0 {
                            f64::NEG_INFINITY
                        } else {
                            0.0
                        }
                    }
                    _ if j > 0 && rng.random_range(0..5) == 0 => f64::NEG_INFINITY,
                    _ => round_to(dtype, rng.random_range(-2.0..2.0)),
                }
            })
            .collect();
        Some((values, dims))
    }
}

pub fn round_to(dtype: DType, v: f64) -> f64 {
    Tensor::from_f64(&[v], [1], dtype, Device::Cpu).and_then(|t| t.to_vec_f64()).expect("a float dtype")[0]
}

/// `n` values uniform in [-2, 2), rounded to `dtype`.
pub fn uniform(rng: &mut StdRng, n: usize, dtype: DType) -> Vec<f64> {
    let raw: Vec<f64> = (0..n).map(|_| rng.random_range(-2.0..2.0)).collect();
    Tensor::from_f64(&raw, [n], dtype, Device::Cpu).and_then(|t| t.to_vec_f64()).expect("a float dtype")
}

/// The f64 reference of one call.
pub struct Reference {
    /// `[batch, heads, seq_q, head_dim_v]`.
    pub out: Vec<f64>,
    /// `[batch, heads, seq_q]`; `-inf` for a fully masked row.
    pub lse: Vec<f64>,
    /// `[batch, heads, seq_q, seq_k]`.
    pub p: Vec<f64>,
    /// Per query row, the magnitudes that scale the errors of its logits: the largest
    /// `|scale · s_ij|` (the scores' rounding to the dtype) and the largest
    /// `scale · Σ_l |q_il · k_jl|` (the rounding of their sums) over its keys.
    pub logit_max: Vec<f64>,
    pub product_max: Vec<f64>,
    /// `Σ_j p_ij · |v_jc|` per output element: the magnitude that scales its error.
    pub out_magnitude: Vec<f64>,
}

/// The bounds on one row's errors, from the composed path's roundings (see the module notes).
pub struct Tolerance {
    /// The relative error of a probability.
    pub p: f64,
    /// The absolute error of the log-sum-exp.
    pub lse: f64,
    u: f64,
    a: f64,
    seq_k: usize,
    /// Half the smallest subnormal of f16, the absolute error of a weight rounded below its
    /// normal range; 0 for the others, whose range the weights stay within.
    floor: f64,
}

impl Tolerance {
    /// Headroom over the first-order bounds below, which the measured errors stay well within.
    const SAFETY: f64 = 2.0;

    pub fn new(dtype: DType, s: &Shape, r: &Reference, row: usize) -> Tolerance {
        let (u, a) = (dtype.unit_roundoff(), arith_roundoff(dtype));
        let (l, products) = (r.logit_max[row], r.product_max[row]);
        // A logit: the score rounded to the dtype, its sum of head_dim products in the
        // arithmetic type, and the FMA that scales it and adds the mask.
        let logit = u * l + a * (4.0 + s.head_dim as f64 / 8.0) * products + a * (1.0 + l);
        // A probability: the logit's error and the normalising sum's (twice the first), the
        // softmax's own arithmetic (exponentials, a sum of seq_k terms), the rounding to the dtype.
        let sums = a * (16.0 + s.seq_k as f64 / 8.0);
        let p = Self::SAFETY * (2.0 * logit + sums + u);
        // The log-sum-exp: the logits' error, the sum's, and its f32 (or f64) rounding.
        let lse = Self::SAFETY * (logit + sums + a * (r.lse[row].abs() + 1.0));
        let floor = if dtype == DType::F16 { 2f64.powi(-25) } else { 0.0 };
        Tolerance { p, lse, u, a, seq_k: s.seq_k, floor }
    }

    /// For an output of f64 value `want` and magnitude `Σ_j p_j |v_j|`: the probabilities'
    /// errors, the product's sum over seq_k terms, the rounding to the dtype, and the subnormal
    /// floor of each weight times a value of magnitude up to 2.
    pub fn out(&self, want: f64, magnitude: f64) -> f64 {
        let sum = self.a * (4.0 + self.seq_k as f64 / 8.0);
        self.p * magnitude
            + Self::SAFETY * (sum * magnitude + self.u * want.abs() + self.seq_k as f64 * self.floor * 2.0)
    }

    /// For a weight of f64 value `want`: relative, with the f16 subnormal floor.
    pub fn weight(&self, want: f64) -> f64 {
        self.p * want + self.floor
    }
}

/// Attention in f64 with loops: scores, the causal mask (key `j > i` removed) and `mask` (its
/// values repeat over the leading dims it lacks), softmax, the product with `v`.
#[allow(clippy::too_many_arguments)]
pub fn reference(
    s: &Shape,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    scale: f64,
    causal: bool,
    mask: Option<&[f64]>,
) -> Reference {
    let (sq, sk, d, dv) = (s.seq_q, s.seq_k, s.head_dim, s.head_dim_v);
    let rows = s.batch * s.heads * sq;
    let mut r = Reference {
        out: vec![0.0; rows * dv],
        lse: vec![0.0; rows],
        p: vec![0.0; rows * sk],
        logit_max: vec![0.0; rows],
        product_max: vec![0.0; rows],
        out_magnitude: vec![0.0; rows * dv],
    };
    for row in 0..rows {
        let (bh, i) = (row / sq, row % sq);
        let qi = &q[row * d..][..d];
        let mut z = vec![0.0; sk];
        for (j, zj) in z.iter_mut().enumerate() {
            let kj = &k[(bh * sk + j) * d..][..d];
            let dot: f64 = qi.iter().zip(kj).map(|(a, b)| a * b).sum();
            let products: f64 = qi.iter().zip(kj).map(|(a, b)| (a * b).abs()).sum();
            r.logit_max[row] = r.logit_max[row].max((scale * dot).abs());
            r.product_max[row] = r.product_max[row].max(scale.abs() * products);
            let m = mask.map_or(0.0, |m| m[(row * sk + j) % m.len()]);
            *zj = if causal && j > i { f64::NEG_INFINITY } else { scale * dot + m };
        }
        let max = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if max == f64::NEG_INFINITY {
            r.lse[row] = f64::NEG_INFINITY; // p and out stay 0
            continue;
        }
        let sum: f64 = z.iter().map(|zj| (zj - max).exp()).sum();
        r.lse[row] = max + sum.ln();
        for j in 0..sk {
            let p = (z[j] - max).exp() / sum;
            r.p[row * sk + j] = p;
            for c in 0..dv {
                r.out[row * dv + c] += p * v[(bh * sk + j) * dv + c];
                r.out_magnitude[row * dv + c] += p * v[(bh * sk + j) * dv + c].abs();
            }
        }
    }
    r
}

/// The largest error seen per dtype, for the summary the sweep prints.
#[derive(Default, Clone, Copy, Debug)]
pub struct Worst {
    /// `max |got − reference|` of the outputs.
    pub out_abs: f64,
    /// The same, as a fraction of the tolerance.
    pub out_ratio: f64,
    pub lse_abs: f64,
    pub lse_ratio: f64,
    pub p_abs: f64,
    pub p_ratio: f64,
}

fn tensor(values: &[f64], dims: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
    Tensor::from_f64(values, dims.to_vec(), dtype, device)
}

/// Frees a NaN-filled block of `n` elements before an op allocates its output: on CUDA the
/// memory pool hands the same block back, so an element the op fails to write reads as NaN.
pub fn poison_pool(n: usize, dtype: DType, device: Device) -> Result<()> {
    drop(Tensor::full(f64::NAN, [n.max(1)], dtype, device)?);
    Ok(())
}

/// One case: random inputs, every entry point, every result against the f64 reference.
#[allow(clippy::too_many_arguments)]
pub fn check_case(
    device: Device,
    dtype: DType,
    s: Shape,
    causal: bool,
    mask_kind: MaskKind,
    seed: u64,
    worst: &mut Worst,
) -> Result<()> {
    let what = format!("{dtype} {s:?} causal {causal} mask {mask_kind:?} on {device}");
    let mut rng = StdRng::seed_from_u64(seed);
    let q = uniform(&mut rng, s.q().iter().product(), dtype);
    let k = uniform(&mut rng, s.k().iter().product(), dtype);
    let v = uniform(&mut rng, s.v().iter().product(), dtype);
    let mask = mask_kind.values(&s, &mut rng, dtype);
    let scale = 1.0 / (s.head_dim.max(1) as f64).sqrt();
    let want = reference(&s, &q, &k, &v, scale, causal, mask.as_ref().map(|(m, _)| m.as_slice()));

    let (qt, kt, vt) =
        (tensor(&q, &s.q(), dtype, device)?, tensor(&k, &s.k(), dtype, device)?, tensor(&v, &s.v(), dtype, device)?);
    let mt = mask.as_ref().map(|(m, dims)| tensor(m, dims, dtype, device)).transpose()?;
    let out_len = s.batch * s.heads * s.seq_q * s.head_dim_v;
    poison_pool(out_len, dtype, device)?;
    let out = ops::attention(&qt, &kt, &vt, scale, causal, mt.as_ref())?;
    poison_pool(out_len, dtype, device)?;
    let (out_lse, lse) = ops::attention_with_lse(&qt, &kt, &vt, scale, causal, mt.as_ref())?;
    poison_pool(s.scores().iter().product(), dtype, device)?;
    let p = ops::attention_weights(&qt, &kt, scale, causal, mt.as_ref())?;

    assert_eq!(
        (out.dims(), out.dtype(), out.device()),
        (&[s.batch, s.heads, s.seq_q, s.head_dim_v][..], dtype, device)
    );
    let lse_dtype = if dtype == DType::F64 { DType::F64 } else { DType::F32 };
    assert_eq!((lse.dims(), lse.dtype(), lse.device()), (&[s.batch, s.heads, s.seq_q][..], lse_dtype, device));
    assert_eq!((p.dims(), p.dtype()), (&s.scores()[..], dtype));
    let out = out.to_vec_f64()?;
    assert_eq!(out, out_lse.to_vec_f64()?, "{what}: attention and attention_with_lse differ");
    let (lse, p) = (lse.to_vec_f64()?, p.to_vec_f64()?);

    let (dv, sk) = (s.head_dim_v, s.seq_k);
    for row in 0..want.lse.len() {
        let tol = Tolerance::new(dtype, &s, &want, row);
        for c in 0..dv {
            let (g, w) = (out[row * dv + c], want.out[row * dv + c]);
            let (err, allowed) = ((g - w).abs(), tol.out(w, want.out_magnitude[row * dv + c]));
            assert!(err <= allowed, "{what}: out row {row} col {c}: {g:e} vs f64 {w:e} (tolerance {allowed:e})");
            worst.out_abs = worst.out_abs.max(err);
            worst.out_ratio = worst.out_ratio.max(err / allowed);
        }
        let (g, w) = (lse[row], want.lse[row]);
        assert!(w.is_finite(), "{what}: no row is fully masked here");
        let err = (g - w).abs();
        assert!(err <= tol.lse, "{what}: lse row {row}: {g:e} vs f64 {w:e} (tolerance {:e})", tol.lse);
        worst.lse_abs = worst.lse_abs.max(err);
        worst.lse_ratio = worst.lse_ratio.max(err / tol.lse);
        let row_sum: f64 = p[row * sk..][..sk].iter().sum();
        assert!((row_sum - 1.0).abs() <= tol.p, "{what}: weights row {row} sums to {row_sum}");
        for j in 0..sk {
            let (g, w) = (p[row * sk + j], want.p[row * sk + j]);
            if w == 0.0 {
                assert_eq!(g, 0.0, "{what}: weight ({row}, {j}) is masked out");
                continue;
            }
            let (err, allowed) = ((g - w).abs(), tol.weight(w));
            assert!(err <= allowed, "{what}: weight ({row}, {j}): {g:e} vs f64 {w:e} (tolerance {allowed:e})");
            worst.p_abs = worst.p_abs.max(err);
            worst.p_ratio = worst.p_ratio.max(err / allowed);
        }
    }
    Ok(())
}

/// Every dtype at head sizes 64 and 128, sequence lengths that are not multiples of 16 or 64
/// (1, 17, 33, 100), `seq_q` above, below and equal to `seq_k`, causal or not, under every mask
/// shape. Prints the largest error per dtype.
pub fn against_f64(device: Device) -> Result<()> {
    // (batch, heads, seq_q, seq_k, head_dim)
    let shapes = [
        (2, 3, 1, 1, 64),
        (1, 2, 1, 33, 64),
        (2, 2, 17, 17, 64),
        (1, 3, 33, 17, 128),
        (2, 1, 17, 100, 128),
        (1, 2, 100, 33, 64),
        (1, 1, 100, 100, 128),
    ];
    let mut seed = 0;
    for dtype in DTYPES.into_iter().filter(|&d| supported(d, device)) {
        let mut worst = Worst::default();
        for &(b, h, sq, sk, d) in &shapes {
            for causal in [false, true] {
                for mask in MASKS {
                    seed += 1;
                    check_case(device, dtype, Shape::new(b, h, sq, sk, d), causal, mask, seed, &mut worst)?;
                }
            }
        }
        eprintln!(
            "{dtype} on {device}: max |error| vs f64: out {:.3e} ({:.2} of tolerance), lse {:.3e} ({:.2}), weights {:.3e} ({:.2})",
            worst.out_abs, worst.out_ratio, worst.lse_abs, worst.lse_ratio, worst.p_abs, worst.p_ratio
        );
        assert!(worst.out_abs > 0.0 || dtype == DType::F64, "{dtype}: no rounding error at all is suspicious");
    }
    Ok(())
}

/// `v` with its own head size (`head_dim_v != head_dim`), and `head_dim = 0` (every score 0:
/// each query averages the values it may see).
pub fn other_head_sizes(device: Device) -> Result<()> {
    let mut worst = Worst::default();
    for dtype in DTYPES.into_iter().filter(|&d| supported(d, device)) {
        for (d, dv) in [(64, 24), (16, 80), (0, 8)] {
            for causal in [false, true] {
                let s = Shape { head_dim_v: dv, ..Shape::new(2, 2, 9, 13, d) };
                check_case(device, dtype, s, causal, MaskKind::Square, 77, &mut worst)?;
            }
        }
    }
    Ok(())
}

/// Causal masking is top-left aligned (key `j > i` removed, as PyTorch's `is_causal`), for
/// `seq_q` below and above `seq_k`: with `q = 0` every score is 0 and each output is the exact
/// mean of the values the query may see.
pub fn causal_is_top_left(device: Device) -> Result<()> {
    for dtype in DTYPES.into_iter().filter(|&d| supported(d, device)) {
        for (sq, sk) in [(2, 4), (4, 2), (3, 3)] {
            let q = tensor(&vec![0.0; sq * 2], &[1, 1, sq, 2], dtype, device)?;
            let k = tensor(&(0..sk * 2).map(|i| i as f64).collect::<Vec<_>>(), &[1, 1, sk, 2], dtype, device)?;
            // Powers of two: every mean below is exact in every dtype.
            let vs: Vec<f64> = (0..sk).map(|j| 2f64.powi(j as i32)).collect();
            let v = tensor(&vs, &[1, 1, sk, 1], dtype, device)?;
            let out = ops::attention(&q, &k, &v, 0.5, true, None)?.to_vec_f64()?;
            let want: Vec<f64> = (0..sq)
                .map(|i| {
                    let seen = &vs[..(i + 1).min(sk)];
                    seen.iter().sum::<f64>() / seen.len() as f64
                })
                .collect();
            // Exact over 1, 2 or 4 keys; over 3, the weights (1/3) and the result round once each.
            for (i, (g, w)) in out.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 3.0 * dtype.unit_roundoff() * w,
                    "{dtype} sq {sq} sk {sk} row {i}: {g} vs {w}"
                );
                if (i + 1).min(sk) != 3 {
                    assert_eq!(*g, *w, "{dtype} sq {sq} sk {sk} row {i}");
                }
            }
            let p = ops::attention_weights(&q, &k, 0.5, true, None)?.to_vec_f64()?;
            for i in 0..sq {
                for j in 0..sk {
                    assert_eq!(p[i * sk + j] == 0.0, j > i, "{dtype} sq {sq} sk {sk}: weight ({i}, {j})");
                }
            }
        }
    }
    Ok(())
}

/// A query whose every key the mask removes gets zeros (not NaN), `lse = -inf` and zero
/// weights; the other rows are unaffected. With the causal mask too.
pub fn fully_masked_rows(device: Device) -> Result<()> {
    for dtype in DTYPES.into_iter().filter(|&d| supported(d, device)) {
        let s = Shape::new(1, 2, 3, 5, 4);
        let mut rng = StdRng::seed_from_u64(5);
        let q = uniform(&mut rng, 24, dtype);
        let k = uniform(&mut rng, 40, dtype);
        let v = uniform(&mut rng, 40, dtype);
        let mut m = vec![0.0; 15];
        m[5..10].iter_mut().for_each(|x| *x = f64::NEG_INFINITY); // query 1
        m[0] = f64::NEG_INFINITY; // with causal, query 0's only key: removed too
        for causal in [false, true] {
            let ts = |x: &[f64], dims: [usize; 4]| tensor(x, &dims, dtype, device);
            let mt = tensor(&m, &[3, 5], dtype, device)?;
            let (out, lse) =
                ops::attention_with_lse(&ts(&q, s.q())?, &ts(&k, s.k())?, &ts(&v, s.v())?, 0.5, causal, Some(&mt))?;
            let want = reference(&s, &q, &k, &v, 0.5, causal, Some(&m));
            let (out, lse) = (out.to_vec_f64()?, lse.to_vec_f64()?);
            for row in 0..6 {
                let empty = row % 3 == 1 || (causal && row % 3 == 0);
                assert_eq!(want.lse[row] == f64::NEG_INFINITY, empty, "reference row {row}");
                if empty {
                    assert_eq!(lse[row], f64::NEG_INFINITY, "{dtype} causal {causal}: lse row {row}");
                    assert_eq!(out[row * 4..][..4], [0.0; 4], "{dtype} causal {causal}: out row {row}");
                } else {
                    assert!((lse[row] - want.lse[row]).abs() < 0.05, "{dtype} causal {causal}: lse row {row}");
                    for c in 0..4 {
                        let (g, w) = (out[row * 4 + c], want.out[row * 4 + c]);
                        assert!((g - w).abs() < 0.05, "{dtype} causal {causal}: out ({row}, {c}): {g} vs {w}");
                    }
                }
            }
        }
    }
    Ok(())
}

/// No queries, no batch or no heads: empty results of the right shapes, no error.
pub fn empty_queries(device: Device) -> Result<()> {
    for (b, h, sq) in [(2, 3, 0), (0, 3, 4), (2, 0, 4)] {
        let s = Shape { head_dim_v: 5, ..Shape::new(b, h, sq, 6, 8) };
        let zeros = |dims: [usize; 4]| Tensor::zeros(dims, DType::F32, device);
        let (q, k, v) = (zeros(s.q())?, zeros(s.k())?, zeros(s.v())?);
        for causal in [false, true] {
            let (out, lse) = ops::attention_with_lse(&q, &k, &v, 1.0, causal, None)?;
            assert_eq!((out.dims(), lse.dims()), (&[b, h, sq, 5][..], &[b, h, sq][..]));
            assert_eq!(ops::attention(&q, &k, &v, 1.0, causal, None)?.elem_count(), 0);
            assert_eq!(ops::attention_weights(&q, &k, 1.0, causal, None)?.dims(), [b, h, sq, 6]);
        }
    }
    Ok(())
}

/// Every bad input is a typed error naming "attention", from all three entry points, before
/// any work: the operands keep their values and versions.
pub fn errors(device: Device) -> Result<()> {
    let t = |dims: &[usize], dtype: DType| -> Result<Tensor> {
        let n: usize = dims.iter().product();
        tensor(&(0..n).map(|i| (i % 7) as f64 - 3.0).collect::<Vec<_>>(), dims, dtype, device)
    };
    let f32t = |dims: &[usize]| t(dims, DType::F32);
    let (q, k, v) = (f32t(&[2, 3, 4, 8])?, f32t(&[2, 3, 5, 8])?, f32t(&[2, 3, 5, 6])?);
    let snapshot = |ts: &[&Tensor]| -> Result<Vec<(Vec<f64>, u64)>> {
        ts.iter().map(|t| Ok((t.to_vec_f64()?, t.version()))).collect()
    };
    let before = snapshot(&[&q, &k, &v])?;

    // Each call goes through all three entry points; all must fail alike.
    let all = |q: &Tensor, k: &Tensor, v: &Tensor, scale: f64, mask: Option<&Tensor>| -> Vec<Error> {
        vec![
            ops::attention(q, k, v, scale, true, mask).unwrap_err(),
            ops::attention_with_lse(q, k, v, scale, false, mask).unwrap_err(),
            ops::attention_weights(q, k, scale, true, mask).unwrap_err(),
        ]
    };
    let shape_err = |errs: Vec<Error>, lhs: &[usize], rhs: &[usize], what: &str| {
        for e in errs {
            match &e {
                Error::ShapeMismatch { op: "attention", lhs: l, rhs: r } => {
                    assert_eq!((l.as_slice(), r.as_slice()), (lhs, rhs), "{what}: {e}")
                }
                other => panic!("{what}: expected an attention ShapeMismatch, got {other:?}"),
            }
        }
    };
    let invalid = |errs: Vec<Error>, needle: &str, what: &str| {
        for e in errs {
            match &e {
                Error::InvalidArgument { op: "attention", reason } => assert!(reason.contains(needle), "{what}: {e}"),
                other => panic!("{what}: expected an attention InvalidArgument, got {other:?}"),
            }
        }
    };

    // Ranks other than 4.
    invalid(all(&f32t(&[3, 4, 8])?, &k, &v, 1.0, None), "q must have rank 4", "rank-3 q");
    invalid(all(&q, &f32t(&[1, 2, 3, 5, 8])?, &v, 1.0, None), "k must have rank 4", "rank-5 k");
    let e = ops::attention(&q, &k, &f32t(&[30, 6])?, 1.0, false, None).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument { op: "attention", reason } if reason.contains("v must have rank 4")),
        "{e}"
    );
    // k against q: batch, heads, head_dim.
    for bad in [[1, 3, 5, 8], [2, 2, 5, 8], [2, 3, 5, 7]] {
        shape_err(all(&q, &f32t(&bad)?, &f32t(&[bad[0], bad[1], 5, 6])?, 1.0, None), &[2, 3, 4, 8], &bad, "k vs q");
    }
    // v against k: batch, heads, seq_k (attention_weights takes no v).
    for bad in [[1, 3, 5, 6], [2, 1, 5, 6], [2, 3, 4, 6]] {
        for f in [
            ops::attention(&q, &k, &f32t(&bad)?, 1.0, false, None).unwrap_err(),
            ops::attention_with_lse(&q, &k, &f32t(&bad)?, 1.0, true, None).unwrap_err(),
        ] {
            shape_err(vec![f], &[2, 3, 5, 8], &bad, "v vs k");
        }
    }
    // No keys, and a scale that is not finite.
    let (k0, v0) = (f32t(&[2, 3, 0, 8])?, f32t(&[2, 3, 0, 6])?);
    invalid(all(&q, &k0, &v0, 1.0, None), "no keys", "seq_k = 0");
    for scale in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        invalid(all(&q, &k, &v, scale, None), "scale must be finite", "scale");
    }
    // Masks whose dims are not the scores' [2, 3, 4, 5] trailing dims.
    for dims in [&[4][..], &[5, 4], &[4, 1], &[1, 5], &[2, 4, 5], &[3, 3, 4, 5], &[1, 2, 3, 4, 5], &[]] {
        let m = f32t(dims)?;
        shape_err(all(&q, &k, &v, 1.0, Some(&m)), &[2, 3, 4, 5], dims, &format!("mask {dims:?}"));
    }
    // Dtypes: mixed, integer.
    for (qd, kd, vd, md) in [
        (DType::F32, DType::F16, DType::F32, DType::F32),
        (DType::F32, DType::F32, DType::BF16, DType::F32),
        (DType::F32, DType::F32, DType::F32, DType::F16),
    ] {
        let m = t(&[4, 5], md)?;
        for e in [
            ops::attention(&t(&[2, 3, 4, 8], qd)?, &t(&[2, 3, 5, 8], kd)?, &t(&[2, 3, 5, 6], vd)?, 1.0, true, Some(&m))
                .unwrap_err(),
            ops::attention_with_lse(
                &t(&[2, 3, 4, 8], qd)?,
                &t(&[2, 3, 5, 8], kd)?,
                &t(&[2, 3, 5, 6], vd)?,
                1.0,
                true,
                Some(&m),
            )
            .unwrap_err(),
        ] {
            let odd = [kd, vd, md].into_iter().find(|&d| d != qd).unwrap();
            assert!(matches!(e, Error::DTypeMismatch { op: "attention", lhs: DType::F32, rhs } if rhs == odd), "{e}");
        }
    }
    let i64t = |dims: &[usize]| t(dims, DType::I64);
    let (qi, ki, vi) = (i64t(&[2, 3, 4, 8])?, i64t(&[2, 3, 5, 8])?, i64t(&[2, 3, 5, 6])?);
    for e in all(&qi, &ki, &vi, 1.0, None) {
        assert!(matches!(e, Error::UnsupportedDType { op: "attention", dtype: DType::I64, .. }), "{e}");
    }
    // Devices: CUDA has no f64, and operands must share one device.
    if device.is_cuda() {
        let f64t = |dims: &[usize]| t(dims, DType::F64);
        for e in all(&f64t(&[2, 3, 4, 8])?, &f64t(&[2, 3, 5, 8])?, &f64t(&[2, 3, 5, 6])?, 1.0, None) {
            assert!(
                matches!(e, Error::UnsupportedDType { op: "attention", dtype: DType::F64, device: d } if d == device),
                "{e}"
            );
        }
        let k_cpu = k.to_device(Device::Cpu)?;
        for e in all(&q, &k_cpu, &v, 1.0, None) {
            assert!(
                matches!(e, Error::DeviceMismatch { op: "attention", lhs, rhs: Device::Cpu } if lhs == device),
                "{e}"
            );
        }
        let m_cpu = Tensor::zeros([4, 5], DType::F32, Device::Cpu)?;
        for e in all(&q, &k, &v, 1.0, Some(&m_cpu)) {
            assert!(matches!(e, Error::DeviceMismatch { op: "attention", .. }), "{e}");
        }
    }
    // The messages name the op and the shapes.
    let msg = ops::attention(&q, &f32t(&[2, 3, 5, 7])?, &v, 1.0, false, None).unwrap_err().to_string();
    assert_eq!(msg, "attention: shape mismatch: [2, 3, 4, 8] vs [2, 3, 5, 7]");
    assert_eq!(snapshot(&[&q, &k, &v])?, before, "a failed call changed an operand");
    Ok(())
}

/// The same inputs on two devices give the same results to within the rounding both carry
/// (twice the tolerance against f64), for every dtype both support.
pub fn devices_agree(a: Device, b: Device) -> Result<()> {
    for dtype in DTYPES.into_iter().filter(|&d| supported(d, a) && supported(d, b)) {
        for (causal, mask_kind) in [(false, MaskKind::None), (true, MaskKind::Square), (true, MaskKind::Full)] {
            let s = Shape::new(2, 3, 33, 100, 64);
            let mut rng = StdRng::seed_from_u64(11);
            let q = uniform(&mut rng, s.q().iter().product(), dtype);
            let k = uniform(&mut rng, s.k().iter().product(), dtype);
            let v = uniform(&mut rng, s.v().iter().product(), dtype);
            let mask = mask_kind.values(&s, &mut rng, dtype);
            let scale = 0.125;
            let want = reference(&s, &q, &k, &v, scale, causal, mask.as_ref().map(|(m, _)| m.as_slice()));
            let run = |device: Device| -> Result<(Vec<f64>, Vec<f64>)> {
                let mt = mask.as_ref().map(|(m, dims)| tensor(m, dims, dtype, device)).transpose()?;
                let (out, lse) = ops::attention_with_lse(
                    &tensor(&q, &s.q(), dtype, device)?,
                    &tensor(&k, &s.k(), dtype, device)?,
                    &tensor(&v, &s.v(), dtype, device)?,
                    scale,
                    causal,
                    mt.as_ref(),
                )?;
                Ok((out.to_vec_f64()?, lse.to_vec_f64()?))
            };
            let ((out_a, lse_a), (out_b, lse_b)) = (run(a)?, run(b)?);
            let dv = s.head_dim_v;
            for row in 0..want.lse.len() {
                let tol = Tolerance::new(dtype, &s, &want, row);
                let what = || format!("{dtype} causal {causal} mask {mask_kind:?}: {a} vs {b}, row {row}");
                assert!(
                    (lse_a[row] - lse_b[row]).abs() <= 2.0 * tol.lse,
                    "{}: lse {} vs {}",
                    what(),
                    lse_a[row],
                    lse_b[row]
                );
                for c in 0..dv {
                    let (x, y) = (out_a[row * dv + c], out_b[row * dv + c]);
                    let allowed = 2.0 * tol.out(want.out[row * dv + c], want.out_magnitude[row * dv + c]);
                    assert!((x - y).abs() <= allowed, "{}: out col {c}: {x} vs {y}", what());
                }
            }
        }
    }
    Ok(())
}

/// `attention_backward`'s own errors, before any work, each naming the op: `out`, `dout` or
/// `lse` of the wrong shape, dtype or device.
pub fn backward_errors(device: Device) -> Result<()> {
    let s = Shape::new(1, 2, 3, 5, 64);
    let t = |dims: &[usize], dtype| Tensor::zeros(dims.to_vec(), dtype, device);
    let dtype = DType::F32;
    let (q, k, v) = (t(&s.q(), dtype)?, t(&s.k(), dtype)?, t(&s.v(), dtype)?);
    let (out, lse) = ops::attention_with_lse(&q, &k, &v, 0.125, false, None)?;
    let op = "attention_backward";
    let call = |out: &Tensor, lse: &Tensor, dout: &Tensor| {
        ops::attention_backward(&q, &k, &v, out, lse, dout, 0.125, false, None)
    };
    let wrong_shape = t(&[1, 2, 3, 63], dtype)?;
    let shape_errors =
        [call(&wrong_shape, &lse, &out), call(&out, &lse, &wrong_shape), call(&out, &t(&[1, 2, 4], DType::F32)?, &out)];
    for e in shape_errors {
        assert!(matches!(e, Err(Error::ShapeMismatch { op: o, .. }) if o == op), "{e:?}");
    }
    let dout16 = t(&s.q(), DType::F16)?;
    assert!(matches!(call(&out, &lse, &dout16), Err(Error::DTypeMismatch { op: o, .. }) if o == op));
    let lse64 = t(&[1, 2, 3], DType::F64)?;
    assert!(matches!(call(&out, &lse64, &out), Err(Error::DTypeMismatch { op: o, .. }) if o == op));
    // The operands' own errors, named for the backward too.
    let bad_k = t(&[1, 2, 5, 32], dtype)?;
    let e = ops::attention_backward(&q, &bad_k, &v, &out, &lse, &out, 0.125, false, None);
    assert!(matches!(e, Err(Error::ShapeMismatch { op: o, .. }) if o == op), "{e:?}");
    Ok(())
}

/// Lists every shared case, for the suites to run.
#[macro_export]
macro_rules! attention_cases {
    ($device:expr) => {
        #[test]
        fn attention_against_f64() -> opsmith_host::Result<()> {
            attention_cases::against_f64($device)
        }
        #[test]
        fn attention_other_head_sizes() -> opsmith_host::Result<()> {
            attention_cases::other_head_sizes($device)
        }
        #[test]
        fn attention_causal_is_top_left() -> opsmith_host::Result<()> {
            attention_cases::causal_is_top_left($device)
        }
        #[test]
        fn attention_fully_masked_rows() -> opsmith_host::Result<()> {
            attention_cases::fully_masked_rows($device)
        }
        #[test]
        fn attention_empty_queries() -> opsmith_host::Result<()> {
            attention_cases::empty_queries($device)
        }
        #[test]
        fn attention_errors() -> opsmith_host::Result<()> {
            attention_cases::errors($device)
        }
        #[test]
        fn attention_backward_errors() -> opsmith_host::Result<()> {
            attention_cases::backward_errors($device)
        }
    };
}
