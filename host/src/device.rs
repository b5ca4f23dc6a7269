//! Where a tensor lives.
//!
//! ```
//! use opsmith_host::Device;
//! let device = Device::cuda_if_available();
//! assert!(device == Device::Cpu || device == Device::Cuda(0));
//! ```
/// A device: the CPU, or a CUDA GPU by ordinal.
///
/// A `Device` is only a name; the CUDA context, stream and loaded kernels behind `Cuda(n)` are
/// created on first use and shared by everything on that device (`cuda::CudaDevice`).
///
/// ```
/// use opsmith_host::Device;
/// assert_eq!(Device::default(), Device::Cpu);
/// assert_eq!(Device::Cuda(1).to_string(), "cuda:1");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// The host CPU, through the `ndarray` backend.
    #[default]
    Cpu,
    /// The CUDA device with this ordinal.
    Cuda(usize),
}

impl Device {
    /// `Cuda(0)` when a CUDA driver and at least one device are present, else `Cpu` (always
    /// `Cpu` in a build without the `cuda` feature).
    ///
    /// ```
    /// let device = opsmith_host::Device::cuda_if_available();
    /// println!("running on {device}");
    /// ```
    pub fn cuda_if_available() -> Device {
        #[cfg(feature = "cuda")]
        if crate::cuda::device_count().unwrap_or(0) > 0 {
            return Device::Cuda(0);
        }
        Device::Cpu
    }

    /// Whether this is a CUDA device.
    ///
    /// ```
    /// use opsmith_host::Device;
    /// assert!(Device::Cuda(0).is_cuda());
    /// assert!(!Device::Cpu.is_cuda());
    /// ```
    pub fn is_cuda(self) -> bool {
        matches!(self, Device::Cuda(_))
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}
