//! The tensor type.
//!
//! ```
//! # fn main() -> opsmith_host::Result<()> {
//! use opsmith_host::{DType, Device, Tensor};
//! let t = Tensor::full(0.5, [2, 3], DType::BF16, Device::Cpu)?;
//! assert_eq!((t.dims(), t.dtype(), t.device()), (&[2, 3][..], DType::BF16, Device::Cpu));
//! # Ok(()) }
//! ```
mod create;
mod display;
mod layout;
mod operators;
mod shape;
#[doc(hidden)]
pub mod storage;

pub use shape::Shape;

#[cfg(feature = "cuda")]
use crate::cuda::CudaDevice;
use crate::dtype::with_element_type;
use crate::{DType, Device, Element, Error, Result};
use ndarray::{ArrayBase, ArrayD, Data, Dimension, IxDyn};
use std::sync::Arc;
use storage::{CpuBuffer, Storage, StorageData};

/// An n-dimensional array that owns (or shares) memory on one device.
///
/// A tensor is always contiguous and row-major: it is a shape over a contiguous run of elements
/// of its storage, starting at an offset. Cloning a `Tensor`, [`Tensor::flat_slice`] and
/// [`Tensor::reshape`] share the memory; [`Tensor::copy`] and [`Tensor::to_device`] copy it.
/// Because every tensor is contiguous, no op needs to check or fix strides; an `ndarray` input
/// in another layout is copied into row-major order by [`Tensor::from_array`].
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{Device, Tensor};
/// let t = Tensor::from_vec((0..6).map(|i| i as f32).collect(), [2, 3], Device::Cpu)?;
/// let tail = t.flat_slice(1, 4)?; // elements 1..5, sharing t's memory
/// assert_eq!(tail.to_vec::<f32>()?, [1.0, 2.0, 3.0, 4.0]);
/// assert!(tail.shares_storage(&t));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Tensor {
    pub(crate) storage: Arc<Storage>,
    pub(crate) offset: usize,
    pub(crate) shape: Shape,
    pub(crate) dtype: DType,
    pub(crate) device: Device,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({:?}, {}, {}", self.shape.dims(), self.dtype, self.device)?;
        if self.offset != 0 {
            write!(f, ", offset {}", self.offset)?;
        }
        f.write_str(")")
    }
}

/// The bit pattern one element of `value` has in `dtype`, for a device memset (f64 has no
/// 64-bit memset: its tensors are filled from the host).
#[cfg(feature = "cuda")]
enum FillPattern {
    Bits32(u32),
    Bits16(u16),
}

#[cfg(feature = "cuda")]
fn fill_pattern(value: f64, dtype: DType) -> Option<FillPattern> {
    match dtype {
        // The same rounding as the host path's `Element::from_f64`.
        DType::F32 => Some(FillPattern::Bits32(<f32 as Element>::from_f64(value).to_bits())),
        DType::F16 => Some(FillPattern::Bits16(<half::f16 as Element>::from_f64(value).to_bits())),
        DType::BF16 => Some(FillPattern::Bits16(<half::bf16 as Element>::from_f64(value).to_bits())),
        DType::U32 => Some(FillPattern::Bits32(<u32 as Element>::from_f64(value))),
        DType::F64 | DType::I64 => None,
    }
}

/// `n` copies of `value` in host memory, or [`Error::TooLarge`] (more bytes than an allocation
/// can hold) or [`Error::OutOfMemory`] (the allocator refused) instead of the abort or
/// capacity-overflow panic of `vec![value; n]`.
pub(crate) fn host_vec<T: Clone>(op: &'static str, n: usize, value: T) -> Result<Vec<T>> {
    let mut values = host_capacity(op, n)?;
    values.resize(n, value);
    Ok(values)
}

/// An empty `Vec` with room for `n` values, with the errors of [`host_vec`] in place of the
/// abort of `Vec::with_capacity(n)`.
pub(crate) fn host_capacity<T>(op: &'static str, n: usize) -> Result<Vec<T>> {
    let bytes =
        n.checked_mul(std::mem::size_of::<T>()).filter(|&b| b <= isize::MAX as usize).ok_or(Error::TooLarge {
            op,
            elements: n as u64,
            limit: (isize::MAX as usize / std::mem::size_of::<T>().max(1)) as u64,
        })?;
    let mut values = Vec::new();
    values.try_reserve_exact(n).map_err(|_| Error::OutOfMemory { op, device: Device::Cpu, bytes })?;
    Ok(values)
}

fn element_count(op: &'static str, shape: &Shape) -> Result<usize> {
    shape.checked_elem_count().ok_or(Error::TooLarge { op, elements: u64::MAX, limit: usize::MAX as u64 })
}

impl Tensor {
    /// A tensor holding `data` in row-major order.
    ///
    /// A `data` whose length is not the shape's element count is [`Error::ElementCount`].
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, Tensor};
    /// let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3], Device::Cpu)?;
    /// assert_eq!(t.dims(), [2, 3]);
    /// assert!(Tensor::from_vec(vec![1.0f32; 5], [2, 3], Device::Cpu).is_err());
    /// # Ok(()) }
    /// ```
    pub fn from_vec<T: Element>(data: Vec<T>, shape: impl Into<Shape>, device: Device) -> Result<Tensor> {
        let shape = shape.into();
        let expected = element_count("Tensor::from_vec", &shape)?;
        if expected != data.len() {
            return Err(Error::ElementCount {
                op: "Tensor::from_vec",
                shape: shape.dims().to_vec(),
                expected,
                actual: data.len(),
            });
        }
        match device {
            Device::Cpu => Ok(Tensor {
                storage: Storage::cpu(T::into_cpu_buffer(data)),
                offset: 0,
                shape,
                dtype: T::DTYPE,
                device,
            }),
            #[cfg(feature = "cuda")]
            Device::Cuda(ordinal) => {
                let stream = CudaDevice::get(ordinal)?.current_stream();
                let t = Tensor::uninit_on("Tensor::from_vec", &stream, shape, T::DTYPE)?;
                t.write_host(&stream, bytemuck::cast_slice(&data))?;
                Ok(t)
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => Err(Error::cuda_disabled("Tensor::from_vec", device)),
        }
    }

    /// A tensor of `dtype` holding `values` (rounded to nearest even), whatever the dtype: the
    /// dtype-erased counterpart of [`Tensor::from_vec`], for references and tests.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor};
    /// let t = Tensor::from_f64(&[1.0, 2.5, -3.0], [3], DType::BF16, Device::Cpu)?;
    /// assert_eq!(t.to_vec_f64()?, [1.0, 2.5, -3.0]);
    /// # Ok(()) }
    /// ```
    pub fn from_f64(values: &[f64], shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        with_element_type!(dtype, T => Tensor::from_vec(values.iter().map(|&v| T::from_f64(v)).collect::<Vec<T>>(), shape, device))
    }

    /// The elements as f64 in row-major order, whatever the dtype (exact: every dtype widens to
    /// f64 without rounding).
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, Tensor, f16};
    /// let t = Tensor::from_vec(vec![f16::from_f32(0.1)], [1], Device::Cpu)?;
    /// assert_eq!(t.to_vec_f64()?, [0.0999755859375]); // the f16 nearest 0.1, exactly
    /// # Ok(()) }
    /// ```
    pub fn to_vec_f64(&self) -> Result<Vec<f64>> {
        with_element_type!(self.dtype, T => Ok(self.to_vec::<T>()?.into_iter().map(T::to_f64).collect()))
    }

    /// A tensor holding a copy of `data` in row-major order.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, Tensor};
    /// let data = [1.0f64, 2.0, 3.0];
    /// let t = Tensor::from_slice(&data, [3], Device::Cpu)?;
    /// assert_eq!(t.to_vec::<f64>()?, data);
    /// # Ok(()) }
    /// ```
    pub fn from_slice<T: Element>(data: &[T], shape: impl Into<Shape>, device: Device) -> Result<Tensor> {
        Tensor::from_vec(data.to_vec(), shape, device)
    }

    /// A tensor with the shape and values of an `ndarray` array, in row-major order whatever the
    /// array's own layout.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, Tensor};
    /// let a = ndarray::array![[1.0f32, 2.0], [3.0, 4.0]];
    /// let t = Tensor::from_array(&a.t(), Device::Cpu)?; // a transposed (column-major) view
    /// assert_eq!(t.to_vec::<f32>()?, [1.0, 3.0, 2.0, 4.0]);
    /// # Ok(()) }
    /// ```
    pub fn from_array<T: Element, S: Data<Elem = T>, D: Dimension>(
        array: &ArrayBase<S, D>,
        device: Device,
    ) -> Result<Tensor> {
        let data: Vec<T> = array.iter().copied().collect();
        Tensor::from_vec(data, array.shape().to_vec(), device)
    }

    /// A tensor of `shape` with every element `value` (rounded to `dtype`).
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor, bf16};
    /// let t = Tensor::full(0.1, [2], DType::BF16, Device::Cpu)?;
    /// assert_eq!(t.to_vec::<bf16>()?, [bf16::from_f64(0.1); 2]);
    /// # Ok(()) }
    /// ```
    pub fn full(value: f64, shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        let shape = shape.into();
        let n = element_count("Tensor::full", &shape)?;
        #[cfg(feature = "cuda")]
        if let (Device::Cuda(ordinal), Some(pattern)) = (device, fill_pattern(value, dtype)) {
            // A memset of the value's bit pattern on the device: no host buffer, no copy.
            let stream = CudaDevice::get(ordinal)?.current_stream();
            let t = Tensor::uninit_on("Tensor::full", &stream, shape, dtype)?;
            t.memset_on(&stream, pattern)?;
            return Ok(t);
        }
        with_element_type!(dtype, T => Tensor::from_vec(host_vec("Tensor::full", n, T::from_f64(value))?, shape, device))
    }

    /// Sets every element of this CUDA tensor (a view: only its own range) to `pattern` with a
    /// device memset on `stream`, recorded as one node when a graph is being captured.
    #[cfg(feature = "cuda")]
    fn memset_on(&self, stream: &crate::cuda::Stream, pattern: FillPattern) -> Result<()> {
        let n = self.elem_count();
        let StorageData::Cuda { device, bytes, uses, .. } = &self.storage.data else {
            // Callers pass CUDA tensors only.
            return Err(Error::InvalidArgument {
                op: "Tensor::fill_",
                reason: "a device memset got a CPU tensor".into(),
            });
        };
        if n == 0 {
            return Ok(());
        }
        let bytes = bytes.write();
        device.bind()?;
        uses.write_on(stream)?;
        let capture = device.capture_on(stream);
        let base = storage::raw_address(&bytes);
        let mut branch = false;
        if let Some(capture) = &capture {
            capture.touch(&self.storage, true); // a replay fills it again
            // One node that writes exactly this allocation.
            branch = capture.begin_exact(&[(base, true)])?;
        }
        let first = base + (self.offset * self.dtype.size_in_bytes()) as u64;
        let cu_stream = stream.raw().cu_stream();
        // SAFETY: the view's `n` elements of its dtype (4 or 2 bytes, the width of the memset)
        // start at `first`, inside the allocation and aligned to the element size (allocations
        // are aligned to the allocator's granularity, views start on whole elements); the write
        // lock is held and the stream is ordered after the allocation's other users.
        let status = unsafe {
            match pattern {
                FillPattern::Bits32(bits) => cudarc::driver::sys::cuMemsetD32Async(first, bits, n, cu_stream),
                FillPattern::Bits16(bits) => cudarc::driver::sys::cuMemsetD16Async(first, bits, n, cu_stream),
            }
        };
        if let (true, Some(capture)) = (branch, &capture) {
            capture.end_exact(&[(base, true)], status.result().is_ok())?;
        }
        status.result().map_err(|e| device.driver_error("cuMemsetAsync", e))?;
        self.storage.bump_version();
        Ok(())
    }

    /// A tensor of zeros.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor};
    /// let t = Tensor::zeros([2, 2], DType::F32, Device::Cpu)?;
    /// assert_eq!(t.to_vec::<f32>()?, [0.0; 4]);
    /// # Ok(()) }
    /// ```
    pub fn zeros(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::full(0.0, shape, dtype, device)
    }

    /// A tensor whose contents are unspecified until something writes them (zeros on the CPU;
    /// on CUDA, whatever the memory held before, as `torch.empty` gives). For the outputs of
    /// kernels that write every element, where zero-filling first would cost a pass over memory.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor};
    /// let out = Tensor::empty([2, 3], DType::F16, Device::Cpu)?;
    /// assert_eq!((out.dims(), out.dtype()), (&[2, 3][..], DType::F16));
    /// # Ok(()) }
    /// ```
    pub fn empty(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        let shape = shape.into();
        match device {
            Device::Cpu => Tensor::zeros(shape, dtype, device),
            #[cfg(feature = "cuda")]
            Device::Cuda(ordinal) => {
                Tensor::uninit_on("Tensor::empty", &CudaDevice::get(ordinal)?.current_stream(), shape, dtype)
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => Err(Error::cuda_disabled("Tensor::empty", device)),
        }
    }

    #[cfg(feature = "cuda")]
    fn uninit_on(op: &'static str, stream: &crate::cuda::Stream, shape: Shape, dtype: DType) -> Result<Tensor> {
        let n = element_count(op, &shape)?;
        let bytes = n.checked_mul(dtype.size_in_bytes()).ok_or(Error::TooLarge {
            op,
            elements: n as u64,
            limit: (usize::MAX / dtype.size_in_bytes()) as u64,
        })?;
        let storage = Storage::cuda_uninit(op, stream, bytes)?;
        Ok(Tensor { storage, offset: 0, shape, dtype, device: stream.device().device() })
    }

    /// The shape.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Shape, Tensor};
    /// let t = Tensor::zeros([2, 3], DType::F32, Device::Cpu)?;
    /// assert_eq!(t.shape(), &Shape::from([2, 3]));
    /// # Ok(()) }
    /// ```
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The dimensions.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor};
    /// let t = Tensor::zeros([2, 3], DType::F32, Device::Cpu)?;
    /// assert_eq!(t.dims(), [2, 3]);
    /// # Ok(()) }
    /// ```
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    /// The element type.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor};
    /// assert_eq!(Tensor::zeros([1], DType::F16, Device::Cpu)?.dtype(), DType::F16);
    /// # Ok(()) }
    /// ```
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device the memory lives on.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor};
    /// let device = Device::cuda_if_available();
    /// assert_eq!(Tensor::zeros([1], DType::F32, device)?.device(), device);
    /// # Ok(()) }
    /// ```
    pub fn device(&self) -> Device {
        self.device
    }

    /// The number of elements.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor};
    /// assert_eq!(Tensor::zeros([2, 3], DType::F32, Device::Cpu)?.elem_count(), 6);
    /// assert_eq!(Tensor::zeros([0, 3], DType::F32, Device::Cpu)?.elem_count(), 0);
    /// # Ok(()) }
    /// ```
    pub fn elem_count(&self) -> usize {
        // Every constructor checked that the product fits.
        self.shape.checked_elem_count().unwrap_or(0)
    }

    /// The position of the first element in the underlying storage, in elements.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor};
    /// let t = Tensor::zeros([10], DType::F32, Device::Cpu)?;
    /// assert_eq!(t.flat_slice(3, 4)?.offset(), 3);
    /// # Ok(()) }
    /// ```
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Whether `self` and `other` share memory (one is a view of the other, or both of a third).
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor};
    /// let t = Tensor::zeros([4], DType::F32, Device::Cpu)?;
    /// assert!(t.reshape([2, 2])?.shares_storage(&t));
    /// assert!(!t.copy()?.shares_storage(&t));
    /// # Ok(()) }
    /// ```
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// A counter of writes to this tensor's storage; it changes whenever an op writes into the
    /// storage in place.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor, ops};
    /// let x = Tensor::full(1.0, [4], DType::F32, Device::Cpu)?;
    /// let before = x.version();
    /// ops::add_into(&x, &x, &x)?; // in place
    /// assert_ne!(x.version(), before);
    /// # Ok(()) }
    /// ```
    pub fn version(&self) -> u64 {
        self.storage.version()
    }

    /// A 1-D view of the `len` elements starting at flat index `start`, sharing memory.
    ///
    /// This is how data at an arbitrary offset (and so at an arbitrary alignment) reaches the
    /// kernels; they take a scalar path when a pointer is not 16-byte aligned.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, Tensor};
    /// let t = Tensor::from_vec((0..6).map(|i| i as f32).collect(), [2, 3], Device::Cpu)?;
    /// assert_eq!(t.flat_slice(2, 3)?.to_vec::<f32>()?, [2.0, 3.0, 4.0]);
    /// assert!(t.flat_slice(4, 3).is_err()); // past the end: Error::OutOfRange
    /// # Ok(()) }
    /// ```
    pub fn flat_slice(&self, start: usize, len: usize) -> Result<Tensor> {
        let n = self.elem_count();
        let end = start.checked_add(len).filter(|&e| e <= n);
        let Some(_) = end else {
            return Err(Error::OutOfRange { op: "Tensor::flat_slice", start, end: start.saturating_add(len), len: n });
        };
        Ok(Tensor { offset: self.offset + start, shape: Shape::from(vec![len]), ..self.clone() })
    }

    /// The same elements under another shape with the same element count, sharing memory.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, Tensor};
    /// let t = Tensor::from_vec((0..6).map(|i| i as f32).collect(), [6], Device::Cpu)?;
    /// let m = t.reshape([3, 2])?;
    /// assert_eq!(m.dims(), [3, 2]);
    /// assert!(t.reshape([4, 2]).is_err()); // 8 elements: Error::ElementCount
    /// # Ok(()) }
    /// ```
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        let expected = element_count("Tensor::reshape", &shape)?;
        if expected != self.elem_count() {
            return Err(Error::ElementCount {
                op: "Tensor::reshape",
                shape: shape.dims().to_vec(),
                expected,
                actual: self.elem_count(),
            });
        }
        Ok(Tensor { shape, ..self.clone() })
    }

    /// The elements in row-major order. Fails with [`Error::ElementType`] if `T` is not the
    /// tensor's dtype. On CUDA this waits for the work that writes the tensor.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, Tensor};
    /// let t = Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?;
    /// assert_eq!(t.to_vec::<f32>()?, [1.0, 2.0]);
    /// assert!(t.to_vec::<f64>().is_err()); // Error::ElementType: the tensor holds f32
    /// # Ok(()) }
    /// ```
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(Error::ElementType { op: "Tensor::to_vec", requested: T::DTYPE, actual: self.dtype });
        }
        let range = self.offset..self.offset + self.elem_count();
        match &self.storage.data {
            StorageData::Cpu(buf) => {
                let buf = buf.read_recursive();
                let slice = T::cpu_slice(&buf).ok_or(Error::ElementType {
                    op: "Tensor::to_vec",
                    requested: T::DTYPE,
                    actual: buf.dtype(),
                })?;
                Ok(slice[range].to_vec())
            }
            #[cfg(feature = "cuda")]
            StorageData::Cuda { device, bytes, uses, .. } => {
                crate::cuda::graph::refuse_while_capturing("Tensor::to_vec", crate::cuda::graph::HOST_READ)?;
                let mut out = host_vec("Tensor::to_vec", range.len(), T::from_f64(0.0))?;
                if out.is_empty() {
                    return Ok(out);
                }
                let stream = device.current_stream();
                let size = self.dtype.size_in_bytes();
                let bytes = bytes.read_recursive();
                let view = bytes.slice(range.start * size..range.end * size);
                device.bind()?;
                uses.read_on(&stream)?;
                stream
                    .raw()
                    .memcpy_dtoh(&view, bytemuck::cast_slice_mut::<T, u8>(&mut out))
                    .map_err(|e| device.driver_error("copying device to host", e))?;
                uses.read_done(&stream)?;
                stream.synchronize()?;
                Ok(out)
            }
        }
    }

    /// The tensor as an `ndarray` array of its shape.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, Tensor};
    /// let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2], Device::Cpu)?;
    /// let a = t.to_array::<f32>()?;
    /// assert_eq!(a[[1, 0]], 3.0);
    /// # Ok(()) }
    /// ```
    pub fn to_array<T: Element>(&self) -> Result<ArrayD<T>> {
        let data = self.to_vec::<T>()?;
        ArrayD::from_shape_vec(IxDyn(self.dims()), data)
            .map_err(|e| Error::InvalidArgument { op: "Tensor::to_array", reason: e.to_string() })
    }

    /// A copy on `device` (a fresh tensor even when `device` is the current one).
    ///
    /// Between two GPUs that reach each other's memory (NVLink, or PCIe peer-to-peer; see
    /// [`cuda::can_access_peer`](crate::cuda::can_access_peer)) the copy goes device to device: peer access is
    /// enabled for the pair on first use, and the copy is queued on the destination's current
    /// stream, after the work that writes `self` and before anything that later uses the result.
    /// Otherwise, and between the CPU and a GPU, it goes through host memory.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, Tensor};
    /// let t = Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?;
    /// let there = t.to_device(Device::cuda_if_available())?;
    /// assert_eq!(there.to_vec::<f32>()?, [1.0, 2.0]);
    /// # Ok(()) }
    /// ```
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        if device == self.device {
            return self.copy();
        }
        #[cfg(feature = "cuda")]
        if let (Device::Cuda(from), Device::Cuda(to)) = (self.device, device) {
            let (src, dst) = (CudaDevice::get(from)?, CudaDevice::get(to)?);
            if crate::cuda::peer::enable_peer_access(&src, &dst)? {
                let out =
                    Tensor::uninit_on("Tensor::to_device", &dst.current_stream(), self.shape.clone(), self.dtype)?;
                storage::copy_to_peer(self, &out)?;
                return Ok(out);
            }
        }
        with_element_type!(self.dtype, T => Tensor::from_vec(self.to_vec::<T>()?, self.shape.clone(), device))
    }

    /// A fresh contiguous copy on the same device.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, Tensor};
    /// let t = Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?;
    /// let c = t.copy()?;
    /// t.fill_(0.0)?;
    /// assert_eq!(c.to_vec::<f32>()?, [1.0, 2.0]); // the copy kept its values
    /// # Ok(()) }
    /// ```
    pub fn copy(&self) -> Result<Tensor> {
        match self.device {
            Device::Cpu => {
                with_element_type!(self.dtype, T => Tensor::from_vec(self.to_vec::<T>()?, self.shape.clone(), self.device))
            }
            #[cfg(feature = "cuda")]
            Device::Cuda(ordinal) => {
                let stream = CudaDevice::get(ordinal)?.current_stream();
                let out = Tensor::uninit_on("Tensor::copy", &stream, self.shape.clone(), self.dtype)?;
                out.copy_from_(self)?; // device to device
                Ok(out)
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => Err(Error::cuda_disabled("Tensor::copy", self.device)),
        }
    }

    /// The values converted to `dtype` (rounded to nearest even), as a new tensor on the same
    /// device. On CUDA, between f32, f16 and bf16, one kernel; conversions to or from f64 (and
    /// every conversion on the CPU) go through host memory.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor, f16};
    /// let t = Tensor::from_vec(vec![1.0f32, 65520.0], [2], Device::Cpu)?;
    /// let h = t.to_dtype(DType::F16)?;
    /// assert_eq!(h.to_vec::<f16>()?, [f16::ONE, f16::INFINITY]); // 65520 rounds past f16's largest
    /// # Ok(()) }
    /// ```
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        if self.device.is_cuda() {
            use opsmith_kernels::names;
            let table = match self.dtype {
                DType::F32 => Some(names::F32),
                DType::F16 => Some(names::F16),
                DType::BF16 => Some(names::BF16),
                DType::F64 | DType::U32 | DType::I64 => None,
            };
            let kernel = table.and_then(|t| match dtype {
                DType::F32 => Some(t.to_f32),
                DType::F16 => Some(t.to_f16),
                DType::BF16 => Some(t.to_bf16),
                DType::F64 | DType::U32 | DType::I64 => None,
            });
            if let Some(kernel) = kernel {
                let out = Tensor::empty(self.shape.clone(), dtype, self.device)?;
                let n = self.elem_count() as u64;
                if n > 0 {
                    crate::cuda::launch(kernel, crate::cuda::Grid::stride(n), (self, &out, n))?;
                }
                return Ok(out);
            }
        }
        let values: Vec<f64> =
            with_element_type!(self.dtype, T => self.to_vec::<T>()?.into_iter().map(T::to_f64).collect());
        with_element_type!(dtype, U => Tensor::from_vec(values.into_iter().map(U::from_f64).collect::<Vec<U>>(), self.shape.clone(), self.device))
    }

    /// Sets every element to `value` (rounded to the dtype), in place: every view of the same
    /// memory sees it. On CUDA it is a device memset (f64 and i64 tensors are written from the
    /// host), so it can be recorded in a graph. Tests use it to poison outputs.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor};
    /// let t = Tensor::zeros([4], DType::F32, Device::Cpu)?;
    /// t.flat_slice(1, 2)?.fill_(7.0)?;
    /// assert_eq!(t.to_vec::<f32>()?, [0.0, 7.0, 7.0, 0.0]);
    /// # Ok(()) }
    /// ```
    pub fn fill_(&self, value: f64) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let (StorageData::Cuda { device, .. }, Some(pattern)) = (&self.storage.data, fill_pattern(value, self.dtype))
        {
            // On the device, as `full` fills: no host buffer, and it can be captured in a graph.
            return self.memset_on(&device.current_stream(), pattern);
        }
        let n = self.elem_count();
        with_element_type!(self.dtype, T => self.write_values::<T>(&host_vec("Tensor::fill_", n, T::from_f64(value))?))
    }

    /// Overwrites this tensor's elements with `src`'s (same shape, dtype and device), in place.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor};
    /// let dst = Tensor::zeros([2], DType::F32, Device::Cpu)?;
    /// dst.copy_from_(&Tensor::from_vec(vec![3.0f32, 4.0], [2], Device::Cpu)?)?;
    /// assert_eq!(dst.to_vec::<f32>()?, [3.0, 4.0]);
    /// # Ok(()) }
    /// ```
    pub fn copy_from_(&self, src: &Tensor) -> Result<()> {
        crate::ops::check::same_layout("Tensor::copy_from_", &[self, src])?;
        match (&self.storage.data, &src.storage.data) {
            // Device to device, unless both are views of one buffer (one lock would be taken twice).
            #[cfg(feature = "cuda")]
            (
                StorageData::Cuda { device, bytes: dst, uses: dst_uses, .. },
                StorageData::Cuda { bytes: src_bytes, uses: src_uses, .. },
            ) if !self.shares_storage(src) => {
                let size = self.dtype.size_in_bytes();
                let n = self.elem_count();
                if n == 0 {
                    return Ok(());
                }
                let stream = device.current_stream();
                // Locked in address order, as every op locks, so that `a.copy_from_(&b)` and
                // `b.copy_from_(&a)` on two threads cannot deadlock.
                let (src_guard, mut dst_guard) = if Arc::as_ptr(&src.storage) < Arc::as_ptr(&self.storage) {
                    let s = src_bytes.read_recursive();
                    (s, dst.write())
                } else {
                    let d = dst.write();
                    (src_bytes.read_recursive(), d)
                };
                // One node that reads exactly `src`'s allocation and writes `self`'s.
                let footprint = [(storage::raw_address(&src_guard), false), (storage::raw_address(&dst_guard), true)];
                let src_view = src_guard.slice(src.offset * size..(src.offset + n) * size);
                let mut dst_view = dst_guard.slice_mut(self.offset * size..(self.offset + n) * size);
                device.bind()?;
                let capture = device.capture_on(&stream);
                let mut branch = false;
                if let Some(capture) = &capture {
                    src_uses.check_capturable("Tensor::copy_from_", &stream, false)?;
                    dst_uses.check_capturable("Tensor::copy_from_", &stream, true)?;
                    capture.touch(&src.storage, false);
                    capture.touch(&self.storage, true);
                    branch = capture.begin_exact(&footprint)?;
                }
                src_uses.read_on(&stream)?;
                dst_uses.write_on(&stream)?;
                let copied = stream.raw().memcpy_dtod(&src_view, &mut dst_view);
                if let (true, Some(capture)) = (branch, &capture) {
                    capture.end_exact(&footprint, copied.is_ok())?;
                }
                copied.map_err(|e| device.driver_error("copying device to device", e))?;
                src_uses.read_done(&stream)?;
                self.storage.bump_version();
                Ok(())
            }
            _ => with_element_type!(self.dtype, T => self.write_values::<T>(&src.to_vec::<T>()?)),
        }
    }

    pub(crate) fn write_values<T: Element>(&self, values: &[T]) -> Result<()> {
        match &self.storage.data {
            StorageData::Cpu(buf) => {
                let mut buf = buf.write();
                let actual = buf.dtype();
                let slice = T::cpu_slice_mut(&mut buf).ok_or(Error::ElementType {
                    op: "Tensor::write",
                    requested: T::DTYPE,
                    actual,
                })?;
                slice[self.offset..self.offset + values.len()].copy_from_slice(values);
                self.storage.bump_version();
                Ok(())
            }
            #[cfg(feature = "cuda")]
            StorageData::Cuda { device, .. } => self.write_host(&device.current_stream(), bytemuck::cast_slice(values)),
        }
    }

    /// Copies `data` (exactly this tensor's bytes) from the host into this tensor's range.
    #[cfg(feature = "cuda")]
    fn write_host(&self, stream: &crate::cuda::Stream, data: &[u8]) -> Result<()> {
        let StorageData::Cuda { device, bytes, uses, .. } = &self.storage.data else {
            return Err(Error::DeviceMismatch { op: "Tensor::write", lhs: self.device, rhs: Device::Cpu });
        };
        crate::cuda::graph::refuse_while_capturing("Tensor::write", crate::cuda::graph::HOST_WRITE)?;
        if data.is_empty() {
            return Ok(());
        }
        let start = self.offset * self.dtype.size_in_bytes();
        let mut bytes = bytes.write();
        let mut view = bytes.slice_mut(start..start + data.len());
        device.bind()?;
        uses.write_on(stream)?;
        stream.raw().memcpy_htod(data, &mut view).map_err(|e| device.driver_error("copying host to device", e))?;
        self.storage.bump_version();
        Ok(())
    }

    /// The device address of the first element (CUDA tensors only), for diagnostics and tests of
    /// alignment.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor};
    /// let t = Tensor::zeros([16], DType::F32, Device::cuda_if_available())?;
    /// match t.device_address() {
    ///     Some(address) => assert_eq!(t.flat_slice(1, 4)?.device_address(), Some(address + 4)),
    ///     None => assert_eq!(t.device(), Device::Cpu),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn device_address(&self) -> Option<u64> {
        match &self.storage.data {
            StorageData::Cpu(_) => None,
            #[cfg(feature = "cuda")]
            StorageData::Cuda { bytes, .. } => {
                let base = storage::raw_address(&bytes.read_recursive());
                Some(base + (self.offset * self.dtype.size_in_bytes()) as u64)
            }
        }
    }
}

impl CpuBuffer {
    #[allow(dead_code)]
    pub(crate) fn len(&self) -> usize {
        match self {
            CpuBuffer::F32(v) => v.len(),
            CpuBuffer::F16(v) => v.len(),
            CpuBuffer::BF16(v) => v.len(),
            CpuBuffer::F64(v) => v.len(),
            CpuBuffer::U32(v) => v.len(),
            CpuBuffer::I64(v) => v.len(),
        }
    }
}
