//! Checked launch geometry and typed kernel arguments.
use super::{Kernel, Stream};
use crate::tensor::storage::with_cuda_ptrs_exact;
use crate::{Error, Result, Tensor};
use std::ffi::c_void;
use std::sync::OnceLock;

/// The block size opsmith's elementwise kernels launch with: small enough that 8 blocks fill a
/// multiprocessor, large enough that block scheduling is not a cost.
///
/// ```
/// assert_eq!(opsmith_host::cuda::DEFAULT_BLOCK % 32, 0); // whole warps
/// ```
pub const DEFAULT_BLOCK: u32 = 256;

/// The largest grid (in blocks) along x that CUDA allows.
const MAX_GRID_X: u64 = (1 << 31) - 1;

/// A 1-D launch configuration. Build it with [`LaunchConfig::grid_stride`] or by hand; every
/// launch validates it.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{Error, cuda::LaunchConfig};
/// let cfg = LaunchConfig { grid: 4096, block: 256, shared_mem_bytes: 0 };
/// cfg.validate("my_kernel")?;
/// let ragged = LaunchConfig { block: 100, ..cfg }; // not whole warps
/// assert!(matches!(ragged.validate("my_kernel"), Err(Error::InvalidBlockSize { block: 100, .. })));
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in the grid.
    pub grid: u32,
    /// Threads per block: a multiple of 32, at most 1024.
    pub block: u32,
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// The configuration for a grid-stride kernel over `work_items` items (elements, or vector
    /// packs): one item per thread while that fits on the device, and never more blocks than
    /// the device keeps resident at once for this kernel (from the driver's occupancy
    /// calculation, which accounts for its registers), since the kernel loops over the rest.
    /// A grid of exactly one wave leaves no partial second wave at the end.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::cuda::{CudaDevice, LaunchConfig};
    /// let dev = CudaDevice::get(0)?;
    /// let kernel = dev.kernel("add_f32")?;
    /// let small = LaunchConfig::grid_stride(&kernel, 1000, 256)?;
    /// assert_eq!(small.grid, 4); // one item per thread
    /// let large = LaunchConfig::grid_stride(&kernel, 1 << 30, 256)?;
    /// assert_eq!(large.grid, dev.sm_count() * kernel.max_active_blocks_per_sm(256)?); // one wave
    /// # Ok(()) }
    /// ```
    pub fn grid_stride(kernel: &Kernel, work_items: u64, block: u32) -> Result<Self> {
        check_block(kernel.name(), block)?;
        let needed = work_items.div_ceil(block as u64).max(1);
        let resident = kernel.device().sm_count() as u64 * kernel.max_active_blocks_per_sm(block)? as u64;
        let blocks = needed.min(resident.max(1));
        let grid = u32::try_from(blocks).map_err(|_| Error::InvalidGrid {
            kernel: kernel.name().into(),
            blocks,
            max: MAX_GRID_X,
        })?;
        Ok(Self { grid, block, shared_mem_bytes: 0 })
    }

    /// The configuration for a streaming kernel over `work_items` items: one item per thread,
    /// blocks of `block` threads, up to the largest grid CUDA allows (a grid-stride kernel
    /// loops over the rest). The GPU dispatches blocks roughly in index order, so the addresses
    /// in flight stay in a narrow window of each array, where one wave of grid-striding blocks
    /// (see [`grid_stride`](Self::grid_stride)) spreads the same traffic over the whole array;
    /// for streaming kernels the covering grid measured faster (BENCHMARKS.md, "Launch shape").
    /// Needs no occupancy query, so it costs no driver call.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Error, cuda::LaunchConfig};
    /// assert_eq!(LaunchConfig::covering("add_f32", 1000, 256)?.grid, 4);
    /// assert_eq!(LaunchConfig::covering("add_f32", 1 << 40, 256)?.grid, (1 << 31) - 1);
    /// assert_eq!(LaunchConfig::covering("add_f32", 0, 256)?.grid, 1);
    /// assert!(matches!(LaunchConfig::covering("add_f32", 10, 48), Err(Error::InvalidBlockSize { .. })));
    /// # Ok(()) }
    /// ```
    pub fn covering(kernel: &str, work_items: u64, block: u32) -> Result<Self> {
        check_block(kernel, block)?;
        let blocks = work_items.div_ceil(block as u64).clamp(1, MAX_GRID_X);
        // `blocks <= MAX_GRID_X < 2^31`, so the conversion cannot fail.
        let grid =
            u32::try_from(blocks).map_err(|_| Error::InvalidGrid { kernel: kernel.into(), blocks, max: MAX_GRID_X })?;
        Ok(Self { grid, block, shared_mem_bytes: 0 })
    }

    /// Checks the block size and the grid size.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Error, cuda::LaunchConfig};
    /// let empty = LaunchConfig { grid: 0, block: 256, shared_mem_bytes: 0 };
    /// assert!(matches!(empty.validate("my_kernel"), Err(Error::InvalidGrid { .. })));
    /// # Ok(()) }
    /// ```
    pub fn validate(&self, kernel: &str) -> Result<()> {
        check_block(kernel, self.block)?;
        if self.grid == 0 || self.grid as u64 > MAX_GRID_X {
            return Err(Error::InvalidGrid { kernel: kernel.into(), blocks: self.grid as u64, max: MAX_GRID_X });
        }
        Ok(())
    }
}

fn check_block(kernel: &str, block: u32) -> Result<()> {
    if block == 0 || block > 1024 || !block.is_multiple_of(32) {
        return Err(Error::InvalidBlockSize { kernel: kernel.into(), block });
    }
    Ok(())
}

/// Converts an element count for a kernel that takes a 32-bit length, or returns
/// [`Error::TooLarge`] naming `kernel`.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{Error, cuda::len_as_u32};
/// assert_eq!(len_as_u32("scale_f32", 1000)?, 1000);
/// assert!(matches!(len_as_u32("scale_f32", 1 << 32), Err(Error::TooLarge { .. })));
/// # Ok(()) }
/// ```
pub fn len_as_u32(kernel: &'static str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::TooLarge { op: kernel, elements: n as u64, limit: u32::MAX as u64 })
}

/// The variable that, set to `0`, launches every kernel only after its predecessor on the
/// stream has finished: see [`Kernel::dependent_launch`].
pub const DEPENDENT_LAUNCH_ENV: &str = "OPSMITH_DEPENDENT_LAUNCH";

/// Whether opsmith's sm_90 kernels are launched early (read once per process): unless turned
/// off, with a driver of CUDA 12.3 or newer, which has every entry point it takes
/// (`cuLaunchKernelEx`, and in captures the edge-data forms of the dependency calls).
pub(crate) fn dependent_launch_enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED
        .get_or_init(|| std::env::var(DEPENDENT_LAUNCH_ENV).map_or(true, |v| v != "0") && super::driver_at_least(12, 3))
}

/// Whether `OPSMITH_LAUNCH_BLOCKING=1` was set when the first launch happened: then every launch
/// synchronizes its stream, so an asynchronous fault is reported by the launch that caused it
/// (except inside a [`Graph::capture`](super::Graph::capture), which records launches without
/// running them; each [`Graph::replay`](super::Graph::replay) synchronizes instead).
///
/// ```
/// if opsmith_host::cuda::launch_blocking() {
///     println!("OPSMITH_LAUNCH_BLOCKING=1: every launch waits for its kernel");
/// }
/// ```
pub fn launch_blocking() -> bool {
    static BLOCKING: OnceLock<bool> = OnceLock::new();
    *BLOCKING.get_or_init(|| std::env::var("OPSMITH_LAUNCH_BLOCKING").is_ok_and(|v| v == "1"))
        && !super::graph::capturing_thread()
}

/// One kernel parameter for [`Kernel::launch`].
///
/// Each variant passes a value of the width the kernel's parameter has; a tensor passes a
/// pointer to its first element and tells the stream ordering whether the kernel reads it or
/// writes it.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{DType, Device, Tensor, cuda::KernelArg};
/// let x = Tensor::zeros([8], DType::F32, Device::Cpu)?;
/// // scale_f32(const float* x, float* y, float a, unsigned int n), with y = x (in place):
/// let args = [KernelArg::Input(&x), KernelArg::Output(&x), KernelArg::F32(2.0), KernelArg::U32(8)];
/// assert_eq!(args.len(), 4);
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug)]
pub enum KernelArg<'a> {
    /// A tensor the kernel reads: passed as a pointer to its first element.
    Input(&'a Tensor),
    /// A tensor the kernel writes (and may read): passed as a pointer to its first element.
    Output(&'a Tensor),
    /// A 64-bit unsigned integer (`u64`, `size_t`).
    U64(u64),
    /// A 64-bit signed integer.
    I64(i64),
    /// A 32-bit unsigned integer.
    U32(u32),
    /// A 32-bit signed integer.
    I32(i32),
    /// A 32-bit float.
    F32(f32),
    /// A 64-bit float.
    F64(f64),
}

/// A parameter value with a stable address for the driver to read.
#[derive(Clone, Copy)]
enum Value {
    W64(u64),
    W32(u32),
}

/// Resolves `args` and launches through [`Kernel::launch_raw`].
///
/// # Safety
/// As [`Kernel::launch`].
pub(super) unsafe fn launch_with_args(
    kernel: &Kernel,
    stream: &Stream,
    cfg: LaunchConfig,
    args: &[KernelArg<'_>],
) -> Result<()> {
    let device = stream.device().device();
    let mut reads = Vec::new();
    let mut writes = Vec::new();
    for arg in args {
        let t = match *arg {
            KernelArg::Input(t) => {
                reads.push(t);
                t
            }
            KernelArg::Output(t) => {
                writes.push(t);
                t
            }
            _ => continue,
        };
        if t.device() != device {
            return Err(Error::DeviceMismatch { op: "Kernel::launch", lhs: device, rhs: t.device() });
        }
    }
    with_cuda_ptrs_exact("Kernel::launch", stream, &reads, &writes, |read_ptrs, write_ptrs| {
        let (mut r, mut w) = (read_ptrs.iter(), write_ptrs.iter());
        let mut values: Vec<Value> = args
            .iter()
            .map(|arg| match *arg {
                // `with_cuda_ptrs` returns one pointer per tensor, in the order given.
                KernelArg::Input(_) => Value::W64(*r.next().expect("one pointer per input")),
                KernelArg::Output(_) => Value::W64(*w.next().expect("one pointer per output")),
                KernelArg::U64(v) => Value::W64(v),
                KernelArg::I64(v) => Value::W64(v as u64),
                KernelArg::F64(v) => Value::W64(v.to_bits()),
                KernelArg::U32(v) => Value::W32(v),
                KernelArg::I32(v) => Value::W32(v as u32),
                KernelArg::F32(v) => Value::W32(v.to_bits()),
            })
            .collect();
        let mut params: Vec<*mut c_void> = values
            .iter_mut()
            .map(|v| match v {
                Value::W64(x) => x as *mut u64 as *mut c_void,
                Value::W32(x) => x as *mut u32 as *mut c_void,
            })
            .collect();
        // SAFETY: forwarded from this function's contract; `values` outlives the launch call.
        unsafe { kernel.launch_raw(stream, cfg, &mut params) }
    })
}
