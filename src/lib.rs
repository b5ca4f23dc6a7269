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
//! # The tensor API
//!
//! Tensors are made, combined, reshaped, indexed and printed as in PyTorch and candle, on the
//! CPU and on CUDA, in every float dtype; integer tensors (`u32`, `i64`) hold indices and
//! labels. Every op returns `Result`; none panics on bad input.
//!
//! ```
//! use opsmith::{DType, Device, Tensor};
//! # fn main() -> opsmith::Result<()> {
//! let dev = Device::cuda_if_available();
//! // Creation: ones, zeros_like, ones_like, full_like, arange, eye, rand and randn (seeded:
//! // the same numbers on the CPU and on CUDA).
//! let a = Tensor::ones([2, 3], DType::F32, dev)?;
//! let r = Tensor::randn([2, 3], DType::F32, dev, 42)?;
//! assert_eq!(r.to_vec::<f32>()?, Tensor::randn([2, 3], DType::F32, Device::Cpu, 42)?.to_vec::<f32>()?);
//! let u = Tensor::rand([4], DType::BF16, dev, 7)?; // uniform in [0, 1)
//! assert!(u.to_vec_f64()?.iter().all(|v| (0.0..1.0).contains(v)));
//! assert_eq!(Tensor::eye(2, DType::F32, dev)?.to_vec::<f32>()?, [1.0, 0.0, 0.0, 1.0]);
//! assert_eq!(a.full_like(0.5)?.to_vec::<f32>()?, [0.5; 6]);
//!
//! // Operators: + - * / and unary -, between tensors and with f64 scalars.
//! let s = (&a + &r)?;
//! let p = (&s * 2.0)?;
//! let n = (-&p)?;
//! let q = (&n / &a)?;
//! let d = (&q - &s)?; // -3 (1 + r), rounded as f32 arithmetic rounds
//! let want: Vec<f32> = r.to_vec::<f32>()?.iter().map(|r| -3.0 * (1.0 + r)).collect();
//! assert_eq!(d.to_vec::<f32>()?, want);
//! println!("{d}"); // values, then Tensor[[2, 3], f32, cpu] (or cuda:0)
//!
//! // Shapes: narrow(dim, start, len), transpose, permute, cat, stack, squeeze, unsqueeze.
//! let x = Tensor::arange(0.0, 6.0, 1.0, DType::F32, dev)?.reshape([2, 3])?;
//! let t = x.transpose(0, 1)?;
//! assert_eq!((t.dims(), t.to_vec::<f32>()?), (&[3, 2][..], vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]));
//! let c = Tensor::cat(&[&x, &a], 0)?;
//! assert_eq!(c.dims(), [4, 3]);
//! assert_eq!(Tensor::stack(&[&x, &x], 0)?.dims(), [2, 2, 3]);
//! assert_eq!(x.narrow(1, 1, 2)?.to_vec::<f32>()?, [1.0, 2.0, 4.0, 5.0]);
//! assert_eq!(x.unsqueeze(0)?.dims(), [1, 2, 3]);
//!
//! // Along a dim: sum, max, argmax (an i64 tensor).
//! let m = x.argmax(1)?;
//! assert_eq!((m.dtype(), m.to_vec_f64()?), (DType::I64, vec![2.0, 2.0]));
//! assert_eq!(x.sum(0)?.to_vec::<f32>()?, [3.0, 5.0, 7.0]);
//! assert_eq!(x.max(1)?.to_vec::<f32>()?, [2.0, 5.0]);
//!
//! // Broadcasting in the binary ops, and broadcast_as.
//! let column = Tensor::from_vec(vec![10.0f32, 20.0], [2, 1], dev)?;
//! assert_eq!((&x + &column)?.to_vec::<f32>()?, [10.0, 11.0, 12.0, 23.0, 24.0, 25.0]);
//! assert_eq!(column.broadcast_as([2, 2])?.to_vec::<f32>()?, [10.0, 10.0, 20.0, 20.0]);
//!
//! // Indexing with integer tensors: index_select and gather.
//! let rows = Tensor::from_vec(vec![1i64, 1, 0], [3], dev)?;
//! assert_eq!(x.index_select(0, &rows)?.dims(), [3, 3]);
//! let labels = Tensor::from_vec(vec![2u32, 0], [2, 1], dev)?;
//! assert_eq!(x.gather(1, &labels)?.to_vec::<f32>()?, [2.0, 3.0]);
//!
//! // Casting: one kernel on CUDA.
//! let h = x.to_dtype(DType::F16)?;
//! assert_eq!((h.dtype(), h.to_vec_f64()?), (DType::F16, x.to_vec_f64()?));
//! # Ok(()) }
//! ```
//!
//! The same ops on autograd variables record their backward: operators, shape ops,
//! broadcasting, `sum`/`max` along a dim, `index_select` and `gather`
//! ([`autograd::ops`], and methods of the same names on [`autograd::Var`]):
//!
//! ```
//! use opsmith::autograd::{Tape, Var, ops as ag};
//! use opsmith::{DType, Device, Tensor};
//! # fn main() -> opsmith::Result<()> {
//! let dev = Device::cuda_if_available();
//! let tape = Tape::new();
//! let x = tape.var(Tensor::arange(0.0, 6.0, 1.0, DType::F32, dev)?.reshape([2, 3])?);
//! let b = tape.var(Tensor::from_vec(vec![1.0f32, -1.0, 2.0], [3], dev)?);
//! let y = (&x * &b)?; // b broadcast over the rows
//! let top = y.transpose(0, 1)?.max(0)?; // each row's largest: [2·2, 5·2]
//! assert_eq!(top.value().to_vec::<f32>()?, [4.0, 10.0]);
//! let picked = y.gather(1, &Tensor::from_vec(vec![0u32, 1], [2, 1], dev)?)?; // [0, -4]
//! let loss = ag::sum(&(&ag::sum(&top)? + &ag::sum(&picked)?)?)?;
//! let grads = tape.backward(&loss)?;
//! // x gets b where it was picked or largest; b gets the sum of the x it multiplied there.
//! assert_eq!(grads.get(&x).unwrap().to_vec::<f32>()?, [1.0, 0.0, 2.0, 0.0, -1.0, 2.0]);
//! assert_eq!(grads.get(&b).unwrap().to_vec::<f32>()?, [0.0, 4.0, 7.0]);
//! assert_eq!(x.argmax(1)?.to_vec::<i64>()?, [2, 2]); // not differentiable: a tensor
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
