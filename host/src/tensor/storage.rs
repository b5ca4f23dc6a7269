//! Memory behind tensors, shared between a tensor and its views.
use crate::DType;
#[cfg(feature = "cuda")]
use crate::cuda::block_cache::{self, MAX_BLOCK};
#[cfg(feature = "cuda")]
use crate::cuda::graph::{DeferredFree, GraphPool};
#[cfg(feature = "cuda")]
use crate::cuda::{CudaDevice, Stream, stream_order::StreamUses};
#[cfg(feature = "cuda")]
use crate::{Device, Error, Result, Tensor};
#[cfg(feature = "cuda")]
use cudarc::driver::{CudaSlice, DevicePtr};
use parking_lot::RwLock;
#[cfg(feature = "cuda")]
use parking_lot::{RwLockReadGuard, RwLockWriteGuard};
#[cfg(feature = "cuda")]
use smallvec::SmallVec;
#[cfg(feature = "cuda")]
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Host memory of one dtype.
#[doc(hidden)]
#[derive(Clone, Debug)]
pub enum CpuBuffer {
    F32(Vec<f32>),
    F16(Vec<half::f16>),
    BF16(Vec<half::bf16>),
    F64(Vec<f64>),
    U32(Vec<u32>),
    I64(Vec<i64>),
}

impl CpuBuffer {
    pub(crate) fn dtype(&self) -> DType {
        match self {
            CpuBuffer::F32(_) => DType::F32,
            CpuBuffer::F16(_) => DType::F16,
            CpuBuffer::BF16(_) => DType::BF16,
            CpuBuffer::F64(_) => DType::F64,
            CpuBuffer::U32(_) => DType::U32,
            CpuBuffer::I64(_) => DType::I64,
        }
    }
}

/// The memory of a tensor and its views, with a version that counts in-place writes (autograd
/// uses it to detect a saved tensor modified before backward).
pub(crate) struct Storage {
    pub(crate) data: StorageData,
    version: AtomicU64,
}

pub(crate) enum StorageData {
    Cpu(RwLock<CpuBuffer>),
    /// Device memory as raw bytes: kernels see only pointers, and the tensor knows the dtype.
    #[cfg(feature = "cuda")]
    Cuda {
        device: CudaDevice,
        /// Taken out by `Storage`'s destructor, which frees it or keeps it for reuse.
        bytes: ManuallyDrop<RwLock<CudaSlice<u8>>>,
        /// Which streams used it, so that work on another stream waits for them. Taken out by
        /// the destructor with `bytes`.
        uses: ManuallyDrop<StreamUses>,
        /// The CUDA graph whose capture allocated it, which owns the memory (`cuda::graph`).
        pool: Option<Arc<GraphPool>>,
    },
}

#[cfg(feature = "cuda")]
impl Drop for Storage {
    fn drop(&mut self) {
        // The memory is freed on the stream that allocated it; that stream first waits for
        // the other streams that used it. A small block of the default stream is kept for the
        // next allocation of its size there instead (`cuda::block_cache`). A graph's memory goes
        // back to its pool, and memory dropped while its device captures a graph waits for the
        // capture to end (`cuda::graph`).
        if let StorageData::Cuda { device, bytes, uses, pool } = &mut self.data {
            // SAFETY: this is the storage's destructor; `bytes` and `uses` are not touched again.
            let (block, uses) = unsafe { (ManuallyDrop::take(bytes).into_inner(), ManuallyDrop::take(uses)) };
            if let Some(pool) = pool {
                pool.give_back(block);
            } else if let Some(capture) = device.active_capture() {
                capture.defer_free(DeferredFree { block, uses });
            } else {
                block_cache::release(device, block, &uses);
            }
        }
    }
}

#[cfg(feature = "cuda")]
impl StorageData {
    fn cuda(device: CudaDevice, slice: CudaSlice<u8>, stream: &Stream, pool: Option<Arc<GraphPool>>) -> Self {
        StorageData::Cuda {
            device,
            bytes: ManuallyDrop::new(RwLock::new(slice)),
            uses: ManuallyDrop::new(StreamUses::new(stream)),
            pool,
        }
    }
}

impl Storage {
    pub(crate) fn cpu(buf: CpuBuffer) -> Arc<Self> {
        Arc::new(Self { data: StorageData::Cpu(RwLock::new(buf)), version: AtomicU64::new(0) })
    }

    /// Uninitialised device memory for `bytes` bytes, allocated on `stream` for `op`.
    #[cfg(feature = "cuda")]
    pub(crate) fn cuda_uninit(op: &'static str, stream: &Stream, bytes: usize) -> Result<Arc<Self>> {
        let device = stream.device().clone();
        device.bind()?;
        if let Some(capture) = device.capture_on(stream) {
            let (slice, pool) = capture.alloc(op, bytes)?;
            return Ok(Arc::new(Self {
                data: StorageData::cuda(device, slice, stream, Some(pool)),
                version: AtomicU64::new(0),
            }));
        }
        let alloc = || {
            if bytes == 0 {
                stream.raw().null::<u8>()
            } else {
                // SAFETY: the memory is uninitialised; every constructor that calls this writes
                // all of it (an upload, a fill, or an op's output) before anyone reads it.
                unsafe { stream.raw().alloc::<u8>(bytes) }
            }
            .map_err(|e| Error::from_alloc(op, device.device(), bytes, e))
        };
        let cached = match bytes {
            1..=MAX_BLOCK if device.is_default_stream(stream) => device.block_cache().take(bytes),
            _ => None,
        };
        let slice = match cached.map(Ok).unwrap_or_else(alloc) {
            // The pool keeps freed memory for reuse (see `keep_pool_memory`): hand it back to
            // the driver and try once more before reporting out-of-memory, and leave the pool
            // empty if even that fails, so a failed allocation hoards nothing.
            Err(Error::OutOfMemory { .. }) => {
                device.release_cached_memory()?;
                let retried = alloc();
                if retried.is_err() {
                    device.release_cached_memory()?;
                }
                retried?
            }
            other => other?,
        };
        Ok(Arc::new(Self { data: StorageData::cuda(device, slice, stream, None), version: AtomicU64::new(0) }))
    }

    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    pub(crate) fn bump_version(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(feature = "cuda")]
enum CudaGuard<'a> {
    Read(RwLockReadGuard<'a, CudaSlice<u8>>),
    Write(RwLockWriteGuard<'a, CudaSlice<u8>>),
}

#[cfg(feature = "cuda")]
/// Calls `f` with device pointers to the first element of each of `reads` and `writes` (in the
/// order given), valid on `stream` for the duration of `f`.
///
/// Each distinct storage is locked once (for writing if any tensor in `writes` uses it), in
/// address order so that concurrent callers cannot deadlock. Work queued by `f` is ordered after
/// earlier writes to the same memory on other streams (and, for a write, after earlier reads
/// there), and later users on other streams wait for it (`cuda::stream_order`); on one stream
/// this costs no driver call. A tensor on another device than `stream`'s is an
/// [`Error::DeviceMismatch`] naming `op`.
pub(crate) fn with_cuda_ptrs<R>(
    op: &'static str,
    stream: &Stream,
    reads: &[&Tensor],
    writes: &[&Tensor],
    f: impl FnOnce(&[u64], &[u64]) -> Result<R>,
) -> Result<R> {
    cuda_ptrs(op, stream, reads, writes, false, f)
}

#[cfg(feature = "cuda")]
/// [`with_cuda_ptrs`] for work whose footprint is exactly `reads` and `writes`: `f` queues one
/// kernel that touches no other memory. Inside a graph capture such a kernel is recorded
/// depending only on the earlier nodes that use the same memory (see `cuda::graph`'s
/// branches), where other work depends on everything recorded before it.
pub(crate) fn with_cuda_ptrs_exact<R>(
    op: &'static str,
    stream: &Stream,
    reads: &[&Tensor],
    writes: &[&Tensor],
    f: impl FnOnce(&[u64], &[u64]) -> Result<R>,
) -> Result<R> {
    cuda_ptrs(op, stream, reads, writes, true, f)
}

#[cfg(feature = "cuda")]
fn cuda_ptrs<R>(
    op: &'static str,
    stream: &Stream,
    reads: &[&Tensor],
    writes: &[&Tensor],
    exact: bool,
    f: impl FnOnce(&[u64], &[u64]) -> Result<R>,
) -> Result<R> {
    // Inline up to 8 operands: a launch then allocates nothing on the host for its pointers.
    let mut storages: SmallVec<[(*const Storage, &Arc<Storage>, bool); 8]> = SmallVec::new();
    for (t, write) in reads.iter().map(|t| (t, false)).chain(writes.iter().map(|t| (t, true))) {
        let ptr = Arc::as_ptr(&t.storage);
        match storages.iter_mut().find(|(p, _, _)| *p == ptr) {
            Some(entry) => entry.2 |= write,
            None => storages.push((ptr, &t.storage, write)),
        }
    }
    storages.sort_by_key(|(p, _, _)| *p as usize);

    let capture = stream.device().capture_on(stream);
    let mut guards: SmallVec<[CudaGuard<'_>; 8]> = SmallVec::new();
    for (_, storage, write) in &storages {
        let (bytes, uses) = match &storage.data {
            StorageData::Cuda { device, bytes, uses, .. } if device == stream.device() => (bytes, uses),
            // A kernel may not be able to reach another device's memory: callers check devices
            // first, and this keeps a miss from reaching the driver.
            StorageData::Cuda { device, .. } => {
                return Err(Error::DeviceMismatch { op, lhs: stream.device().device(), rhs: device.device() });
            }
            StorageData::Cpu(_) => {
                return Err(Error::DeviceMismatch { op, lhs: stream.device().device(), rhs: Device::Cpu });
            }
        };
        if let Some(capture) = &capture {
            uses.check_capturable(op, stream, *write)?;
            capture.touch(storage, *write);
        }
        guards.push(if *write { CudaGuard::Write(bytes.write()) } else { CudaGuard::Read(bytes.read_recursive()) });
        if *write { uses.write_on(stream)? } else { uses.read_on(stream)? }
    }
    for (_, storage, write) in &storages {
        if *write {
            storage.bump_version();
        }
    }
    let bases: SmallVec<[u64; 8]> = guards.iter().map(|guard| device_address(guard)).collect();
    let address = |t: &Tensor| {
        let index = storages.iter().position(|(p, _, _)| *p == Arc::as_ptr(&t.storage)).unwrap_or(0);
        bases[index] + (t.offset * t.dtype.size_in_bytes()) as u64
    };
    let read_ptrs: SmallVec<[u64; 8]> = reads.iter().map(|t| address(t)).collect();
    let write_ptrs: SmallVec<[u64; 8]> = writes.iter().map(|t| address(t)).collect();
    // Each storage by its base address: a block the graph's pool hands out again has the same
    // base, so the new tensor's users are ordered after the old one's.
    // Built only while capturing: an eager launch pays nothing for it.
    let footprint: SmallVec<[(u64, bool); 8]> = match &capture {
        Some(_) if exact => storages.iter().zip(&bases).map(|((_, _, write), base)| (*base, *write)).collect(),
        _ => SmallVec::new(),
    };
    let branch = match &capture {
        Some(capture) if exact => capture.begin_exact(&footprint)?,
        _ => false,
    };
    let result = f(&read_ptrs, &write_ptrs);
    if let (true, Some(capture)) = (branch, &capture) {
        capture.end_exact(&footprint, result.is_ok())?;
    }
    for (_, storage, write) in &storages {
        if let (false, StorageData::Cuda { uses, .. }) = (*write, &storage.data) {
            uses.read_done(stream)?;
        }
    }
    drop(guards);
    result
}

#[cfg(feature = "cuda")]
/// The device address of a locked allocation.
fn device_address(guard: &CudaGuard<'_>) -> u64 {
    let slice: &CudaSlice<u8> = match guard {
        CudaGuard::Read(g) => g,
        CudaGuard::Write(g) => g,
    };
    raw_address(slice)
}

#[cfg(feature = "cuda")]
/// The device address of `slice`. cudarc's event tracking is off for opsmith's contexts, so
/// `device_ptr` records and waits for nothing: it is a plain read of the address.
pub(crate) fn raw_address(slice: &CudaSlice<u8>) -> u64 {
    let (ptr, _no_event) = slice.device_ptr(slice.stream());
    ptr
}

#[cfg(feature = "cuda")]
/// Copies all of `src` into `dst`, which live on two different CUDA devices with peer access
/// enabled between them (see `cuda::peer`), without a host round trip.
///
/// The copy runs on `dst`'s device's current stream. That stream first waits for the work that
/// writes `src` (through an event on `src`'s current stream, as an event can only be recorded on
/// a stream of its own context), and `src`'s current stream then waits for the copy, so that
/// `src`'s next writer, which waits for `src`'s last reader, cannot overwrite it mid-copy. The
/// copy counts as a write of `dst` on `dst`'s stream, which its next user elsewhere waits for.
pub(crate) fn copy_to_peer(src: &Tensor, dst: &Tensor) -> Result<()> {
    let op = "Tensor::to_device";
    crate::cuda::graph::refuse_while_capturing(op, "a graph records one device's work, and this copies between two")?;
    let (
        StorageData::Cuda { device: src_dev, bytes: src_bytes, uses: src_uses, .. },
        StorageData::Cuda { device: dst_dev, bytes: dst_bytes, uses: dst_uses, .. },
    ) = (&src.storage.data, &dst.storage.data)
    else {
        return Err(Error::DeviceMismatch { op, lhs: src.device, rhs: dst.device });
    };
    let n = src.elem_count();
    if src_dev == dst_dev || n != dst.elem_count() || src.dtype != dst.dtype {
        return Err(Error::InvalidArgument {
            op,
            reason: format!("a peer copy needs two devices, got {src:?} and {dst:?}"),
        });
    }
    if n == 0 {
        return Ok(());
    }
    let size = src.dtype.size_in_bytes();
    let (src_stream, dst_stream) = (src_dev.current_stream(), dst_dev.current_stream());
    // Two storages, locked in address order, as `with_cuda_ptrs` does, so that copies in both
    // directions at once cannot deadlock.
    let (src_guard, dst_guard) = if Arc::as_ptr(&src.storage) < Arc::as_ptr(&dst.storage) {
        let s = src_bytes.read_recursive();
        (s, dst_bytes.write())
    } else {
        let d = dst_bytes.write();
        (src_bytes.read_recursive(), d)
    };
    let src_err = |call| move |e| src_dev.driver_error(call, e);
    let dst_err = |call| move |e| dst_dev.driver_error(call, e);

    src_dev.bind()?;
    src_uses.read_on(&src_stream)?;
    let src_base = raw_address(&src_guard);
    let src_ready = src_stream.raw().record_event(None).map_err(src_err("cuEventRecord"))?;
    dst_stream.raw().wait(&src_ready).map_err(dst_err("cuStreamWaitEvent"))?;

    dst_dev.bind()?;
    dst_uses.write_on(&dst_stream)?;
    let dst_base = raw_address(&dst_guard);
    // SAFETY: both ranges lie inside their live allocations (the tensors' elements), peer access
    // is enabled both ways, and the stream waits for `src`'s writer and `dst`'s users above.
    unsafe {
        cudarc::driver::result::memcpy_peer_async(
            dst_dev.context().cu_ctx(),
            dst_base + (dst.offset * size) as u64,
            src_dev.context().cu_ctx(),
            src_base + (src.offset * size) as u64,
            n * size,
            dst_stream.raw().cu_stream(),
        )
    }
    .map_err(dst_err("cuMemcpyPeerAsync"))?;
    let copied = dst_stream.raw().record_event(None).map_err(dst_err("cuEventRecord"))?;
    // `src`'s read is noted on its own stream, which from here on also waits for the copy.
    src_stream.raw().wait(&copied).map_err(src_err("cuStreamWaitEvent"))?;
    src_uses.read_done(&src_stream)?;
    drop((src_guard, dst_guard));
    dst.storage.bump_version();
    Ok(())
}
