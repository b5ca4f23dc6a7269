//! Peer-to-peer access between two CUDA devices of one host (NVLink or PCIe).
use super::CudaDevice;
use crate::{Error, Result};
use cudarc::driver::sys;
use parking_lot::Mutex;
use std::collections::HashMap;

/// Whether `cuda:<from>` can read and write `cuda:<to>`'s memory directly, as the driver reports
/// it (`cuDeviceCanAccessPeer`). A device is not its own peer: `can_access_peer(n, n)` is false.
///
/// ```
/// use opsmith_host::cuda;
/// if cuda::device_count().unwrap_or(0) >= 2 {
///     println!("cuda:0 reads cuda:1 directly: {}", cuda::can_access_peer(0, 1).unwrap());
/// }
/// ```
pub fn can_access_peer(from: usize, to: usize) -> Result<bool> {
    if from == to {
        return Ok(false);
    }
    let (a, b) = (CudaDevice::get(from)?, CudaDevice::get(to)?);
    let mut can = 0i32;
    // SAFETY: the out-pointer is valid and both handles come from live contexts.
    let status = unsafe { sys::cuDeviceCanAccessPeer(&mut can, a.context().cu_device(), b.context().cu_device()) };
    status.result().map_err(|source| a.driver_error("cuDeviceCanAccessPeer", source))?;
    Ok(can != 0)
}

/// Per unordered pair of ordinals: whether direct access was enabled both ways.
static ENABLED: Mutex<Option<HashMap<(usize, usize), bool>>> = Mutex::new(None);

/// Enables direct access between `a` and `b` in both directions, once per pair for the life of
/// the process, and says whether it is on. `false` (peer access impossible) is not an error: a
/// copy then goes through the host.
pub(crate) fn enable_peer_access(a: &CudaDevice, b: &CudaDevice) -> Result<bool> {
    let key = (a.ordinal().min(b.ordinal()), a.ordinal().max(b.ordinal()));
    // Held while enabling, so that two threads do not race to enable the same pair.
    let mut enabled = ENABLED.lock();
    let table = enabled.get_or_insert_with(HashMap::new);
    if let Some(&on) = table.get(&key) {
        return Ok(on);
    }
    let on = can_access_peer(a.ordinal(), b.ordinal())?
        && can_access_peer(b.ordinal(), a.ordinal())?
        && grant(a, b)?
        && grant(b, a)?;
    table.insert(key, on);
    Ok(on)
}

/// Lets `from` access memory that lives on `to`; false when the driver has no room for another
/// peer.
fn grant(from: &CudaDevice, to: &CudaDevice) -> Result<bool> {
    from.bind()?;
    // SAFETY: `from`'s context is current and `to`'s context is live.
    let status = unsafe { sys::cuCtxEnablePeerAccess(to.context().cu_ctx(), 0) };
    match status {
        sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {}
        sys::CUresult::CUDA_ERROR_TOO_MANY_PEERS => return Ok(false),
        other => other.result().map_err(|source| from.driver_error("cuCtxEnablePeerAccess", source))?,
    }
    // Memory from a stream-ordered pool (how tensors are allocated when the device supports it)
    // does not follow the context's peer access: the pool grants it itself.
    if to.context().has_async_alloc() {
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: the out-pointer is valid and the device handle comes from a live context.
        unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, to.context().cu_device()) }
            .result()
            .map_err(|source| to.driver_error("cuDeviceGetDefaultMemPool", source))?;
        let ordinal = i32::try_from(from.ordinal())
            .map_err(|_| Error::NoSuchDevice { ordinal: from.ordinal(), count: super::device_count().unwrap_or(0) })?;
        let access = sys::CUmemAccessDesc {
            location: sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: ordinal },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: one valid descriptor, naming a device other than the pool's own.
        unsafe { sys::cuMemPoolSetAccess(pool, &access, 1) }
            .result()
            .map_err(|source| to.driver_error("cuMemPoolSetAccess", source))?;
    }
    Ok(true)
}
