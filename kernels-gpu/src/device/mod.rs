//! opsmith's device-side std: what a kernel needs beyond `core`.
//!
//! * [`index`]: the global thread index and grid-stride iteration, in 64-bit arithmetic.
//! * [`memory`]: 16-byte vector loads and stores and the alignment test that selects them.
//! * [`math`]: a real fused multiply-add (rustc keeps `a * b + c` as two roundings), the
//!   correctly rounded square root, and `exp` from `ex2.approx`.
//! * [`element`]: the storage dtypes (f32, f16, bf16) and their conversions to f32.
//! * [`elementwise`]: the driver that streams N inputs to M outputs through a per-element closure.
//! * [`warp`]: warp-level sums by register shuffles (no shared memory).
pub mod element;
pub mod elementwise;
pub mod index;
pub mod math;
pub mod memory;
pub mod warp;
