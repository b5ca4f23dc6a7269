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
//!
//! Each handle gets a fixed workspace of its own when it is created (32 MiB, cuBLAS's
//! recommendation for Hopper; `OPSMITH_CUBLAS_WORKSPACE=<bytes>` sets another size, 0 for none),
//! as PyTorch gives its handles: without one, cuBLAS allocates workspace during a call, which a
//! CUDA graph capture cannot record, so matmuls could not be captured. Without a workspace,
//! cuBLAS picks kernels that need none (no split-K reduction).
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

/// The workspace each handle gets by default: cuBLAS's recommended size for Hopper (32 MiB),
/// also enough for older GPUs' kernels.
const DEFAULT_WORKSPACE_BYTES: usize = 32 << 20;

/// The workspace size: `OPSMITH_CUBLAS_WORKSPACE` (bytes) when it is set to a number, else the
/// default. Read once.
fn workspace_bytes() -> usize {
    static BYTES: OnceLock<usize> = OnceLock::new();
    *BYTES.get_or_init(|| {
        std::env::var("OPSMITH_CUBLAS_WORKSPACE")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(DEFAULT_WORKSPACE_BYTES)
    })
}

/// A handle and its workspace (device memory from `cuMemAlloc`, never freed, like the handle;
/// address 0 when the size is 0).
struct Handle {
    raw: sys::cublasHandle_t,
    workspace: u64,
    workspace_bytes: usize,
}

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
/// name) to the caller's error; `op` names the caller when a new handle's workspace does not fit.
pub(crate) fn with_handle<R>(
    op: &'static str,
    stream: &Stream,
    blas_error: &dyn Fn(&'static str, CublasError) -> Error,
    f: impl FnOnce(sys::cublasHandle_t) -> Result<R>,
) -> Result<R> {
    stream.device().bind()?;
    let handle = handle_for(op, stream, blas_error)?;
    let guard = handle.lock();
    f(guard.raw)
}

fn handle_for(
    op: &'static str,
    stream: &Stream,
    blas_error: &dyn Fn(&'static str, CublasError) -> Error,
) -> Result<Arc<Mutex<Handle>>> {
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
        let handle = entry.handle.lock();
        // SAFETY: the handle is live and unused, the stream belongs to the current context, and
        // the workspace is the handle's own (setting a stream resets it, so it is set again).
        unsafe { bind(&handle, raw_stream) }.map_err(|(call, source)| blas_error(call, source))?;
        drop(handle);
        entry.stream = raw_stream.clone();
        return Ok(entry.handle.clone());
    }
    let workspace_bytes = workspace_bytes();
    let workspace = match workspace_bytes {
        0 => 0,
        // SAFETY: a plain allocation in the context current on this thread (bound by
        // `with_handle`); cuBLAS only uses it as scratch space.
        bytes => unsafe { cudarc::driver::result::malloc_sync(bytes) }
            .map_err(|e| Error::from_alloc(op, stream.device().device(), bytes, e))?,
    };
    let raw = match cublas::create_handle() {
        Ok(raw) => raw,
        Err(source) => {
            if workspace != 0 {
                // SAFETY: allocated above and not used by anything.
                let _ = unsafe { cudarc::driver::result::free_sync(workspace) };
            }
            return Err(blas_error("cublasCreate", source));
        }
    };
    let handle = Handle { raw, workspace, workspace_bytes };
    // SAFETY: the handle was just created; the stream belongs to the current context.
    let configured = unsafe { configure(&handle, raw_stream) };
    if let Err((call, source)) = configured {
        // SAFETY: the handle and workspace were created above and are not used after this.
        let _ = unsafe { cublas::destroy_handle(handle.raw) };
        if workspace != 0 {
            // SAFETY: as above.
            let _ = unsafe { cudarc::driver::result::free_sync(workspace) };
        }
        return Err(blas_error(call, source));
    }
    let handle = Arc::new(Mutex::new(handle));
    pool.push(Entry { ordinal, stream: raw_stream.clone(), handle: handle.clone() });
    Ok(handle)
}

/// Binds a new handle to its stream and workspace and sets its math mode: no TF32 (f32
/// products are full f32, so CUDA agrees with the CPU to f32 rounding), and split-K partial sums
/// reduced in the compute type (f32) rather than the output type, so f16 and bf16 results are
/// rounded once.
///
/// # Safety
/// `handle` is live; `stream` belongs to the context current on this thread.
unsafe fn configure(handle: &Handle, stream: &CudaStream) -> Result<(), (&'static str, CublasError)> {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        bind(handle, stream)?;
        sys::cublasSetMathMode(handle.raw, sys::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)
            .result()
            .map_err(|e| ("cublasSetMathMode", e))
    }
}

/// Sets `handle`'s stream, then its workspace (setting a stream resets the workspace to cuBLAS's
/// own pool).
///
/// # Safety
/// `handle` is live and no call uses it; `stream` belongs to the context current on this thread.
unsafe fn bind(handle: &Handle, stream: &CudaStream) -> Result<(), (&'static str, CublasError)> {
    // SAFETY: forwarded from this function's contract; the workspace holds `workspace_bytes`
    // bytes of the same context (none when 0) and belongs to this handle alone.
    unsafe {
        cublas::set_stream(handle.raw, stream.cu_stream() as sys::cudaStream_t).map_err(|e| ("cublasSetStream", e))?;
        sys::cublasSetWorkspace_v2(handle.raw, handle.workspace as *mut std::ffi::c_void, handle.workspace_bytes)
            .result()
            .map_err(|e| ("cublasSetWorkspace", e))
    }
}
