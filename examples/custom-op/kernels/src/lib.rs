//! A 3×3 weighted filter over an image, and its backward, as nvptx64 kernels.
//!
//! Compiled for the host this crate is empty but for the kernel names, which the host imports
//! so that a renamed kernel is a compile error there.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, stdarch_nvptx, core_intrinsics))]
#![cfg_attr(target_arch = "nvptx64", allow(internal_features))]

/// The forward kernel's name.
pub const FORWARD: &str = "filter3x3_forward_f32";
/// The backward kernel's name.
pub const BACKWARD: &str = "filter3x3_backward_f32";

#[cfg(target_arch = "nvptx64")]
mod device {
    use core::arch::nvptx;

    #[panic_handler]
    fn panic(_: &core::panic::PanicInfo) -> ! {
        // SAFETY: `trap` has no preconditions.
        unsafe { nvptx::trap() }
    }

    fn grid_stride(n: u64) -> impl Iterator<Item = u64> {
        // SAFETY: reading special registers has no preconditions.
        let (start, step) = unsafe {
            (
                nvptx::_block_idx_x() as u64 * nvptx::_block_dim_x() as u64 + nvptx::_thread_idx_x() as u64,
                nvptx::_grid_dim_x() as u64 * nvptx::_block_dim_x() as u64,
            )
        };
        (start..n).step_by(step as usize)
    }

    /// Sums `weight(dr, dc) * src[r + s*(dr - 1), c + s*(dc - 1)]` over the 3×3 neighbourhood,
    /// zero outside the image; `s = 1` is the filter (a correlation), `s = -1` its transpose.
    ///
    /// # Safety
    /// `src` is valid for `height * width` values and `weights` for 9; `r < height`, `c < width`.
    #[inline(always)]
    unsafe fn neighbourhood(
        src: *const f32,
        weights: *const f32,
        r: u64,
        c: u64,
        height: u64,
        width: u64,
        s: i64,
    ) -> f32 {
        let mut acc = 0.0f32;
        for dr in 0..3i64 {
            for dc in 0..3i64 {
                let (rr, cc) = (r as i64 + s * (dr - 1), c as i64 + s * (dc - 1));
                if rr >= 0 && cc >= 0 && (rr as u64) < height && (cc as u64) < width {
                    // SAFETY: the index is inside the image, and the weight index is below 9.
                    unsafe {
                        let w = weights.add((dr * 3 + dc) as usize).read();
                        let x = src.add(rr as usize * width as usize + cc as usize).read();
                        acc = core::intrinsics::fmaf32(w, x, acc);
                    }
                }
            }
        }
        acc
    }

    /// `out[r, c] = Σ w[dr, dc] · x[r + dr - 1, c + dc - 1]` with zero padding.
    ///
    /// Thread mapping: one output pixel per thread, grid-stride over `height * width`.
    ///
    /// # Safety
    /// `x` and `out` are valid for `height * width` f32 and do not overlap; `weights` for 9.
    #[unsafe(no_mangle)]
    pub unsafe extern "ptx-kernel" fn filter3x3_forward_f32(
        x: *const f32,
        weights: *const f32,
        out: *mut f32,
        height: u64,
        width: u64,
    ) {
        if width == 0 {
            return;
        }
        for i in grid_stride(height * width) {
            // SAFETY: i < height * width; forwarded from this kernel's contract.
            unsafe { out.add(i as usize).write(neighbourhood(x, weights, i / width, i % width, height, width, 1)) };
        }
    }

    /// `gx[r, c] = Σ w[dr, dc] · g[r - dr + 1, c - dc + 1]`: the transpose of the forward, the
    /// gradient of a loss with respect to `x` given its gradient `g` with respect to `out`.
    ///
    /// Thread mapping: one input pixel per thread, grid-stride over `height * width`.
    ///
    /// # Safety
    /// `g` and `gx` are valid for `height * width` f32 and do not overlap; `weights` for 9.
    #[unsafe(no_mangle)]
    pub unsafe extern "ptx-kernel" fn filter3x3_backward_f32(
        g: *const f32,
        weights: *const f32,
        gx: *mut f32,
        height: u64,
        width: u64,
    ) {
        if width == 0 {
            return;
        }
        for i in grid_stride(height * width) {
            // SAFETY: i < height * width; forwarded from this kernel's contract.
            unsafe { gx.add(i as usize).write(neighbourhood(g, weights, i / width, i % width, height, width, -1)) };
        }
    }
}
