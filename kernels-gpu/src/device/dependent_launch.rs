//! Programmatic dependent launch (sm_90): a kernel may start while the kernel before it on
//! the stream is still running, as long as it waits for that kernel before it touches memory.
//!
//! The host launches a kernel this way (the `PROGRAMMATIC_STREAM_SERIALIZATION` launch
//! attribute, or a programmatic edge in a graph) only when the kernel came from an sm_90 build,
//! where every kernel begins with [`prologue`]. In other builds [`prologue`] is empty, and on a
//! normal launch both of its instructions return at once.

/// Lets the next kernel on the stream be scheduled, then waits until every kernel this one
/// depends on has finished and its writes are visible. It must come before the kernel's first
/// access to global memory: after it, the kernel sees what its predecessors wrote, and they
/// can no longer read what it writes.
///
/// Signalling first is what saves time: the next kernel's launch and block scheduling then
/// overlap this kernel's run instead of following its end. That next kernel runs its own
/// `prologue`, so it waits for this one to finish before it reads or writes anything.
#[inline(always)]
pub fn prologue() {
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90"))]
    {
        // SAFETY: both instructions only order this grid against its neighbours on the
        // stream; neither touches memory. The asm is not `nomem`, so the compiler moves no load
        // or store above the wait.
        unsafe { core::arch::asm!("griddepcontrol.launch_dependents;", "griddepcontrol.wait;", options(nostack)) }
    }
}
