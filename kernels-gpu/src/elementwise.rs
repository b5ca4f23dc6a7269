//! The elementwise kernel family: `add`, `sub`, `mul`, `div`, `fused_mul_add`, `add_mul`, `add_mul_backward`
//! (from a gradient tensor or from one gradient value everywhere), one set per storage dtype.
//!
//! [`elementwise_family!`] defines, from one list of identifiers, both the `extern "ptx-kernel"`
//! entry points (on nvptx64 only) and the [`ElementwiseKernels`] name table (everywhere).
use crate::names::ElementwiseKernels;

macro_rules! elementwise_family {
    (
        $(#[$table_doc:meta])*
        $table:ident, $elem:ty, {
            add: $add:ident,
            sub: $sub:ident,
            mul: $mul:ident,
            div: $div:ident,
            affine: $affine:ident,
            fused_mul_add: $fma:ident,
            add_mul: $add_mul:ident,
            add_mul_backward: $add_mul_bwd:ident,
            add_mul_backward_uniform: $add_mul_bwd_uniform:ident,
            add_mul_backward_split: $add_mul_bwd_split:ident,
            add_mul_backward_split_uniform: $add_mul_bwd_split_uniform:ident $(,)?
        }
    ) => {
        $(#[$table_doc])*
        #[cfg(not(target_arch = "nvptx64"))]
        pub const $table: ElementwiseKernels = ElementwiseKernels {
            add: $add,
            sub: $sub,
            mul: $mul,
            div: $div,
            affine: $affine,
            fused_mul_add: $fma,
            add_mul: $add_mul,
            add_mul_backward: $add_mul_bwd,
            add_mul_backward_uniform: $add_mul_bwd_uniform,
            add_mul_backward_split: $add_mul_bwd_split,
            add_mul_backward_split_uniform: $add_mul_bwd_split_uniform,
        };

        crate::kernel! {
            /// `out[i] = a[i] + b[i]` for `i < n`.
            ///
            /// Threads map to 16-byte packs in grid-stride order, scalar for the tail or when any
            /// pointer is not 16-byte aligned; any grid size is correct.
            ///
            /// # Safety
            /// `a`, `b` and `out` are valid for `n` elements and aligned to the element type; `out`
            /// is either exactly `a` or `b`, or overlaps neither.
            pub unsafe fn $add(
                a: *const [$elem; n],
                b: *const [$elem; n],
                #[in_place] out: *mut [$elem; n],
                n: u64,
            ) {
                // SAFETY: forwarded from this kernel's contract.
                unsafe { crate::device::elementwise::map_elementwise::<$elem, 2, 1>([a, b], [out], n, |[a, b]| [a + b]) }
            }
        }

        crate::kernel! {
            /// `out[i] = a[i] - b[i]` for `i < n`.
            ///
            /// Thread mapping as for the `add` kernel of this family.
            ///
            /// # Safety
            /// As for `add`: `a`, `b` and `out` are valid for `n` elements and aligned to the element
            /// type; `out` is either exactly `a` or `b`, or overlaps neither.
            pub unsafe fn $sub(
                a: *const [$elem; n],
                b: *const [$elem; n],
                #[in_place] out: *mut [$elem; n],
                n: u64,
            ) {
                // SAFETY: forwarded from this kernel's contract.
                unsafe { crate::device::elementwise::map_elementwise::<$elem, 2, 1>([a, b], [out], n, |[a, b]| [a - b]) }
            }
        }

        crate::kernel! {
            /// `out[i] = x[i] * alpha + beta` for `i < n`, one rounding in f32 (`fma.rn.f32`): negation,
            /// scaling and shifting by a scalar.
            ///
            /// Thread mapping as for the `add` kernel of this family.
            ///
            /// # Safety
            /// `x` and `out` are valid for `n` elements and aligned to the element type; `out` is
            /// either exactly `x` or does not overlap it.
            pub unsafe fn $affine(
                x: *const [$elem; n],
                #[in_place] out: *mut [$elem; n],
                alpha: f32,
                beta: f32,
                n: u64,
            ) {
                use crate::device::math::fma;
                // SAFETY: forwarded from this kernel's contract.
                unsafe { crate::device::elementwise::map_elementwise::<$elem, 1, 1>([x], [out], n, |[x]| [fma(x, alpha, beta)]) }
            }
        }

        crate::kernel! {
            /// `out[i] = a[i] * b[i]` for `i < n`.
            ///
            /// Thread mapping as for the `add` kernel of this family.
            ///
            /// # Safety
            /// As for `add`: `a`, `b` and `out` are valid for `n` elements and aligned to the element
            /// type; `out` is either exactly `a` or `b`, or overlaps neither.
            pub unsafe fn $mul(
                a: *const [$elem; n],
                b: *const [$elem; n],
                #[in_place] out: *mut [$elem; n],
                n: u64,
            ) {
                // SAFETY: forwarded from this kernel's contract.
                unsafe { crate::device::elementwise::map_elementwise::<$elem, 2, 1>([a, b], [out], n, |[a, b]| [a * b]) }
            }
        }

        crate::kernel! {
            /// `out[i] = a[i] / b[i]` for `i < n`, correctly rounded in f32 (`div.rn.f32`), then
            /// rounded to the storage dtype.
            ///
            /// Thread mapping as for the `add` kernel of this family.
            ///
            /// # Safety
            /// As for `add`: `a`, `b` and `out` are valid for `n` elements and aligned to the element
            /// type; `out` is either exactly `a` or `b`, or overlaps neither.
            pub unsafe fn $div(
                a: *const [$elem; n],
                b: *const [$elem; n],
                #[in_place] out: *mut [$elem; n],
                n: u64,
            ) {
                // SAFETY: forwarded from this kernel's contract.
                unsafe { crate::device::elementwise::map_elementwise::<$elem, 2, 1>([a, b], [out], n, |[a, b]| [a / b]) }
            }
        }

        crate::kernel! {
            /// `d[i] = a[i] * b[i] + c[i]` for `i < n`, with one rounding in f32 (`fma.rn.f32`),
            /// then one rounding to the storage dtype.
            ///
            /// Thread mapping as for the `add` kernel of this family.
            ///
            /// # Safety
            /// `a`, `b`, `c` and `d` are valid for `n` elements and aligned to the element type; `d`
            /// is either exactly one of the inputs or overlaps none of them.
            pub unsafe fn $fma(
                a: *const [$elem; n],
                b: *const [$elem; n],
                c: *const [$elem; n],
                #[in_place] d: *mut [$elem; n],
                n: u64,
            ) {
                use crate::device::math::fma;
                // SAFETY: forwarded from this kernel's contract.
                unsafe { crate::device::elementwise::map_elementwise::<$elem, 3, 1>([a, b, c], [d], n, |[a, b, c]| [fma(a, b, c)]) }
            }
        }

        crate::kernel! {
            /// `z[i] = (x[i] + y[i]) * w[i]` for `i < n`, in f32 with the sum rounded to f32.
            ///
            /// Thread mapping as for the `add` kernel of this family.
            ///
            /// # Safety
            /// `x`, `y`, `w` and `z` are valid for `n` elements and aligned to the element type; `z`
            /// is either exactly one of the inputs or overlaps none of them.
            pub unsafe fn $add_mul(
                x: *const [$elem; n],
                y: *const [$elem; n],
                w: *const [$elem; n],
                #[in_place] z: *mut [$elem; n],
                n: u64,
            ) {
                // SAFETY: forwarded from this kernel's contract.
                unsafe { crate::device::elementwise::map_elementwise::<$elem, 3, 1>([x, y, w], [z], n, |[x, y, w]| [(x + y) * w]) }
            }
        }

        crate::kernel! {
            /// The backward of `z = (x + y) * w` for an upstream gradient `g`, in one pass:
            /// `gxy[i] = g[i] * w[i]` (the gradient of both `x` and `y`) and
            /// `gw[i] = g[i] * (x[i] + y[i])`.
            ///
            /// Thread mapping as for the `add` kernel of this family.
            ///
            /// # Safety
            /// All six pointers are valid for `n` elements and aligned to the element type; each of
            /// `gxy` and `gw` is exactly one input or overlaps no input, and they do not overlap each
            /// other.
            pub unsafe fn $add_mul_bwd(
                g: *const [$elem; n],
                x: *const [$elem; n],
                y: *const [$elem; n],
                w: *const [$elem; n],
                #[in_place] gxy: *mut [$elem; n],
                #[in_place] gw: *mut [$elem; n],
                n: u64,
            ) {
                // SAFETY: forwarded from this kernel's contract.
                unsafe {
                    crate::device::elementwise::map_elementwise::<$elem, 4, 2>(
                        [g, x, y, w],
                        [gxy, gw],
                        n,
                        |[g, x, y, w]| [g * w, g * (x + y)],
                    )
                }
            }
        }

        crate::kernel! {
            /// The backward of `z = (x + y) * w` when the upstream gradient is `g` in every element
            /// (the gradient of a `sum` or `mean`): `gxy[i] = g * w[i]` and `gw[i] = g * (x[i] + y[i])`,
            /// without reading a gradient tensor.
            ///
            /// Thread mapping as for the `add` kernel of this family.
            ///
            /// # Safety
            /// All five pointers are valid for `n` elements and aligned to the element type; each of
            /// `gxy` and `gw` is exactly one input or overlaps no input, and they do not overlap each
            /// other.
            pub unsafe fn $add_mul_bwd_uniform(
                x: *const [$elem; n],
                y: *const [$elem; n],
                w: *const [$elem; n],
                #[in_place] gxy: *mut [$elem; n],
                #[in_place] gw: *mut [$elem; n],
                g: f32,
                n: u64,
            ) {
                // SAFETY: forwarded from this kernel's contract.
                unsafe {
                    crate::device::elementwise::map_elementwise::<$elem, 3, 2>(
                        [x, y, w],
                        [gxy, gw],
                        n,
                        |[x, y, w]| [g * w, g * (x + y)],
                    )
                }
            }
        }

        crate::kernel! {
            /// The backward of `z = (x + y) * w` when `x` and `y` are distinct variables that
            /// each need a gradient of their own: `gx[i] = gy[i] = g[i] * w[i]` and
            /// `gw[i] = g[i] * (x[i] + y[i])`, in one pass. Writing `gy` here costs one store
            /// per element; a copy of `gx` afterwards would cost a load, a store and a launch.
            ///
            /// Thread mapping as for the `add` kernel of this family.
            ///
            /// # Safety
            /// All seven pointers are valid for `n` elements and aligned to the element type;
            /// each output is exactly one input or overlaps no input, and the outputs do not
            /// overlap each other.
            pub unsafe fn $add_mul_bwd_split(
                g: *const [$elem; n],
                x: *const [$elem; n],
                y: *const [$elem; n],
                w: *const [$elem; n],
                #[in_place] gx: *mut [$elem; n],
                #[in_place] gy: *mut [$elem; n],
                #[in_place] gw: *mut [$elem; n],
                n: u64,
            ) {
                // SAFETY: forwarded from this kernel's contract.
                unsafe {
                    crate::device::elementwise::map_elementwise::<$elem, 4, 3>(
                        [g, x, y, w],
                        [gx, gy, gw],
                        n,
                        |[g, x, y, w]| [g * w, g * w, g * (x + y)],
                    )
                }
            }
        }

        crate::kernel! {
            /// As the split backward of this family for an upstream gradient that is `g` in every
            /// element: `gx[i] = gy[i] = g * w[i]` and `gw[i] = g * (x[i] + y[i])`.
            ///
            /// Thread mapping as for the `add` kernel of this family.
            ///
            /// # Safety
            /// All six pointers are valid for `n` elements and aligned to the element type; each
            /// output is exactly one input or overlaps no input, and the outputs do not overlap
            /// each other.
            pub unsafe fn $add_mul_bwd_split_uniform(
                x: *const [$elem; n],
                y: *const [$elem; n],
                w: *const [$elem; n],
                #[in_place] gx: *mut [$elem; n],
                #[in_place] gy: *mut [$elem; n],
                #[in_place] gw: *mut [$elem; n],
                g: f32,
                n: u64,
            ) {
                // SAFETY: forwarded from this kernel's contract.
                unsafe {
                    crate::device::elementwise::map_elementwise::<$elem, 3, 3>(
                        [x, y, w],
                        [gx, gy, gw],
                        n,
                        |[x, y, w]| [g * w, g * w, g * (x + y)],
                    )
                }
            }
        }
    };
}

elementwise_family! {
    /// The elementwise kernels for f32 tensors.
    F32, f32, {
        add: add_f32,
        sub: sub_f32,
        mul: mul_f32,
        div: div_f32,
        affine: affine_f32,
        fused_mul_add: fused_mul_add_f32,
        add_mul: add_mul_f32,
        add_mul_backward: add_mul_backward_f32,
        add_mul_backward_uniform: add_mul_backward_uniform_f32,
        add_mul_backward_split: add_mul_backward_split_f32,
        add_mul_backward_split_uniform: add_mul_backward_split_uniform_f32,
    }
}

elementwise_family! {
    /// The elementwise kernels for f16 tensors (arithmetic in f32).
    F16, crate::dtype::F16, {
        add: add_f16,
        sub: sub_f16,
        mul: mul_f16,
        div: div_f16,
        affine: affine_f16,
        fused_mul_add: fused_mul_add_f16,
        add_mul: add_mul_f16,
        add_mul_backward: add_mul_backward_f16,
        add_mul_backward_uniform: add_mul_backward_uniform_f16,
        add_mul_backward_split: add_mul_backward_split_f16,
        add_mul_backward_split_uniform: add_mul_backward_split_uniform_f16,
    }
}

elementwise_family! {
    /// The elementwise kernels for bf16 tensors (arithmetic in f32).
    BF16, crate::dtype::Bf16, {
        add: add_bf16,
        sub: sub_bf16,
        mul: mul_bf16,
        div: div_bf16,
        affine: affine_bf16,
        fused_mul_add: fused_mul_add_bf16,
        add_mul: add_mul_bf16,
        add_mul_backward: add_mul_backward_bf16,
        add_mul_backward_uniform: add_mul_backward_uniform_bf16,
        add_mul_backward_split: add_mul_backward_split_bf16,
        add_mul_backward_split_uniform: add_mul_backward_split_uniform_bf16,
    }
}
