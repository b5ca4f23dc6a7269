//! opsmith's GPU kernels, written in `#![no_std]` Rust.
//!
//! This crate is compiled twice:
//!
//! * for `nvptx64-nvidia-cuda`, by `host/build.rs` (through `opsmith-ptx-builder`), into the PTX
//!   module that `opsmith-host` embeds. Only that build contains the kernels themselves and the
//!   device-side std in `device`.
//! * for the host, as an ordinary dependency of `opsmith-host`. That build contains only the
//!   kernel *name tables* ([`names`]) and the pure-arithmetic helpers in [`convert`], so the host
//!   refers to kernels through the same identifiers the kernels are defined with: a renamed kernel
//!   is a compile error on the host, never a missing symbol at a user's run time.
#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, stdarch_nvptx, core_intrinsics, f16, portable_simd, link_llvm_intrinsics)
)]
#![cfg_attr(target_arch = "nvptx64", allow(internal_features))]
#![warn(missing_docs)]

pub mod convert;
#[cfg(target_arch = "nvptx64")]
pub mod device;
mod elementwise;
mod loss;
pub mod names;
mod reduction;
mod softmax;

pub use names::{ElementwiseKernels, LossKernels, ReductionKernels, SoftmaxKernels};

/// The kernels never unwind: a panic on the device stops the thread with a trap, which the host
/// sees as a launch failure naming the kernel.
#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: `trap` has no preconditions; it aborts the kernel and reports an error to the host.
    unsafe { core::arch::nvptx::trap() }
}
