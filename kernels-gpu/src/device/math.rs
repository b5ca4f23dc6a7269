//! Arithmetic with the rounding we mean.

unsafe extern "C" {
    /// `ex2.approx.f32`: 2^x on the special function unit, within 2 ulp (2^-inf = +0,
    /// 2^+inf = +inf, NaN stays NaN; subnormal results kept: this is not the `.ftz` form).
    #[link_name = "llvm.nvvm.ex2.approx.f32"]
    fn ex2_approx(x: f32) -> f32;
    /// `ex2.approx.ftz.f32`: as `ex2.approx.f32`, subnormal inputs and results flushed to
    /// zero; one special-function instruction, where the non-`ftz` form adds a range check and
    /// two multiplies around it.
    #[link_name = "llvm.nvvm.ex2.approx.ftz.f"]
    fn ex2_approx_ftz(x: f32) -> f32;
    /// `lg2.approx.f32`: log2(x) on the special function unit (absolute error about 2^-22 near
    /// 1; log2(+0) = -inf, log2 of a negative number is NaN).
    #[link_name = "llvm.nvvm.lg2.approx.f"]
    fn lg2_approx_f32(x: f32) -> f32;
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

/// The correctly rounded f64 square root (`sqrt.rn.f64`), as the CPU's `f64::sqrt`. `core` has
/// no `f64::sqrt`; the intrinsic lowers to the PTX instruction, not to a libm call.
#[inline(always)]
pub fn sqrt_f64(x: f64) -> f64 {
    core::intrinsics::sqrtf64(x)
}

/// `e^x` within a few ulps over the whole f32 range (`exp(±inf) = inf, 0`, NaN stays NaN,
/// subnormal results kept): `ex2.approx.f32` behind the range reduction of
/// [`exp_via_exp2`](crate::real::exp_via_exp2), which the host tests exercise.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // SAFETY: `ex2.approx.f32` is defined for every input.
    crate::real::exp_via_exp2(x, |t| unsafe { ex2_approx(t) })
}

/// log2(e) in f32, the factor that turns `exp(x)` into `2^(x * LOG2_E)`.
pub const LOG2_E: f32 = core::f32::consts::LOG2_E;

/// ln(2) in f32, the factor that turns `log2(x)` into `ln(x)`.
pub const LN_2: f32 = core::f32::consts::LN_2;

/// 2^x, one special-function instruction.
///
/// `core`'s `exp2f32` lowers to a libm call that the nvptx backend cannot select; the PTX
/// instruction is what nvcc's `exp2f` fast path uses too.
#[inline(always)]
pub fn exp2(x: f32) -> f32 {
    // SAFETY: the intrinsic is a pure function of its argument.
    unsafe { ex2_approx(x) }
}

/// 2^x with subnormal results flushed to zero: one special-function instruction and nothing
/// else. For softmax weights, where a weight under 2^-126 of the row's largest counts for
/// nothing anyway.
#[inline(always)]
pub fn exp2_ftz(x: f32) -> f32 {
    // SAFETY: the intrinsic is a pure function of its argument.
    unsafe { ex2_approx_ftz(x) }
}

/// log2(x), one special-function instruction (see [`exp2`] for why not `core`'s).
#[inline(always)]
pub fn log2(x: f32) -> f32 {
    // SAFETY: the intrinsic is a pure function of its argument.
    unsafe { lg2_approx_f32(x) }
}

/// `|x|`, by clearing the sign bit (what `abs.f32` does).
#[inline(always)]
pub fn abs(x: f32) -> f32 {
    f32::from_bits(x.to_bits() & 0x7fff_ffff)
}

/// A running f32 sum that carries the rounding error of each addition in a second term
/// (Neumaier's form of Kahan summation), so that a thread adding thousands of values in
/// sequence loses no more than a couple of roundings in all. Four more additions a term: free
/// in a memory-bound loop.
#[derive(Clone, Copy)]
pub struct CompensatedSum {
    sum: f32,
    compensation: f32,
}

impl CompensatedSum {
    /// Nothing added yet.
    pub const ZERO: CompensatedSum = CompensatedSum { sum: 0.0, compensation: 0.0 };

    /// Adds `x`.
    #[inline(always)]
    pub fn add(self, x: f32) -> CompensatedSum {
        let sum = self.sum + x;
        // What the addition lost: exact (Fast2Sum) when the larger magnitude comes first.
        let (big, small) = if abs(self.sum) >= abs(x) { (self.sum, x) } else { (x, self.sum) };
        CompensatedSum { sum, compensation: self.compensation + ((big - sum) + small) }
    }

    /// Both terms times `factor` (a rescaled sum of exponentials).
    #[inline(always)]
    pub fn scaled(self, factor: f32) -> CompensatedSum {
        CompensatedSum { sum: self.sum * factor, compensation: self.compensation * factor }
    }

    /// The sum. An infinite or NaN sum is returned as it is: its compensation (`inf - inf`)
    /// would only turn an infinity into NaN.
    #[inline(always)]
    pub fn total(self) -> f32 {
        if (self.sum - self.sum) == 0.0 { self.sum + self.compensation } else { self.sum }
    }
}

/// `address[0..2] += values` as one atomic `red.global.add.v2.f32` (sm_90 and newer, PTX
/// 8.1): each of the two adds is atomic, as two [`atomic_add`]s would be, in one instruction.
///
/// # Safety
/// `address` is valid for two f32 in global memory and 8-byte aligned.
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub unsafe fn atomic_add2(address: *mut f32, values: [f32; 2]) {
    // SAFETY: the caller's contract: a global, 8-byte aligned address of two f32, so its
    // generic form converts to the global window and `red` writes only those two.
    unsafe {
        core::arch::asm!(
            "{{",
            ".reg .u64 %global;",
            "cvta.to.global.u64 %global, {a};",
            "red.global.add.v2.f32 [%global], {{{x}, {y}}};",
            "}}",
            a = in(reg64) address as u64,
            x = in(reg32) values[0],
            y = in(reg32) values[1],
            options(nostack, preserves_flags),
        )
    };
}

/// `*address += value` as one atomic `red.add.f32` (no return value): scatter-adds whose
/// targets may repeat. The order of the additions to one address is not fixed.
///
/// # Safety
/// `address` is valid for an aligned f32 in global memory.
#[inline(always)]
pub unsafe fn atomic_add(address: *mut f32, value: f32) {
    // SAFETY: the caller's contract: a global address, so its generic form converts to the
    // global window, and `red.global` writes only `*address`. (A generic `red` compiles to a
    // test of the address space and a compare-and-swap loop for shared memory beside the add.)
    unsafe {
        core::arch::asm!(
            "{{",
            ".reg .u64 %global;",
            "cvta.to.global.u64 %global, {a};",
            "red.global.add.f32 [%global], {v};",
            "}}",
            a = in(reg64) address as u64,
            v = in(reg32) value,
            options(nostack, preserves_flags),
        )
    };
}
