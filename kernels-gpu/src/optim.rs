//! Optimizer steps that update parameters in place: SGD (plain, or with momentum) and Adam
//! (AdamW when weight decay is on), each one fused kernel, and their update formulas, which the
//! CPU backend runs too (generic over [`Real`]). The kernels use only FMA, multiply, divide and
//! square root, all correctly rounded in PTX as on the CPU, so both give the same bits.
use crate::names::OptimizerKernels;
use crate::real::Real;

/// Plain SGD for one element: `p − lr (g + wd p)`.
#[inline(always)]
pub fn sgd<T: Real>(p: T, g: T, lr: T, weight_decay: T) -> T {
    let d = weight_decay.mul_add(p, g);
    (-lr).mul_add(d, p)
}

/// SGD with momentum for one element: `buf' = μ buf + (g + wd p)`, `p' = p − lr buf'`.
/// Returns `(p', buf')`.
#[inline(always)]
pub fn sgd_momentum<T: Real>(p: T, g: T, buf: T, lr: T, momentum: T, weight_decay: T) -> (T, T) {
    let d = weight_decay.mul_add(p, g);
    let buf = momentum.mul_add(buf, d);
    ((-lr).mul_add(buf, p), buf)
}

/// The per-step scalars of an Adam update, derived on the host (in f64) from the
/// hyperparameters and the step number, then rounded to the arithmetic type. A kernel takes them
/// as scalar parameters in field order ([`AdamCoefficients::to_array`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamCoefficients<T> {
    /// β1, the first moment's decay.
    pub beta1: T,
    /// 1 − β1, formed in f64 (in f32, `1 − 0.999f32` keeps only 4 digits).
    pub one_minus_beta1: T,
    /// β2, the second moment's decay.
    pub beta2: T,
    /// 1 − β2, formed in f64.
    pub one_minus_beta2: T,
    /// ε, added to the bias-corrected `√v`.
    pub eps: T,
    /// `lr · weight_decay`: AdamW's decoupled decay per step.
    pub lr_weight_decay: T,
    /// `lr / (1 − β1^step)`: the learning rate with the first moment's bias correction.
    pub step_size: T,
    /// `1 / √(1 − β2^step)`: the second moment's bias correction, applied to `√v`.
    pub inv_sqrt_bias2: T,
}

impl<T: Copy> AdamCoefficients<T> {
    /// The coefficients converted one by one (f64 to the arithmetic type, on the host).
    pub fn map<U>(self, f: impl Fn(T) -> U) -> AdamCoefficients<U> {
        AdamCoefficients {
            beta1: f(self.beta1),
            one_minus_beta1: f(self.one_minus_beta1),
            beta2: f(self.beta2),
            one_minus_beta2: f(self.one_minus_beta2),
            eps: f(self.eps),
            lr_weight_decay: f(self.lr_weight_decay),
            step_size: f(self.step_size),
            inv_sqrt_bias2: f(self.inv_sqrt_bias2),
        }
    }

    /// The coefficients in field order: the order of the `adam` kernels' scalar parameters.
    pub fn to_array(self) -> [T; 8] {
        [
            self.beta1,
            self.one_minus_beta1,
            self.beta2,
            self.one_minus_beta2,
            self.eps,
            self.lr_weight_decay,
            self.step_size,
            self.inv_sqrt_bias2,
        ]
    }
}

/// Adam (AdamW) for one element. Returns `(p', m', v')`:
///
/// * `m' = β1 m + (1 − β1) g`, `v' = β2 v + (1 − β2) g²`;
/// * `p' = p − lr wd p − step_size m' / (√v' / √(1 − β2^step) + ε)`, the decay taken from the
///   old p (as PyTorch's AdamW).
#[inline(always)]
pub fn adam<T: Real>(p: T, g: T, m: T, v: T, c: &AdamCoefficients<T>) -> (T, T, T) {
    let m = c.beta1.mul_add(m, c.one_minus_beta1 * g);
    let v = c.beta2.mul_add(v, c.one_minus_beta2 * g * g);
    let denom = v.sqrt().mul_add(c.inv_sqrt_bias2, c.eps);
    let decayed = (-c.lr_weight_decay).mul_add(p, p);
    ((-c.step_size).mul_add(m / denom, decayed), m, v)
}

macro_rules! optimizer_family {
    (
        $(#[$table_doc:meta])*
        $table:ident, $elem:ty, {
            sgd: $sgd:ident,
            sgd_momentum: $sgd_momentum:ident,
            adam: $adam:ident $(,)?
        }
    ) => {
        $(#[$table_doc])*
        #[cfg(not(target_arch = "nvptx64"))]
        pub const $table: OptimizerKernels = OptimizerKernels {
            sgd: $sgd,
            sgd_momentum: $sgd_momentum,
            adam: $adam,
        };

        crate::kernel! {
            /// Plain SGD: `param_out[i] = param[i] − lr (grad[i] + weight_decay param[i])` for
            /// `i < n`, in f32 with FMAs.
            ///
            /// Threads map to 16-byte packs in grid-stride order, scalar for the tail or when a
            /// pointer is not 16-byte aligned; any grid size is correct.
            ///
            /// # Safety
            /// Every pointer is valid for `n` elements and aligned to the element type;
            /// `param_out` is exactly `param` (the in-place update) or `grad`, or overlaps neither.
            pub unsafe fn $sgd(
                param: *const [$elem; n],
                grad: *const [$elem; n],
                #[in_place] param_out: *mut [$elem; n],
                lr: f32,
                weight_decay: f32,
                n: u64,
            ) {
                // SAFETY: forwarded from this kernel's contract.
                unsafe {
                    crate::device::elementwise::map_elementwise::<$elem, 2, 1>([param, grad], [param_out], n, |[p, g]| {
                        [sgd(p, g, lr, weight_decay)]
                    })
                }
            }
        }

        crate::kernel! {
            /// SGD with momentum: `buf_out = momentum buf + (grad + weight_decay param)` and
            /// `param_out = param − lr buf_out`, elementwise for `i < n`, in f32 with FMAs.
            ///
            /// Thread mapping as for the plain SGD kernel of this family.
            ///
            /// # Safety
            /// Every pointer is valid for `n` elements and aligned to the element type; each output
            /// is exactly one input (in place: `param_out` is `param`, `buf_out` is `buf`) or
            /// overlaps none, and the outputs do not overlap each other.
            pub unsafe fn $sgd_momentum(
                param: *const [$elem; n],
                grad: *const [$elem; n],
                buf: *const [$elem; n],
                #[in_place] param_out: *mut [$elem; n],
                #[in_place] buf_out: *mut [$elem; n],
                lr: f32,
                momentum: f32,
                weight_decay: f32,
                n: u64,
            ) {
                // SAFETY: forwarded from this kernel's contract.
                unsafe {
                    crate::device::elementwise::map_elementwise::<$elem, 3, 2>(
                        [param, grad, buf],
                        [param_out, buf_out],
                        n,
                        |[p, g, b]| {
                            let (p, b) = sgd_momentum(p, g, b, lr, momentum, weight_decay);
                            [p, b]
                        },
                    )
                }
            }
        }

        crate::kernel! {
            /// Adam (AdamW) in one pass: reads `param`, `grad`, `m`, `v` and writes the updated
            /// parameter and moments (see [`adam`]), elementwise for `i < n`, in f32. The scalars are
            /// [`AdamCoefficients`] in field order.
            ///
            /// Thread mapping as for the plain SGD kernel of this family.
            ///
            /// # Safety
            /// Every pointer is valid for `n` elements and aligned to the element type; each output
            /// is exactly one input (in place: `param_out` is `param`, `m_out` is `m`, `v_out` is
            /// `v`) or overlaps none, and the outputs do not overlap each other.
            pub unsafe fn $adam(
                param: *const [$elem; n],
                grad: *const [$elem; n],
                m: *const [$elem; n],
                v: *const [$elem; n],
                #[in_place] param_out: *mut [$elem; n],
                #[in_place] m_out: *mut [$elem; n],
                #[in_place] v_out: *mut [$elem; n],
                beta1: f32,
                one_minus_beta1: f32,
                beta2: f32,
                one_minus_beta2: f32,
                eps: f32,
                lr_weight_decay: f32,
                step_size: f32,
                inv_sqrt_bias2: f32,
                n: u64,
            ) {
                let c = AdamCoefficients {
                    beta1,
                    one_minus_beta1,
                    beta2,
                    one_minus_beta2,
                    eps,
                    lr_weight_decay,
                    step_size,
                    inv_sqrt_bias2,
                };
                // SAFETY: forwarded from this kernel's contract.
                unsafe {
                    crate::device::elementwise::map_elementwise::<$elem, 4, 3>(
                        [param, grad, m, v],
                        [param_out, m_out, v_out],
                        n,
                        |[p, g, m, v]| {
                            let (p, m, v) = adam(p, g, m, v, &c);
                            [p, m, v]
                        },
                    )
                }
            }
        }
    };
}

optimizer_family! {
    /// The optimizer kernels for f32 parameters, gradients and state.
    F32, f32, {
        sgd: sgd_f32,
        sgd_momentum: sgd_momentum_f32,
        adam: adam_f32,
    }
}
