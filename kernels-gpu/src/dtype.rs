//! The 16-bit storage types a kernel's buffers may hold, on the device and in the host build's
//! kernel declarations alike (see [`decl`](crate::decl)). Their arithmetic, on the device, is in
//! `device::element`.

/// An IEEE 754 binary16 value, stored as its bits (layout-compatible with `half::f16`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(transparent)]
pub struct F16(pub u16);

/// A bfloat16 value, stored as its bits (layout-compatible with `half::bf16`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(transparent)]
pub struct Bf16(pub u16);
