//! NCCL communicators on opsmith tensors, through cudarc's NCCL bindings.
use super::bootstrap::{TOKEN_ENV, Token, broadcast_bytes, check_rank};
use crate::cuda::CudaDevice;
use crate::tensor::storage::with_cuda_ptrs;
use crate::{DType, Device, Error, Result, Tensor};
use cudarc::nccl::result::{self as nccl, NcclError};
use cudarc::nccl::sys;
use std::ffi::{CStr, c_void};
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

/// The oldest NCCL with `ncclAvg` and bf16, both of which the communicator uses.
const MIN_VERSION: i32 = 2_10_00;
/// The first NCCL with `ncclGetLastError`.
const LAST_ERROR_VERSION: i32 = 2_13_00;

const FIX: &str = "install NCCL 2.10 or newer so that the loader finds `libnccl.so` (cudarc looks for that \
                   name, not only `libnccl.so.2`): `apt install libnccl2 libnccl-dev`, or `pip install \
                   nvidia-nccl-cu12` and link its libnccl.so.2 as libnccl.so in a directory on LD_LIBRARY_PATH";

/// NCCL's version code (e.g. 22803 for 2.28.3) once the library is loaded and recent enough.
fn loaded() -> Result<i32> {
    static VERSION: OnceLock<std::result::Result<i32, String>> = OnceLock::new();
    let version = VERSION.get_or_init(|| {
        // SAFETY: probing only loads the library by name and drops it; no NCCL call is made.
        // cudarc's own loader panics when the library is missing, so it must not run before this.
        if !unsafe { sys::is_culib_present() } {
            return Err(FIX.to_string());
        }
        keep_multicast_off();
        let version = nccl::get_nccl_version().map_err(|e| format!("ncclGetVersion failed: {e:?}"))?;
        if version < MIN_VERSION {
            return Err(format!("NCCL {} is too old: {FIX}", version_text(version)));
        }
        Ok(version)
    });
    version.clone().map_err(|fix| Error::LibraryMissing { op: "nccl", lib: "nccl", fix })
}

/// NCCL reads `NCCL_NVLS_ENABLE` when it initialises. NVLink SHARP multicast binds NVSwitch
/// multicast objects to the GPUs; on shared machines an aborted job can leave those behind and
/// take GPUs out of service, and collectives of the sizes data-parallel training reduces do not
/// need it. A value set by the user is kept.
fn keep_multicast_off() {
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        // SAFETY: this runs once, before the first NCCL call, under `loaded`'s OnceLock; Rust's
        // own environment accesses are serialised with it. What cannot be ruled out is C code on
        // another thread calling getenv at this moment; a program that has such threads sets
        // NCCL_NVLS_ENABLE itself before starting them, and then this is skipped.
        unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    }
}

fn version_text(code: i32) -> String {
    format!("{}.{}.{}", code / 10000, (code / 100) % 100, code % 100)
}

/// Whether NCCL can be loaded on this machine (and is 2.10 or newer).
///
/// ```
/// println!("NCCL: {}", opsmith_host::dist::nccl_available());
/// ```
pub fn nccl_available() -> bool {
    loaded().is_ok()
}

/// The loaded NCCL's version as (major, minor, patch); [`Error::LibraryMissing`] without it.
///
/// ```
/// match opsmith_host::dist::nccl_version() {
///     Ok((major, minor, patch)) => println!("NCCL {major}.{minor}.{patch}"),
///     Err(e) => println!("{e}"),
/// }
/// ```
pub fn nccl_version() -> Result<(u32, u32, u32)> {
    let code = loaded()? as u32;
    Ok((code / 10000, (code / 100) % 100, code % 100))
}

/// NCCL's name for the error, and its last message when the library has one.
fn nccl_error(call: &'static str, device: Device, error: NcclError) -> Error {
    // SAFETY: ncclGetErrorString returns a pointer to a static NUL-terminated string.
    let name = unsafe { CStr::from_ptr(sys::ncclGetErrorString(error.0)) }.to_string_lossy().into_owned();
    let mut reason = format!("{name} ({:?})", error.0);
    if loaded().is_ok_and(|v| v >= LAST_ERROR_VERSION) {
        // SAFETY: the communicator argument is unused by NCCL; the result is NULL or a
        // NUL-terminated string owned by NCCL, copied here at once.
        let last = unsafe { sys::ncclGetLastError(std::ptr::null_mut()) };
        if !last.is_null() {
            // SAFETY: non-null, NUL-terminated (see above).
            let last = unsafe { CStr::from_ptr(last) }.to_string_lossy();
            if !last.is_empty() {
                reason = format!("{reason}: {last}");
            }
        }
    }
    Error::Nccl { call, device, reason }
}

/// An NCCL unique id: rank 0 makes it, every rank passes it to [`Communicator::new`]. It travels
/// between processes and hosts as its 128 bytes ([`UniqueId::to_bytes`], [`bootstrap_tcp`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId([u8; 128]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId({:02x?}…)", &self.0[..8])
    }
}

impl UniqueId {
    /// A fresh id (`ncclGetUniqueId`; NCCL also opens its own bootstrap socket on this host,
    /// which the ranks find through the id). [`Error::LibraryMissing`] without NCCL.
    ///
    /// ```
    /// use opsmith_host::{dist::UniqueId, Error};
    /// match UniqueId::new() {
    ///     Ok(id) => assert_eq!(UniqueId::from_bytes(id.to_bytes()), id),
    ///     Err(Error::LibraryMissing { lib, .. }) => assert_eq!(lib, "nccl"),
    ///     Err(e) => panic!("{e}"),
    /// }
    /// ```
    pub fn new() -> Result<UniqueId> {
        loaded()?;
        let id = nccl::get_uniqueid().map_err(|e| nccl_error("ncclGetUniqueId", Device::Cpu, e))?;
        Ok(UniqueId(id.internal.map(|c| c as u8)))
    }

    /// The id's bytes, to send to the other ranks.
    pub fn to_bytes(&self) -> [u8; 128] {
        self.0
    }

    /// The id from bytes made by [`UniqueId::to_bytes`] on rank 0.
    ///
    /// ```
    /// use opsmith_host::dist::UniqueId;
    /// let id = UniqueId::from_bytes([7; 128]);
    /// assert_eq!(id.to_bytes(), [7; 128]);
    /// ```
    pub fn from_bytes(bytes: [u8; 128]) -> UniqueId {
        UniqueId(bytes)
    }

    fn raw(&self) -> sys::ncclUniqueId {
        sys::ncclUniqueId { internal: self.0.map(|b| b as std::ffi::c_char) }
    }
}

/// Rank 0 makes a [`UniqueId`] and sends it over TCP to ranks `1..world_size`, which connect to
/// `addr` (rank 0's address, reachable from every rank) and retry until `timeout`; every rank
/// returns the same id. See [`broadcast_bytes`] for the exchange and its errors.
///
/// Across hosts, start one process per GPU with its rank, the world size and the same address
/// (the examples read it from [`ADDR_ENV`](super::ADDR_ENV), `OPSMITH_DIST_ADDR=host:port`).
/// When [`TOKEN_ENV`] (`OPSMITH_DIST_TOKEN`) is set, every rank must have the same secret there,
/// and only ranks that prove they hold it are sent the id (see [`Token`]); unset, the exchange
/// is unauthenticated (see the [module docs](super) for the trust model). A token that is set
/// but empty is an [`Error::InvalidArgument`].
///
/// ```no_run
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::dist::{ADDR_ENV, Communicator, addr_from_env, bootstrap_tcp};
/// use opsmith_host::Device;
/// let (rank, world_size) = (1, 2); // from your launcher
/// let addr = addr_from_env(ADDR_ENV, "127.0.0.1:29500")?;
/// let id = bootstrap_tcp(rank, world_size, addr, std::time::Duration::from_secs(120))?;
/// let comm = Communicator::new(Device::Cuda(0), rank, world_size, &id)?;
/// # Ok(()) }
/// ```
pub fn bootstrap_tcp(rank: usize, world_size: usize, addr: SocketAddr, timeout: Duration) -> Result<UniqueId> {
    let token = Token::from_env(TOKEN_ENV)?;
    let bytes =
        broadcast_bytes(rank, world_size, addr, timeout, token.as_ref(), || Ok(UniqueId::new()?.to_bytes().to_vec()))?;
    let bytes: [u8; 128] = bytes.try_into().map_err(|b: Vec<u8>| Error::Bootstrap {
        rank,
        addr,
        reason: format!("received {} bytes; an NCCL unique id has 128", b.len()),
    })?;
    Ok(UniqueId::from_bytes(bytes))
}

/// One rank's NCCL communicator, bound to one GPU.
///
/// Collectives run on the device's current stream (see [`Stream::make_current`](crate::cuda::Stream::make_current)), ordered
/// after earlier writes to the tensors on other streams and before their later users, like any
/// op; they write the tensors in place and bump their versions. Every rank must issue the same
/// collectives, in the same order, on tensors of the same shapes and dtypes: NCCL matches them
/// by order, and a rank that skips one leaves the others waiting.
///
/// A communicator can move to another thread but not be shared between threads. Dropped
/// normally, it is destroyed (`ncclCommDestroy`, which waits for its pending collectives);
/// dropped during a panic, or after NCCL reported an asynchronous error, it is aborted.
///
/// ```no_run
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::dist::{Communicator, UniqueId};
/// use opsmith_host::{cuda, Device, Tensor};
/// let world_size = cuda::device_count()?;
/// let id = UniqueId::new()?;
/// let handles: Vec<_> = (0..world_size)
///     .map(|rank| {
///         std::thread::spawn(move || -> opsmith_host::Result<Vec<f32>> {
///             let device = Device::Cuda(rank);
///             let comm = Communicator::new(device, rank, world_size, &id)?;
///             let grad = Tensor::from_vec(vec![rank as f32; 4], [4], device)?;
///             comm.all_reduce_mean_(&[&grad])?;
///             grad.to_vec::<f32>()
///         })
///     })
///     .collect();
/// for h in handles {
///     assert_eq!(h.join().unwrap()?, vec![(world_size - 1) as f32 / 2.0; 4]);
/// }
/// # Ok(()) }
/// ```
pub struct Communicator {
    comm: sys::ncclComm_t,
    device: CudaDevice,
    rank: usize,
    world_size: usize,
}

// SAFETY: an NCCL communicator may be used from any thread, one at a time; `Communicator` is not
// `Sync`, so `&self` methods never run on two threads at once.
unsafe impl Send for Communicator {}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Communicator(rank {} of {}, {})", self.rank, self.world_size, self.device())
    }
}

/// NCCL's type for a dtype.
fn nccl_dtype(dtype: DType) -> sys::ncclDataType_t {
    match dtype {
        DType::F32 => sys::ncclDataType_t::ncclFloat32,
        DType::F16 => sys::ncclDataType_t::ncclFloat16,
        DType::BF16 => sys::ncclDataType_t::ncclBfloat16,
        DType::F64 => sys::ncclDataType_t::ncclFloat64,
        DType::U32 => sys::ncclDataType_t::ncclUint32,
        DType::I64 => sys::ncclDataType_t::ncclInt64,
    }
}

impl Communicator {
    /// Joins the communicator of `world_size` ranks named by `id` as `rank`, on `device`.
    ///
    /// Blocks until every rank has called it (NCCL's `ncclCommInitRank`), so each rank runs in
    /// its own thread or process. Fails with [`Error::LibraryMissing`] without NCCL, and with
    /// [`Error::InvalidArgument`] for a rank outside the world or a device that is not a GPU.
    ///
    /// ```
    /// use opsmith_host::dist::{Communicator, UniqueId};
    /// use opsmith_host::{Device, Error};
    /// let id = UniqueId::from_bytes([0; 128]);
    /// let err = Communicator::new(Device::Cpu, 0, 1, &id).unwrap_err();
    /// assert!(matches!(err, Error::InvalidArgument { op: "Communicator::new", .. }), "{err}");
    /// ```
    pub fn new(device: Device, rank: usize, world_size: usize, id: &UniqueId) -> Result<Self> {
        let op = "Communicator::new";
        let Device::Cuda(ordinal) = device else {
            return Err(Error::InvalidArgument {
                op,
                reason: format!("NCCL communicators live on GPUs, not {device}"),
            });
        };
        check_rank(op, rank, world_size)?;
        loaded()?;
        let cuda = CudaDevice::get(ordinal)?;
        // NCCL takes the device from the current context.
        cuda.bind()?;
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: the out-pointer is valid; rank and world size were checked to fit an i32.
        unsafe { nccl::comm_init_rank(&mut comm, world_size as i32, id.raw(), rank as i32) }
            .map_err(|e| nccl_error("ncclCommInitRank", device, e))?;
        Ok(Communicator { comm, device: cuda, rank, world_size })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The GPU this rank's collectives run on.
    pub fn device(&self) -> Device {
        self.device.device()
    }

    /// Replaces each tensor by the sum of that tensor over all ranks, in place. The tensors go
    /// in one NCCL group (one launch for all of them).
    ///
    /// Fails before any communication with [`Error::DeviceMismatch`] for a tensor on another
    /// device than the communicator's, and with [`Error::Overlap`] when two tensors share
    /// memory.
    ///
    /// ```no_run
    /// # fn main() -> opsmith_host::Result<()> {
    /// # use opsmith_host::{dist::{Communicator, UniqueId}, DType, Device, Tensor};
    /// # let comm = Communicator::new(Device::Cuda(0), 0, 1, &UniqueId::new()?)?;
    /// let (w, b) = (Tensor::full(1.0, [4, 4], DType::F32, Device::Cuda(0))?, Tensor::zeros([4], DType::F32, Device::Cuda(0))?);
    /// comm.all_reduce_sum_(&[&w, &b])?; // one NCCL group for both
    /// # Ok(()) }
    /// ```
    pub fn all_reduce_sum_(&self, tensors: &[&Tensor]) -> Result<()> {
        self.all_reduce("all_reduce_sum_", tensors, sys::ncclRedOp_t::ncclSum)
    }

    /// Replaces each tensor by the mean of that tensor over all ranks, in place (NCCL's
    /// `ncclAvg`, which for floating-point types scales each rank's values by 1/world size
    /// and sums): how data-parallel training averages gradients. Errors as
    /// [`Communicator::all_reduce_sum_`].
    pub fn all_reduce_mean_(&self, tensors: &[&Tensor]) -> Result<()> {
        self.all_reduce("all_reduce_mean_", tensors, sys::ncclRedOp_t::ncclAvg)
    }

    /// Overwrites `t` on every rank with rank `root`'s `t`, in place: how every replica starts
    /// from the same weights.
    ///
    /// ```no_run
    /// # fn main() -> opsmith_host::Result<()> {
    /// # use opsmith_host::{dist::{Communicator, UniqueId}, DType, Device, Tensor};
    /// # let comm = Communicator::new(Device::Cuda(0), 0, 1, &UniqueId::new()?)?;
    /// let weights = Tensor::zeros([256, 256], DType::F32, comm.device())?; // each rank's own init
    /// comm.broadcast_(&weights, 0)?; // now rank 0's everywhere
    /// # Ok(()) }
    /// ```
    pub fn broadcast_(&self, t: &Tensor, root: usize) -> Result<()> {
        let op = "broadcast_";
        if root >= self.world_size {
            return Err(Error::InvalidArgument {
                op,
                reason: format!("root {root} is not a rank of a world of {}", self.world_size),
            });
        }
        self.check_devices(op, &[t])?;
        if t.elem_count() == 0 {
            return Ok(());
        }
        let stream = self.device.current_stream();
        with_cuda_ptrs(op, &stream, &[], &[t], |_, ptrs| {
            self.device.bind()?;
            // SAFETY: in place: the pointer is valid for `t`'s elements on this device, and
            // `with_cuda_ptrs` holds the storage's write lock while NCCL enqueues.
            unsafe {
                nccl::broadcast(
                    ptrs[0] as *const c_void,
                    ptrs[0] as *mut c_void,
                    t.elem_count(),
                    nccl_dtype(t.dtype()),
                    root as i32,
                    self.comm,
                    stream.raw().cu_stream() as sys::cudaStream_t,
                )
            }
            .map(|_| ())
            .map_err(|e| nccl_error("ncclBroadcast", self.device(), e))
        })
    }

    fn check_devices(&self, op: &'static str, tensors: &[&Tensor]) -> Result<()> {
        match tensors.iter().find(|t| t.device() != self.device()) {
            Some(t) => Err(Error::DeviceMismatch { op, lhs: self.device(), rhs: t.device() }),
            None => Ok(()),
        }
    }

    fn all_reduce(&self, op: &'static str, tensors: &[&Tensor], reduce: sys::ncclRedOp_t) -> Result<()> {
        self.check_devices(op, tensors)?;
        crate::ops::check::no_partial_overlap(op, &[], tensors)?;
        // Every rank skips the same empty tensors, as the shapes agree across ranks.
        let tensors: Vec<&Tensor> = tensors.iter().copied().filter(|t| t.elem_count() > 0).collect();
        if tensors.is_empty() {
            return Ok(());
        }
        let stream = self.device.current_stream();
        with_cuda_ptrs(op, &stream, &[], &tensors, |_, ptrs| {
            self.device.bind()?;
            nccl::group_start().map_err(|e| nccl_error("ncclGroupStart", self.device(), e))?;
            let mut first_error = None;
            for (t, &ptr) in tensors.iter().zip(ptrs) {
                // SAFETY: in place: each pointer is valid for its tensor's elements on this
                // device, no two tensors overlap, and `with_cuda_ptrs` holds their write locks
                // until the group has been enqueued.
                let queued = unsafe {
                    nccl::all_reduce(
                        ptr as *const c_void,
                        ptr as *mut c_void,
                        t.elem_count(),
                        nccl_dtype(t.dtype()),
                        reduce,
                        self.comm,
                        stream.raw().cu_stream() as sys::cudaStream_t,
                    )
                };
                if let Err(e) = queued {
                    first_error = Some(nccl_error("ncclAllReduce", self.device(), e));
                    break;
                }
            }
            // Ended even after a failure, so the thread is not left inside a group.
            let ended = nccl::group_end().map_err(|e| nccl_error("ncclGroupEnd", self.device(), e));
            match first_error {
                Some(e) => Err(e),
                None => ended.map(|_| ()),
            }
        })
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Errors here have nowhere to go; the device's context may be current for no one else.
        let _ = self.device.bind();
        let mut pending = sys::ncclResult_t::ncclSuccess;
        // SAFETY: the communicator is live until the destroy or abort below.
        let queried = unsafe { sys::ncclCommGetAsyncError(self.comm, &mut pending) };
        let healthy = !std::thread::panicking()
            && queried == sys::ncclResult_t::ncclSuccess
            && pending == sys::ncclResult_t::ncclSuccess;
        // SAFETY: called once, on a live communicator that nothing uses afterwards. Destroy waits
        // for pending collectives, which on the failure path may never finish, so that path
        // aborts them instead.
        let _ = unsafe { if healthy { nccl::comm_destroy(self.comm) } else { nccl::comm_abort(self.comm) } };
    }
}
