//! opsmith's autograd: a tape that records ops (fused ones included) and runs their backward
//! on the CPU or on CUDA, custom ops with a backward you write, and gradient checks.
//!
//! * [`Tape`] and [`Var`]: variables that require gradients, recorded nodes, [`Tape::backward`].
//! * [`ops`]: differentiable ops: `add`, `sub`, `mul`, `div`, `neg`, `scale`, `add_scalar`, `sum`,
//!   `mean`, `fused_mul_add`, `add_mul` (one fused backward kernel), `add_row` (a bias row),
//!   `matmul` (cuBLAS on CUDA), `relu`, `gelu`, `silu`, `softmax` (with scale and mask),
//!   `attention` (scaled dot-product, causal or masked), `cross_entropy`, `mse_loss`; the shape ops `narrow`, `permute`, `transpose`, `cat`,
//!   `stack`, `squeeze`, `unsqueeze`, `reshape` and the cast `to_dtype`, also as methods on
//!   [`Var`] (`x.narrow(1, 0, 2)?`, `Var::cat(&[&a, &b], 0)?`).
//! * Operators: `+ - * /` and unary `-` on `&Var` (and with an `f64`), returning `Result`.
//! * [`nn`]: [`nn::Linear`] and [`nn::Mlp`], parameters as tape variables, safetensors files.
//! * `data_parallel` (with the `nccl` feature): one replica per GPU, gradients averaged with NCCL.
//! * [`optim`]: [`optim::Sgd`] and [`optim::Adam`], updating parameters in place on the device.
//! * [`CustomOp`] and [`custom`]: your own forward and backward, per device.
//! * [`gradcheck()`] and [`compare_devices`]: finite differences in f64, and CUDA against CPU.
//! * [`no_grad`]: inference without recording.
//! * [`onnx`]: export a traced forward pass as an ONNX model, fused and custom ops included.
//!
//! ```
//! # fn main() -> opsmith_autograd::Result<()> {
//! use opsmith_autograd::{Tape, ops};
//! use opsmith_host::{Device, Tensor};
//! let device = Device::cuda_if_available();
//! let tape = Tape::new();
//! let a = tape.var(Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3], device)?);
//! let b = tape.var(Tensor::from_vec(vec![4.0f32, 5.0, 6.0], [3], device)?);
//! let c = tape.var(Tensor::from_vec(vec![0.5f32; 3], [3], device)?);
//! let loss = ops::mean(&ops::fused_mul_add(&a, &b, &c)?)?;
//! let grads = tape.backward(&loss)?;
//! let ga = grads.get(&a).unwrap().to_vec::<f32>()?; // b / 3
//! assert!((ga[0] - 4.0 / 3.0).abs() < 1e-6);
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
// docs.rs marks what each cargo feature adds.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod custom;
#[cfg(feature = "nccl")]
pub mod data_parallel;
mod error;
pub mod gradcheck;
pub mod nn;
pub mod onnx;
mod operators;
pub mod ops;
pub mod optim;
mod tape;

pub use custom::{CustomOp, custom};
pub use error::{Error, Result};
pub use gradcheck::{GradcheckOptions, GradcheckReport, compare_devices, gradcheck};
pub use tape::{Gradients, NoGradGuard, Tape, Var, VarId, is_grad_enabled, no_grad};
