//! Activations on the CPU: the shared cases (`common/activation.rs`), plus the f64 checks that
//! need no GPU: the backward against central differences of the forward, and the references'
//! own tail formulas against the plain definitions.
mod common;

use common::activation::{Act, INTERESTING};
use common::tensor;
use opsmith_host::{DType, Device, Result};

activation_cases!(Device::Cpu);

/// `f(x)` for each x, through the op on f64 tensors.
fn forward_f64(act: Act, xs: &[f64]) -> Result<Vec<f64>> {
    act.forward(&tensor(xs, DType::F64, Device::Cpu)?)?.to_vec_f64()
}

/// The backward op (with g = 1) against central differences `(f(x + h) − f(x − h)) / 2h` of the
/// forward op, in f64, away from relu's kink.
#[test]
fn backward_matches_central_differences() -> Result<()> {
    let xs: Vec<f64> = (-60..=60).map(|k| k as f64 * 0.1 + 0.013).chain([-9.0, -7.5, 6.0, 9.5]).collect();
    for act in Act::ALL {
        let h: Vec<f64> = xs.iter().map(|x| 1e-5 * x.abs().max(1.0)).collect();
        let plus: Vec<f64> = xs.iter().zip(&h).map(|(x, h)| x + h).collect();
        let minus: Vec<f64> = xs.iter().zip(&h).map(|(x, h)| x - h).collect();
        let (fp, fm) = (forward_f64(act, &plus)?, forward_f64(act, &minus)?);
        let ones = tensor(&vec![1.0; xs.len()], DType::F64, Device::Cpu)?;
        let analytic = act.backward(&ones, &tensor(&xs, DType::F64, Device::Cpu)?)?.to_vec_f64()?;
        for i in 0..xs.len() {
            let numeric = (fp[i] - fm[i]) / (plus[i] - minus[i]);
            // Truncation error O(h² f''') and cancellation error O(ε f / h).
            let tol = 1e-8 * (1.0 + numeric.abs() + forward_f64(act, &[xs[i]])?[0].abs() / xs[i].abs().max(1.0));
            assert!(
                (analytic[i] - numeric).abs() <= tol,
                "{act:?}'({}) = {:e}, central difference {numeric:e}",
                xs[i],
                analytic[i]
            );
            // And the hand-written derivative agrees with both.
            assert!((act.reference_derivative(xs[i]) - numeric).abs() <= tol, "{act:?} reference at {}", xs[i]);
        }
    }
    Ok(())
}

/// The references compute gelu's `1 + tanh(u)` as `2 / (1 + e^(−2u))` where tanh(u) is near −1;
/// check that switch against the plain tanh form where both are accurate, and silu's against
/// `x σ(x)`.
#[test]
fn references_agree_with_the_plain_definitions() {
    let sqrt_2_over_pi = (2.0 / std::f64::consts::PI).sqrt();
    for k in -300..=300 {
        let x = k as f64 * 0.01;
        let plain = 0.5 * x * (1.0 + (sqrt_2_over_pi * (x + 0.044715 * x * x * x)).tanh());
        let r = Act::Gelu.reference(x);
        // The plain form's `1 + tanh` loses about ε in absolute terms to cancellation.
        let tol = 1e-14 * r.abs() + 1e-15 * x.abs();
        assert!((r - plain).abs() <= tol, "gelu({x}): {r:e} vs {plain:e}");
        let silu = x * (1.0 / (1.0 + (-x).exp()));
        assert!((Act::Silu.reference(x) - silu).abs() <= 1e-15 * silu.abs().max(1e-3), "silu({x})");
    }
    // The tails keep relative precision where the plain forms lose it.
    assert!(Act::Gelu.reference(-10.0) < 0.0 && Act::Gelu.reference(-10.0) > -1e-36);
    assert!(INTERESTING.iter().all(|x| Act::ALL.iter().all(|a| a.reference(*x).is_finite())));
}

/// CPU f32 results stay much closer to f64 than the shared tolerance (written to admit CUDA's
/// approximate exponential): within 8 f32 roundoffs of the error scale.
#[test]
fn cpu_f32_is_within_a_few_ulps() -> Result<()> {
    let xs: Vec<f64> = (-2000..=2000).map(|k| (k as f64 * 0.006) as f32 as f64).collect();
    let x = tensor(&xs, DType::F32, Device::Cpu)?;
    let ones = tensor(&vec![1.0; xs.len()], DType::F32, Device::Cpu)?;
    for act in Act::ALL {
        let y = act.forward(&x)?.to_vec_f64()?;
        let dy = act.backward(&ones, &x)?.to_vec_f64()?;
        for i in 0..xs.len() {
            let u = 2f64.powi(-24);
            let tol = |derivative: bool| 8.0 * u * act.error_scale(xs[i], derivative) + 2f64.powi(-140);
            let (r, dr) = (act.reference(xs[i]), act.reference_derivative(xs[i]));
            assert!((y[i] - r).abs() <= tol(false), "{act:?}({}) = {:e} vs {r:e}", xs[i], y[i]);
            assert!((dy[i] - dr).abs() <= tol(true), "{act:?}'({}) = {:e} vs {dr:e}", xs[i], dy[i]);
        }
    }
    Ok(())
}

/// f32 arithmetic as on the device, but with an exponential whose `exp2` is 3 ulps off (one more
/// than `ex2.approx.f32`'s bound), in a direction that varies with the input: the shared
/// formulas run on it must stay inside the tolerance the GPU suite uses.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
struct DeviceLike(f32);

macro_rules! device_like_op {
    ($($trait:ident :: $method:ident, $op:tt);*) => {$(
        impl std::ops::$trait for DeviceLike {
            type Output = DeviceLike;
            fn $method(self, rhs: DeviceLike) -> DeviceLike {
                DeviceLike(self.0 $op rhs.0)
            }
        }
    )*};
}
device_like_op!(Add::add, +; Sub::sub, -; Mul::mul, *; Div::div, /);

impl std::ops::Neg for DeviceLike {
    type Output = DeviceLike;
    fn neg(self) -> DeviceLike {
        DeviceLike(-self.0)
    }
}

impl opsmith_kernels::real::Real for DeviceLike {
    fn constant(value: f64) -> Self {
        DeviceLike(value as f32)
    }
    fn mul_add(self, a: Self, b: Self) -> Self {
        DeviceLike(self.0.mul_add(a.0, b.0))
    }
    fn exp(self) -> Self {
        let off_exp2 = |t: f32| {
            let sign = if t.to_bits().count_ones().is_multiple_of(2) { 1.0 } else { -1.0 };
            ((t as f64).exp2() * (1.0 + sign * 3.0 * f64::from(f32::EPSILON))) as f32
        };
        DeviceLike(opsmith_kernels::real::exp_via_exp2(self.0, off_exp2))
    }
    fn sqrt(self) -> Self {
        DeviceLike(self.0.sqrt())
    }
    fn abs(self) -> Self {
        DeviceLike(self.0.abs())
    }
}

#[test]
fn shared_tolerance_admits_a_device_exponential() {
    use opsmith_kernels::activation as f;
    let mut rng = rand::SeedableRng::seed_from_u64(9);
    let xs = common::activation::inputs(&mut rng, 200_000, DType::F32);
    for act in [Act::Gelu, Act::Silu] {
        let (mut worst, mut worst_bwd) = (0.0f64, 0.0f64);
        for &x in &xs {
            let d = DeviceLike(x as f32);
            let (y, dy) = match act {
                Act::Gelu => (f::gelu(d), f::gelu_backward(DeviceLike(1.0), d)),
                _ => (f::silu(d), f::silu_backward(DeviceLike(1.0), d)),
            };
            let (r, dr) = (act.reference(x), act.reference_derivative(x));
            let tol = |k| common::activation::tolerance(DType::F32, r, 1.0, act.error_scale(x, k), x);
            worst = worst.max((y.0 as f64 - r).abs() / tol(false));
            worst_bwd = worst_bwd.max((dy.0 as f64 - dr).abs() / tol(true));
        }
        eprintln!("{act:?}: largest error / tolerance with a 3-ulp exp2: forward {worst:.3}, backward {worst_bwd:.3}");
        assert!(worst <= 0.5 && worst_bwd <= 0.5, "{act:?}: {worst} {worst_bwd} of the tolerance");
    }
}
