//! The one error type of `opsmith-host`. Every variant names the operation (or kernel) and the
//! offending shape, dtype or device, so a message is enough to find the call that failed.
//!
//! ```
//! # fn main() -> opsmith_host::Result<()> {
//! use opsmith_host::{DType, Device, Tensor, ops};
//! let a = Tensor::zeros([2], DType::F32, Device::Cpu)?;
//! let b = Tensor::zeros([3], DType::F32, Device::Cpu)?;
//! let err = ops::add(&a, &b).unwrap_err();
//! assert_eq!(err.to_string(), "add: shape mismatch: [2] vs [3]");
//! # Ok(()) }
//! ```
use crate::{DType, Device};
#[cfg(feature = "cublas")]
use cudarc::cublas::result::CublasError;
#[cfg(feature = "cuda")]
use cudarc::driver::DriverError;

/// `Result` with [`Error`].
///
/// ```
/// use opsmith_host::{Device, Result, Tensor};
/// fn ones(n: usize) -> Result<Tensor> {
///     Tensor::full(1.0, [n], opsmith_host::DType::F32, Device::Cpu)
/// }
/// assert_eq!(ones(2).unwrap().to_vec::<f32>().unwrap(), [1.0, 1.0]);
/// ```
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in `opsmith-host`.
///
/// Match on a variant to react to one kind of failure; the fields say which operand was wrong.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{DType, Device, Error, Tensor, ops};
/// let a = Tensor::zeros([2], DType::F32, Device::Cpu)?;
/// let b = Tensor::zeros([2], DType::F16, Device::Cpu)?;
/// match ops::mul(&a, &b) {
///     Err(Error::DTypeMismatch { op, lhs, rhs }) => assert_eq!((op, lhs, rhs), ("mul", DType::F32, DType::F16)),
///     other => panic!("expected a dtype mismatch, got {other:?}"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Operands of an op have different shapes.
    #[error("{op}: shape mismatch: {lhs:?} vs {rhs:?}")]
    ShapeMismatch {
        /// The operation.
        op: &'static str,
        /// The first operand's shape.
        lhs: Vec<usize>,
        /// The offending operand's shape.
        rhs: Vec<usize>,
    },
    /// Operands of an op have different dtypes.
    #[error("{op}: dtype mismatch: {lhs} vs {rhs}")]
    DTypeMismatch {
        /// The operation.
        op: &'static str,
        /// The first operand's dtype.
        lhs: DType,
        /// The offending operand's dtype.
        rhs: DType,
    },
    /// Operands of an op live on different devices.
    #[error("{op}: device mismatch: {lhs} vs {rhs}")]
    DeviceMismatch {
        /// The operation.
        op: &'static str,
        /// The first operand's device.
        lhs: Device,
        /// The offending operand's device.
        rhs: Device,
    },
    /// The op has no implementation for this dtype on this device.
    #[error("{op}: dtype {dtype} is not supported on {device}")]
    UnsupportedDType {
        /// The operation.
        op: &'static str,
        /// The dtype.
        dtype: DType,
        /// The device.
        device: Device,
    },
    /// The number of values does not match the shape.
    #[error("{op}: shape {shape:?} holds {expected} elements, but {actual} were given")]
    ElementCount {
        /// The operation.
        op: &'static str,
        /// The requested shape.
        shape: Vec<usize>,
        /// Elements the shape holds.
        expected: usize,
        /// Elements supplied.
        actual: usize,
    },
    /// A view reaches past the end of its tensor.
    #[error("{op}: range {start}..{end} is outside a tensor of {len} elements")]
    OutOfRange {
        /// The operation.
        op: &'static str,
        /// First element of the requested range.
        start: usize,
        /// One past the last element of the requested range.
        end: usize,
        /// Elements in the tensor.
        len: usize,
    },
    /// An output overlaps an input without being exactly that input, or two outputs overlap.
    #[error("{op}: output {output} partially overlaps another operand; use a separate tensor or exactly the same one")]
    Overlap {
        /// The operation.
        op: &'static str,
        /// Which output (0-based).
        output: usize,
    },
    /// A kernel launch was given a tensor of another dtype than the kernel declares for that
    /// parameter.
    #[error("{kernel}: parameter `{param}` is declared {expected}, got a {actual} tensor")]
    ArgumentDType {
        /// The kernel.
        kernel: &'static str,
        /// The parameter, by its name in the kernel's declaration.
        param: &'static str,
        /// The element type the kernel declares.
        expected: opsmith_kernels::decl::ElemKind,
        /// The tensor's dtype.
        actual: DType,
    },
    /// A kernel launch was given a tensor of another length than the kernel declares for that
    /// parameter (from the launch's scalar arguments).
    #[error("{kernel}: parameter `{param}` {}", length_mismatch(*expected, *actual))]
    ArgumentLength {
        /// The kernel.
        kernel: &'static str,
        /// The parameter, by its name in the kernel's declaration.
        param: &'static str,
        /// The declared length, or `None` when the launch's scalars make it overflow or negative.
        expected: Option<u64>,
        /// Elements in the tensor given.
        actual: u64,
    },
    /// A typed read asked for a different element type than the tensor holds.
    #[error("{op}: the tensor holds {actual}, not {requested}")]
    ElementType {
        /// The operation.
        op: &'static str,
        /// The type asked for.
        requested: DType,
        /// The tensor's dtype.
        actual: DType,
    },
    /// The element count is too large: for one launch's indexing, for the memory a host
    /// allocation can address, or for `usize` itself (`elements` is then `u64::MAX`).
    #[error("{}", too_large(op, *elements, *limit))]
    TooLarge {
        /// The operation or kernel.
        op: &'static str,
        /// The element count, `u64::MAX` when it overflows.
        elements: u64,
        /// The largest count allowed.
        limit: u64,
    },
    /// A launch's block size is not a multiple of 32 in 32..=1024.
    #[error("{kernel}: invalid block size {block}: it must be a multiple of 32 between 32 and 1024")]
    InvalidBlockSize {
        /// The kernel.
        kernel: String,
        /// The rejected block size.
        block: u32,
    },
    /// A launch's grid is empty or larger than the hardware allows.
    #[error("{kernel}: invalid grid of {blocks} blocks: it must be between 1 and {max}")]
    InvalidGrid {
        /// The kernel.
        kernel: String,
        /// The requested block count.
        blocks: u64,
        /// The largest allowed.
        max: u64,
    },
    /// The CUDA driver library could not be loaded.
    #[error(
        "no CUDA driver: libcuda could not be loaded (is an NVIDIA driver installed, and is the \
         library on the loader path?). Use Device::Cpu, or Device::cuda_if_available()"
    )]
    NoCudaDriver,
    /// The requested CUDA device does not exist.
    #[error("cuda:{ordinal} does not exist: {count} CUDA device(s) visible")]
    NoSuchDevice {
        /// The requested ordinal.
        ordinal: usize,
        /// Devices the driver reports.
        count: usize,
    },
    /// A CUDA driver call failed.
    #[cfg(feature = "cuda")]
    #[error("{call} on {device} failed: {source}")]
    Driver {
        /// What was being done.
        call: &'static str,
        /// The device.
        device: Device,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// A CUDA driver call that concerns no one device (initialization with the device count,
    /// or the driver version) failed.
    #[cfg(feature = "cuda")]
    #[error("{call} failed: {source}")]
    DriverQuery {
        /// The driver function.
        call: &'static str,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// The device (or the host, for a CPU tensor) has too little free memory.
    #[error("{op}: out of memory on {device}: allocating {bytes} bytes failed")]
    OutOfMemory {
        /// The operation that allocated.
        op: &'static str,
        /// The device.
        device: Device,
        /// The allocation size.
        bytes: usize,
    },
    /// The driver refused to launch a kernel.
    #[cfg(feature = "cuda")]
    #[error("launching kernel `{kernel}` on {device} failed: {source}")]
    Launch {
        /// The kernel.
        kernel: String,
        /// The device.
        device: Device,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// A kernel faulted while running (reported at the launch with `OPSMITH_LAUNCH_BLOCKING=1`).
    #[cfg(feature = "cuda")]
    #[error("kernel `{kernel}` on {device} faulted: {source}")]
    KernelFault {
        /// The kernel.
        kernel: String,
        /// The device.
        device: Device,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// A PTX module could not be loaded.
    #[error("loading PTX module `{module}` on {device} failed: {reason}")]
    ModuleLoad {
        /// The module's name.
        module: String,
        /// The device.
        device: Device,
        /// The driver's error and its JIT log.
        reason: String,
    },
    /// A kernel family needs a newer GPU than this one (the attention family needs sm_80).
    #[error("{device} is sm_{arch}; opsmith's {family} kernels need sm_{needs} or newer")]
    UnsupportedArch {
        /// The kernel family.
        family: &'static str,
        /// Its oldest architecture, `10 * major + minor`.
        needs: u32,
        /// The device's architecture.
        arch: u32,
        /// The device.
        device: Device,
    },
    /// A kernel image embedded in opsmith does not decompress: the crate's files are damaged.
    #[error("opsmith's embedded {image} is damaged ({reason}); reinstall the opsmith-host crate")]
    DamagedKernelImage {
        /// Which image: the family and the PTX or cubin.
        image: String,
        /// What the decompressor said.
        reason: String,
    },
    /// A module has no kernel of that name.
    #[error("module `{module}` has no kernel `{kernel}`")]
    KernelNotFound {
        /// The module's name.
        module: String,
        /// The requested kernel.
        kernel: String,
    },
    /// A CUDA library that the op needs (such as cuBLAS) could not be loaded.
    #[error("{op}: {lib} could not be loaded. Fix: {fix}")]
    LibraryMissing {
        /// The operation.
        op: &'static str,
        /// The library, as the loader names it (e.g. `libcublas.so`).
        lib: &'static str,
        /// How to make it loadable.
        fix: String,
    },
    /// An NCCL call failed.
    #[error("{call} on {device} failed: {reason}")]
    Nccl {
        /// The NCCL function.
        call: &'static str,
        /// The communicator's device.
        device: Device,
        /// NCCL's error name and its last error message.
        reason: String,
    },
    /// The TCP exchange that shares a communicator's unique id failed.
    #[error("bootstrap of rank {rank} through {addr} failed: {reason}")]
    Bootstrap {
        /// The rank that reports the failure.
        rank: usize,
        /// The address of rank 0.
        addr: std::net::SocketAddr,
        /// What went wrong.
        reason: String,
    },
    /// The TCP exchange did not complete in time.
    #[error("bootstrap of rank {rank} through {addr} timed out after {timeout:?}, waiting for rank(s) {missing:?}")]
    BootstrapTimeout {
        /// The rank that gave up.
        rank: usize,
        /// The address of rank 0.
        addr: std::net::SocketAddr,
        /// How long it waited.
        timeout: std::time::Duration,
        /// The ranks it was still waiting for.
        missing: Vec<usize>,
    },
    /// A cuBLAS call failed.
    #[cfg(feature = "cublas")]
    #[error("{op} on {device}: {call} failed for operands of shapes {lhs:?} and {rhs:?}: {source}")]
    Blas {
        /// The operation.
        op: &'static str,
        /// The cuBLAS function.
        call: &'static str,
        /// The device.
        device: Device,
        /// The first operand's shape.
        lhs: Vec<usize>,
        /// The second operand's shape.
        rhs: Vec<usize>,
        /// cuBLAS's status.
        #[source]
        source: CublasError,
    },
    /// The op needs a cargo feature of opsmith that this build was compiled without.
    #[error(
        "{op} on {device} needs opsmith's `{feature}` cargo feature, which this build leaves out; \
         enable it in Cargo.toml (`cuda`, `cublas` and `nccl` are on by default), or use Device::Cpu"
    )]
    FeatureDisabled {
        /// The operation.
        op: &'static str,
        /// The cargo feature it needs: `cuda`, `cublas` or `nccl`.
        feature: &'static str,
        /// The device asked for.
        device: Device,
    },
    /// Something a CUDA graph cannot record was asked for while one was being captured
    /// ([`cuda::Graph::capture`](crate::cuda::Graph::capture)): a read of device memory on the
    /// host, a synchronization, a CPU tensor, work ordered after another stream, or a second
    /// capture on the same device. Nothing was queued; the capture fails with this error.
    #[error("{op} cannot be captured into a CUDA graph: {reason}")]
    Capture {
        /// The operation refused.
        op: &'static str,
        /// Why it cannot be part of a graph, and what to do instead.
        reason: String,
    },
    /// A value the caller supplied is not valid for the call.
    #[error("{op}: {reason}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

impl Error {
    /// The error for using CUDA in a build without the `cuda` feature.
    #[cfg_attr(feature = "cuda", allow(dead_code))]
    pub(crate) fn cuda_disabled(op: &'static str, device: Device) -> Self {
        Error::FeatureDisabled { op, feature: "cuda", device }
    }

    /// Maps a driver error to [`Error::OutOfMemory`] when it is one, else to [`Error::Driver`].
    #[cfg(feature = "cuda")]
    pub(crate) fn from_alloc(op: &'static str, device: Device, bytes: usize, source: DriverError) -> Self {
        if source.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            Error::OutOfMemory { op, device, bytes }
        } else {
            Error::Driver { call: "memory allocation", device, source }
        }
    }
}

/// The second half of [`Error::ArgumentLength`]'s message.
fn length_mismatch(expected: Option<u64>, actual: u64) -> String {
    match expected {
        Some(n) => format!("must hold {n} elements, got a tensor of {actual}"),
        None => format!("has a declared length that overflows for these scalar arguments (got a tensor of {actual})"),
    }
}

/// [`Error::TooLarge`]'s message: an element count that overflows is said so, rather than
/// printed as `u64::MAX`.
fn too_large(op: &str, elements: u64, limit: u64) -> String {
    if elements == u64::MAX {
        format!("{op}: the shape's element count overflows (the limit is {limit} elements)")
    } else {
        format!("{op}: {elements} elements exceed the limit of {limit}")
    }
}
