//! Kernel modules: opsmith's own (see `prebuilt`), and third-party PTX or cubins loaded at run time.
use super::CudaDevice;
use super::launch::{self, KernelArg, LaunchConfig};
use super::stream::Stream;
use crate::{Device, Error, Result};
use cudarc::driver::sys;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::Arc;

/// A module of kernels (from PTX or a cubin) loaded into one device's context.
///
/// ```standalone_crate
/// # fn main() -> opsmith_host::Result<()> {
/// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
/// use opsmith_host::cuda::{KernelArg, KernelModule, LaunchConfig, len_as_u32};
/// use opsmith_host::{DType, Device, Tensor};
/// // scale_f32(x, y, a, n): y[i] = a * x[i] for i < n, one thread per element, a 32-bit n.
/// let ptx = include_str!("../../../examples/ptx/scale.ptx");
/// let module = KernelModule::from_ptx(&Device::Cuda(0), "scale", ptx)?;
/// let kernel = module.kernel("scale_f32")?;
/// let n = 1000;
/// let x = Tensor::from_vec(vec![1.5f32; n], [n], Device::Cuda(0))?;
/// let y = Tensor::full(f64::NAN, [n], DType::F32, Device::Cuda(0))?;
/// let len = len_as_u32("scale_f32", n)?;
/// // The kernel does not loop, so the grid must cover all n elements.
/// let cfg = LaunchConfig { grid: len.div_ceil(256), block: 256, shared_mem_bytes: 0 };
/// let args = [KernelArg::Input(&x), KernelArg::Output(&y), KernelArg::F32(2.0), KernelArg::U32(len)];
/// // SAFETY: scale_f32 reads n f32 of x and writes n of y, which both hold; they do not overlap.
/// unsafe { kernel.launch(&kernel.device().current_stream(), cfg, &args)? };
/// assert_eq!(y.to_vec::<f32>()?, vec![3.0f32; n]);
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
    /// Every kernel waits for its predecessors before it touches memory (opsmith's sm_90
    /// builds), so it may be launched before they finish: see [`Kernel::dependent_launch`].
    dependent_launch: bool,
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
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, Error, cuda::KernelModule};
    /// // PTX loads on CUDA devices only.
    /// let on_cpu = KernelModule::from_ptx(&Device::Cpu, "mine", ".version 7.0");
    /// assert!(matches!(on_cpu, Err(Error::InvalidArgument { .. })));
    /// # if !Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// // Text the driver rejects comes back with its log.
    /// let broken = KernelModule::from_ptx(&Device::Cuda(0), "broken", ".version 7.0\n.target sm_70\nnot ptx");
    /// assert!(matches!(broken, Err(Error::ModuleLoad { .. })));
    /// # Ok(()) }
    /// ```
    pub fn from_ptx(device: &Device, name: &str, ptx: &str) -> Result<Self> {
        let mut image = ptx.as_bytes().to_vec();
        if image.contains(&0) {
            let reason = "the PTX text contains a NUL byte".into();
            return Err(Error::ModuleLoad { module: name.into(), device: *device, reason });
        }
        image.push(0); // the driver reads PTX up to its NUL
        Self::load("KernelModule::from_ptx", device, name, &image, false)
    }

    /// Loads a cubin (machine code that `ptxas` or `nvcc -cubin` made for one GPU architecture)
    /// into `device`'s context. Nothing is compiled, so this is fast; a cubin for another
    /// architecture is [`Error::ModuleLoad`] with the driver's reason.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, Error, cuda::{KernelModule, prebuilt}};
    /// let cubin = prebuilt::cubin(prebuilt::Family::Timing, 90)?.expect("shipped");
    /// assert!(matches!(KernelModule::from_cubin(&Device::Cpu, "t", &cubin), Err(Error::InvalidArgument { .. })));
    /// # if !Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// let garbage = KernelModule::from_cubin(&Device::Cuda(0), "garbage", b"\x7fELF not really");
    /// assert!(matches!(garbage, Err(Error::ModuleLoad { .. })));
    /// # Ok(()) }
    /// ```
    pub fn from_cubin(device: &Device, name: &str, cubin: &[u8]) -> Result<Self> {
        Self::load_cubin(device, name, cubin, false)
    }

    /// [`from_cubin`](Self::from_cubin) for a cubin of opsmith's sm_90 builds, whose kernels
    /// all begin with `dependent_launch::prologue`, so that they may be launched early.
    pub(crate) fn from_cubin_waiting_for_predecessors(device: &Device, name: &str, cubin: &[u8]) -> Result<Self> {
        Self::load_cubin(device, name, cubin, true)
    }

    fn load_cubin(device: &Device, name: &str, cubin: &[u8], dependent_launch: bool) -> Result<Self> {
        // The driver reads the ELF image in place: give it 8-byte alignment, as a file read
        // into memory would have.
        let mut aligned = vec![0u64; cubin.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut aligned)[..cubin.len()].copy_from_slice(cubin);
        Self::load("KernelModule::from_cubin", device, name, bytemuck::cast_slice(&aligned), dependent_launch)
    }

    /// `cuModuleLoadDataEx` on `image` (NUL-terminated PTX, or a cubin), with the JIT's error log.
    fn load(op: &'static str, device: &Device, name: &str, image: &[u8], dependent_launch: bool) -> Result<Self> {
        let Device::Cuda(ordinal) = *device else {
            return Err(Error::InvalidArgument { op, reason: format!("modules load on CUDA devices, not {device}") });
        };
        let dev = CudaDevice::get(ordinal)?;
        dev.bind()?;

        const LOG_BYTES: usize = 16 * 1024;
        let mut log = vec![0u8; LOG_BYTES];
        let mut options =
            [sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER, sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES];
        // The driver takes option values as pointer-sized words; the size is passed by value.
        let mut values = [log.as_mut_ptr() as *mut c_void, LOG_BYTES as *mut c_void];
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `image` is NUL-terminated PTX or a whole cubin, alive for the call; the option
        // arrays have matching lengths and the log buffer outlives the call.
        let status = unsafe {
            sys::cuModuleLoadDataEx(
                &mut module,
                image.as_ptr() as *const c_void,
                options.len() as u32,
                options.as_mut_ptr(),
                values.as_mut_ptr(),
            )
        };
        if let Err(e) = status.result() {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let log = String::from_utf8_lossy(&log[..end]);
            let reason = if log.trim().is_empty() { e.to_string() } else { format!("{e}; JIT log: {}", log.trim()) };
            return Err(Error::ModuleLoad { module: name.into(), device: *device, reason });
        }
        Ok(Self {
            name: name.into(),
            handle: Arc::new(ModuleHandle { module, device: dev, dependent_launch }),
            functions: Mutex::new(HashMap::new()),
        })
    }

    /// The module's name.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::cuda::CudaDevice;
    /// use opsmith_host::cuda::prebuilt::Family;
    /// assert_eq!(CudaDevice::get(0)?.module(Family::Softmax)?.name(), "opsmith/softmax");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether its kernels are launched early: see [`Kernel::dependent_launch`].
    pub(crate) fn dependent_launch(&self) -> bool {
        self.handle.dependent_launch && launch::dependent_launch_enabled()
    }

    /// Looks up a kernel (a `.entry`) by name.
    ///
    /// A name the module does not define is [`Error::KernelNotFound`].
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::{Error, cuda::CudaDevice};
    /// let dev = CudaDevice::get(0)?;
    /// let module = dev.module(opsmith_kernels::Family::Elementwise)?;
    /// let fma = module.kernel(opsmith_kernels::names::F16.fused_mul_add.name())?;
    /// assert_eq!(fma.name(), "fused_mul_add_f16");
    /// assert!(matches!(module.kernel("no_such_kernel"), Err(Error::KernelNotFound { .. })));
    /// # Ok(()) }
    /// ```
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
        let kernel = Kernel {
            name: name.into(),
            func,
            module: self.handle.clone(),
            occupancy: Default::default(),
            dynamic_shared_limit: Default::default(),
        };
        functions.insert(name.into(), kernel.clone());
        Ok(kernel)
    }
}

/// One kernel of a loaded module. Launch it with [`Kernel::launch`].
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
/// use opsmith_host::cuda::{CudaDevice, DEFAULT_BLOCK};
/// let kernel = CudaDevice::get(0)?.kernel("add_f32")?;
/// println!("{kernel:?}: {} blocks of {DEFAULT_BLOCK} per SM", kernel.max_active_blocks_per_sm(DEFAULT_BLOCK)?);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Kernel {
    name: Arc<str>,
    func: sys::CUfunction,
    module: Arc<ModuleHandle>,
    /// (block size, resident blocks per multiprocessor), computed once per block size.
    occupancy: Arc<Mutex<Vec<(u32, u32)>>>,
    /// The dynamic shared memory limit set on the function past the default 48 KiB (0: not
    /// raised).
    dynamic_shared_limit: Arc<std::sync::atomic::AtomicU32>,
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
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::cuda::CudaDevice;
    /// let kernel = CudaDevice::get(0)?.kernel("mul_bf16")?;
    /// assert_eq!(kernel.name(), "mul_bf16");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device whose context the kernel is loaded in.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::cuda::CudaDevice;
    /// let dev = CudaDevice::get(0)?;
    /// assert_eq!(dev.kernel("add_f32")?.device(), &dev);
    /// # Ok(()) }
    /// ```
    pub fn device(&self) -> &CudaDevice {
        &self.module.device
    }

    /// Whether a launch of this kernel may begin before the kernel ahead of it on the stream
    /// has finished (programmatic dependent launch, sm_90 and newer): true for opsmith's own
    /// kernels where they come from a cubin of the sm_90 builds, whose kernels each wait for
    /// their predecessors before touching memory, with a driver of CUDA 12.3 or newer, unless
    /// `OPSMITH_DEPENDENT_LAUNCH=0`
    /// ([`DEPENDENT_LAUNCH_ENV`](super::DEPENDENT_LAUNCH_ENV)) turns it off. The kernel's
    /// launch and the scheduling of its blocks then overlap the end of the kernel before it.
    /// Kernels loaded by [`KernelModule`] are always launched after their predecessors.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::cuda::CudaDevice;
    /// let dev = CudaDevice::get(0)?;
    /// let kernel = dev.kernel("add_f32")?;
    /// println!("{kernel:?} launches early: {}", kernel.dependent_launch());
    /// # Ok(()) }
    /// ```
    pub fn dependent_launch(&self) -> bool {
        self.module.dependent_launch && launch::dependent_launch_enabled()
    }

    /// How many blocks of `block` threads one multiprocessor keeps resident for this kernel
    /// (the driver's occupancy calculation, from its registers and shared memory).
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::cuda::CudaDevice;
    /// let dev = CudaDevice::get(0)?;
    /// let kernel = dev.kernel("fused_mul_add_f32")?;
    /// let blocks = kernel.max_active_blocks_per_sm(256)?;
    /// assert!(blocks * 256 <= dev.max_threads_per_sm());
    /// # Ok(()) }
    /// ```
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
    /// This is the untyped path, for PTX that comes with no declaration (from nvcc, Triton, a
    /// file). A kernel written with `opsmith_kernels::kernel!` has one: launch it through
    /// [`KernelCrate::launch`](super::KernelCrate::launch) or [`launch`](super::launch), which
    /// check all of the below and need no `unsafe`.
    ///
    /// # Safety
    /// What opsmith cannot check: that `args` match the kernel's parameter list in number, order
    /// and width, that the kernel stays inside each tensor's elements, and that it writes only
    /// the tensors passed as [`KernelArg::Output`]. A [`Graph`](super::Graph) capture relies on
    /// the last two: it orders the launch after only the earlier work on these tensors.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::cuda::{CudaDevice, DEFAULT_BLOCK, KernelArg, LaunchConfig};
    /// use opsmith_host::{DType, Tensor};
    /// let dev = CudaDevice::get(0)?;
    /// let kernel = dev.kernel(opsmith_kernels::names::F32.fused_mul_add.name())?;
    /// let n = 10_000;
    /// let a = Tensor::from_vec((0..n).map(|i| i as f32).collect(), [n], dev.device())?;
    /// let d = Tensor::full(f64::NAN, [n], DType::F32, dev.device())?;
    /// // The kernel loops over 4-element packs, so a grid-stride grid covers any n.
    /// let cfg = LaunchConfig::grid_stride(&kernel, (n as u64).div_ceil(4), DEFAULT_BLOCK)?;
    /// let (input, output) = (KernelArg::Input(&a), KernelArg::Output(&d));
    /// let args = [input, input, input, output, KernelArg::U64(n as u64)]; // d = a * a + a
    /// // SAFETY: fused_mul_add_f32(a, b, c, d, n) reads n f32 of a, b and c and writes n of d;
    /// // d overlaps none of them.
    /// unsafe { kernel.launch(&dev.current_stream(), cfg, &args)? };
    /// assert_eq!(d.to_vec::<f32>()?[3], 3.0 * 3.0 + 3.0);
    /// # Ok(()) }
    /// ```
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

    /// Raises the function's dynamic shared memory limit to `bytes` when that is past the 48 KiB
    /// every function may use (once per size; the driver refuses what the device lacks).
    fn allow_dynamic_shared(&self, bytes: u32) -> Result<()> {
        use std::sync::atomic::Ordering;
        const DEFAULT_LIMIT: u32 = 48 * 1024;
        if bytes <= DEFAULT_LIMIT || bytes <= self.dynamic_shared_limit.load(Ordering::Acquire) {
            return Ok(());
        }
        let attribute = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        // SAFETY: the function belongs to the context bound by the caller; the attribute takes a
        // byte count.
        unsafe { sys::cuFuncSetAttribute(self.func, attribute, bytes as i32) }.result().map_err(|source| {
            Error::Launch { kernel: self.name.to_string(), device: self.device().device(), source }
        })?;
        self.dynamic_shared_limit.fetch_max(bytes, Ordering::AcqRel);
        Ok(())
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
        self.allow_dynamic_shared(cfg.shared_mem_bytes)?;
        let early = self.dependent_launch();
        let capturing = super::graph::capturing_thread();
        if early && capturing {
            // A capture records the dependency as a programmatic edge instead of the attribute.
            super::graph::make_kernel_edges_programmatic(stream);
        }
        let launched = if early && !capturing {
            let mut attribute = sys::CUlaunchAttribute {
                id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                pad: [0; 4],
                // SAFETY: the value is a plain C union of integers and structs of integers, for
                // which all zeros is valid.
                value: unsafe { std::mem::zeroed() },
            };
            attribute.value.programmaticStreamSerializationAllowed = 1;
            let config = sys::CUlaunchConfig {
                gridDimX: cfg.grid,
                gridDimY: 1,
                gridDimZ: 1,
                blockDimX: cfg.block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: cfg.shared_mem_bytes,
                hStream: stream.raw().cu_stream(),
                attrs: &mut attribute,
                numAttrs: 1,
            };
            // SAFETY: as below; `config` and its one attribute outlive the call, and the
            // kernel's module guarantees that it waits for its predecessors before it touches
            // memory, which is what launching it early requires.
            unsafe { sys::cuLaunchKernelEx(&config, self.func, params.as_mut_ptr(), std::ptr::null_mut()) }.result()
        } else {
            // SAFETY: the function belongs to the current context, the configuration was
            // validated, and the caller guarantees the parameters.
            unsafe {
                cudarc::driver::result::launch_kernel(
                    self.func,
                    (cfg.grid, 1, 1),
                    (cfg.block, 1, 1),
                    cfg.shared_mem_bytes,
                    stream.raw().cu_stream(),
                    params,
                )
            }
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
