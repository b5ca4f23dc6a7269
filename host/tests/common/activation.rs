//! Activation test bodies, shared by the CPU suite (`activation.rs`) and the GPU suite
//! (`gpu_activation.rs`): each case takes a device, and checks it against f64 references
//! written from the definitions here.
use super::{DTYPES, OFFSETS, SENTINEL, padded_view, round_to, store_floor, store_roundoff, supported, tensor, values};
use opsmith_host::{DType, Device, Error, Result, Tensor, ops};
use rand::{Rng, SeedableRng, rngs::StdRng};

/// Element counts: empty, one, primes below and above a 16-byte pack and a block, and past 1000.
pub const ACT_SIZES: [usize; 6] = [0, 1, 7, 31, 1021, 4099];

/// Inputs every run starts with: ±0, tiny, around silu's minimum (−1.278), the ranges where
/// σ underflows in f32 (below −87) and where gelu's z does (x below −10), and huge values.
pub const INTERESTING: [f64; 42] = [
    0.0, -0.0, 1e-30, -1e-30, 1e-7, -1e-7, 1e-3, -1e-3, 0.5, -0.5, 1.0, -1.0, 1.278, -1.278, 2.0, -2.0, 3.0, -3.0, 5.0,
    -5.0, 8.0, -8.0, 10.0, -10.0, 10.3, -10.3, 20.0, -20.0, 50.0, -50.0, 88.0, -88.0, 95.0, -95.0, 103.0, -103.0,
    110.0, -110.0, 1e4, -1e4, 1e20, -1e20,
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    Relu,
    Gelu,
    Silu,
}

/// √(2/π).
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `1 + tanh(u)`, from tanh itself where that is accurate, and as the equal `2 / (1 + e^(−2u))`
/// where tanh(u) is near −1 and the sum would cancel.
fn one_plus_tanh(u: f64) -> f64 {
    if u > -1.0 { 1.0 + u.tanh() } else { 2.0 / (1.0 + (-2.0 * u).exp()) }
}

impl Act {
    pub const ALL: [Act; 3] = [Act::Relu, Act::Gelu, Act::Silu];

    pub fn forward(self, x: &Tensor) -> Result<Tensor> {
        match self {
            Act::Relu => ops::relu(x),
            Act::Gelu => ops::gelu(x),
            Act::Silu => ops::silu(x),
        }
    }

    pub fn forward_into(self, x: &Tensor, out: &Tensor) -> Result<()> {
        match self {
            Act::Relu => ops::relu_into(x, out),
            Act::Gelu => ops::gelu_into(x, out),
            Act::Silu => ops::silu_into(x, out),
        }
    }

    pub fn backward(self, g: &Tensor, x: &Tensor) -> Result<Tensor> {
        match self {
            Act::Relu => ops::relu_backward(g, x),
            Act::Gelu => ops::gelu_backward(g, x),
            Act::Silu => ops::silu_backward(g, x),
        }
    }

    pub fn backward_into(self, g: &Tensor, x: &Tensor, gx: &Tensor) -> Result<()> {
        match self {
            Act::Relu => ops::relu_backward_into(g, x, gx),
            Act::Gelu => ops::gelu_backward_into(g, x, gx),
            Act::Silu => ops::silu_backward_into(g, x, gx),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Act::Relu => "relu",
            Act::Gelu => "gelu",
            Act::Silu => "silu",
        }
    }

    /// f(x) in f64, from the definition (gelu in its tanh form).
    pub fn reference(self, x: f64) -> f64 {
        match self {
            Act::Relu if x.is_nan() => x,
            Act::Relu => x.max(0.0),
            Act::Gelu => 0.5 * x * one_plus_tanh(SQRT_2_OVER_PI * (x + 0.044715 * x.powi(3))),
            Act::Silu => x / (1.0 + (-x).exp()),
        }
    }

    /// f'(x) in f64, differentiated by hand from the definition.
    pub fn reference_derivative(self, x: f64) -> f64 {
        match self {
            Act::Relu => (x > 0.0) as u8 as f64,
            Act::Gelu => {
                let u = SQRT_2_OVER_PI * (x + 0.044715 * x.powi(3));
                let du = SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * x * x);
                // d/dx tanh(u) = sech²(u) u'; sech = 1 / cosh has no cancellation, and
                // multiplying by it twice keeps the product in range where cosh² overflows.
                let sech = 1.0 / u.cosh();
                0.5 * one_plus_tanh(u) + 0.5 * x * du * sech * sech
            }
            Act::Silu => {
                let (s, s_neg) = (sigmoid(x), sigmoid(-x));
                s * (1.0 + x * s_neg)
            }
        }
    }

    /// What bounds the arithmetic's error in f(x) (`derivative` false) or f'(x), in units of the
    /// arithmetic's roundoff: the magnitude of the terms, times the conditioning where an
    /// argument carries rounding error. gelu's `z = 2u` is rounded a few times, and σ(z)
    /// amplifies a relative error δ of z into `|z| σ(−z) δ`.
    pub fn error_scale(self, x: f64, derivative: bool) -> f64 {
        let z = 2.0 * SQRT_2_OVER_PI * (x + 0.044715 * x.powi(3));
        match (self, derivative) {
            (Act::Relu, _) => 0.0,
            (Act::Silu, false) => self.reference(x).abs(),
            (Act::Silu, true) => sigmoid(x) + (x * sigmoid(x) * sigmoid(-x)).abs(),
            (Act::Gelu, false) => self.reference(x).abs() * (1.0 + z.abs() * sigmoid(-z)),
            (Act::Gelu, true) => {
                let dz = 2.0 * SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * x * x);
                let t = sigmoid(z) * sigmoid(-z);
                sigmoid(z) * (1.0 + z.abs() * sigmoid(-z)) + (x * t * dz).abs() * (1.0 + z.abs())
            }
        }
    }
}

/// The largest error allowed in a result `r = g · f(x)` (g = 1 for the forward) stored as
/// `dtype`: 64 roundoffs of the arithmetic times the error scale (CUDA's exponential alone is a
/// few ulps, and σ a handful of operations on it), the rounding to the storage dtype, and
/// below the arithmetic's normal range, where relative accuracy is not kept, its smallest
/// normal times the size of the terms.
pub fn tolerance(dtype: DType, r: f64, g: f64, error_scale: f64, x: f64) -> f64 {
    let (u, normal_min) =
        if dtype == DType::F64 { (f64::EPSILON / 2.0, f64::MIN_POSITIVE) } else { (2f64.powi(-24), 2f64.powi(-126)) };
    64.0 * u * error_scale * g.abs()
        + store_roundoff(dtype) * r.abs() * 1.01
        + store_floor(dtype)
        + normal_min * (1.0 + x.abs()) * g.abs()
}

/// `n` finite inputs rounded to `dtype`: [`INTERESTING`] first, then random values, mostly in
/// [−6, 6], some of magnitude 2^-20 to 2^7.
pub fn inputs(rng: &mut StdRng, n: usize, dtype: DType) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let v = match INTERESTING.get(i) {
                Some(&v) => v,
                None if rng.random_bool(0.3) => {
                    let sign = if rng.random_bool(0.5) { 1.0 } else { -1.0 };
                    sign * 2f64.powf(rng.random_range(-20.0..7.0))
                }
                None => rng.random_range(-6.0..6.0),
            };
            let v = round_to(dtype, v);
            if v.is_finite() { v } else { round_to(dtype, 0.75) }
        })
        .collect()
}

/// Upstream gradients: both signs, magnitudes 1/16 to 16, rounded to `dtype`.
pub fn gradients(rng: &mut StdRng, n: usize, dtype: DType) -> Vec<f64> {
    super::random_values(rng, n, dtype)
}

fn check_close(context: &str, dtype: DType, got: f64, r: f64, g: f64, scale: f64, x: f64) {
    let tol = tolerance(dtype, r, g, scale, x);
    assert!(
        (got - r).abs() <= tol || (got == r),
        "{context}: got {got:e}, f64 reference {r:e}, tolerance {tol:e}, x = {x:e}, g = {g:e}"
    );
}

/// One activation, every dtype × size × offset: forward and backward (`_into` forms writing
/// into NaN-poisoned views inside sentinel-padded buffers, at the given offset) against the f64
/// references, nothing written outside the views, inputs unchanged, and the functional forms
/// equal to the `_into` ones.
pub fn activation_against_f64(device: Device, act: Act) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(500 + act as u64);
    for dtype in DTYPES {
        for n in ACT_SIZES {
            for offset in OFFSETS {
                let x = inputs(&mut rng, n, dtype);
                let g = gradients(&mut rng, n, dtype);
                // Input views at other offsets than the outputs, so aligned and unaligned mix.
                let (_x_buf, xv) = padded_view(n, (offset + 1) % 4, 0.0, dtype, device)?;
                let (_g_buf, gv) = padded_view(n, offset, 0.0, dtype, device)?;
                xv.copy_from_(&tensor(&x, dtype, device)?)?;
                gv.copy_from_(&tensor(&g, dtype, device)?)?;
                let (out_buf, out) = padded_view(n, offset, f64::NAN, dtype, device)?;
                let (gx_buf, gx) = padded_view(n, offset, f64::NAN, dtype, device)?;
                let context =
                    |what: &str, i: usize| format!("{what} {dtype} on {device}, n={n} offset={offset}, [{i}]");

                if !supported(dtype, device) {
                    let err = act.forward_into(&xv, &out).unwrap_err();
                    assert!(matches!(err, Error::UnsupportedDType { dtype: DType::F64, .. }), "{err}");
                    let err = act.backward(&gv, &xv).unwrap_err();
                    assert!(matches!(err, Error::UnsupportedDType { dtype: DType::F64, .. }), "{err}");
                    continue;
                }
                act.forward_into(&xv, &out)?;
                act.backward_into(&gv, &xv, &gx)?;
                let (y, dy) = (values(&out)?, values(&gx)?);
                for i in 0..n {
                    let r = act.reference(x[i]);
                    check_close(&context(act.name(), i), dtype, y[i], r, 1.0, act.error_scale(x[i], false), x[i]);
                    let r = g[i] * act.reference_derivative(x[i]);
                    let what = format!("{}_backward", act.name());
                    check_close(&context(&what, i), dtype, dy[i], r, g[i], act.error_scale(x[i], true), x[i]);
                }
                for buf in [&out_buf, &gx_buf] {
                    let v = values(buf)?;
                    let outside = v[..offset].iter().chain(&v[offset + n..]);
                    assert!(outside.into_iter().all(|&s| s == SENTINEL), "{}: wrote outside its view", context("", 0));
                }
                assert_eq!(values(&xv)?, x, "{}: x changed", context(act.name(), 0));
                assert_eq!(values(&gv)?, g, "{}: g changed", context(act.name(), 0));
                let same_bits = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same_bits(&values(&act.forward(&xv)?)?, &y), "{}: functional form", context(act.name(), 0));
                assert!(same_bits(&values(&act.backward(&gv, &xv)?)?, &dy), "{}: functional", context(act.name(), 0));
            }
        }
    }
    Ok(())
}

/// ±inf, NaN and ±0, spelled out: limits at ±inf, NaN propagation, relu's handling of −0 and
/// NaN in both directions.
pub fn special_values(device: Device) -> Result<()> {
    let inf = f64::INFINITY;
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
        if !supported(dtype, device) {
            continue;
        }
        let x = tensor(&[inf, -inf, f64::NAN, 0.0, -0.0], dtype, device)?;
        let g = tensor(&[2.0, 2.0, 2.0, 2.0, 2.0], dtype, device)?;
        let run = |y: Result<Tensor>| y.and_then(|y| values(&y));
        let bits =
            |v: &[f64]| v.iter().map(|v| if v.is_nan() { "NaN".into() } else { format!("{v:?}") }).collect::<Vec<_>>();
        let case = |name: &str, got: Vec<f64>, want: [f64; 5]| {
            assert_eq!(bits(&got), bits(&want), "{name} {dtype} on {device} at [inf, -inf, NaN, 0, -0]");
        };
        case("relu", run(ops::relu(&x))?, [inf, 0.0, f64::NAN, 0.0, 0.0]);
        case("relu_backward", run(ops::relu_backward(&g, &x))?, [2.0, 0.0, 0.0, 0.0, 0.0]);
        case("gelu", run(ops::gelu(&x))?, [inf, -0.0, f64::NAN, 0.0, -0.0]);
        case("gelu_backward", run(ops::gelu_backward(&g, &x))?, [2.0, 0.0, f64::NAN, 1.0, 1.0]);
        case("silu", run(ops::silu(&x))?, [inf, -0.0, f64::NAN, 0.0, -0.0]);
        case("silu_backward", run(ops::silu_backward(&g, &x))?, [2.0, 0.0, f64::NAN, 1.0, 1.0]);
        // NaN in the gradient propagates wherever the derivative is used.
        let g_nan = tensor(&[f64::NAN; 5], dtype, device)?;
        let gx = run(ops::gelu_backward(&g_nan, &tensor(&[1.0, -1.0, 0.0, 3.0, -3.0], dtype, device)?))?;
        assert!(gx.iter().all(|v| v.is_nan()), "gelu_backward {dtype} on {device}: {gx:?}");
    }
    Ok(())
}

/// In place: `out` and `gx` may be exactly an input; the version of what was written moves.
pub fn in_place(device: Device) -> Result<()> {
    let x0 = [-2.0, -0.5, 0.25, 1.5, 4.0];
    for act in Act::ALL {
        let x = tensor(&x0, DType::F32, device)?;
        let before = x.version();
        act.forward_into(&x, &x)?;
        assert!(x.version() > before, "{act:?}: an in-place write bumps the version");
        let expected = values(&act.forward(&tensor(&x0, DType::F32, device)?)?)?;
        assert_eq!(values(&x)?, expected, "{act:?} in place");

        let (g, x) = (tensor(&[1.5; 5], DType::F32, device)?, tensor(&x0, DType::F32, device)?);
        let expected = values(&act.backward(&g, &x)?)?;
        act.backward_into(&g, &x, &g)?;
        assert_eq!(values(&g)?, expected, "{act:?}_backward into g");
        let g = tensor(&[1.5; 5], DType::F32, device)?;
        act.backward_into(&g, &x, &x)?;
        assert_eq!(values(&x)?, expected, "{act:?}_backward into x");
    }
    Ok(())
}

/// Operand checks name the op: shape, dtype, partial overlap; inputs unchanged afterwards.
pub fn operand_errors(device: Device) -> Result<()> {
    let x = tensor(&[1.0, -2.0, 3.0], DType::F32, device)?;
    let g4 = tensor(&[1.0, 1.0, 1.0, 1.0], DType::F32, device)?;
    let g_h = tensor(&[1.0, 1.0, 1.0], DType::F16, device)?;
    for act in Act::ALL {
        let name = format!("{}_backward", act.name());
        match act.backward(&g4, &x) {
            Err(Error::ShapeMismatch { op, lhs, rhs }) => assert_eq!((op, lhs, rhs), (name.as_str(), vec![4], vec![3])),
            other => panic!("{act:?}: expected a shape mismatch, got {other:?}"),
        }
        match act.backward(&g_h, &x) {
            Err(Error::DTypeMismatch { op, lhs: DType::F16, rhs: DType::F32 }) => assert_eq!(op, name),
            other => panic!("{act:?}: expected a dtype mismatch, got {other:?}"),
        }
        let out = Tensor::zeros([3], DType::F16, device)?;
        assert!(matches!(act.forward_into(&x, &out), Err(Error::DTypeMismatch { op, .. }) if op == act.name()));
        let out = Tensor::zeros([4], DType::F32, device)?;
        assert!(matches!(act.forward_into(&x, &out), Err(Error::ShapeMismatch { op, .. }) if op == act.name()));
        let buf = tensor(&[1.0, 2.0, 3.0, 4.0], DType::F32, device)?;
        let (lo, hi) = (buf.flat_slice(0, 3)?, buf.flat_slice(1, 3)?);
        assert!(matches!(act.forward_into(&lo, &hi), Err(Error::Overlap { op, output: 0 }) if op == act.name()));
        assert_eq!(values(&buf)?, [1.0, 2.0, 3.0, 4.0]);
    }
    assert_eq!(values(&x)?, [1.0, -2.0, 3.0]);
    Ok(())
}

/// Lists the activation cases, for the suites to run.
#[macro_export]
macro_rules! activation_cases {
    ($device:expr) => {
        #[test]
        fn relu_against_f64() -> opsmith_host::Result<()> {
            common::activation::activation_against_f64($device, common::activation::Act::Relu)
        }
        #[test]
        fn gelu_against_f64() -> opsmith_host::Result<()> {
            common::activation::activation_against_f64($device, common::activation::Act::Gelu)
        }
        #[test]
        fn silu_against_f64() -> opsmith_host::Result<()> {
            common::activation::activation_against_f64($device, common::activation::Act::Silu)
        }
        #[test]
        fn activation_special_values() -> opsmith_host::Result<()> {
            common::activation::special_values($device)
        }
        #[test]
        fn activation_in_place() -> opsmith_host::Result<()> {
            common::activation::in_place($device)
        }
        #[test]
        fn activation_operand_errors() -> opsmith_host::Result<()> {
            common::activation::operand_errors($device)
        }
    };
}
