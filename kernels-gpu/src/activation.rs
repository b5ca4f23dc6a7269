//! Activations and their backward: relu, gelu (tanh form) and silu, each one fused kernel per
//! storage dtype, and the formulas themselves, which the CPU backend runs too (generic over
//! [`Real`]).
//!
//! gelu's tanh form, `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`, is computed as `x σ(z)`
//! with `z = x (GELU_LINEAR + GELU_CUBIC x²)`: the same function, since
//! `0.5 (1 + tanh u) = σ(2u)`, without the cancellation of `1 + tanh u` for negative x (at
//! x = −5 that sum is 9e-8, below half an f32 ulp of 1, so the tanh form returns 0 where gelu is
//! −2.3e-7).
//!
//! At ±inf every function returns its limit rather than NaN from `inf · 0`: gelu and silu
//! give +inf and −0, their derivatives 1 and 0. NaN gives NaN, except that `relu_backward`
//! passes no gradient where x is NaN (as `x > 0` is false).
// A PTX build without the `activation` feature keeps the formulas and drops the kernels.
#![cfg_attr(all(target_arch = "nvptx64", not(feature = "activation")), allow(unused_macros, unused_imports))]
use crate::names::ActivationKernels;
use crate::real::Real;

/// `2 √(2/π)`: gelu's `z` is `x (GELU_LINEAR + GELU_CUBIC x²)`.
pub const GELU_LINEAR: f64 = 2.0 * 0.797_884_560_802_865_4;
/// `2 √(2/π) · 0.044715`.
pub const GELU_CUBIC: f64 = GELU_LINEAR * 0.044_715;
/// `3 · GELU_CUBIC`: `dz/dx = GELU_LINEAR + GELU_CUBIC_SLOPE x²`.
pub const GELU_CUBIC_SLOPE: f64 = 3.0 * GELU_CUBIC;

/// `(σ(x), σ(−x))` from one exponential, with neither overflow nor cancellation: for
/// `e = e^(−|x|)`, which lies in [0, 1], one of them is `1 / (1 + e)` and the other
/// `e / (1 + e)`. So `σ(−large) = 0` and `σ(large) = 1` with no inf/inf, `1 − σ(x)` is
/// never formed by subtraction, and NaN gives NaN.
#[inline(always)]
pub fn sigmoid_pair<T: Real>(x: T) -> (T, T) {
    let one = T::constant(1.0);
    let e = (-x.abs()).exp();
    let near_one = one / (one + e);
    let near_zero = e * near_one;
    if x >= T::constant(0.0) { (near_one, near_zero) } else { (near_zero, near_one) }
}

/// `max(x, 0)`, with `relu(−0) = +0`; NaN stays NaN.
#[inline(always)]
pub fn relu<T: Real>(x: T) -> T {
    if x <= T::constant(0.0) { T::constant(0.0) } else { x }
}

/// `g · [x > 0]`, as a select: no gradient where x is not positive (NaN included), and the
/// gradient unchanged where it is.
#[inline(always)]
pub fn relu_backward<T: Real>(g: T, x: T) -> T {
    if x > T::constant(0.0) { g } else { T::constant(0.0) }
}

/// `x · s` for `s = σ(·) ≥ 0`, and −0 where s is 0: what the product gives for finite x, and
/// the limit, not NaN, at x = −inf.
#[inline(always)]
fn times_sigmoid<T: Real>(x: T, s: T) -> T {
    if s == T::constant(0.0) { -T::constant(0.0) } else { x * s }
}

/// `s + k t`: the derivative of `x σ(z)`, for `s = σ(z)`, `t = σ(z) σ(−z)` and
/// `k = x dz/dx`. Where t is 0 (|z| past about 100 in f32, and ±inf) it is s, which spares
/// `inf · 0` in `k t`.
#[inline(always)]
fn sigmoid_product_slope<T: Real>(s: T, t: T, k: T) -> T {
    if t == T::constant(0.0) { s } else { k.mul_add(t, s) }
}

/// gelu's `z = x (GELU_LINEAR + GELU_CUBIC x²)`, given `x²`.
#[inline(always)]
fn gelu_z<T: Real>(x: T, x2: T) -> T {
    x * T::constant(GELU_CUBIC).mul_add(x2, T::constant(GELU_LINEAR))
}

/// gelu, tanh form: `x σ(z)` (see the module docs).
#[inline(always)]
pub fn gelu<T: Real>(x: T) -> T {
    times_sigmoid(x, sigmoid_pair(gelu_z(x, x * x)).0)
}

/// `g · gelu'(x)`, where `gelu'(x) = σ(z) + x σ(z) σ(−z) dz/dx`.
#[inline(always)]
pub fn gelu_backward<T: Real>(g: T, x: T) -> T {
    let x2 = x * x;
    let (s, s_neg) = sigmoid_pair(gelu_z(x, x2));
    let dz = T::constant(GELU_CUBIC_SLOPE).mul_add(x2, T::constant(GELU_LINEAR));
    g * sigmoid_product_slope(s, s * s_neg, x * dz)
}

/// silu (swish): `x σ(x)`.
#[inline(always)]
pub fn silu<T: Real>(x: T) -> T {
    times_sigmoid(x, sigmoid_pair(x).0)
}

/// `g · silu'(x)`, where `silu'(x) = σ(x) (1 + x (1 − σ(x))) = σ(x) + x σ(x) σ(−x)`.
#[inline(always)]
pub fn silu_backward<T: Real>(g: T, x: T) -> T {
    let (s, s_neg) = sigmoid_pair(x);
    g * sigmoid_product_slope(s, s * s_neg, x)
}

/// One forward kernel: `out[i] = f(x[i])`.
macro_rules! forward_kernel {
    ($name:ident, $elem:ty, $f:ident) => {
        crate::kernel! {
            #[doc = concat!("`out[i] = ", stringify!($f), "(x[i])` for `i < n`, in f32, rounded once to the storage dtype.")]
            ///
            /// Threads map to 16-byte packs in grid-stride order, scalar for the tail or when a
            /// pointer is not 16-byte aligned; any grid size is correct.
            ///
            /// # Safety
            /// `x` and `out` are valid for `n` elements and aligned to the element type; `out` is
            /// either exactly `x` or does not overlap it.
            pub unsafe fn $name(
                x: *const [$elem; n],
                #[in_place] out: *mut [$elem; n],
                n: u64,
            ) {
                // SAFETY: forwarded from this kernel's contract.
                unsafe { crate::device::elementwise::map_elementwise::<$elem, 1, 1>([x], [out], n, |[x]| [$f(x)]) }
            }
        }
    };
}

/// One backward kernel: `gx[i] = f(g[i], x[i])`.
macro_rules! backward_kernel {
    ($name:ident, $elem:ty, $f:ident) => {
        crate::kernel! {
            #[doc = concat!("`gx[i] = ", stringify!($f), "(g[i], x[i])` for `i < n`: the upstream gradient `g` times the derivative at `x`, in one pass, in f32, rounded once to the storage dtype.")]
            ///
            /// Threads map to 16-byte packs in grid-stride order, scalar for the tail or when a
            /// pointer is not 16-byte aligned; any grid size is correct.
            ///
            /// # Safety
            /// `g`, `x` and `gx` are valid for `n` elements and aligned to the element type; `gx` is
            /// either exactly `g` or `x`, or overlaps neither.
            pub unsafe fn $name(
                g: *const [$elem; n],
                x: *const [$elem; n],
                #[in_place] gx: *mut [$elem; n],
                n: u64,
            ) {
                // SAFETY: forwarded from this kernel's contract.
                unsafe {
                    crate::device::elementwise::map_elementwise::<$elem, 2, 1>([g, x], [gx], n, |[g, x]| [$f(g, x)])
                }
            }
        }
    };
}

macro_rules! activation_family {
    (
        $(#[$table_doc:meta])*
        $table:ident, $elem:ty, {
            relu: $relu:ident,
            relu_backward: $relu_bwd:ident,
            gelu: $gelu:ident,
            gelu_backward: $gelu_bwd:ident,
            silu: $silu:ident,
            silu_backward: $silu_bwd:ident $(,)?
        }
    ) => {
        $(#[$table_doc])*
        #[cfg(not(target_arch = "nvptx64"))]
        pub const $table: ActivationKernels = ActivationKernels {
            relu: $relu,
            relu_backward: $relu_bwd,
            gelu: $gelu,
            gelu_backward: $gelu_bwd,
            silu: $silu,
            silu_backward: $silu_bwd,
        };
        forward_kernel!($relu, $elem, relu);
        backward_kernel!($relu_bwd, $elem, relu_backward);
        forward_kernel!($gelu, $elem, gelu);
        backward_kernel!($gelu_bwd, $elem, gelu_backward);
        forward_kernel!($silu, $elem, silu);
        backward_kernel!($silu_bwd, $elem, silu_backward);
    };
}

#[cfg(any(not(target_arch = "nvptx64"), feature = "activation"))]
activation_family! {
    /// The activation kernels for f32 tensors.
    F32, f32, {
        relu: relu_f32,
        relu_backward: relu_backward_f32,
        gelu: gelu_f32,
        gelu_backward: gelu_backward_f32,
        silu: silu_f32,
        silu_backward: silu_backward_f32,
    }
}

#[cfg(any(not(target_arch = "nvptx64"), feature = "activation"))]
activation_family! {
    /// The activation kernels for f16 tensors (arithmetic in f32).
    F16, crate::dtype::F16, {
        relu: relu_f16,
        relu_backward: relu_backward_f16,
        gelu: gelu_f16,
        gelu_backward: gelu_backward_f16,
        silu: silu_f16,
        silu_backward: silu_backward_f16,
    }
}

#[cfg(any(not(target_arch = "nvptx64"), feature = "activation"))]
activation_family! {
    /// The activation kernels for bf16 tensors (arithmetic in f32).
    BF16, crate::dtype::Bf16, {
        relu: relu_bf16,
        relu_backward: relu_backward_bf16,
        gelu: gelu_bf16,
        gelu_backward: gelu_backward_bf16,
        silu: silu_bf16,
        silu_backward: silu_backward_bf16,
    }
}
