//! `y = gelu(x + b) + r` (bias, GeLU with the tanh approximation, residual) and its backward,
//! fused into one pass over memory each, as nvptx64 kernels for f32, f16 and bf16 (arithmetic
//! in f32).
//!
//! Composed from separate ops, the forward reads and writes the `rows × cols` activations 7
//! times (`x + b`: 2, `gelu`: 2, `+ r`: 3); fused, 3 times (read `x` and `r`, write `y`). The
//! gelu formulas are opsmith's own (`opsmith_kernels::activation`), so the fused op computes
//! what `ops::gelu` does.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]

use opsmith_kernels::dtype::{Bf16, F16};
#[cfg(target_arch = "nvptx64")]
use opsmith_kernels::{
    activation::{gelu, gelu_backward},
    device::element::Element,
    device::index::GridStride,
    device::memory::{is_pack_aligned, load_pack, store_pack},
};

/// `out[i] = f(x[i] + b[i % cols], other[i])` for the `rows × cols` elements of row-major
/// matrices `x`, `other` and `out`, `b` being one row.
///
/// Thread mapping: when `cols` is a whole number of 16-byte packs and every pointer is
/// 16-byte aligned, one pack per thread in grid-stride order (one vector load each of `x`, `b`
/// and `other`, one vector store); otherwise one element per thread. Any grid size is correct.
///
/// # Safety
/// `x`, `other` and `out` are valid for `rows * cols` elements, `b` for `cols`, all aligned to
/// `T`; `out` overlaps none of the inputs.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn map_with_row_bias<T: Element>(
    x: *const T,
    b: *const T,
    other: *const T,
    out: *mut T,
    rows: u64,
    cols: u64,
    f: impl Fn(f32, f32) -> f32,
) {
    let n = rows * cols;
    let lanes = T::LANES as u64;
    let aligned = is_pack_aligned(x) && is_pack_aligned(b) && is_pack_aligned(other) && is_pack_aligned(out);
    if aligned && cols % lanes == 0 {
        let row_packs = cols / lanes;
        for p in GridStride::over(0, n / lanes) {
            // SAFETY: pack p lies inside the matrices (p < n / lanes) and pack p % row_packs inside
            // the bias row; every pointer is 16-byte aligned.
            let (xs, bs, os) = unsafe {
                (T::unpack(load_pack(x, p)), T::unpack(load_pack(b, p % row_packs)), T::unpack(load_pack(other, p)))
            };
            let mut ys = xs;
            for k in 0..T::LANES {
                ys[k] = f(xs[k] + bs[k], os[k]);
            }
            // SAFETY: as for the loads; only this thread writes pack p.
            unsafe { store_pack(out, p, T::pack(ys)) };
        }
    } else {
        for i in GridStride::over(0, n) {
            let i = i as usize;
            // SAFETY: i < rows * cols, and i % cols < cols.
            unsafe {
                let z = (*x.add(i)).to_f32() + (*b.add(i % cols as usize)).to_f32();
                *out.add(i) = T::from_f32(f(z, (*other.add(i)).to_f32()));
            }
        }
    }
}

/// Defines the forward and backward kernel for one dtype.
macro_rules! bias_gelu_kernels {
    ($forward:ident, $backward:ident, $t:ty) => {
        opsmith_kernels::kernel! {
            #[doc = concat!("`y = gelu(x + b) + r` for ", stringify!($t), " `[rows, cols]` matrices and a `[cols]` bias.")]
            ///
            /// # Safety
            /// `x`, `r` and `y` are valid for `rows * cols` elements, `b` for `cols`; `y`
            /// overlaps no input.
            pub unsafe fn $forward(
                x: *const [$t; rows * cols],
                b: *const [$t; cols],
                r: *const [$t; rows * cols],
                y: *mut [$t; rows * cols],
                rows: u64,
                cols: u64,
            ) {
                // SAFETY: forwarded from this kernel's contract.
                unsafe { map_with_row_bias(x, b, r, y, rows, cols, |z, r| gelu(z) + r) }
            }
        }

        opsmith_kernels::kernel! {
            #[doc = concat!("`dx = g · gelu'(x + b)` for ", stringify!($t), ": the gradient with respect to `x`; `b`'s is the sum of `dx`'s rows and `r`'s is `g`.")]
            ///
            /// # Safety
            /// `g`, `x` and `dx` are valid for `rows * cols` elements, `b` for `cols`; `dx`
            /// overlaps no input.
            pub unsafe fn $backward(
                g: *const [$t; rows * cols],
                x: *const [$t; rows * cols],
                b: *const [$t; cols],
                dx: *mut [$t; rows * cols],
                rows: u64,
                cols: u64,
            ) {
                // SAFETY: forwarded from this kernel's contract.
                unsafe { map_with_row_bias(x, b, g, dx, rows, cols, |z, g| gelu_backward(g, z)) }
            }
        }
    };
}

bias_gelu_kernels!(bias_gelu_residual_f32, bias_gelu_residual_backward_f32, f32);
bias_gelu_kernels!(bias_gelu_residual_f16, bias_gelu_residual_backward_f16, F16);
bias_gelu_kernels!(bias_gelu_residual_bf16, bias_gelu_residual_backward_bf16, Bf16);
