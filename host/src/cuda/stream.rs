//! Streams and events.
use super::CudaDevice;
use crate::Result;
use cudarc::driver::{CudaEvent, CudaStream, DriverError, sys::CUevent_flags};
use std::cell::RefCell;
use std::sync::Arc;

/// A CUDA stream: work on one stream runs in order; work on different streams may overlap.
///
/// Tensors remember which stream last wrote them, so an op on another stream waits for that
/// write without a manual synchronize.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
/// use opsmith_host::{Tensor, cuda::CudaDevice, ops};
/// let dev = CudaDevice::get(0)?;
/// let (producer, consumer) = (dev.new_stream()?, dev.new_stream()?);
/// let x = Tensor::from_vec(vec![2.0f32; 1 << 16], [1 << 16], dev.device())?;
/// let y = {
///     let _on = producer.make_current();
///     ops::mul(&x, &x)?
/// };
/// let z = {
///     let _on = consumer.make_current();
///     ops::add(&y, &x)? // waits for the producer's write of y
/// };
/// assert_eq!(z.to_vec::<f32>()?[0], 6.0);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Stream {
    device: CudaDevice,
    inner: Arc<CudaStream>,
}

impl PartialEq for Stream {
    fn eq(&self, other: &Self) -> bool {
        self.same_as(other)
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream(cuda:{}, {:?})", self.device.ordinal(), self.inner.cu_stream())
    }
}

thread_local! {
    /// Streams made current by [`Stream::make_current`], innermost last, each with the id of
    /// the guard that put it there.
    static CURRENT: RefCell<Vec<(u64, Stream)>> = const { RefCell::new(Vec::new()) };
    /// The next guard's id.
    static NEXT_GUARD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The innermost stream made current on this thread for `device`, if any.
pub(crate) fn current_for(device: &CudaDevice) -> Option<Stream> {
    CURRENT.with(|c| c.borrow().iter().rev().find(|(_, s)| s.device == *device).map(|(_, s)| s.clone()))
}

/// Restores the previous current stream when dropped. See [`Stream::make_current`].
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
/// use opsmith_host::cuda::CudaDevice;
/// let dev = CudaDevice::get(0)?;
/// let side = dev.new_stream()?;
/// let guard = side.make_current();
/// let here = dev.current_stream().record_event()?; // recorded on `side`
/// drop(guard); // back to the default stream
/// side.wait(&here)?;
/// # Ok(()) }
/// ```
#[must_use = "the stream stops being current when the guard is dropped"]
pub struct StreamGuard {
    /// Which entry of this thread's stack the guard removes.
    id: u64,
    // Not Send: the guard must drop on the thread whose stack it changed.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        // Its own entry, wherever it is: guards dropped out of order (stored in a struct, moved
        // into a Vec) must not take another guard's stream off the stack.
        CURRENT.with(|c| c.borrow_mut().retain(|(id, _)| *id != self.id));
    }
}

impl Stream {
    pub(crate) fn from_parts(device: CudaDevice, inner: Arc<CudaStream>) -> Self {
        Self { device, inner }
    }

    /// The device this stream belongs to.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::cuda::CudaDevice;
    /// let dev = CudaDevice::get(0)?;
    /// assert_eq!(dev.new_stream()?.device(), &dev);
    /// # Ok(()) }
    /// ```
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    pub(crate) fn raw(&self) -> &Arc<CudaStream> {
        &self.inner
    }

    /// Whether `self` and `other` are one CUDA stream (`==` says the same).
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::cuda::CudaDevice;
    /// let dev = CudaDevice::get(0)?;
    /// let side = dev.new_stream()?;
    /// let _guard = side.make_current();
    /// assert!(dev.current_stream().same_as(&side));
    /// assert!(!dev.default_stream().same_as(&side));
    /// # Ok(()) }
    /// ```
    pub fn same_as(&self, other: &Stream) -> bool {
        self.inner.cu_stream() == other.inner.cu_stream() && self.device == other.device
    }

    /// Makes the work queued on this stream from now on wait for everything queued on `other`
    /// so far (an event recorded on `other` now, without timing).
    pub(crate) fn wait_for_now(&self, other: &Stream) -> Result<()> {
        self.wait_raw(other).map_err(|source| self.device.driver_error("cuStreamWaitEvent", source))
    }

    /// Makes the work queued on this stream from now on wait for `event`.
    pub(crate) fn wait_event(&self, event: &CudaEvent) -> Result<()> {
        self.inner.wait(event).map_err(|source| self.device.driver_error("cuStreamWaitEvent", source))
    }

    pub(crate) fn wait_raw(&self, other: &Stream) -> std::result::Result<(), DriverError> {
        let marker = other.inner.record_event(None)?;
        self.inner.wait(&marker)
    }

    /// Makes this the stream that ops on its device use on this thread, until the guard drops.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::{cuda::CudaDevice, ops, Device, Tensor};
    /// let dev = CudaDevice::get(0)?;
    /// let side = dev.new_stream()?;
    /// let a = Tensor::from_vec(vec![1.0f32; 1024], [1024], Device::Cuda(0))?;
    /// {
    ///     let _on_side = side.make_current();
    ///     let _b = ops::add(&a, &a)?; // runs on `side`
    /// }
    /// # Ok(()) }
    /// ```
    pub fn make_current(&self) -> StreamGuard {
        let id = NEXT_GUARD.with(|next| next.replace(next.get() + 1));
        CURRENT.with(|c| c.borrow_mut().push((id, self.clone())));
        StreamGuard { id, _not_send: std::marker::PhantomData }
    }

    /// Blocks until all work queued on this stream has finished.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::{Tensor, cuda::CudaDevice, ops};
    /// let dev = CudaDevice::get(0)?;
    /// let x = Tensor::from_vec(vec![1.0f32; 1 << 20], [1 << 20], dev.device())?;
    /// let _y = ops::add(&x, &x)?;
    /// dev.current_stream().synchronize()?; // the add has finished
    /// # Ok(()) }
    /// ```
    pub fn synchronize(&self) -> Result<()> {
        super::graph::refuse_while_capturing("Stream::synchronize", super::graph::SYNC)?;
        self.inner.synchronize().map_err(|source| self.device.driver_error("cuStreamSynchronize", source))
    }

    /// Records an event at this point of the stream, with timing enabled.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::{Tensor, cuda::CudaDevice, ops};
    /// let dev = CudaDevice::get(0)?;
    /// let x = Tensor::from_vec(vec![1.0f32; 1 << 20], [1 << 20], dev.device())?;
    /// let stream = dev.current_stream();
    /// let start = stream.record_event()?;
    /// let _y = ops::fused_mul_add(&x, &x, &x)?;
    /// let end = stream.record_event()?;
    /// println!("fused_mul_add of 2^20 f32: {:.3} ms", start.elapsed_ms(&end)?);
    /// # Ok(()) }
    /// ```
    pub fn record_event(&self) -> Result<Event> {
        let event = self
            .device
            .context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|source| self.device.driver_error("cuEventCreate", source))?;
        event.record(&self.inner).map_err(|source| self.device.driver_error("cuEventRecord", source))?;
        Ok(Event { device: self.device.clone(), inner: event })
    }

    /// Makes later work on this stream wait until `event` has completed.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::cuda::CudaDevice;
    /// let dev = CudaDevice::get(0)?;
    /// let (first, second) = (dev.new_stream()?, dev.new_stream()?);
    /// let done = first.record_event()?;
    /// second.wait(&done)?; // work queued on `second` from here on runs after `first`'s so far
    /// second.synchronize()?;
    /// # Ok(()) }
    /// ```
    pub fn wait(&self, event: &Event) -> Result<()> {
        if self.device.capture_on(self).is_some() {
            return Err(crate::Error::Capture {
                op: "Stream::wait",
                reason: "a graph records one stream, and a wait for an event recorded outside it cannot be replayed"
                    .into(),
            });
        }
        self.inner.wait(&event.inner).map_err(|source| self.device.driver_error("cuStreamWaitEvent", source))
    }
}

/// A point in a stream, for ordering other streams after it and for timing.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
/// use opsmith_host::cuda::CudaDevice;
/// let stream = CudaDevice::get(0)?.current_stream();
/// let (start, end) = (stream.record_event()?, stream.record_event()?);
/// assert!(start.elapsed_ms(&end)? >= 0.0);
/// # Ok(()) }
/// ```
pub struct Event {
    device: CudaDevice,
    inner: CudaEvent,
}

impl Event {
    /// Blocks until the work before the event has finished.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::{Tensor, cuda::CudaDevice, ops};
    /// let dev = CudaDevice::get(0)?;
    /// let x = Tensor::from_vec(vec![1.0f32; 1 << 20], [1 << 20], dev.device())?;
    /// let _y = ops::add(&x, &x)?;
    /// dev.current_stream().record_event()?.synchronize()?; // the add has finished
    /// # Ok(()) }
    /// ```
    pub fn synchronize(&self) -> Result<()> {
        super::graph::refuse_while_capturing("Event::synchronize", super::graph::SYNC)?;
        self.inner.synchronize().map_err(|source| self.device.driver_error("cuEventSynchronize", source))
    }

    /// Milliseconds between this event and a later one (both must have completed).
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::{Tensor, cuda::CudaDevice, ops};
    /// let dev = CudaDevice::get(0)?;
    /// let x = Tensor::from_vec(vec![1.0f32; 1 << 22], [1 << 22], dev.device())?;
    /// let stream = dev.current_stream();
    /// let start = stream.record_event()?;
    /// let _y = ops::add(&x, &x)?;
    /// let end = stream.record_event()?;
    /// let ms = start.elapsed_ms(&end)?; // waits for `end` first
    /// println!("{:.0} GB/s", 3.0 * 4.0 * (1u64 << 22) as f64 / ms as f64 / 1e6);
    /// # Ok(()) }
    /// ```
    pub fn elapsed_ms(&self, later: &Event) -> Result<f32> {
        later.synchronize()?;
        self.inner.elapsed_ms(&later.inner).map_err(|source| self.device.driver_error("cuEventElapsedTime", source))
    }
}

impl From<&Stream> for crate::Device {
    fn from(s: &Stream) -> Self {
        s.device.device()
    }
}
