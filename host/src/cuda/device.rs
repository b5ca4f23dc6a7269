//! One shared context (and default stream, and loaded kernels) per CUDA device.
use super::module::KernelModule;
use super::stream::Stream;
use crate::{Device, Error, Result};
use cudarc::driver::{CudaContext, CudaStream, sys::CUdevice_attribute};
use parking_lot::Mutex;
use std::sync::{Arc, OnceLock};

/// A CUDA device's shared state: its context, its default stream, and opsmith's kernels
/// loaded into it. Cheap to clone; get one with [`CudaDevice::get`].
#[derive(Clone)]
pub struct CudaDevice(Arc<Inner>);

struct Inner {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    default_stream: Arc<CudaStream>,
    sm_count: u32,
    max_threads_per_sm: u32,
    kernels: OnceLock<KernelModule>,
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
            kernels: OnceLock::new(),
        })))
    }

    /// The ordinal.
    pub fn ordinal(&self) -> usize {
        self.0.ordinal
    }

    /// This device as a [`Device`].
    pub fn device(&self) -> Device {
        Device::Cuda(self.0.ordinal)
    }

    /// The number of streaming multiprocessors.
    pub fn sm_count(&self) -> u32 {
        self.0.sm_count
    }

    /// The most threads one multiprocessor keeps resident.
    pub fn max_threads_per_sm(&self) -> u32 {
        self.0.max_threads_per_sm
    }

    /// The device's name, e.g. "NVIDIA H200".
    pub fn name(&self) -> Result<String> {
        self.0.ctx.name().map_err(|source| self.driver_error("cuDeviceGetName", source))
    }

    /// The compute capability as (major, minor).
    pub fn compute_capability(&self) -> Result<(u32, u32)> {
        let (major, minor) = self
            .0
            .ctx
            .compute_capability()
            .map_err(|source| self.driver_error("reading the compute capability", source))?;
        Ok((major as u32, minor as u32))
    }

    /// (free, total) device memory in bytes, as the driver reports it.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.0.ctx.mem_get_info().map_err(|source| self.driver_error("cuMemGetInfo", source))
    }

    /// The stream ops use on this device unless a [`Stream::make_current`] guard says otherwise.
    pub fn default_stream(&self) -> Stream {
        Stream::from_parts(self.clone(), self.0.default_stream.clone())
    }

    /// A new non-blocking stream on this device.
    pub fn new_stream(&self) -> Result<Stream> {
        let inner = self.0.ctx.new_stream().map_err(|source| self.driver_error("cuStreamCreate", source))?;
        Ok(Stream::from_parts(self.clone(), inner))
    }

    /// The stream ops on this device use now, on this thread.
    pub fn current_stream(&self) -> Stream {
        super::stream::current_for(self).unwrap_or_else(|| self.default_stream())
    }

    /// Waits for all work on every stream of this device.
    pub fn synchronize(&self) -> Result<()> {
        self.0.ctx.synchronize().map_err(|source| self.driver_error("cuCtxSynchronize", source))
    }

    /// opsmith's own kernels, loaded into this device's context on first use.
    pub fn kernels(&self) -> Result<&KernelModule> {
        if let Some(module) = self.0.kernels.get() {
            return Ok(module);
        }
        let module = KernelModule::from_ptx(&self.device(), "opsmith-kernels", super::EMBEDDED_PTX)?;
        // Another thread may have won the race; either module is equivalent.
        Ok(self.0.kernels.get_or_init(|| module))
    }

    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.0.ctx
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
