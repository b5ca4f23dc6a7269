//! Arithmetic with the rounding we mean.

unsafe extern "C" {
    /// `ex2.approx.f32`: 2^x within 2 ulp, subnormal results kept (this is not the `.ftz` form).
    #[link_name = "llvm.nvvm.ex2.approx.f32"]
    fn ex2_approx(x: f32) -> f32;
}

/// `a * b + c` with a single rounding (`fma.rn.f32`).
///
/// rustc, unlike nvcc, never contracts `a * b + c` into an FMA, so a fused kernel must ask for
/// it; this is also what makes the GPU result bit-identical to the CPU backend's `mul_add`.
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    core::intrinsics::fmaf32(a, b, c)
}

/// The correctly rounded square root (`sqrt.rn.f32`), as the CPU's `f32::sqrt`.
#[inline(always)]
pub fn sqrt(x: f32) -> f32 {
    core::intrinsics::sqrtf32(x)
}

/// `e^x` within a few ulps over the whole f32 range (`exp(±inf) = inf, 0`, NaN stays NaN,
/// subnormal results kept): `ex2.approx.f32` behind the range reduction of
/// [`exp_via_exp2`](crate::real::exp_via_exp2), which the host tests exercise.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // SAFETY: `ex2.approx.f32` is defined for every input.
    crate::real::exp_via_exp2(x, |t| unsafe { ex2_approx(t) })
}
