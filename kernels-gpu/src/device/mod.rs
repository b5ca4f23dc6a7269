//! opsmith's device-side std: what a kernel needs beyond `core`.
//!
//! * [`index`]: the global thread index and grid- and warp-stride iteration, in 64-bit arithmetic.
//! * [`memory`]: 16-byte vector loads and stores and the alignment test that selects them.
//! * [`math`]: a real fused multiply-add (rustc keeps `a * b + c` as two roundings), the
//!   correctly rounded square roots (f32 and f64), `exp` from `ex2.approx`, and `2^x` and `log2` on the special
//!   function unit.
//! * [`element`]: the storage dtypes (f32, f16, bf16) and their conversions to f32.
//! * [`elementwise`]: the driver that streams N inputs to M outputs through a per-element closure.
//! * [`warp`]: warp-level sums and maxima by register shuffles (no shared memory).
//! * [`block`]: block-level sums and maxima: shuffles within each warp, then 256 bytes of shared
//!   memory across the warps, one barrier per reduction, reusable in a loop.
//! * [`rows`]: one warp or one block per row: which values of the row each thread holds, and
//!   their loads and stores.
//! * [`unroll`]: loops expanded into straight-line code, so arrays indexed by them stay in
//!   registers.
//! * [`tensor_core`]: `mma.sync`, `ldmatrix` and `cp.async` (sm_80), for the attention family.
//! * [`flash`]: the fused attention forward's tile walk (online softmax on tensor cores).
//! * [`flash_backward`]: the fused attention backward's two kernels (`dQ`; `dK` and `dV`).
//! * [`logsumexp`]: a row's maximum and sum of exponentials, for softmax and cross-entropy.
//! * [`dependent_launch`]: the prologue of every kernel, which lets an sm_90 kernel start
//!   before its predecessor on the stream has finished.
pub mod block;
pub mod dependent_launch;
pub mod element;
pub mod elementwise;
#[cfg(feature = "attention")]
pub mod flash;
#[cfg(feature = "attention")]
pub mod flash_backward;
pub mod index;
pub mod logsumexp;
pub mod math;
pub mod memory;
pub mod rows;
#[cfg(feature = "attention")]
pub mod tensor_core;
pub mod unroll;
pub mod warp;
