//! One shared context (and default stream, and loaded kernel families) per CUDA device.
use super::block_cache::BlockCache;
use super::graph::ActiveCapture;
use super::module::{Kernel, KernelModule};
use super::prebuilt::{self, Family, KernelImage};
use super::stream::Stream;
use crate::{Device, Error, Result};
use cudarc::driver::{CudaContext, CudaStream, sys::CUdevice_attribute};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// A CUDA device's shared state: its context, its default stream, and opsmith's kernels
/// loaded into it. Cheap to clone; get one with [`CudaDevice::get`].
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
/// use opsmith_host::{Device, Tensor, cuda::CudaDevice, ops};
/// let dev = CudaDevice::get(0)?;
/// let x = Tensor::from_vec(vec![1.0f32; 4096], [4096], dev.device())?;
/// let y = ops::add(&x, &x)?; // queued on dev.current_stream()
/// dev.synchronize()?;
/// assert_eq!(y.to_vec::<f32>()?[4095], 2.0);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct CudaDevice(Arc<Inner>);

struct Inner {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    default_stream: Arc<CudaStream>,
    sm_count: u32,
    max_threads_per_sm: u32,
    /// opsmith's kernel families, each loaded on the first use of one of its kernels.
    families: [OnceLock<LoadedFamily>; Family::ALL.len()],
    /// Small freed blocks of the default stream, reused without a driver call.
    blocks: BlockCache,
    /// Modules of kernel crates ([`KernelCrate`](super::KernelCrate)), by name and PTX address.
    user_modules: Mutex<Vec<(&'static str, usize, Arc<KernelModule>)>>,
    /// The graph capture in progress on this device, if any ([`super::Graph::capture`]);
    /// `capturing` says whether there is one without taking the lock, as every allocation asks.
    capture: Mutex<Option<Arc<ActiveCapture>>>,
    capturing: AtomicBool,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaDevice(cuda:{})", self.0.ordinal)
    }
}

impl PartialEq for CudaDevice {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// A loaded kernel family of a device.
struct LoadedFamily {
    family: Family,
    module: KernelModule,
    image: KernelImage,
    load_time: Duration,
    note: Option<String>,
}

/// What [`CudaDevice::loaded_modules`] reports of one kernel family.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LoadedModule {
    /// The family.
    pub family: Family,
    /// The image it was loaded from.
    pub image: KernelImage,
    /// How long the load took, the driver's compilation of PTX included.
    pub load_time: Duration,
    /// Why a fitting cubin was not used, if one was refused.
    pub note: Option<String>,
    /// Whether its kernels are launched before their predecessors on the stream finish (see
    /// [`Kernel::dependent_launch`](super::Kernel::dependent_launch)).
    pub dependent_launch: bool,
}

/// The family that defines one of opsmith's kernels: one hash lookup, as every launch asks.
fn family_of(name: &str) -> Option<Family> {
    static FAMILIES: OnceLock<std::collections::HashMap<&'static str, Family>> = OnceLock::new();
    let map = FAMILIES.get_or_init(|| {
        Family::ALL.into_iter().flat_map(|family| family.kernel_names().map(move |name| (name, family))).collect()
    });
    map.get(name).copied()
}

static REGISTRY: Mutex<Vec<Option<CudaDevice>>> = Mutex::new(Vec::new());

/// Makes the device's stream-ordered memory pool keep freed memory for reuse instead of handing
/// it back to the driver at every synchronization (its default threshold is 0). Without this,
/// a tensor allocated after a synchronize maps fresh pages, which costs more than the kernels of
/// a training step; with it, the pool behaves like PyTorch's caching allocator.
fn keep_pool_memory(ctx: &CudaContext) -> std::result::Result<(), cudarc::driver::DriverError> {
    use cudarc::driver::sys;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: the out-pointer is valid and the device handle comes from a live context.
    unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) }.result()?;
    let mut threshold = u64::MAX;
    // SAFETY: RELEASE_THRESHOLD takes a pointer to a u64 (cuuint64_t), valid for the call.
    unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            &mut threshold as *mut u64 as *mut std::ffi::c_void,
        )
    }
    .result()
}

impl CudaDevice {
    /// The shared state of `cuda:<ordinal>`, created on first use.
    ///
    /// Fails with [`Error::NoCudaDriver`] when the driver library is missing and with
    /// [`Error::NoSuchDevice`] when the ordinal is out of range.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::{Error, cuda::{self, CudaDevice}};
    /// let dev = CudaDevice::get(0)?;
    /// assert_eq!(dev, CudaDevice::get(0)?); // the same shared state
    /// let count = cuda::device_count()?;
    /// assert!(matches!(CudaDevice::get(count), Err(Error::NoSuchDevice { .. })));
    /// # Ok(()) }
    /// ```
    pub fn get(ordinal: usize) -> Result<CudaDevice> {
        let count = super::device_count()?;
        if ordinal >= count {
            return Err(Error::NoSuchDevice { ordinal, count });
        }
        let mut registry = REGISTRY.lock();
        if registry.len() < count {
            registry.resize(count, None);
        }
        if let Some(dev) = &registry[ordinal] {
            return Ok(dev.clone());
        }
        let dev = Self::create(ordinal)?;
        registry[ordinal] = Some(dev.clone());
        Ok(dev)
    }

    fn create(ordinal: usize) -> Result<CudaDevice> {
        let device = Device::Cuda(ordinal);
        let driver = |call| move |source| Error::Driver { call, device, source };
        let ctx = CudaContext::new(ordinal).map_err(driver("creating the context"))?;
        // SAFETY: opsmith orders streams around every allocation itself (`stream_order`): a use
        // on another stream waits for the last write (and a write for the reads since), the
        // allocating stream waits for every other user before it frees the memory, and writes
        // hold the allocation's write lock. This runs before the context's first allocation.
        unsafe { ctx.disable_event_tracking() };
        // A non-blocking stream of our own rather than the legacy NULL stream, which would
        // serialise with every other stream in the process.
        let default_stream = ctx.new_stream().map_err(driver("creating the default stream"))?;
        if ctx.has_async_alloc() {
            keep_pool_memory(&ctx).map_err(driver("configuring the memory pool"))?;
        }
        let attr = |a| ctx.attribute(a).map(|v| v.max(1) as u32).map_err(driver("reading device attributes"));
        let sm_count = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let max_threads_per_sm = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?;
        Ok(CudaDevice(Arc::new(Inner {
            ordinal,
            ctx,
            default_stream,
            sm_count,
            max_threads_per_sm,
            families: Default::default(),
            blocks: BlockCache::default(),
            user_modules: Mutex::new(Vec::new()),
            capture: Mutex::new(None),
            capturing: AtomicBool::new(false),
        })))
    }

    /// The ordinal.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// assert_eq!(opsmith_host::cuda::CudaDevice::get(0)?.ordinal(), 0);
    /// # Ok(()) }
    /// ```
    pub fn ordinal(&self) -> usize {
        self.0.ordinal
    }

    /// This device as a [`Device`].
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::{Device, cuda::CudaDevice};
    /// assert_eq!(CudaDevice::get(0)?.device(), Device::Cuda(0));
    /// # Ok(()) }
    /// ```
    pub fn device(&self) -> Device {
        Device::Cuda(self.0.ordinal)
    }

    /// The number of streaming multiprocessors.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// assert!(opsmith_host::cuda::CudaDevice::get(0)?.sm_count() >= 1);
    /// # Ok(()) }
    /// ```
    pub fn sm_count(&self) -> u32 {
        self.0.sm_count
    }

    /// The most threads one multiprocessor keeps resident.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// let dev = opsmith_host::cuda::CudaDevice::get(0)?;
    /// println!("{} threads resident at once", dev.sm_count() * dev.max_threads_per_sm());
    /// # Ok(()) }
    /// ```
    pub fn max_threads_per_sm(&self) -> u32 {
        self.0.max_threads_per_sm
    }

    /// The device's name, e.g. "NVIDIA H200".
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// println!("{}", opsmith_host::cuda::CudaDevice::get(0)?.name()?);
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> Result<String> {
        self.0.ctx.name().map_err(|source| self.driver_error("cuDeviceGetName", source))
    }

    /// The compute capability as (major, minor).
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// let (major, minor) = opsmith_host::cuda::CudaDevice::get(0)?.compute_capability()?;
    /// assert!(major >= 7, "the embedded PTX needs sm_70 or newer, this is sm_{major}{minor}");
    /// # Ok(()) }
    /// ```
    pub fn compute_capability(&self) -> Result<(u32, u32)> {
        let (major, minor) = self
            .0
            .ctx
            .compute_capability()
            .map_err(|source| self.driver_error("reading the compute capability", source))?;
        Ok((major as u32, minor as u32))
    }

    /// (free, total) device memory in bytes, as the driver reports it.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// let (free, total) = opsmith_host::cuda::CudaDevice::get(0)?.memory_info()?;
    /// assert!(free <= total);
    /// # Ok(()) }
    /// ```
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.0.ctx.mem_get_info().map_err(|source| self.driver_error("cuMemGetInfo", source))
    }

    /// The stream ops use on this device unless a [`Stream::make_current`] guard says otherwise.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// let dev = opsmith_host::cuda::CudaDevice::get(0)?;
    /// dev.default_stream().synchronize()?;
    /// # Ok(()) }
    /// ```
    pub fn default_stream(&self) -> Stream {
        Stream::from_parts(self.clone(), self.0.default_stream.clone())
    }

    /// A new non-blocking stream on this device.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// let dev = opsmith_host::cuda::CudaDevice::get(0)?;
    /// let side = dev.new_stream()?;
    /// assert_eq!(side.device(), &dev);
    /// # Ok(()) }
    /// ```
    pub fn new_stream(&self) -> Result<Stream> {
        let inner = self.0.ctx.new_stream().map_err(|source| self.driver_error("cuStreamCreate", source))?;
        Ok(Stream::from_parts(self.clone(), inner))
    }

    /// The stream ops on this device use now, on this thread.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// let dev = opsmith_host::cuda::CudaDevice::get(0)?;
    /// let side = dev.new_stream()?;
    /// let start = dev.current_stream().record_event()?; // on the default stream
    /// {
    ///     let _guard = side.make_current();
    ///     let on_side = dev.current_stream().record_event()?; // on `side`
    ///     on_side.synchronize()?;
    /// }
    /// start.synchronize()?;
    /// # Ok(()) }
    /// ```
    pub fn current_stream(&self) -> Stream {
        super::stream::current_for(self).unwrap_or_else(|| self.default_stream())
    }

    /// Waits for all work on every stream of this device.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::{Tensor, cuda::CudaDevice, ops};
    /// let dev = CudaDevice::get(0)?;
    /// let x = Tensor::from_vec(vec![3.0f32; 1 << 20], [1 << 20], dev.device())?;
    /// let _y = ops::mul(&x, &x)?;
    /// dev.synchronize()?; // the multiply has finished
    /// # Ok(()) }
    /// ```
    pub fn synchronize(&self) -> Result<()> {
        super::graph::refuse_while_capturing("CudaDevice::synchronize", super::graph::SYNC)?;
        self.0.ctx.synchronize().map_err(|source| self.driver_error("cuCtxSynchronize", source))
    }

    /// One of opsmith's own kernels, by name, from its family's module (loaded on first use:
    /// see [`module`](Self::module)). A name opsmith does not define is
    /// [`Error::KernelNotFound`].
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::cuda::CudaDevice;
    /// let add = CudaDevice::get(0)?.kernel(opsmith_kernels::names::F32.add.name())?;
    /// assert_eq!(add.name(), "add_f32");
    /// # Ok(()) }
    /// ```
    pub fn kernel(&self, name: &str) -> Result<Kernel> {
        let Some(family) = family_of(name) else {
            return Err(Error::KernelNotFound { module: "opsmith".into(), kernel: name.into() });
        };
        self.module(family)?.kernel(name)
    }

    /// The module of one of opsmith's kernel families, loaded into this device's context on
    /// first use: the shipped cubin for this GPU when there is one, else the PTX, which the
    /// driver compiles ([`prebuilt::choose_image`]). A cubin the driver refuses (one made by a
    /// newer CUDA than the driver knows) falls back to the PTX.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::cuda::{CudaDevice, prebuilt::Family};
    /// let dev = CudaDevice::get(0)?;
    /// let module = dev.module(Family::Loss)?;
    /// assert_eq!(module.name(), "opsmith/loss");
    /// # Ok(()) }
    /// ```
    pub fn module(&self, family: Family) -> Result<&KernelModule> {
        let slot = &self.0.families[family as usize];
        if let Some(loaded) = slot.get() {
            return Ok(&loaded.module);
        }
        let loaded = self.load_family(family)?;
        // Another thread may have won the race; either module is equivalent.
        Ok(&slot.get_or_init(|| loaded).module)
    }

    /// A kernel crate's module, loaded from `ptx` on the first call for this `(name, ptx)` and
    /// kept for the life of the device's context.
    pub(crate) fn user_module(&self, name: &'static str, ptx: &'static str) -> Result<Arc<KernelModule>> {
        let key = ptx.as_ptr() as usize;
        let mut modules = self.0.user_modules.lock();
        if let Some((_, _, module)) = modules.iter().find(|(n, k, _)| *n == name && *k == key) {
            return Ok(module.clone());
        }
        // Loading under the lock makes a second thread wait for this load instead of repeating
        // the driver's PTX compilation.
        let module = Arc::new(KernelModule::from_ptx(&self.device(), name, ptx)?);
        modules.push((name, key, module.clone()));
        Ok(module)
    }

    /// The kernel families loaded on this device so far: which image each came from and how
    /// long its load took (what `doctor` prints).
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::cuda::{CudaDevice, prebuilt::Family};
    /// let dev = CudaDevice::get(0)?;
    /// dev.module(Family::Elementwise)?;
    /// for m in dev.loaded_modules() {
    ///     println!("{:?}: {} in {:?}", m.family, m.image, m.load_time);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn loaded_modules(&self) -> Vec<LoadedModule> {
        let loaded = self.0.families.iter().filter_map(OnceLock::get);
        loaded
            .map(|l| LoadedModule {
                family: l.family,
                image: l.image,
                load_time: l.load_time,
                note: l.note.clone(),
                dependent_launch: l.module.dependent_launch(),
            })
            .collect()
    }

    fn load_family(&self, family: Family) -> Result<LoadedFamily> {
        let started = Instant::now();
        let (major, minor) = self.compute_capability()?;
        if 10 * major + minor < family.min_arch() {
            let (needs, arch) = (family.min_arch(), 10 * major + minor);
            return Err(Error::UnsupportedArch { family: family.name(), needs, arch, device: self.device() });
        }
        let name = format!("opsmith/{}", family.name());
        let device = self.device();
        let mut note = None;
        if let KernelImage::Cubin { arch } = prebuilt::choose_image(major, minor)
            && let Some(cubin) = prebuilt::cubin(family, arch)?
        {
            // From sm_90 on the cubins come from the family's sm_90 build, whose kernels wait for
            // their predecessors (`has_sm90_build`), so they may be launched early.
            let loaded = if arch >= 90 && family.has_sm90_build() {
                KernelModule::from_cubin_waiting_for_predecessors(&device, &name, &cubin)
            } else {
                KernelModule::from_cubin(&device, &name, &cubin)
            };
            match loaded {
                Ok(module) => {
                    let image = KernelImage::Cubin { arch };
                    return Ok(LoadedFamily { family, module, image, load_time: started.elapsed(), note });
                }
                // An older driver can refuse a cubin of a newer CUDA; the PTX still loads.
                Err(Error::ModuleLoad { reason, .. }) => {
                    note = Some(format!("the sm_{arch} cubin was refused: {reason}"))
                }
                Err(e) => return Err(e),
            }
        }
        let module = KernelModule::from_ptx(&device, &name, &prebuilt::ptx(family)?)?;
        Ok(LoadedFamily { family, module, image: KernelImage::Ptx, load_time: started.elapsed(), note })
    }

    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.0.ctx
    }

    /// Hands the memory that the device keeps for reuse (its stream-ordered pool, and the small
    /// blocks of [`cached_block_bytes`](Self::cached_block_bytes)) back to the driver, after
    /// waiting for the device (like PyTorch's `torch.cuda.empty_cache()`): tensors still alive
    /// keep theirs. Allocations call it by themselves once before they
    /// report [`Error::OutOfMemory`]; call it to leave memory to another process.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::cuda::CudaDevice;
    /// CudaDevice::get(0)?.release_cached_memory()?;
    /// # Ok(()) }
    /// ```
    pub fn release_cached_memory(&self) -> Result<()> {
        use cudarc::driver::sys;
        self.bind()?; // the cached blocks are freed through this device's context
        self.0.blocks.clear();
        self.synchronize()?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: the out-pointer is valid and the device handle comes from a live context.
        unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, self.0.ctx.cu_device()) }
            .result()
            .map_err(|source| self.driver_error("cuDeviceGetDefaultMemPool", source))?;
        // SAFETY: `pool` is the device's default pool; trimming frees only memory no allocation
        // holds, and the synchronize above completed every pending free.
        unsafe { sys::cuMemPoolTrimTo(pool, 0) }.result().map_err(|source| self.driver_error("cuMemPoolTrimTo", source))
    }

    /// Bytes of small freed allocations this device keeps for reuse: blocks of up to 1 MiB
    /// allocated on the default stream, kept by size (up to 64 MiB in all) and handed to the
    /// next allocation of the same size there without a driver call.
    /// [`release_cached_memory`](Self::release_cached_memory) frees them.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::{DType, Tensor, cuda::CudaDevice};
    /// let dev = CudaDevice::get(0)?;
    /// dev.release_cached_memory()?;
    /// drop(Tensor::zeros([1024], DType::F32, dev.device())?);
    /// assert_eq!(dev.cached_block_bytes(), 4096); // kept
    /// let _again = Tensor::zeros([1024], DType::F32, dev.device())?; // and reused
    /// assert_eq!(dev.cached_block_bytes(), 0);
    /// # Ok(()) }
    /// ```
    pub fn cached_block_bytes(&self) -> usize {
        self.0.blocks.bytes()
    }

    pub(crate) fn block_cache(&self) -> &BlockCache {
        &self.0.blocks
    }

    /// The graph capture in progress on this device, if any.
    pub(crate) fn active_capture(&self) -> Option<Arc<ActiveCapture>> {
        if !self.0.capturing.load(Ordering::Acquire) {
            return None;
        }
        self.0.capture.lock().clone()
    }

    /// The capture in progress on `stream`, if that stream is capturing.
    pub(crate) fn capture_on(&self, stream: &Stream) -> Option<Arc<ActiveCapture>> {
        self.active_capture().filter(|capture| capture.is_on(stream))
    }

    /// Starts tracking `capture`; false when another one is in progress on this device.
    pub(crate) fn try_set_active_capture(&self, capture: Arc<ActiveCapture>) -> bool {
        let mut slot = self.0.capture.lock();
        if slot.is_some() {
            return false;
        }
        *slot = Some(capture);
        self.0.capturing.store(true, Ordering::Release);
        true
    }

    /// Ends tracking the capture in progress.
    pub(crate) fn clear_active_capture(&self) {
        let mut slot = self.0.capture.lock();
        self.0.capturing.store(false, Ordering::Release);
        *slot = None;
    }

    /// Whether `stream` is this device's default stream.
    pub(crate) fn is_default_stream(&self, stream: &Stream) -> bool {
        Arc::ptr_eq(stream.raw(), &self.0.default_stream)
    }

    /// Makes this device's context current on the calling thread (the device guard every op
    /// takes before touching the driver).
    pub(crate) fn bind(&self) -> Result<()> {
        self.0.ctx.bind_to_thread().map_err(|source| self.driver_error("cuCtxSetCurrent", source))
    }

    pub(crate) fn driver_error(&self, call: &'static str, source: cudarc::driver::DriverError) -> Error {
        Error::Driver { call, device: self.device(), source }
    }
}
