//! `y = gelu(x + b) + r` (bias, GeLU with the tanh approximation, residual) and its backward,
//! each fused into one pass over the activations, as nvptx64 kernels for f32, f16 and bf16
//! (arithmetic in f32).
//!
//! Counted in passes over the `rows × cols` activations (each read or write of one matrix):
//! * forward: composed from separate ops 7 (`x + b`: 2, `gelu`: 2, `+ r`: 3); fused 3 (read `x`
//!   and `r`, write `y`).
//! * backward: composed 4 (`gelu_backward(g, z)`: 3, then summing `dz` over rows for `db`: 1);
//!   fused 3 (read `g` and `x`, write `dx`), with `db` summed on the way in per band of rows and
//!   the bands added by a second, small kernel.
//!
//! The gelu formulas are opsmith's own (`opsmith_kernels::activation`), so the fused op computes
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

/// The backward's work: for each (band `k`, column unit `u`) pair, walks down band `k`'s rows,
/// writes `dx = gelu_backward(g, x + b)` and adds it up per column into `db_bands[k, ..]`. A
/// column unit is a 16-byte pack when every row is whole packs and every pointer is 16-byte
/// aligned, else one column. Neighbouring threads take neighbouring units of the same rows, so
/// the loads stay coalesced.
///
/// # Safety
/// As for the backward kernels: `g`, `x` and `dx` are valid for `rows * cols` elements, `b`
/// for `cols`, `db_bands` for `bands * cols` f32; the outputs overlap nothing.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn backward_by_bands<T: Element>(
    g: *const T,
    x: *const T,
    b: *const T,
    dx: *mut T,
    db_bands: *mut f32,
    rows: u64,
    cols: u64,
    bands: u64,
) {
    if bands == 0 {
        return;
    }
    let band_rows = rows.div_ceil(bands);
    let lanes = T::LANES as u64;
    let aligned = is_pack_aligned(g) && is_pack_aligned(x) && is_pack_aligned(b) && is_pack_aligned(dx);
    if aligned && cols % lanes == 0 {
        let units = cols / lanes;
        for j in GridStride::over(0, bands * units) {
            let (k, u) = (j / units, j % units);
            // SAFETY: u < cols / lanes, so the pack is inside the bias row.
            let bs = T::unpack(unsafe { load_pack(b, u) });
            let mut acc = [0.0f32; 8];
            for r in k * band_rows..rows.min((k + 1) * band_rows) {
                let p = r * units + u;
                // SAFETY: r < rows and u < units, so pack p is inside the matrices.
                let (gs, xs) = unsafe { (T::unpack(load_pack(g, p)), T::unpack(load_pack(x, p))) };
                let mut ds = gs;
                for l in 0..T::LANES {
                    ds[l] = gelu_backward(gs[l], xs[l] + bs[l]);
                    acc[l] += ds[l];
                }
                // SAFETY: as for the loads; only this thread writes pack p.
                unsafe { store_pack(dx, p, T::pack(ds)) };
            }
            for l in 0..T::LANES {
                // SAFETY: k < bands and u * lanes + l < cols.
                unsafe { *db_bands.add((k * cols + u * lanes + l as u64) as usize) = acc[l] };
            }
        }
    } else {
        for j in GridStride::over(0, bands * cols) {
            let (k, c) = (j / cols, j % cols);
            // SAFETY: c < cols.
            let bc = unsafe { *b.add(c as usize) }.to_f32();
            let mut acc = 0.0f32;
            for r in k * band_rows..rows.min((k + 1) * band_rows) {
                let i = (r * cols + c) as usize;
                // SAFETY: i < rows * cols.
                unsafe {
                    let d = gelu_backward((*g.add(i)).to_f32(), (*x.add(i)).to_f32() + bc);
                    *dx.add(i) = T::from_f32(d);
                    acc += d;
                }
            }
            // SAFETY: k < bands and c < cols.
            unsafe { *db_bands.add((k * cols + c) as usize) = acc };
        }
    }
}

/// Defines the forward, backward and bias-sum kernels for one dtype.
macro_rules! bias_gelu_kernels {
    ($forward:ident, $backward:ident, $sum_bands:ident, $t:ty) => {
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
            #[doc = concat!("The backward for ", stringify!($t), ": `dx = g · gelu'(x + b)`, and `b`'s gradient in `bands` partial sums: `db_bands[k, c]` sums `dx[r, c]` (in f32, before rounding) over the rows `r` of band `k`, the `k`-th of `bands` runs of `ceil(rows / bands)` rows. `r`'s gradient is `g` itself.")]
            ///
            /// Thread mapping: one (band, column pack) pair per thread, grid-stride, walking
            /// down the band's rows (see `backward_by_bands`).
            ///
            /// # Safety
            /// `g`, `x` and `dx` are valid for `rows * cols` elements, `b` for `cols`,
            /// `db_bands` for `bands * cols` f32; the outputs overlap nothing.
            pub unsafe fn $backward(
                g: *const [$t; rows * cols],
                x: *const [$t; rows * cols],
                b: *const [$t; cols],
                dx: *mut [$t; rows * cols],
                db_bands: *mut [f32; bands * cols],
                rows: u64,
                cols: u64,
                bands: u64,
            ) {
                // SAFETY: forwarded from this kernel's contract.
                unsafe { backward_by_bands(g, x, b, dx, db_bands, rows, cols, bands) }
            }
        }

        opsmith_kernels::kernel! {
            #[doc = concat!("`db[c] = Σ_k db_bands[k, c]`, in band order, rounded once to ", stringify!($t), ": the second pass of the bias gradient.")]
            ///
            /// Thread mapping: one column per thread, grid-stride; neighbouring threads read
            /// neighbouring columns.
            ///
            /// # Safety
            /// `db_bands` is valid for `bands * cols` f32 and `db` for `cols` elements.
            pub unsafe fn $sum_bands(db_bands: *const [f32; bands * cols], db: *mut [$t; cols], bands: u64, cols: u64) {
                for c in GridStride::over(0, cols) {
                    let mut acc = 0.0f32;
                    for k in 0..bands {
                        // SAFETY: k * cols + c < bands * cols.
                        acc += unsafe { *db_bands.add((k * cols + c) as usize) };
                    }
                    // SAFETY: c < cols.
                    unsafe { *db.add(c as usize) = <$t>::from_f32(acc) };
                }
            }
        }
    };
}

bias_gelu_kernels!(bias_gelu_residual_f32, bias_gelu_residual_backward_f32, bias_gelu_sum_bands_f32, f32);
bias_gelu_kernels!(bias_gelu_residual_f16, bias_gelu_residual_backward_f16, bias_gelu_sum_bands_f16, F16);
bias_gelu_kernels!(bias_gelu_residual_bf16, bias_gelu_residual_backward_bf16, bias_gelu_sum_bands_bf16, Bf16);
