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
//!
//! # Trust model
//!
//! Whoever can reach rank 0's bootstrap port can connect to it; what they can do then depends
//! on the token:
//!
//! * Without one (the default, as before), the exchange is unauthenticated: anyone who connects
//!   can take a free rank's place and receive the unique id (enough to join the communicator),
//!   or make the bootstrap fail on every rank with a bogus hello.
//! * With a shared [`Token`] (for `bootstrap_tcp`, the same secret in [`TOKEN_ENV`],
//!   `OPSMITH_DIST_TOKEN`, on every rank), rank 0 and each peer prove to each other that they
//!   hold it, by HMAC-SHA-256 over fresh nonces, before rank 0 acts on the peer's hello; the
//!   token itself is never sent. A connection that cannot prove it gets nothing but a refusal,
//!   does not count, and cannot fail the job; a peer takes no id from an impostor of rank 0.
//!
//! Either way the id travels unencrypted, NCCL's own connections are not authenticated at all,
//! and a flood of connections can keep the ranks from meeting until the timeout (never past
//! it): keep the job's ports on a private network, and the token long and random.
mod bootstrap;
#[cfg(feature = "nccl")]
mod nccl;

pub use bootstrap::{
    ADDR_ENV, MAGIC, MAX_PENDING, TOKEN_ENV, Token, addr_from_env, broadcast_bytes, fetch_bytes, serve_bytes,
};
#[cfg(feature = "nccl")]
pub use nccl::{Communicator, UniqueId, bootstrap_tcp, nccl_available, nccl_version};
