//! Thread indices and grid-stride loops.
//!
//! Every index is widened to `u64` before it is multiplied, so a launch over more than 2^32
//! elements never wraps.
use core::arch::nvptx;

/// The calling thread's index in the whole 1-D grid: `blockIdx.x * blockDim.x + threadIdx.x`.
#[inline(always)]
pub fn global_thread_index() -> u64 {
    // SAFETY: reading the special registers has no preconditions.
    unsafe { nvptx::_block_idx_x() as u64 * nvptx::_block_dim_x() as u64 + nvptx::_thread_idx_x() as u64 }
}

/// The number of threads in the whole 1-D grid: `gridDim.x * blockDim.x`.
#[inline(always)]
pub fn grid_thread_count() -> u64 {
    // SAFETY: reading the special registers has no preconditions.
    unsafe { nvptx::_grid_dim_x() as u64 * nvptx::_block_dim_x() as u64 }
}

/// The indices `start + t, start + t + T, start + t + 2T, …` below `end`, where `t` is this
/// thread's global index and `T` the grid's thread count.
///
/// Together, the threads of a grid visit every index of `start..end` exactly once, whatever the
/// grid size, so the host may size the grid for occupancy rather than for the element count.
#[derive(Clone, Copy)]
pub struct GridStride {
    next: u64,
    end: u64,
    step: u64,
}

impl GridStride {
    /// Grid-stride iteration over `start..end`.
    #[inline(always)]
    pub fn over(start: u64, end: u64) -> Self {
        Self { next: start + global_thread_index(), end, step: grid_thread_count() }
    }

    /// Warp-stride iteration over `0..end`: warp `w` of the `W` warps in the grid visits
    /// `w, w + W, w + 2W, …`, every lane of a warp the same indices, so the warp stays converged
    /// and a grid of any size covers each index once (one row per warp, for example).
    #[inline(always)]
    pub fn over_warps(end: u64) -> Self {
        // A block is a whole number of warps (the host checks it); `max` keeps a malformed launch
        // from looping forever.
        Self { next: global_thread_index() / 32, end, step: (grid_thread_count() / 32).max(1) }
    }

    /// Block-stride iteration over `0..end`: block `b` of the `B` blocks in the grid visits
    /// `b, b + B, b + 2B, …`, every thread of a block the same indices, so the block reaches
    /// each barrier together and a grid of any size covers each index once (one row per block).
    #[inline(always)]
    pub fn over_blocks(end: u64) -> Self {
        // SAFETY: reading the special registers has no preconditions.
        let (block, blocks) = unsafe { (nvptx::_block_idx_x() as u64, nvptx::_grid_dim_x() as u64) };
        Self { next: block, end, step: blocks }
    }
}

impl Iterator for GridStride {
    type Item = u64;

    #[inline(always)]
    fn next(&mut self) -> Option<u64> {
        if self.next < self.end {
            let i = self.next;
            self.next += self.step;
            Some(i)
        } else {
            None
        }
    }
}
