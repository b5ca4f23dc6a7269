//! A kernel that keeps the GPU busy for a given time, for benchmarks.
//!
//! Queued ahead of timed work, it gives the host time to queue every timed launch before the
//! first one runs, so each starts the moment its predecessor ends, and a pair of events around a
//! launch measures the GPU's time for it rather than the host's pace (NVIDIA's nvbench does the
//! same with its "blocking kernel").

/// The PTX entry point of the spin kernel: `spin_ns(ns: u64)`.
///
/// ```
/// assert_eq!(opsmith_kernels::names::SPIN, "spin_ns");
/// ```
pub const SPIN: &str = "spin_ns";

#[cfg(target_arch = "nvptx64")]
unsafe extern "C" {
    /// `%globaltimer`: the GPU's nanosecond clock, the same on every multiprocessor.
    #[link_name = "llvm.nvvm.read.ptx.sreg.globaltimer"]
    fn globaltimer() -> u64;
}

/// Returns once `ns` nanoseconds of the GPU's global timer have passed since it started.
///
/// Thread mapping: thread 0 of block 0 waits; every other thread returns at once. Launch it with
/// one block of 32 threads.
///
/// # Safety
/// None beyond a valid launch: it reads and writes no memory.
#[cfg(target_arch = "nvptx64")]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn spin_ns(ns: u64) {
    crate::device::dependent_launch::prologue();
    // SAFETY: reading special registers has no preconditions.
    if unsafe { core::arch::nvptx::_block_idx_x() + core::arch::nvptx::_thread_idx_x() } != 0 {
        return;
    }
    // SAFETY: as above.
    let start = unsafe { globaltimer() };
    // SAFETY: as above; the intrinsic reads the clock anew each time.
    while unsafe { globaltimer() }.wrapping_sub(start) < ns {}
}
