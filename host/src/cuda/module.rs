//! PTX modules: opsmith's own, embedded at build time, and third-party PTX loaded at run time.
use super::CudaDevice;
use super::launch::{self, KernelArg, LaunchConfig};
use super::stream::Stream;
use crate::{Device, Error, Result};
use cudarc::driver::sys;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::Arc;

/// opsmith's kernels as PTX, compiled from `kernels-gpu` by `host/build.rs`.
pub const EMBEDDED_PTX: &str = include_str!(env!("OPSMITH_KERNELS_PTX"));

/// The architecture [`EMBEDDED_PTX`] was generated for (`sm_70` unless `OPSMITH_PTX_ARCH` was
/// set at build time). The driver compiles it for the actual GPU when the module loads.
pub const EMBEDDED_PTX_ARCH: &str = env!("OPSMITH_KERNELS_ARCH");

/// A PTX module loaded into one device's context.
///
/// ```no_run
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::cuda::{KernelArg, KernelModule, LaunchConfig};
/// use opsmith_host::{Device, Tensor};
/// let ptx = std::fs::read_to_string("scale.ptx").unwrap();
/// let module = KernelModule::from_ptx(&Device::Cuda(0), "scale", &ptx)?;
/// let kernel = module.kernel("scale_f32")?;
/// let x = Tensor::from_vec(vec![1.0f32; 1000], [1000], Device::Cuda(0))?;
/// let y = Tensor::zeros([1000], opsmith_host::DType::F32, Device::Cuda(0))?;
/// let cfg = LaunchConfig::grid_stride(&kernel, 1000, 256)?;
/// // SAFETY: scale_f32(const float*, float*, float, unsigned long long) reads and writes 1000 elements.
/// unsafe {
///     kernel.launch(&kernel.device().current_stream(), cfg,
///         &[KernelArg::Input(&x), KernelArg::Output(&y), KernelArg::F32(2.0), KernelArg::U64(1000)])?;
/// }
/// # Ok(()) }
/// ```
pub struct KernelModule {
    name: String,
    handle: Arc<ModuleHandle>,
    functions: Mutex<HashMap<String, Kernel>>,
}

struct ModuleHandle {
    module: sys::CUmodule,
    device: CudaDevice,
}

// SAFETY: a CUmodule handle may be used from any thread once its context is current, which every
// use here ensures through `CudaDevice::bind`.
unsafe impl Send for ModuleHandle {}
// SAFETY: as above; the handle is never mutated after loading.
unsafe impl Sync for ModuleHandle {}

impl Drop for ModuleHandle {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: the module was loaded in this context and no Kernel refers to it any more
            // (each Kernel holds an Arc to this handle).
            let status = unsafe { sys::cuModuleUnload(self.module) };
            self.device.context().record_err(status.result());
        }
    }
}

impl KernelModule {
    /// Loads PTX source into `device`'s context. `name` is used in error messages.
    ///
    /// The driver compiles the PTX for the device here; a rejection returns
    /// [`Error::ModuleLoad`] with the driver's JIT log.
    pub fn from_ptx(device: &Device, name: &str, ptx: &str) -> Result<Self> {
        let Device::Cuda(ordinal) = *device else {
            return Err(Error::InvalidArgument {
                op: "KernelModule::from_ptx",
                reason: format!("PTX modules load on CUDA devices, not {device}"),
            });
        };
        let dev = CudaDevice::get(ordinal)?;
        let load_error = |reason: String| Error::ModuleLoad { module: name.into(), device: *device, reason };
        let source = CString::new(ptx).map_err(|_| load_error("the PTX text contains a NUL byte".into()))?;
        dev.bind()?;

        const LOG_BYTES: usize = 16 * 1024;
        let mut log = vec![0u8; LOG_BYTES];
        let mut options =
            [sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER, sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES];
        // The driver takes option values as pointer-sized words; the size is passed by value.
        let mut values = [log.as_mut_ptr() as *mut c_void, LOG_BYTES as *mut c_void];
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `source` is NUL-terminated PTX; the option arrays have matching lengths and the
        // log buffer outlives the call.
        let status = unsafe {
            sys::cuModuleLoadDataEx(
                &mut module,
                source.as_ptr() as *const c_void,
                options.len() as u32,
                options.as_mut_ptr(),
                values.as_mut_ptr(),
            )
        };
        if let Err(e) = status.result() {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let log = String::from_utf8_lossy(&log[..end]);
            return Err(load_error(format!("{e}; JIT log: {}", log.trim())));
        }
        Ok(Self {
            name: name.into(),
            handle: Arc::new(ModuleHandle { module, device: dev }),
            functions: Mutex::new(HashMap::new()),
        })
    }

    /// The module's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Looks up a kernel (a `.entry`) by name.
    pub fn kernel(&self, name: &str) -> Result<Kernel> {
        let mut functions = self.functions.lock();
        if let Some(k) = functions.get(name) {
            return Ok(k.clone());
        }
        let not_found = || Error::KernelNotFound { module: self.name.clone(), kernel: name.into() };
        let c_name = CString::new(name).map_err(|_| not_found())?;
        self.handle.device.bind()?;
        let mut func: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: the module is loaded in the current context and `c_name` is NUL-terminated.
        let status = unsafe { sys::cuModuleGetFunction(&mut func, self.handle.module, c_name.as_ptr()) };
        match status {
            sys::CUresult::CUDA_SUCCESS => {}
            sys::CUresult::CUDA_ERROR_NOT_FOUND => return Err(not_found()),
            other => return Err(self.handle.device.driver_error("cuModuleGetFunction", other.result().unwrap_err())),
        }
        let kernel = Kernel { name: name.into(), func, module: self.handle.clone(), occupancy: Default::default() };
        functions.insert(name.into(), kernel.clone());
        Ok(kernel)
    }
}

/// One kernel of a loaded module. Launch it with [`Kernel::launch`].
#[derive(Clone)]
pub struct Kernel {
    name: Arc<str>,
    func: sys::CUfunction,
    module: Arc<ModuleHandle>,
    /// (block size, resident blocks per multiprocessor), computed once per block size.
    occupancy: Arc<Mutex<Vec<(u32, u32)>>>,
}

// SAFETY: a CUfunction is an immutable handle, valid while its module is loaded (the Arc keeps it).
unsafe impl Send for Kernel {}
// SAFETY: as above.
unsafe impl Sync for Kernel {}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernel({} on cuda:{})", self.name, self.module.device.ordinal())
    }
}

impl Kernel {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device whose context the kernel is loaded in.
    pub fn device(&self) -> &CudaDevice {
        &self.module.device
    }

    /// How many blocks of `block` threads one multiprocessor keeps resident for this kernel
    /// (the driver's occupancy calculation, from its registers and shared memory).
    pub fn max_active_blocks_per_sm(&self, block: u32) -> Result<u32> {
        let mut cache = self.occupancy.lock();
        if let Some(&(_, blocks)) = cache.iter().find(|(b, _)| *b == block) {
            return Ok(blocks);
        }
        self.device().bind()?;
        let mut blocks = 0i32;
        // SAFETY: the function belongs to the current context and the out-pointer is valid.
        let status =
            unsafe { sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut blocks, self.func, block as i32, 0) };
        status.result().map_err(|e| self.device().driver_error("cuOccupancyMaxActiveBlocksPerMultiprocessor", e))?;
        let blocks = blocks.max(1) as u32;
        cache.push((block, blocks));
        Ok(blocks)
    }

    /// Launches the kernel on `stream` with `args` as its parameters, in order, through the
    /// checked launch path: the configuration is validated, the driver's status is checked and
    /// named, and with `OPSMITH_LAUNCH_BLOCKING=1` the stream is synchronized so a fault is
    /// reported here. Tensor arguments become device pointers to their first element, ordered
    /// after earlier writes on other streams.
    ///
    /// # Safety
    /// What opsmith cannot check: that `args` match the kernel's parameter list in number, order
    /// and width, that the kernel stays inside each tensor's elements, and that it writes only
    /// the tensors passed as [`KernelArg::Output`].
    pub unsafe fn launch(&self, stream: &Stream, cfg: LaunchConfig, args: &[KernelArg<'_>]) -> Result<()> {
        if stream.device() != self.device() {
            return Err(Error::DeviceMismatch {
                op: "Kernel::launch",
                lhs: self.device().device(),
                rhs: stream.device().device(),
            });
        }
        // SAFETY: forwarded from this function's contract.
        unsafe { launch::launch_with_args(self, stream, cfg, args) }
    }

    /// Launches with raw parameter pointers (each pointing at one parameter's value).
    ///
    /// # Safety
    /// `params` must match the kernel's parameter list and every device pointer in it must be
    /// valid for what the kernel does with it.
    pub(crate) unsafe fn launch_raw(
        &self,
        stream: &Stream,
        cfg: LaunchConfig,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        cfg.validate(&self.name)?;
        let device = self.device();
        device.bind()?;
        // SAFETY: the function belongs to the current context, the configuration was validated,
        // and the caller guarantees the parameters.
        let launched = unsafe {
            cudarc::driver::result::launch_kernel(
                self.func,
                (cfg.grid, 1, 1),
                (cfg.block, 1, 1),
                cfg.shared_mem_bytes,
                stream.raw().cu_stream(),
                params,
            )
        };
        launched.map_err(|source| Error::Launch { kernel: self.name.to_string(), device: device.device(), source })?;
        if launch::launch_blocking() {
            stream.raw().synchronize().map_err(|source| Error::KernelFault {
                kernel: self.name.to_string(),
                device: device.device(),
                source,
            })?;
        }
        Ok(())
    }
}
