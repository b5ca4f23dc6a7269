//! Warp-level collectives.

unsafe extern "C" {
    /// `shfl.sync.bfly.b32`: exchange with the lane whose index differs in the bits of `lane_mask`.
    #[link_name = "llvm.nvvm.shfl.sync.bfly.f32"]
    fn shfl_sync_bfly_f32(member_mask: u32, value: f32, lane_mask: u32, clamp: u32) -> f32;
}

/// Every lane mask: the whole warp takes part.
const FULL_WARP: u32 = 0xffff_ffff;

/// The sum of `value` over the 32 lanes of the warp, returned to every lane.
///
/// A butterfly: five exchanges, each adding the partner lane's partial sum. The order of the
/// additions is fixed, so the result is the same on every run.
///
/// # Safety
/// All 32 lanes of the warp must call it together (no lane may have exited or diverged).
#[inline(always)]
pub unsafe fn warp_sum(mut value: f32) -> f32 {
    let mut offset = 16;
    while offset > 0 {
        // SAFETY: the caller guarantees the whole warp is converged here; clamp 0x1f keeps the
        // exchange inside the warp.
        value += unsafe { shfl_sync_bfly_f32(FULL_WARP, value, offset, 0x1f) };
        offset /= 2;
    }
    value
}

/// This thread's lane within its warp.
#[inline(always)]
pub fn lane_id() -> u32 {
    // SAFETY: reading the special register has no preconditions.
    unsafe { core::arch::nvptx::_thread_idx_x() % 32 }
}
