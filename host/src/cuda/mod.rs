//! The CUDA runtime, on `cudarc`'s driver API (the driver library is loaded at run time, so a
//! binary built here runs on machines without CUDA and reports [`Error::NoCudaDriver`] there).
//!
//! * [`CudaDevice`]: one context per device, created on first use and shared.
//! * [`Stream`] and [`Event`]: ordering and timing; ops run on the device's current stream.
//! * [`KernelModule`] and [`Kernel`]: kernel modules, opsmith's own ([`prebuilt`]: PTX and
//!   cubins per kernel family, loaded on first use) or third-party PTX and cubins.
//! * [`launch`] and [`KernelCrate`]: typed, checked launches of kernels declared with
//!   `opsmith_kernels::kernel!` (opsmith's own, or a kernel crate's PTX).
//! * [`LaunchConfig`] and [`Grid`]: checked launch geometry.
//! * [`Graph`]: a sequence of ops captured once and replayed with one launch (CUDA graphs).
//! * [`can_access_peer`]: whether two GPUs of this host reach each other's memory directly.
//! * [`time_runs`]: event-timed medians of GPU work, for benchmarks.
//! * `require_cublas` (with the `cublas` feature): whether cuBLAS (which `ops::matmul` uses)
//!   loads, with the fix if not.
//!
//! On a machine without a GPU, everything here returns an error rather than panicking, so code
//! can probe and fall back to the CPU:
//!
//! ```
//! # fn main() -> opsmith_host::Result<()> {
//! use opsmith_host::cuda::{self, CudaDevice};
//! match cuda::device_count() {
//!     Ok(n) if n > 0 => {
//!         let dev = CudaDevice::get(0)?;
//!         println!("{} with {} SMs", dev.name()?, dev.sm_count());
//!     }
//!     Ok(_) | Err(opsmith_host::Error::NoCudaDriver) => println!("no GPU: ops run on the CPU"),
//!     Err(e) => return Err(e),
//! }
//! # Ok(()) }
//! ```
#[cfg(feature = "cublas")]
pub(crate) mod blas;
pub(crate) mod block_cache;
mod device;
pub mod graph;
mod launch;
mod module;
pub(crate) mod peer;
pub mod prebuilt;
mod stream;
pub(crate) mod stream_order;
mod timing;
mod typed_launch;

#[cfg(feature = "cublas")]
pub use blas::{cublas_available, cublas_handles, require_cublas};
pub use device::{CudaDevice, LoadedModule};
pub use graph::{GRAPH_BRANCHES_ENV, Graph};
pub use launch::{DEFAULT_BLOCK, DEPENDENT_LAUNCH_ENV, KernelArg, LaunchConfig, launch_blocking, len_as_u32};
pub use module::{Kernel, KernelModule};
pub use peer::can_access_peer;
pub use stream::{Event, Stream, StreamGuard};
pub use timing::{Timings, time_runs};
pub use typed_launch::{Grid, KernelCrate, KernelParam, KernelParams, launch};

use crate::{Error, Result};
use std::sync::OnceLock;

/// Whether the CUDA driver library can be loaded on this machine.
///
/// A driver without devices is possible (a container without GPUs passed in); [`device_count`]
/// tells.
///
/// ```
/// if !opsmith_host::cuda::driver_available() {
///     println!("no CUDA driver: install the NVIDIA driver to use a GPU");
/// }
/// ```
pub fn driver_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: probing only loads the library by name and drops it; no driver call is made.
    *PRESENT.get_or_init(|| unsafe { cudarc::driver::sys::is_culib_present() })
}

/// Whether the driver is at least CUDA `major.minor` (read once): its newer entry points are
/// called only then, as cudarc panics on a symbol the library lacks.
pub(crate) fn driver_at_least(major: u32, minor: u32) -> bool {
    static VERSION: OnceLock<(u32, u32)> = OnceLock::new();
    *VERSION.get_or_init(|| driver_version().unwrap_or((0, 0))) >= (major, minor)
}

/// The number of CUDA devices the driver reports; [`Error::NoCudaDriver`] without a driver.
///
/// ```
/// let gpus = opsmith_host::cuda::device_count().unwrap_or(0);
/// println!("{gpus} CUDA device(s)");
/// ```
pub fn device_count() -> Result<usize> {
    if !driver_available() {
        return Err(Error::NoCudaDriver);
    }
    // Asked once: every op resolves its device through this, and the count cannot change
    // while the process runs.
    static COUNT: OnceLock<std::result::Result<usize, cudarc::driver::DriverError>> = OnceLock::new();
    let count = COUNT.get_or_init(|| {
        cudarc::driver::result::init()
            .and_then(|_| cudarc::driver::CudaContext::device_count())
            .map(|n| n.max(0) as usize)
    });
    count.map_err(|source| Error::DriverQuery { call: "cuDeviceGetCount", source })
}

/// The CUDA driver's version as (major, minor), e.g. (13, 0).
///
/// ```
/// match opsmith_host::cuda::driver_version() {
///     Ok((major, minor)) => println!("CUDA driver {major}.{minor}"),
///     Err(e) => println!("{e}"), // Error::NoCudaDriver on a machine without one
/// }
/// ```
pub fn driver_version() -> Result<(u32, u32)> {
    if !driver_available() {
        return Err(Error::NoCudaDriver);
    }
    let mut v = 0i32;
    // SAFETY: cuDriverGetVersion writes one int through a valid pointer.
    let status = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    status.result().map_err(|source| Error::DriverQuery { call: "cuDriverGetVersion", source })?;
    Ok((v as u32 / 1000, (v as u32 % 1000) / 10))
}
