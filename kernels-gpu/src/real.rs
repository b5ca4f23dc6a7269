//! [`Real`]: the arithmetic that the formulas shared by the kernels and the CPU backend are
//! written in.
//!
//! The activation and optimizer formulas ([`crate::activation`], [`crate::optim`]) are generic
//! over `Real`, so the CPU backend runs the very same sequence of operations as the kernels:
//! the optimizer steps give the same bits on both, and the activations differ only where the
//! exponential does (the device's comes from `ex2.approx`, see [`Real::exp`]).
//!
//! On the device `Real` is implemented for f32 only; on the host for f32 and f64, with `std`'s
//! correctly rounded operations.
use core::ops::{Add, Div, Mul, Neg, Sub};

/// A floating-point type the shared formulas compute in.
pub trait Real:
    Copy
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
{
    /// `value` rounded to nearest. The formulas pass only constants, which fold at compile
    /// time, so no f64 arithmetic reaches the PTX.
    fn constant(value: f64) -> Self;
    /// `self * a + b` with one rounding.
    fn mul_add(self, a: Self, b: Self) -> Self;
    /// `e^self`. Within an ulp on the host (`std`); within a few ulps on the device, where it is
    /// [`exp_via_exp2`] over `ex2.approx.f32`.
    fn exp(self) -> Self;
    /// The square root, correctly rounded on both.
    fn sqrt(self) -> Self;
    /// The absolute value.
    fn abs(self) -> Self;
}

/// The part of log2(e) that rounding it to f32 (`LOG2_E`) drops.
const LOG2_E_REST: f32 = 1.925_963e-8;

/// `e^x` in f32 from a base-2 exponential `exp2` (the device's `ex2.approx.f32`), adding about
/// one ulp to `exp2`'s own error over the whole range.
///
/// The plain `exp2(x * LOG2_E)` (CUDA's `__expf`) also loses the rounding error of the product,
/// up to about `|x| / 2` ulps of the result: 10 ulps at x = 20, where sigmoid and gelu still
/// care, and over 30 near the ends of the range. Two
/// FMAs recover the exact rest `r` of `x log2(e)` beyond `t = x * LOG2_E`, and
/// `2^r = 1 + r ln 2` to f32 precision, since `|r| < 2^-16`.
///
/// Past [−104, 89] e^x is 0 or inf in f32; clamping there keeps `r` finite (inf − inf would be
/// NaN). `clamp` passes NaN through.
#[inline(always)]
pub fn exp_via_exp2(x: f32, exp2: impl Fn(f32) -> f32) -> f32 {
    use core::f32::consts::{LN_2, LOG2_E};
    let x = x.clamp(-104.0, 89.0);
    let t = x * LOG2_E;
    let rest = x.mul_add(LOG2_E_REST, x.mul_add(LOG2_E, -t));
    exp2(t) * rest.mul_add(LN_2, 1.0)
}

#[cfg(target_arch = "nvptx64")]
impl Real for f32 {
    #[inline(always)]
    fn constant(value: f64) -> f32 {
        value as f32
    }
    #[inline(always)]
    fn mul_add(self, a: f32, b: f32) -> f32 {
        crate::device::math::fma(self, a, b)
    }
    #[inline(always)]
    fn exp(self) -> f32 {
        crate::device::math::exp(self)
    }
    #[inline(always)]
    fn sqrt(self) -> f32 {
        crate::device::math::sqrt(self)
    }
    #[inline(always)]
    fn abs(self) -> f32 {
        f32::from_bits(self.to_bits() & 0x7fff_ffff)
    }
}

/// `Real` on the host, through `std`'s methods of the same names.
#[cfg(not(target_arch = "nvptx64"))]
macro_rules! host_real {
    ($($t:ty),*) => {$(
        impl Real for $t {
            #[inline(always)]
            fn constant(value: f64) -> $t {
                value as $t
            }
            #[inline(always)]
            fn mul_add(self, a: $t, b: $t) -> $t {
                <$t>::mul_add(self, a, b)
            }
            #[inline(always)]
            fn exp(self) -> $t {
                <$t>::exp(self)
            }
            #[inline(always)]
            fn sqrt(self) -> $t {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn abs(self) -> $t {
                <$t>::abs(self)
            }
        }
    )*};
}

#[cfg(not(target_arch = "nvptx64"))]
host_real!(f32, f64);

#[cfg(test)]
mod tests {
    use super::*;

    /// Units in the last place of `exact` that `got` is off by (subnormals count in the
    /// subnormal ulp).
    fn ulps(got: f32, exact: f64) -> f64 {
        let ulp = (exact.abs().max(f32::MIN_POSITIVE as f64) * f32::EPSILON as f64).max(2f64.powi(-149));
        (got as f64 - exact).abs() / ulp
    }

    /// With a correctly rounded `exp2`, `exp_via_exp2` is within 1.5 ulps everywhere, where the
    /// plain `exp2(x log2 e)` is off by up to ~|x| / 2 ulps.
    #[test]
    fn exp_via_exp2_is_within_two_ulps() {
        let exact_exp2 = |t: f32| (t as f64).exp2() as f32;
        let (mut worst, mut worst_plain) = (0.0f64, 0.0f64);
        for k in -1_040_000..=890_000 {
            let x = k as f32 * 1e-4;
            let exact = (x as f64).exp();
            let got = exp_via_exp2(x, exact_exp2);
            if got.is_infinite() {
                // Overflow, where the exact value rounds to inf or is within 2 ulps of doing so.
                assert!(exact >= f32::MAX as f64 * (1.0 - 2.0 * f32::EPSILON as f64), "exp({x}) = inf");
                continue;
            }
            worst = worst.max(ulps(got, exact));
            if exact < f32::MAX as f64 {
                worst_plain = worst_plain.max(ulps(exact_exp2(x * core::f32::consts::LOG2_E), exact));
            }
        }
        std::eprintln!("exp_via_exp2: {worst:.2} ulps; plain exp2(x log2 e): {worst_plain:.2} ulps");
        assert!(worst <= 1.5, "{worst} ulps");
        assert!(worst_plain > 20.0, "the rest matters: the plain form is off by {worst_plain} ulps");
        assert_eq!(exp_via_exp2(f32::NEG_INFINITY, exact_exp2), 0.0);
        assert_eq!(exp_via_exp2(-200.0, exact_exp2), 0.0);
        assert_eq!(exp_via_exp2(f32::INFINITY, exact_exp2), f32::INFINITY);
        assert_eq!(exp_via_exp2(100.0, exact_exp2), f32::INFINITY);
        assert!(exp_via_exp2(f32::NAN, exact_exp2).is_nan());
        assert_eq!(exp_via_exp2(0.0, exact_exp2), 1.0);
        assert!(exp_via_exp2(-100.0, exact_exp2) > 0.0, "subnormal results are kept");
    }
}
