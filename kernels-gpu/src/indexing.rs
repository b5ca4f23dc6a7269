//! Kernels that index: sums and maxima along one dim, `index_select` and `gather` and their
//! backward (a scatter-add), and the random fills of `rand`/`randn`. They ship in the elementwise family's module.
//!
//! A dim of a contiguous tensor splits it into `[outer, d, inner]`: element `(a, j, i)` is at
//! `(a·d + j)·inner + i`. Every kernel here takes that view, so one kernel serves every rank.
//!
//! The kernels map one thread to one output element, grid-stride. Along the last dim
//! (`inner = 1`) a thread reads its row alone: correct for every shape, not tuned for long rows.
use crate::names::{DimKernels, GatherKernels};

macro_rules! dim_family {
    (
        $(#[$table_doc:meta])*
        $table:ident, $elem:ty, $bits:expr, {
            sum_dim: $sum:ident,
            max_dim: $max:ident,
            uniform: $uniform:ident,
            normal: $normal:ident,
            scatter_add: $scatter:ident $(,)?
        }
    ) => {
        $(#[$table_doc])*
        #[cfg(not(target_arch = "nvptx64"))]
        pub const $table: DimKernels =
            DimKernels { sum_dim: $sum, max_dim: $max, uniform: $uniform, normal: $normal, scatter_add: $scatter };

        crate::kernel! {
            /// `out[a, index, i] += src[a, j, i]` in f32 over the `[outer, k, inner]` view of
            /// `src` and the `[outer, d, inner]` view of `out`: the backward of `index_select`
            /// (`index_len = k`, the index of `j` is `index[j]`) and of `gather`
            /// (`index_len = outer·k·inner`, one index per element of `src`). Repeated targets
            /// add atomically, in no fixed order; an index outside `0..d` adds nothing.
            ///
            /// # Safety
            /// `src` is valid for `outer·k·inner` elements, `index` for `index_len`, which is `k`
            /// or `outer·k·inner`, and `out` for `outer·d·inner` f32; `out` overlaps neither input.
            pub unsafe fn $scatter(
                src: *const [$elem; outer * k * inner],
                index: *const [i64; index_len],
                out: *mut [f32; outer * d * inner],
                outer: u64,
                d: u64,
                inner: u64,
                k: u64,
                index_len: u64,
            ) {
                use crate::device::{element::Element, index, math::atomic_add};
                let (Some(inner_nz), Some(k_nz)) =
                    (core::num::NonZeroU64::new(inner), core::num::NonZeroU64::new(k))
                else {
                    return;
                };
                let per_element = index_len != k;
                for o in index::GridStride::over(0, outer * k * inner) {
                    let (rest, i) = (o / inner_nz, o % inner_nz);
                    let (a, j) = (rest / k_nz, rest % k_nz);
                    // SAFETY: o < outer·k·inner = index_len when per element, else j < k.
                    let at = unsafe { index.add(if per_element { o } else { j } as usize).read() };
                    if at >= 0 && (at as u64) < d {
                        // SAFETY: o < outer·k·inner; a < outer, at < d, i < inner.
                        unsafe {
                            let value = src.add(o as usize).read().to_f32();
                            atomic_add(out.add(((a * d + at as u64) * inner + i) as usize), value);
                        }
                    }
                }
            }
        }

        crate::kernel! {
            /// `out[a, i] = x[a, 0, i] + … + x[a, d - 1, i]` over the `[outer, d, inner]` view,
            /// added in f32 (compensated) in order of `j`, then rounded to the dtype.
            ///
            /// # Safety
            /// `x` is valid for `outer·d·inner` elements and `out` for `outer·inner`; they do not
            /// overlap.
            pub unsafe fn $sum(
                x: *const [$elem; outer * d * inner],
                out: *mut [$elem; outer * inner],
                outer: u64,
                d: u64,
                inner: u64,
            ) {
                use crate::device::{element::Element, index, math::CompensatedSum};
                let Some(inner_nz) = core::num::NonZeroU64::new(inner) else { return };
                for o in index::GridStride::over(0, outer * inner) {
                    let (a, i) = (o / inner_nz, o % inner_nz);
                    let base = a * d * inner + i;
                    let mut acc = CompensatedSum::ZERO;
                    for j in 0..d {
                        // SAFETY: a < outer, j < d, i < inner, so the offset is inside `x`.
                        acc = acc.add(unsafe { x.add((base + j * inner) as usize).read() }.to_f32());
                    }
                    // SAFETY: o < outer·inner.
                    unsafe { out.add(o as usize).write(<$elem>::from_f32(acc.total())) };
                }
            }
        }

        crate::kernel! {
            /// `values[a, i]` = the largest of `x[a, :, i]` and `indices[a, i]` its first index
            /// `j` along the dim. A NaN is larger than everything (the first NaN wins), as in
            /// PyTorch; `d = 0` writes nothing (the host refuses it).
            ///
            /// # Safety
            /// `x` is valid for `outer·d·inner` elements, `values` and `indices` for
            /// `outer·inner` each; no two overlap.
            pub unsafe fn $max(
                x: *const [$elem; outer * d * inner],
                values: *mut [$elem; outer * inner],
                indices: *mut [i64; outer * inner],
                outer: u64,
                d: u64,
                inner: u64,
            ) {
                use crate::device::{element::Element, index};
                let Some(inner_nz) = core::num::NonZeroU64::new(inner) else { return };
                if d == 0 {
                    return;
                }
                for o in index::GridStride::over(0, outer * inner) {
                    let (a, i) = (o / inner_nz, o % inner_nz);
                    let base = a * d * inner + i;
                    // SAFETY: d > 0, so element j = 0 is inside `x`.
                    let (mut best, mut at) = (unsafe { x.add(base as usize).read() }, 0u64);
                    let mut j = 1;
                    while j < d && !best.to_f32().is_nan() {
                        // SAFETY: j < d.
                        let v = unsafe { x.add((base + j * inner) as usize).read() };
                        if v.to_f32() > best.to_f32() || v.to_f32().is_nan() {
                            (best, at) = (v, j);
                        }
                        j += 1;
                    }
                    // SAFETY: o < outer·inner.
                    unsafe {
                        values.add(o as usize).write(best);
                        indices.add(o as usize).write(at as i64);
                    }
                }
            }
        }

        crate::kernel! {
            /// `out[i]` = element `i` of the uniform stream of `seed`, in `[0, 1)`
            /// ([`uniform_f32`](crate::random::uniform_f32) with this dtype's significant bits).
            ///
            /// # Safety
            /// `out` is valid for `n` elements.
            pub unsafe fn $uniform(out: *mut [$elem; n], n: u64, seed: u64) {
                use crate::device::{element::Element, index};
                for i in index::GridStride::over(0, n) {
                    let value = crate::random::uniform_f32(seed, i, $bits);
                    // SAFETY: i < n.
                    unsafe { out.add(i as usize).write(<$elem>::from_f32(value)) };
                }
            }
        }

        crate::kernel! {
            /// `out[i]` = element `i` of the standard normal stream of `seed`
            /// ([`normal_f32`](crate::random::normal_f32)), rounded to the dtype.
            ///
            /// # Safety
            /// `out` is valid for `n` elements.
            pub unsafe fn $normal(out: *mut [$elem; n], n: u64, seed: u64) {
                use crate::device::{element::Element, index};
                for i in index::GridStride::over(0, n) {
                    let value = crate::random::normal_f32(seed, i);
                    // SAFETY: i < n.
                    unsafe { out.add(i as usize).write(<$elem>::from_f32(value)) };
                }
            }
        }
    };
}

/// Every bit set: NaN in each float dtype, the largest `u32`, and -1 as an `i64`. What an
/// out-of-range index reads on the device, where the kernel cannot return an error.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn all_ones<T: Copy>() -> T {
    let mut value = core::mem::MaybeUninit::<T>::uninit();
    // SAFETY: every element type here (floats and integers) is valid for every bit pattern.
    unsafe {
        value.as_mut_ptr().write_bytes(0xff, 1);
        value.assume_init()
    }
}

/// `out[a, j, i] = src[a, at, i]` over the `[outer, k, inner]` view of `out`, with `at` =
/// `index_of(o, j)` for output element `o`; all-ones bits where `at` is outside `0..d`.
///
/// # Safety
/// `src` is valid for `outer·d·inner` elements and `out` for `outer·k·inner`; `index_of` reads
/// only valid memory for `o < outer·k·inner` and `j < k`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn pick<T: Copy>(
    src: *const T,
    out: *mut T,
    [outer, d, inner, k]: [u64; 4],
    index_of: impl Fn(u64, u64) -> i64,
) {
    let (Some(inner_nz), Some(k_nz)) = (core::num::NonZeroU64::new(inner), core::num::NonZeroU64::new(k)) else {
        return;
    };
    for o in crate::device::index::GridStride::over(0, outer * k * inner) {
        let (rest, i) = (o / inner_nz, o % inner_nz);
        let (a, j) = (rest / k_nz, rest % k_nz);
        let at = index_of(o, j);
        let value = if at >= 0 && (at as u64) < d {
            // SAFETY: a < outer, at < d, i < inner.
            unsafe { src.add(((a * d + at as u64) * inner + i) as usize).read() }
        } else {
            all_ones()
        };
        // SAFETY: o < outer·k·inner.
        unsafe { out.add(o as usize).write(value) };
    }
}

macro_rules! gather_family {
    (
        $(#[$table_doc:meta])*
        $table:ident, $elem:ty, { index_select: $select:ident, gather: $gather:ident $(,)? }
    ) => {
        $(#[$table_doc])*
        #[cfg(not(target_arch = "nvptx64"))]
        pub const $table: GatherKernels = GatherKernels { index_select: $select, gather: $gather };

        crate::kernel! {
            /// `out[a, j, i] = src[a, index[j], i]` over the `[outer, d, inner]` view of `src`
            /// and the `[outer, k, inner]` view of `out`. An index outside `0..d` reads
            /// all-ones bits (NaN for floats) instead of memory outside `src`.
            ///
            /// # Safety
            /// `src` is valid for `outer·d·inner` elements, `index` for `k`, `out` for
            /// `outer·k·inner`; `out` overlaps neither input.
            pub unsafe fn $select(
                src: *const [$elem; outer * d * inner],
                index: *const [i64; k],
                out: *mut [$elem; outer * k * inner],
                outer: u64,
                d: u64,
                inner: u64,
                k: u64,
            ) {
                // SAFETY: forwarded from this kernel's contract; j < k.
                unsafe { pick(src, out, [outer, d, inner, k], |_, j| index.add(j as usize).read()) }
            }
        }

        crate::kernel! {
            /// `out[a, j, i] = src[a, index[a, j, i], i]` over the `[outer, d, inner]` view of
            /// `src` and the `[outer, k, inner]` views of `index` and `out`. An index outside
            /// `0..d` reads all-ones bits (NaN for floats) instead of memory outside `src`.
            ///
            /// # Safety
            /// `src` is valid for `outer·d·inner` elements, `index` and `out` for
            /// `outer·k·inner`; `out` overlaps neither input.
            pub unsafe fn $gather(
                src: *const [$elem; outer * d * inner],
                index: *const [i64; outer * k * inner],
                out: *mut [$elem; outer * k * inner],
                outer: u64,
                d: u64,
                inner: u64,
                k: u64,
            ) {
                // SAFETY: forwarded from this kernel's contract; o < outer·k·inner.
                unsafe { pick(src, out, [outer, d, inner, k], |o, _| index.add(o as usize).read()) }
            }
        }
    };
}

dim_family! {
    /// Sums and maxima along a dim, and random fills, for f32 tensors.
    DIM_F32, f32, 24, { sum_dim: sum_dim_f32, max_dim: max_dim_f32, uniform: uniform_f32, normal: normal_f32,
    scatter_add: scatter_add_f32 }
}
dim_family! {
    /// Sums and maxima along a dim, and random fills, for f16 tensors.
    DIM_F16, crate::dtype::F16, 11,
    { sum_dim: sum_dim_f16, max_dim: max_dim_f16, uniform: uniform_f16, normal: normal_f16,
    scatter_add: scatter_add_f16 }
}
dim_family! {
    /// Sums and maxima along a dim, and random fills, for bf16 tensors.
    DIM_BF16, crate::dtype::Bf16, 8,
    { sum_dim: sum_dim_bf16, max_dim: max_dim_bf16, uniform: uniform_bf16, normal: normal_bf16,
    scatter_add: scatter_add_bf16 }
}

gather_family! {
    /// `index_select` and `gather` of f32 tensors.
    GATHER_F32, f32, { index_select: index_select_f32, gather: gather_f32 }
}
gather_family! {
    /// `index_select` and `gather` of f16 tensors.
    GATHER_F16, crate::dtype::F16, { index_select: index_select_f16, gather: gather_f16 }
}
gather_family! {
    /// `index_select` and `gather` of bf16 tensors.
    GATHER_BF16, crate::dtype::Bf16, { index_select: index_select_bf16, gather: gather_bf16 }
}
gather_family! {
    /// `index_select` and `gather` of f64 tensors.
    GATHER_F64, f64, { index_select: index_select_f64, gather: gather_f64 }
}
gather_family! {
    /// `index_select` and `gather` of u32 tensors.
    GATHER_U32, u32, { index_select: index_select_u32, gather: gather_u32 }
}
gather_family! {
    /// `index_select` and `gather` of i64 tensors.
    GATHER_I64, i64, { index_select: index_select_i64, gather: gather_i64 }
}
