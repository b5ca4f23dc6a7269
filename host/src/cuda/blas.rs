//! cuBLAS: whether the library loads, and its handles, one per stream.
//!
//! cudarc loads libcublas at run time and panics when it cannot, so every op checks
//! [`require_cublas`] before its first cuBLAS call and returns [`Error::LibraryMissing`] instead.
//!
//! A handle is costly to create (it allocates device workspace), so handles are created on first
//! use and kept. Each belongs to one stream: cuBLAS documents that streams sharing a handle share
//! its workspace pool, which makes results depend on what the other streams run at the same
//! time; a handle per stream keeps every result reproducible. Handles are never destroyed
//! (at process exit the driver may already be gone); once nobody holds a handle's stream any
//! more, the handle is handed to the next new stream of its device.
use super::Stream;
use crate::{Error, Result};
use cudarc::cublas::result::{self as cublas, CublasError};
use cudarc::cublas::sys;
use cudarc::driver::CudaStream;
use parking_lot::Mutex;
use std::sync::{Arc, OnceLock};

/// The name the loader is asked for first.
const LIB: &str = "libcublas.so";

/// Whether libcublas can be loaded on this machine (probed once).
///
/// ```
/// // false on a machine without CUDA: matmul on Device::Cpu needs no cuBLAS.
/// let _present: bool = opsmith_host::cuda::cublas_available();
/// ```
pub fn cublas_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: probing loads the library by name and drops it again; no cuBLAS function runs.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// `Ok` when libcublas loads; otherwise [`Error::LibraryMissing`] naming `op`, with the fix.
///
/// ```
/// use opsmith_host::{cuda, Error};
/// match cuda::require_cublas("my_op") {
///     Ok(()) => {}
///     Err(Error::LibraryMissing { fix, .. }) => eprintln!("no cuBLAS: {fix}"),
///     Err(other) => panic!("{other}"),
/// }
/// ```
pub fn require_cublas(op: &'static str) -> Result<()> {
    if cublas_available() {
        return Ok(());
    }
    Err(Error::LibraryMissing {
        op,
        lib: LIB,
        fix: "put the directory that holds libcublas.so on LD_LIBRARY_PATH (/usr/local/cuda/lib64 for a CUDA \
              toolkit, site-packages/nvidia/cu13/lib or nvidia/cublas/lib for pip's wheels), or, where that \
              directory has only libcublas.so.13, add the symlink libcublas.so -> libcublas.so.13 there \
              (opsmith asks for libcublas.so and libcublas.so.12, not .so.13)"
            .into(),
    })
}

/// How many cuBLAS handles opsmith holds, over all devices: one per stream that has run a
/// cuBLAS op, except that a stream's handle passes to a new stream once the old one is gone.
///
/// ```
/// // Matmul on the CPU needs no handle.
/// let _handles: usize = opsmith_host::cuda::cublas_handles();
/// ```
pub fn cublas_handles() -> usize {
    POOL.lock().len()
}

struct Handle(sys::cublasHandle_t);

// SAFETY: cuBLAS handles may be used from any host thread; each one is used by one thread at a
// time, under its mutex.
unsafe impl Send for Handle {}

struct Entry {
    ordinal: usize,
    /// Held so that the stream outlives its queued work's use of the handle: once this is the
    /// last reference, no new work can reach the stream and the handle may be rebound.
    stream: Arc<CudaStream>,
    handle: Arc<Mutex<Handle>>,
}

static POOL: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// Calls `f` with the cuBLAS handle of `stream`, with the stream's context current on this
/// thread and no other thread using the handle. `blas_error` maps a failed cuBLAS call (by
/// name) to the caller's error.
pub(crate) fn with_handle<R>(
    stream: &Stream,
    blas_error: &dyn Fn(&'static str, CublasError) -> Error,
    f: impl FnOnce(sys::cublasHandle_t) -> Result<R>,
) -> Result<R> {
    stream.device().bind()?;
    let handle = handle_for(stream, blas_error)?;
    let guard = handle.lock();
    f(guard.0)
}

fn handle_for(stream: &Stream, blas_error: &dyn Fn(&'static str, CublasError) -> Error) -> Result<Arc<Mutex<Handle>>> {
    let ordinal = stream.device().ordinal();
    let raw_stream = stream.raw();
    let mut pool = POOL.lock();
    if let Some(entry) = pool.iter().find(|e| Arc::ptr_eq(&e.stream, raw_stream)) {
        return Ok(entry.handle.clone());
    }
    // Both counts are 1 only when the pool holds the last references (it is locked, so no one
    // can take a new one): the stream is unreachable and no call is using the handle.
    let idle = pool
        .iter_mut()
        .find(|e| e.ordinal == ordinal && Arc::strong_count(&e.stream) == 1 && Arc::strong_count(&e.handle) == 1);
    if let Some(entry) = idle {
        // Work queued on the old stream may still be using the handle's workspace.
        entry.stream.synchronize().map_err(|source| stream.device().driver_error("cuStreamSynchronize", source))?;
        // SAFETY: the handle is live and unused, and the stream belongs to the current context.
        unsafe { cublas::set_stream(entry.handle.lock().0, raw_stream.cu_stream() as sys::cudaStream_t) }
            .map_err(|source| blas_error("cublasSetStream", source))?;
        entry.stream = raw_stream.clone();
        return Ok(entry.handle.clone());
    }
    let handle = Handle(cublas::create_handle().map_err(|source| blas_error("cublasCreate", source))?);
    // SAFETY: the handle was just created; the stream belongs to the current context.
    let configured = unsafe { configure(handle.0, raw_stream) };
    if let Err((call, source)) = configured {
        // SAFETY: the handle was created above and is not used after this.
        let _ = unsafe { cublas::destroy_handle(handle.0) };
        return Err(blas_error(call, source));
    }
    let handle = Arc::new(Mutex::new(handle));
    pool.push(Entry { ordinal, stream: raw_stream.clone(), handle: handle.clone() });
    Ok(handle)
}

/// Binds a new handle to its stream and sets its math mode: no TF32 (f32 products are full f32,
/// so CUDA agrees with the CPU to f32 rounding), and split-K partial sums reduced in the compute
/// type (f32) rather than the output type, so f16 and bf16 results are rounded once.
///
/// # Safety
/// `handle` is a live handle; `stream` belongs to the context current on this thread.
unsafe fn configure(handle: sys::cublasHandle_t, stream: &CudaStream) -> Result<(), (&'static str, CublasError)> {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        cublas::set_stream(handle, stream.cu_stream() as sys::cudaStream_t).map_err(|e| ("cublasSetStream", e))?;
        sys::cublasSetMathMode(handle, sys::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)
            .result()
            .map_err(|e| ("cublasSetMathMode", e))
    }
}
