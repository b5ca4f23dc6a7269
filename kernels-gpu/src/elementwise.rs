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
            add_mul_backward_split_uniform: $add_mul_bwd_split_uniform:ident,
            strided_copy: $strided_copy:ident,
            to_f32: $to_f32:ident,
            to_f16: $to_f16:ident,
            to_bf16: $to_bf16:ident $(,)?
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
            strided_copy: $strided_copy,
            to_f32: $to_f32,
            to_f16: $to_f16,
            to_bf16: $to_bf16,
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

        crate::kernel! {
            /// Copies `n` elements between two strided layouts of one shape of rank 6 (`d0..d5`,
            /// leading dims 1 for a lower rank): element `(i0, …, i5)` goes from
            /// `src[Σ ik·sk]` to `dst[Σ ik·tk]`. With the right strides this is a transpose or
            /// permutation (`src` strided, `dst` contiguous), a narrow along a dim, or one
            /// input's place in a concatenation (`dst` strided). Offsets at or past a buffer's
            /// length are skipped, so bad strides cannot read or write out of bounds.
            ///
            /// # Safety
            /// `src` is valid for `src_len` elements and `dst` for `dst_len`, both aligned to the
            /// element type; they do not overlap; `n = d0·…·d5`.
            pub unsafe fn $strided_copy(
                src: *const [$elem; src_len],
                dst: *mut [$elem; dst_len],
                n: u64,
                src_len: u64,
                dst_len: u64,
                d0: u64, d1: u64, d2: u64, d3: u64, d4: u64, d5: u64,
                s0: u64, s1: u64, s2: u64, s3: u64, s4: u64, s5: u64,
                t0: u64, t1: u64, t2: u64, t3: u64, t4: u64, t5: u64,
            ) {
                use core::num::NonZeroU64;
                let dims = [d0, d1, d2, d3, d4, d5];
                let (src_strides, dst_strides) = ([s0, s1, s2, s3, s4, s5], [t0, t1, t2, t3, t4, t5]);
                // A zero dim means nothing to copy (and would be a division by zero below).
                let mut divisors = [NonZeroU64::MIN; 6];
                for k in 0..6 {
                    match NonZeroU64::new(dims[k]) {
                        Some(d) => divisors[k] = d,
                        None => return,
                    }
                }
                for i in crate::device::index::GridStride::over(0, n) {
                    let (mut rest, mut from, mut to) = (i, 0u64, 0u64);
                    for k in (0..6).rev() {
                        let index = rest % divisors[k];
                        rest /= divisors[k];
                        from += index * src_strides[k];
                        to += index * dst_strides[k];
                    }
                    if from < src_len && to < dst_len {
                        // SAFETY: both offsets are inside their buffers (checked just above).
                        unsafe { dst.add(to as usize).write(src.add(from as usize).read()) };
                    }
                }
            }
        }

        crate::kernel! {
            /// `out[i] = x[i]` as f32 for `i < n` (exact: every value widens exactly).
            ///
            /// # Safety
            /// `x` and `out` are valid for `n` elements, aligned, and do not overlap.
            pub unsafe fn $to_f32(x: *const [$elem; n], out: *mut [f32; n], n: u64) {
                use crate::device::element::Element;
                for i in crate::device::index::GridStride::over(0, n) {
                    // SAFETY: i < n.
                    unsafe { out.add(i as usize).write(x.add(i as usize).read().to_f32()) };
                }
            }
        }

        crate::kernel! {
            /// `out[i] = x[i]` rounded to f16 (nearest even) for `i < n`.
            ///
            /// # Safety
            /// `x` and `out` are valid for `n` elements, aligned, and do not overlap.
            pub unsafe fn $to_f16(x: *const [$elem; n], out: *mut [crate::dtype::F16; n], n: u64) {
                use crate::device::element::Element;
                for i in crate::device::index::GridStride::over(0, n) {
                    // SAFETY: i < n.
                    unsafe { out.add(i as usize).write(crate::dtype::F16::from_f32(x.add(i as usize).read().to_f32())) };
                }
            }
        }

        crate::kernel! {
            /// `out[i] = x[i]` rounded to bf16 (nearest even) for `i < n`.
            ///
            /// # Safety
            /// `x` and `out` are valid for `n` elements, aligned, and do not overlap.
            pub unsafe fn $to_bf16(x: *const [$elem; n], out: *mut [crate::dtype::Bf16; n], n: u64) {
                use crate::device::element::Element;
                for i in crate::device::index::GridStride::over(0, n) {
                    // SAFETY: i < n.
                    unsafe { out.add(i as usize).write(crate::dtype::Bf16::from_f32(x.add(i as usize).read().to_f32())) };
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
        strided_copy: strided_copy_f32,
        to_f32: f32_to_f32,
        to_f16: f32_to_f16,
        to_bf16: f32_to_bf16,
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
        strided_copy: strided_copy_f16,
        to_f32: f16_to_f32,
        to_f16: f16_to_f16,
        to_bf16: f16_to_bf16,
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
        strided_copy: strided_copy_bf16,
        to_f32: bf16_to_f32,
        to_f16: bf16_to_f16,
        to_bf16: bf16_to_bf16,
    }
}
