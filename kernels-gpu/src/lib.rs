//! opsmith's GPU kernels, written in `#![no_std]` Rust.
//!
//! This crate is compiled twice:
//!
//! * for `nvptx64-nvidia-cuda`, once per kernel [`Family`] (a cargo feature each), by
//!   `cargo xtask kernels` (through `opsmith-ptx-builder`), into the PTX and cubins that
//!   `opsmith-host` ships in `host/prebuilt/` and embeds. Only that build contains the kernels
//!   themselves and the device-side std in `device`; it needs the pinned nightly.
//! * for the host, as an ordinary dependency of `opsmith-host`. That build contains only the
//!   kernel *name tables* ([`names`]) and pure arithmetic: the conversions in [`convert`], and
//!   the activation and optimizer formulas ([`activation`], [`optim`], generic over
//!   [`real::Real`]) that the CPU backend runs as well, so that it computes what the kernels do,
//!   operation for operation. The host refers to kernels through the same identifiers the
//!   kernels are defined with: a renamed kernel is a compile error on the host, never a missing
//!   symbol at a user's run time. This build works on stable Rust.
//!
//! ```
//! use opsmith_kernels::names;
//! // The host launches kernels by these names, which the kernels' own macro generated.
//! assert_eq!(names::F32.fused_mul_add.name(), "fused_mul_add_f32");
//! assert_eq!(names::reduction::BF16.sum_rows, "sum_rows_bf16");
//! ```
#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, stdarch_nvptx, core_intrinsics, f16, portable_simd, link_llvm_intrinsics, asm_experimental_arch)
)]
#![cfg_attr(target_arch = "nvptx64", allow(internal_features))]
#![warn(missing_docs)]

// The host build's `Real` impls use std's float methods; the kernels see only `core`.
#[cfg(not(target_arch = "nvptx64"))]
extern crate std;

// A kernel family's module holds its name table (host and device) and its kernels (nvptx64
// only). A PTX build compiles only the families its cargo features name, so each family
// becomes a module of its own that the host loads on first use; the host build has them all.
// The activation formulas are part of the device-side std (a kernel crate's fused op may call
// `activation::gelu`); the module's kernels are gated on the feature inside it.
pub mod activation;
#[cfg(any(not(target_arch = "nvptx64"), feature = "attention"))]
mod attention;
pub mod convert;
pub mod decl;
#[cfg(target_arch = "nvptx64")]
pub mod device;
pub mod dtype;
#[cfg(any(not(target_arch = "nvptx64"), feature = "elementwise"))]
mod elementwise;
// The along-a-dim, gather and random kernels ship in the elementwise module.
#[cfg(any(not(target_arch = "nvptx64"), feature = "elementwise"))]
mod indexing;
#[cfg(any(not(target_arch = "nvptx64"), feature = "loss"))]
mod loss;
#[cfg(any(not(target_arch = "nvptx64"), feature = "matmul"))]
mod matmul;
pub mod names;
#[cfg(any(not(target_arch = "nvptx64"), feature = "optimizer"))]
pub mod optim;
pub mod prebuilt;
pub mod random;
pub mod real;
#[cfg(any(not(target_arch = "nvptx64"), feature = "reduction"))]
mod reduction;
#[cfg(any(not(target_arch = "nvptx64"), feature = "softmax"))]
mod softmax;
#[cfg(any(not(target_arch = "nvptx64"), feature = "timing"))]
mod timing;

pub use names::{
    ActivationKernels, AttentionKernels, ElementwiseKernels, Family, LaunchBounds, LossKernels, MatmulKernels,
    OptimizerKernels, ReductionKernels, SoftmaxKernels,
};

/// The kernels never unwind: a panic on the device stops the thread with a trap, which the host
/// sees as a launch failure naming the kernel.
#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: `trap` has no preconditions; it aborts the kernel and reports an error to the host.
    unsafe { core::arch::nvptx::trap() }
}
