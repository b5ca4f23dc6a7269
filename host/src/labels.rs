//! Class labels for classification losses: `u32` values on one device.
#[cfg(feature = "cuda")]
use crate::cuda::{CudaDevice, Stream, graph::DeferredFree, stream_order::StreamUses};
use crate::{Device, Error, Result};
#[cfg(feature = "cuda")]
use cudarc::driver::{CudaSlice, DevicePtr};
#[cfg(feature = "cuda")]
use std::mem::ManuallyDrop;
use std::sync::Arc;

/// One class index per row, as `u32`, on the CPU or in device memory: the targets of
/// [`ops::cross_entropy`](crate::ops::cross_entropy).
///
/// The largest label is noted on the host when the labels are made, so a loss can reject a
/// label out of range for its class count without reading device memory. Cloning shares the
/// memory (labels never change once made).
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{Device, Labels};
/// let labels = Labels::new(&[2, 0, 1], Device::Cpu)?;
/// assert_eq!(labels.len(), 3);
/// assert_eq!(labels.to_vec()?, [2, 0, 1]);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Labels {
    data: LabelData,
    len: usize,
    max: Option<u32>,
}

#[derive(Clone)]
enum LabelData {
    Cpu(Arc<Vec<u32>>),
    #[cfg(feature = "cuda")]
    Cuda {
        device: CudaDevice,
        values: Arc<DeviceLabels>,
    },
}

#[cfg(feature = "cuda")]
/// Labels in device memory, with the streams that used them. Both are taken out by the
/// destructor.
struct DeviceLabels {
    device: CudaDevice,
    values: ManuallyDrop<CudaSlice<u32>>,
    uses: ManuallyDrop<StreamUses>,
}

#[cfg(feature = "cuda")]
impl Drop for DeviceLabels {
    fn drop(&mut self) {
        // SAFETY: this is the destructor; neither field is touched again.
        let (values, uses) = unsafe { (ManuallyDrop::take(&mut self.values), ManuallyDrop::take(&mut self.uses)) };
        match self.device.active_capture() {
            // Released once the capture ends, as a tensor's memory is (`cuda::graph`).
            Some(capture) => {
                let (len, stream) = (values.len() * std::mem::size_of::<u32>(), values.stream().clone());
                let address = values.leak();
                // SAFETY: the allocation of `len` bytes just released by the slice above; the
                // new slice owns it and frees it once the capture ends.
                let block = unsafe { stream.upgrade_device_ptr::<u8>(address, len) };
                capture.defer_free(DeferredFree { block, uses });
            }
            // Freed on the stream that uploaded them, after every other stream that read them.
            None => {
                uses.before_free();
                drop(values);
            }
        }
    }
}

impl std::fmt::Debug for Labels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Labels({}, {}", self.len, self.device())?;
        if let Some(max) = self.max {
            write!(f, ", max {max}")?;
        }
        f.write_str(")")
    }
}

impl Labels {
    /// Labels holding a copy of `values` on `device`.
    pub fn new(values: &[u32], device: Device) -> Result<Labels> {
        let max = values.iter().copied().max();
        let data = match device {
            Device::Cpu => LabelData::Cpu(Arc::new(values.to_vec())),
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => return Err(Error::cuda_disabled("Labels::new", device)),
            #[cfg(feature = "cuda")]
            Device::Cuda(ordinal) => {
                crate::cuda::graph::refuse_while_capturing("Labels::new", crate::cuda::graph::HOST_WRITE)?;
                let device = CudaDevice::get(ordinal)?;
                let stream = device.current_stream();
                device.bind()?;
                let values =
                    if values.is_empty() { stream.raw().null::<u32>() } else { stream.raw().clone_htod(values) }
                        .map_err(|e| {
                            Error::from_alloc("Labels::new", device.device(), std::mem::size_of_val(values), e)
                        })?;
                let labels = DeviceLabels {
                    device: device.clone(),
                    values: ManuallyDrop::new(values),
                    uses: ManuallyDrop::new(StreamUses::new(&stream)),
                };
                LabelData::Cuda { device, values: Arc::new(labels) }
            }
        };
        Ok(Labels { data, len: values.len(), max })
    }

    /// The number of labels.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no labels.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device the labels live on.
    pub fn device(&self) -> Device {
        match &self.data {
            LabelData::Cpu(_) => Device::Cpu,
            #[cfg(feature = "cuda")]
            LabelData::Cuda { device, .. } => device.device(),
        }
    }

    /// The largest label, `None` when there are none (known without reading the device).
    pub fn max(&self) -> Option<u32> {
        self.max
    }

    /// The labels as a `Vec`, copied from the device if they live there.
    pub fn to_vec(&self) -> Result<Vec<u32>> {
        match &self.data {
            LabelData::Cpu(values) => Ok(values.to_vec()),
            #[cfg(feature = "cuda")]
            LabelData::Cuda { device, values } => {
                if self.len == 0 {
                    return Ok(Vec::new());
                }
                crate::cuda::graph::refuse_while_capturing("Labels::to_vec", crate::cuda::graph::HOST_READ)?;
                let stream = device.current_stream();
                device.bind()?;
                values.uses.read_on(&stream)?;
                let mut out = vec![0u32; self.len];
                stream
                    .raw()
                    .memcpy_dtoh(&*values.values, &mut out)
                    .map_err(|e| device.driver_error("copying labels to the host", e))?;
                values.uses.read_done(&stream)?;
                stream.synchronize()?;
                Ok(out)
            }
        }
    }

    /// The values on the CPU, for the CPU halves of the losses.
    pub(crate) fn cpu_values(&self) -> Option<&[u32]> {
        match &self.data {
            LabelData::Cpu(values) => Some(values),
            #[cfg(feature = "cuda")]
            LabelData::Cuda { .. } => None,
        }
    }

    #[cfg(feature = "cuda")]
    /// Calls `f` with the device address of the first label, valid on `stream` for the duration
    /// of `f` (work `f` queues is ordered after the upload of the labels). Labels on the CPU are
    /// an [`Error::DeviceMismatch`] naming `op`.
    pub(crate) fn with_device_ptr<R>(
        &self,
        op: &'static str,
        stream: &Stream,
        f: impl FnOnce(u64) -> Result<R>,
    ) -> Result<R> {
        let LabelData::Cuda { values, .. } = &self.data else {
            return Err(Error::DeviceMismatch { op, lhs: stream.device().device(), rhs: Device::Cpu });
        };
        if let Some(capture) = stream.device().capture_on(stream) {
            values.uses.check_capturable(op, stream, false)?;
            capture.keep(values.clone()); // a replay reads them
        }
        values.uses.read_on(stream)?;
        // Event tracking is off for opsmith's contexts: this only reads the address.
        let (ptr, _no_event) = values.values.device_ptr(stream.raw());
        let result = f(ptr);
        values.uses.read_done(stream)?;
        result
    }
}
