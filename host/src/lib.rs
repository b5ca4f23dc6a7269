//! opsmith's runtime: devices, streams and events, tensors that own memory on a device, checked
//! kernel launches, module loading, and a CPU backend on `ndarray` that implements every op the
//! GPU does.
//!
//! ```
//! use opsmith_host::{Device, Tensor, ops};
//!
//! # fn main() -> opsmith_host::Result<()> {
//! let device = Device::cuda_if_available(); // CUDA device 0 if there is one, else the CPU
//! let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3], device)?;
//! let b = Tensor::from_vec(vec![4.0f32, 5.0, 6.0], [3], device)?;
//! let c = Tensor::from_vec(vec![0.5f32, 0.5, 0.5], [3], device)?;
//! let d = ops::fused_mul_add(&a, &b, &c)?; // d = a * b + c in one pass
//! assert_eq!(d.to_vec::<f32>()?, [4.5, 10.5, 18.5]);
//! # Ok(())
//! # }
//! ```
//!
//! Layout: [`device`] names devices; `cuda` holds the CUDA runtime (contexts, streams,
//! events, modules, launches); [`tensor`] the tensor type; [`labels`] class labels for the
//! losses; [`ops`] the operations, each with its CPU and CUDA halves side by side; [`dist`] the
//! TCP bootstrap and NCCL communicators, for several GPUs; [`error`] the one error type.
//!
//! Cargo features: `cuda` (default) is the CUDA runtime, on `cudarc`; without it there is no
//! cudarc at all, the CPU backend is complete, and a tensor on `Device::Cuda(n)` is
//! [`Error::FeatureDisabled`]. `cublas` (default) adds `ops::matmul` on CUDA; `nccl` adds
//! `dist`'s communicators. The CUDA libraries are loaded at run time, so none of them is
//! needed to build.
#![warn(missing_docs)]
// docs.rs marks what each cargo feature adds.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod dist;
pub mod dtype;
pub mod error;
pub mod labels;
pub mod ops;
pub mod tensor;

pub use device::Device;
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use half::{bf16, f16};
pub use labels::Labels;
pub use tensor::{Shape, Tensor};
