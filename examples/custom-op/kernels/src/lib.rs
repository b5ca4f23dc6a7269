//! A 3×3 weighted filter over an image, and its backward, as nvptx64 kernels for f32 and f16
//! images (f32 weights and arithmetic).
//!
//! Each kernel is written once, with `opsmith_kernels::kernel!`. Compiled for nvptx64 (by
//! `cargo xtask kernels`, or the host crate's `build-kernels` feature) that is the kernel;
//! compiled for the host it is a `const` of the same name declaring the parameters, which the
//! host crate launches with tensors: a wrong argument does not compile there.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]

#[cfg(target_arch = "nvptx64")]
use opsmith_kernels::device::{element::Element, index::GridStride, math::fma};
use opsmith_kernels::dtype::F16;

/// Sums `weight(dr, dc) · src[r + s(dr − 1), c + s(dc − 1)]` over the 3×3 neighbourhood, zero
/// outside the image, into every pixel of `out`: `s = 1` is the filter (a correlation),
/// `s = −1` its transpose, the backward.
///
/// Thread mapping: one output pixel per thread, grid-stride over `height * width`.
///
/// # Safety
/// `src` and `out` are valid for `height * width` values and do not overlap; `weights` for 9.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn stencil<T: Element>(src: *const T, weights: *const f32, out: *mut T, height: u64, width: u64, s: i64) {
    for i in GridStride::over(0, height * width) {
        let (r, c) = ((i / width) as i64, (i % width) as i64);
        let mut acc = 0.0f32;
        for dr in 0..3i64 {
            for dc in 0..3i64 {
                let (rr, cc) = (r + s * (dr - 1), c + s * (dc - 1));
                if rr >= 0 && cc >= 0 && (rr as u64) < height && (cc as u64) < width {
                    // SAFETY: (rr, cc) is inside the image, and the weight index is below 9.
                    let (w, x) = unsafe {
                        (*weights.add((dr * 3 + dc) as usize), *src.add((rr as u64 * width + cc as u64) as usize))
                    };
                    acc = fma(w, x.to_f32(), acc);
                }
            }
        }
        // SAFETY: i < height * width.
        unsafe { *out.add(i as usize) = T::from_f32(acc) };
    }
}

/// Defines the forward and backward kernel for one image dtype.
macro_rules! filter_kernels {
    ($forward:ident, $backward:ident, $t:ty) => {
        opsmith_kernels::kernel! {
            #[doc = concat!("`out[r, c] = Σ w[dr, dc] · x[r + dr − 1, c + dc − 1]`, zero padded, for ", stringify!($t), " images.")]
            ///
            /// # Safety
            /// `x` and `out` are valid for `height * width` values and do not overlap; `weights`
            /// for 9 f32.
            pub unsafe fn $forward(
                x: *const [$t; height * width],
                weights: *const [f32; 9],
                out: *mut [$t; height * width],
                height: u64,
                width: u64,
            ) {
                // SAFETY: forwarded from this kernel's contract.
                unsafe { stencil(x, weights, out, height, width, 1) }
            }
        }

        opsmith_kernels::kernel! {
            #[doc = concat!("`gx[r, c] = Σ w[dr, dc] · g[r − dr + 1, c − dc + 1]`: the forward's transpose, for ", stringify!($t), " images.")]
            ///
            /// # Safety
            /// `g` and `gx` are valid for `height * width` values and do not overlap; `weights`
            /// for 9 f32.
            pub unsafe fn $backward(
                g: *const [$t; height * width],
                weights: *const [f32; 9],
                gx: *mut [$t; height * width],
                height: u64,
                width: u64,
            ) {
                // SAFETY: forwarded from this kernel's contract.
                unsafe { stencil(g, weights, gx, height, width, -1) }
            }
        }
    };
}

filter_kernels!(filter3x3_forward_f32, filter3x3_backward_f32, f32);
filter_kernels!(filter3x3_forward_f16, filter3x3_backward_f16, F16);
