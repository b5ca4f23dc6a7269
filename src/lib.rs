//! opsmith: GPU kernels written in Rust, with checked launches, a CPU backend and autograd.
//!
//! This facade re-exports the workspace's crates:
//! * [`host`] (`opsmith-host`): devices, streams, tensors, ops, module loading;
//! * [`kernels`] (`opsmith-kernels`): the kernel name tables shared with the PTX, and the
//!   activation and optimizer formulas the CPU backend shares with the kernels;
//! * [`autograd`] (`opsmith-autograd`): the tape, custom ops, gradcheck, `nn` (Linear, Mlp),
//!   `optim` (SGD, Adam), data-parallel training, and `onnx` (export to ONNX models).
//!
//! ```
//! use opsmith::{ops, Device, Tensor};
//! # fn main() -> opsmith::Result<()> {
//! let device = Device::cuda_if_available();
//! let x = Tensor::from_vec(vec![1.0f32, 2.0], [2], device)?;
//! let z = ops::add_mul(&x, &x, &x)?; // (x + x) * x
//! assert_eq!(z.to_vec::<f32>()?, [2.0, 8.0]);
//! # Ok(()) }
//! ```
//!
//! One error type, [`Error`], for host and autograd ops alike, and operators on tensors and
//! variables that return `Result` (as candle's do):
//!
//! ```
//! use opsmith::autograd::{Tape, Var, ops as ag};
//! use opsmith::{Device, Tensor};
//! fn loss(x: &Var) -> opsmith::Result<Var> {
//!     let y = (x * x)?;
//!     Ok(ag::sum(&(&y + x)?)?)
//! }
//! # fn main() -> opsmith::Result<()> {
//! let device = Device::cuda_if_available();
//! let a = Tensor::from_vec(vec![1.0f32, -2.0, 4.0], [3], device)?;
//! let b = ((&a * 2.0)? / &a)?;                       // a host op: host::Error inside opsmith::Error
//! assert_eq!(b.to_vec::<f32>()?, [2.0, 2.0, 2.0]);
//! let tape = Tape::new();
//! let x = tape.var(a);
//! let grads = tape.backward(&loss(&x)?)?;             // an autograd op, the same `?`
//! assert_eq!(grads.get(&x).unwrap().to_vec::<f32>()?, [3.0, -3.0, 9.0]);
//! # Ok(()) }
//! ```
//!
//! Cargo features, all on by default: `cuda` (CUDA devices, through `cudarc` with the driver
//! loaded at run time), `cublas` (`ops::matmul` on CUDA) and `nccl` (collectives between GPUs).
//! With `default-features = false` opsmith is the CPU backend alone, with no `cudarc` in the
//! dependency tree, and asking for `Device::Cuda(n)` is [`host::Error::FeatureDisabled`]. Nothing in
//! the build needs a nightly, a CUDA toolkit or network access beyond crates.io: the kernels
//! ship prebuilt.
#![warn(missing_docs)]
// docs.rs marks what each cargo feature adds.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use opsmith_autograd as autograd;
/// One error type for everything opsmith does: host errors (shapes, dtypes, devices, launches,
/// the driver) are [`Error::Host`], autograd's (backward, custom ops, models, export) the other
/// variants. `?` works on both kinds of op in one function; [`Error::host`] gives the host error
/// to match on.
pub use opsmith_autograd::{Error, Result};
pub use opsmith_host as host;
#[cfg(feature = "cuda")]
pub use opsmith_host::cuda;
pub use opsmith_host::{DType, Device, Element, Labels, Shape, Tensor, bf16, f16, ops};
pub use opsmith_kernels as kernels;
