//! Arithmetic with the rounding we mean.

/// `a * b + c` with a single rounding (`fma.rn.f32`).
///
/// rustc, unlike nvcc, never contracts `a * b + c` into an FMA, so a fused kernel must ask for
/// it; this is also what makes the GPU result bit-identical to the CPU backend's `mul_add`.
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    core::intrinsics::fmaf32(a, b, c)
}
