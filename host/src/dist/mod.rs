//! Several GPUs, in one process or many, on one host or many: NCCL communicators and the TCP
//! bootstrap that lets their ranks find each other.
//!
//! * `UniqueId`, `Communicator`: one communicator per rank and GPU; in-place all-reduce (sum
//!   and mean) and broadcast of tensors, on the device's current stream.
//! * `bootstrap_tcp`: rank 0 makes the unique id and sends it to the other ranks over TCP;
//!   [`broadcast_bytes`], [`serve_bytes`] and [`fetch_bytes`] are that exchange over any bytes,
//!   and need no GPU.
//!
//! NCCL is loaded at run time, like the CUDA driver: without it, everything here that needs it
//! returns [`Error::LibraryMissing`](crate::Error::LibraryMissing) with the fix, and the rest of
//! opsmith works as before. Before NCCL's first use, `NCCL_NVLS_ENABLE=0` is put in the process
//! environment unless it is already set: NVLink SHARP multicast can leave NVSwitch state behind
//! that takes shared GPUs out of service, and data-parallel training does not need it.
//!
//! The communicators need the `nccl` cargo feature (on by default); the byte exchange is
//! always there.
mod bootstrap;
#[cfg(feature = "nccl")]
mod nccl;

pub use bootstrap::{ADDR_ENV, MAGIC, MAX_PENDING, addr_from_env, broadcast_bytes, fetch_bytes, serve_bytes};
#[cfg(feature = "nccl")]
pub use nccl::{Communicator, UniqueId, bootstrap_tcp, nccl_available, nccl_version};
