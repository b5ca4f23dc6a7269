//! Warp-level collectives: sums and maxima by register shuffles.

unsafe extern "C" {
    /// `shfl.sync.bfly.b32`: exchange with the lane whose index differs in the bits of `lane_mask`.
    #[link_name = "llvm.nvvm.shfl.sync.bfly.f32"]
    fn shfl_sync_bfly_f32(member_mask: u32, value: f32, lane_mask: u32, clamp: u32) -> f32;
}

/// Every lane mask: the whole warp takes part.
const FULL_WARP: u32 = 0xffff_ffff;

/// `combine` folded over the 32 lanes of the warp by a butterfly: five exchanges, each combining
/// a lane's partial with its partner's. Every lane ends with the same result, and the order of
/// the combinations is fixed, so the result is the same on every run.
///
/// # Safety
/// All 32 lanes of the warp must call it together (no lane may have exited or diverged).
#[inline(always)]
unsafe fn butterfly(mut value: f32, combine: impl Fn(f32, f32) -> f32) -> f32 {
    let mut offset = 16;
    while offset > 0 {
        // SAFETY: the caller guarantees the whole warp is converged here; clamp 0x1f keeps the
        // exchange inside the warp.
        value = combine(value, unsafe { shfl_sync_bfly_f32(FULL_WARP, value, offset, 0x1f) });
        offset /= 2;
    }
    value
}

/// `value` from the lane whose index differs from this one's in the bits of `lane_mask`
/// (`shfl.sync.bfly`): the step of a butterfly over a part of the warp, such as the four lanes
/// that share a row of a tensor-core fragment (`lane_mask` 1 and 2).
///
/// # Safety
/// All 32 lanes of the warp must call it together (no lane may have exited or diverged).
#[inline(always)]
pub unsafe fn xor_shuffle(value: f32, lane_mask: u32) -> f32 {
    // SAFETY: the caller guarantees the whole warp is converged here; clamp 0x1f keeps the
    // exchange inside the warp.
    unsafe { shfl_sync_bfly_f32(FULL_WARP, value, lane_mask, 0x1f) }
}

/// The sum of `value` over the 32 lanes of the warp, returned to every lane, in a fixed order of
/// additions.
///
/// # Safety
/// All 32 lanes of the warp must call it together (no lane may have exited or diverged).
#[inline(always)]
pub unsafe fn warp_sum(value: f32) -> f32 {
    // SAFETY: forwarded from the caller.
    unsafe { butterfly(value, |a, b| a + b) }
}

/// The largest `value` over the 32 lanes of the warp, returned to every lane. NaN lanes are
/// ignored (`max.f32`), so the result is NaN only when every lane holds NaN.
///
/// # Safety
/// All 32 lanes of the warp must call it together (no lane may have exited or diverged).
#[inline(always)]
pub unsafe fn warp_max(value: f32) -> f32 {
    // SAFETY: forwarded from the caller.
    unsafe { butterfly(value, f32::max) }
}

/// Adds `value` over the warp and has lane 0 write the total to `partials[w]`, where `w` is
/// the warp's index in the whole grid: the end of a first reduction pass.
///
/// # Safety
/// All 32 lanes of the warp call it together, and `partials` is valid for one f32 per warp of
/// the grid.
#[inline(always)]
pub unsafe fn store_warp_total(value: f32, partials: *mut f32) {
    // SAFETY: forwarded from the caller.
    let total = unsafe { warp_sum(value) };
    if lane_id() == 0 {
        let warp = super::index::global_thread_index() / 32;
        // SAFETY: `warp` is below the grid's warp count, the caller's bound.
        unsafe { partials.add(warp as usize).write(total) };
    }
}

/// This thread's lane within its warp.
#[inline(always)]
pub fn lane_id() -> u32 {
    // SAFETY: reading the special register has no preconditions.
    unsafe { core::arch::nvptx::_thread_idx_x() % 32 }
}
