//! Block-level collectives: sums and maxima over every thread of a 1-D block, through registers
//! within each warp and a few words of shared memory across the warps.
//!
//! A reduction is three steps: each warp reduces its 32 values by shuffles
//! ([`warp_sum`]/[`warp_max`]), lane 0 of warp `w` writes the warp's result to word `w` of a
//! scratch buffer, and after one barrier every warp reads all the warps' words and reduces them
//! by shuffles again, so every thread of the block gets the same result, combined in the same
//! order on every run.
//!
//! **Barrier discipline.** A single barrier per reduction is enough because [`BlockReduce`]
//! alternates between two scratch buffers: reduction `k` writes buffer `k % 2`, then waits at
//! barrier `k`, then reads. A thread writes buffer `k % 2` again only at reduction `k + 2`,
//! after passing barrier `k + 1`, which no thread reaches before it has finished reading
//! reduction `k`. So a kernel may reduce any number of times, in a loop over rows for example,
//! with one `BlockReduce` and no further synchronisation, provided every thread of the block
//! makes the same sequence of calls.
use super::warp::{warp_max, warp_sum};
use core::arch::nvptx;

/// A `*mut f32` to a new block-scoped `.shared` array of `$bytes` bytes (16-byte aligned).
macro_rules! shared_array {
    ($name:ident, $bytes:literal) => {{
        let base: u64;
        // SAFETY: declares a block-scoped `.shared` array and converts its address to a generic
        // pointer; it touches no memory. The braces give every inlined instance its own
        // declaration (PTX reports a duplicate definition without them). Not `pure`, so LLVM
        // never merges two instances into one buffer.
        unsafe {
            core::arch::asm!(
                "{{",
                concat!(".shared .align 16 .b8 ", stringify!($name), "[", stringify!($bytes), "];"),
                concat!("cvta.shared.u64 {p}, ", stringify!($name), ";"),
                "}}",
                p = out(reg64) base,
                options(nostack, preserves_flags),
            )
        };
        base as *mut f32
    }};
}

/// Words per scratch buffer: one per warp of the largest block (1024 threads).
const WORDS: usize = 32;

/// A block-wide reducer over a scratch of `2 × 32` f32 words of this block's shared memory (256
/// bytes); see the [module docs](self) for the barrier discipline that makes it reusable.
pub struct BlockReduce {
    scratch: *mut f32,
    /// The buffer (0 or 1) the next reduction uses.
    phase: usize,
}

impl BlockReduce {
    /// A reducer with its own shared-memory scratch.
    ///
    /// Each inlined call declares its own 256 bytes, so make one per kernel (at its entry point,
    /// outside any loop or per-variant branch) and pass it down.
    #[inline(always)]
    pub fn new() -> Self {
        Self { scratch: shared_array!(opsmith_block_reduce, 256), phase: 0 }
    }

    /// `combine` folded over `value` of every thread of the block, returned to every thread.
    ///
    /// # Safety
    /// Every thread of the block calls it together (none exited, all in the same sequence of
    /// reductions on this reducer), `blockDim.x` is a multiple of 32, at most 1024, and
    /// `blockDim.y = blockDim.z = 1`.
    #[inline(always)]
    unsafe fn reduce(&mut self, value: f32, identity: f32, warp: impl Fn(f32) -> f32) -> f32 {
        // SAFETY: reading the special registers has no preconditions.
        let (thread, threads) = unsafe { (nvptx::_thread_idx_x() as usize, nvptx::_block_dim_x() as usize) };
        let (lane, warp_index, warps) = (thread % 32, thread / 32, threads / 32);
        // SAFETY: phase * WORDS + 32 <= 2 * WORDS words, inside the 256-byte scratch.
        let buffer = unsafe { self.scratch.add(self.phase * WORDS) };
        self.phase ^= 1;
        let partial = warp(value);
        if lane == 0 {
            // SAFETY: warp_index < warps <= 32; only this warp's lane 0 writes this word, and no
            // thread reads it before the barrier below (nor, by the alternation of buffers, is
            // any thread still reading it from the reduction before last).
            unsafe { buffer.add(warp_index).write(partial) };
        }
        // SAFETY: every thread of the block reaches this barrier (the caller's contract).
        unsafe { nvptx::_syncthreads() };
        // SAFETY: lane < warps <= 32 words, written before the barrier.
        let word = if lane < warps { unsafe { buffer.add(lane).read() } } else { identity };
        warp(word)
    }

    /// The sum of `value` over every thread of the block, returned to every thread, in a fixed
    /// order of additions.
    ///
    /// # Safety
    /// As for every collective of this reducer: every thread of the block calls it together
    /// (none exited, all in the same sequence of reductions on this reducer), `blockDim.x` is a
    /// multiple of 32, at most 1024, and `blockDim.y = blockDim.z = 1`.
    #[inline(always)]
    pub unsafe fn sum(&mut self, value: f32) -> f32 {
        // SAFETY (both): forwarded from the caller; each warp is converged because the whole
        // block is.
        unsafe { self.reduce(value, 0.0, |v| unsafe { warp_sum(v) }) }
    }

    /// The largest `value` over every thread of the block, returned to every thread. NaN is
    /// ignored (`max.f32`), so the result is NaN only when every value is NaN.
    ///
    /// # Safety
    /// As for [`sum`](Self::sum).
    #[inline(always)]
    pub unsafe fn max(&mut self, value: f32) -> f32 {
        // SAFETY (both): forwarded from the caller; each warp is converged because the whole
        // block is.
        unsafe { self.reduce(value, f32::NEG_INFINITY, |v| unsafe { warp_max(v) }) }
    }
}

impl Default for BlockReduce {
    #[inline(always)]
    fn default() -> Self {
        Self::new()
    }
}

/// Sums across the warps of a block, lane by lane: lane `l` of warp 0 gets `value` of lane `l`
/// of every warp, added in warp order. For kernels whose lanes hold different things (lane `l`
/// a column, say) while the warps split the work on each (the rows).
pub struct LaneSums {
    /// 32 words per warp of the largest block: 4 KiB of this block's shared memory.
    scratch: *mut f32,
}

impl LaneSums {
    /// A summer with its own shared-memory scratch (make one per kernel, at its entry point).
    #[inline(always)]
    pub fn new() -> Self {
        Self { scratch: shared_array!(opsmith_lane_sums, 4096) }
    }

    /// For lane `l` of warp 0: `value` of lane `l` summed over the block's warps in warp order
    /// (`((w0 + w1) + w2) + …`, the same on every run). Other warps get 0. The scratch is free
    /// again when it returns, so it may be called in a loop.
    ///
    /// # Safety
    /// Every thread of the block calls it together (none exited, the same number of calls),
    /// `blockDim.x` is a multiple of 32, at most 1024, and `blockDim.y = blockDim.z = 1`.
    #[inline(always)]
    pub unsafe fn sum_to_first_warp(&mut self, value: f32) -> f32 {
        // SAFETY: reading the special registers has no preconditions.
        let (thread, threads) = unsafe { (nvptx::_thread_idx_x() as usize, nvptx::_block_dim_x() as usize) };
        // SAFETY: thread < blockDim.x <= 1024 words of the 4 KiB scratch; each thread writes its
        // own word.
        unsafe { self.scratch.add(thread).write(value) };
        // SAFETY: every thread of the block reaches both barriers (the caller's contract).
        unsafe { nvptx::_syncthreads() };
        let mut total = 0.0f32;
        if thread < 32 {
            for warp in 0..threads / 32 {
                // SAFETY: warp * 32 + thread < blockDim.x, written before the barrier.
                total += unsafe { self.scratch.add(warp * 32 + thread).read() };
            }
        }
        // The next call's writes must wait until warp 0 has read this call's words.
        // SAFETY: as above.
        unsafe { nvptx::_syncthreads() };
        total
    }
}
