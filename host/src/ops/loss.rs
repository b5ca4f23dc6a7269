//! Losses, each with its backward: cross-entropy from logits, with the log-softmax fused in,
//! and the mean squared error. CPU and CUDA halves side by side.
//!
//! Both are means, returned as a one-element tensor of shape `[]` in the inputs' dtype. On CUDA
//! the forward leaves f32 partials that one block adds in a fixed order (the same bits every
//! run), and the backward reads the upstream gradient on the device, so a training step never
//! waits for the host.
use super::check;
#[cfg(feature = "cuda")]
use super::cuda::{check_launch_len, dtype_table};
#[cfg(feature = "cuda")]
use super::reduce::{cuda_device, finish_block, finish_sum, launch, reduce_partials};
#[cfg(feature = "cuda")]
use super::softmax::launch_rows;
use super::softmax::{reciprocal_or_zero, row_max_sum};
use crate::DType;
#[cfg(feature = "cuda")]
use crate::cuda::CudaDevice;
#[cfg(feature = "cuda")]
use crate::cuda::{KernelArg, LaunchConfig};
use crate::dtype::{Accumulator, with_float_type};
use crate::{Device, Element, Error, Labels, Result, Shape, Tensor};
#[cfg(feature = "cuda")]
use opsmith_kernels::names::{ALL_LOSS, loss::THREAD_ROW_MAX_COLS};

#[cfg(feature = "cuda")]
/// Launches a cross-entropy kernel over `rows` rows of `classes` logits with the mapping the
/// kernel takes for that row length: about one thread per row up to `THREAD_ROW_MAX_COLS`
/// classes, one warp per row past it ([`launch_rows`]).
///
/// # Safety
/// As for [`launch_rows`].
unsafe fn launch_cross_entropy(
    device: &CudaDevice,
    name: &str,
    rows: usize,
    classes: usize,
    args: &[KernelArg<'_>],
) -> Result<()> {
    if classes as u64 <= THREAD_ROW_MAX_COLS {
        launch(device, name, rows as u64, args)
    } else {
        // SAFETY: forwarded from the caller.
        unsafe { launch_rows(device, name, rows, args) }
    }
}

/// The most rows whose mean cross-entropy one block computes, in one launch
/// (`cross_entropy_mean`, for rows of up to `THREAD_ROW_MAX_COLS` classes): four rows a thread
/// of 1024, one batch of loads. More rows take the cross-entropy kernel and `sum_finish`.
#[cfg(feature = "cuda")]
const ONE_BLOCK_MEAN_ROWS: usize = 4096;

/// Checks logits `[rows, classes]` against their labels and returns (rows, classes).
fn classification(op: &'static str, logits: &Tensor, labels: &Labels) -> Result<(usize, usize)> {
    check::float(op, logits)?;
    let [rows, classes] = *logits.dims() else {
        return Err(Error::InvalidArgument {
            op,
            reason: format!("expects logits of shape [rows, classes], got {:?}", logits.dims()),
        });
    };
    if labels.device() != logits.device() {
        return Err(Error::DeviceMismatch { op, lhs: logits.device(), rhs: labels.device() });
    }
    if labels.len() != rows {
        return Err(Error::ShapeMismatch { op, lhs: vec![rows], rhs: vec![labels.len()] });
    }
    if rows == 0 {
        return Err(Error::InvalidArgument { op, reason: "the mean over zero rows is undefined".into() });
    }
    match labels.max() {
        Some(label) if label as usize >= classes => {
            Err(Error::InvalidArgument { op, reason: format!("label {label} is out of range for {classes} classes") })
        }
        _ => Ok((rows, classes)),
    }
}

/// Checks that `g` is a one-element upstream gradient of `like`'s dtype and device.
fn scalar_gradient(op: &'static str, g: &Tensor, like: &Tensor) -> Result<()> {
    check::same_device(op, &[like, g])?;
    check::same_dtype(op, &[like, g])?;
    if g.elem_count() != 1 {
        return Err(Error::ShapeMismatch { op, lhs: vec![1], rhs: g.dims().to_vec() });
    }
    Ok(())
}

/// The labels as host values (on the CPU).
fn host_labels<'a>(op: &'static str, labels: &'a Labels) -> Result<&'a [u32]> {
    labels.cpu_values().ok_or(Error::DeviceMismatch { op, lhs: Device::Cpu, rhs: labels.device() })
}

/// The mean cross-entropy of `logits` (`[rows, classes]`) against class `labels` (one per row):
/// `mean over r of (ln(sum_c exp(logits[r, c])) - logits[r, labels[r]])`, the negative log of
/// the softmax probability of each row's label. Shape `[]`, the logits' dtype.
///
/// Errors: labels on another device ([`Error::DeviceMismatch`]), a label count other than the
/// row count ([`Error::ShapeMismatch`]), a label of `classes` or more or zero rows
/// ([`Error::InvalidArgument`], checked on the host without reading device memory).
///
/// On CUDA the log-softmax is fused in: one kernel reads each row once (one thread per row of
/// up to [`THREAD_ROW_MAX_COLS`](opsmith_kernels::names::loss::THREAD_ROW_MAX_COLS) classes,
/// one warp per longer row), then one block averages the per-row losses. Up to 4096 rows of
/// at most that many classes, one block does both in one launch, with the same bits.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Labels, Tensor};
/// let logits = Tensor::from_vec(vec![0.0f32, 0.0, 2.0, 2.0], [2, 2], Device::Cpu)?;
/// let labels = Labels::new(&[1, 0], Device::Cpu)?;
/// // Each row is uniform over 2 classes: the loss is ln 2.
/// let loss = ops::cross_entropy(&logits, &labels)?.to_vec::<f32>()?[0];
/// assert!((loss - std::f32::consts::LN_2).abs() < 1e-6);
/// # Ok(()) }
/// ```
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))] // rows are for the CUDA half
pub fn cross_entropy(logits: &Tensor, labels: &Labels) -> Result<Tensor> {
    let (rows, classes) = classification("cross_entropy", logits, labels)?;
    match logits.device() {
        Device::Cpu => {
            check::cpu_work("cross_entropy")?;
            let labels = host_labels("cross_entropy", labels)?;
            cross_entropy_cpu(logits, labels, classes)
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => {
            let table = dtype_table("cross_entropy", logits, ALL_LOSS)?;
            check_launch_len("cross_entropy", logits.elem_count(), logits.dtype())?;
            let device = cuda_device("cross_entropy", logits)?;
            let out = Tensor::empty(Shape::from(Vec::new()), logits.dtype(), logits.device())?;
            let scale = 1.0 / rows as f64;
            if classes as u64 <= THREAD_ROW_MAX_COLS && rows <= ONE_BLOCK_MEAN_ROWS {
                labels.with_device_ptr("cross_entropy", &device.current_stream(), |labels| {
                    let kernel = device.kernel(table.cross_entropy_mean)?;
                    let cfg = LaunchConfig { grid: 1, block: finish_block(rows), shared_mem_bytes: 0 };
                    let args = [
                        KernelArg::Input(logits),
                        KernelArg::U64(labels),
                        KernelArg::Output(&out),
                        KernelArg::U64(rows as u64),
                        KernelArg::U64(classes as u64),
                        KernelArg::F32(scale as f32),
                    ];
                    // SAFETY: cross_entropy_mean kernels take (logits, labels, out, rows, cols,
                    // scale); logits hold rows * classes elements, labels one value per row, out
                    // one element; one block of a multiple of 32 threads up to 1024, and
                    // classes <= THREAD_ROW_MAX_COLS, as the kernel requires.
                    unsafe { kernel.launch(&device.current_stream(), cfg, &args) }
                })?;
                return Ok(out);
            }
            let losses = Tensor::empty(Shape::from(rows), DType::F32, logits.device())?;
            labels.with_device_ptr("cross_entropy", &device.current_stream(), |labels| {
                let args = [
                    KernelArg::Input(logits),
                    KernelArg::U64(labels),
                    KernelArg::Output(&losses),
                    KernelArg::U64(rows as u64),
                    KernelArg::U64(classes as u64),
                ];
                // SAFETY: cross_entropy kernels take (logits, labels, losses, rows, cols); logits
                // hold rows * classes elements, labels and losses one value per row.
                unsafe { launch_cross_entropy(&device, table.cross_entropy, rows, classes, &args) }
            })?;
            finish_sum("cross_entropy", &losses, rows, scale, &out)?;
            Ok(out)
        }
        #[cfg(not(feature = "cuda"))]
        device @ Device::Cuda(_) => Err(Error::cuda_disabled("cross_entropy", device)),
    }
}

/// In f64 (every dtype widens to it exactly), rounded once.
fn cross_entropy_cpu(logits: &Tensor, labels: &[u32], classes: usize) -> Result<Tensor> {
    let xs = logits.to_vec_f64()?;
    let total: f64 = xs
        .chunks(classes)
        .zip(labels)
        .map(|(z, &label)| {
            let (max, sum) = row_max_sum(z);
            (max - z[label as usize]) + sum.ln()
        })
        .sum();
    Tensor::from_f64(&[total / labels.len() as f64], Shape::from(Vec::new()), logits.dtype(), Device::Cpu)
}

/// The backward of [`cross_entropy`] for the logits: `(softmax(logits) - onehot(labels)) * g / rows`,
/// where `g` is the one-element upstream gradient. Shape and dtype of `logits`.
///
/// On CUDA `g` is read on the device (no host round trip), in one kernel, one thread per row of
/// up to [`THREAD_ROW_MAX_COLS`](opsmith_kernels::names::loss::THREAD_ROW_MAX_COLS) classes,
/// one warp per longer row.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Labels, Tensor};
/// let logits = Tensor::from_vec(vec![0.0f32, 0.0], [1, 2], Device::Cpu)?;
/// let labels = Labels::new(&[1], Device::Cpu)?;
/// let g = Tensor::from_vec(vec![2.0f32], [], Device::Cpu)?;
/// let gx = ops::cross_entropy_backward(&g, &logits, &labels)?;
/// assert_eq!(gx.to_vec::<f32>()?, [1.0, -1.0]); // ([0.5, 0.5] - [0, 1]) * 2
/// # Ok(()) }
/// ```
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))] // rows are for the CUDA half
pub fn cross_entropy_backward(g: &Tensor, logits: &Tensor, labels: &Labels) -> Result<Tensor> {
    cross_entropy_backward_of(Upstream::Tensor(g), logits, labels)
}

/// [`cross_entropy_backward`] with an upstream gradient the host knows (a loss's seed of 1, a
/// scaled loss's factor): the same values, bit for bit, as `g` filled into a one-element
/// tensor of the logits' dtype, with no tensor filled on the device first (on CUDA one kernel
/// launch and no fill: in a captured graph, one node instead of two).
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Labels, Tensor};
/// let logits = Tensor::from_vec(vec![0.0f32, 0.0], [1, 2], Device::Cpu)?;
/// let labels = Labels::new(&[1], Device::Cpu)?;
/// let gx = ops::cross_entropy_backward_scalar(2.0, &logits, &labels)?;
/// assert_eq!(gx.to_vec::<f32>()?, [1.0, -1.0]); // ([0.5, 0.5] - [0, 1]) * 2
/// # Ok(()) }
/// ```
pub fn cross_entropy_backward_scalar(g: f64, logits: &Tensor, labels: &Labels) -> Result<Tensor> {
    cross_entropy_backward_of(Upstream::Known(g), logits, labels)
}

/// The upstream gradient of a loss's backward.
#[derive(Clone, Copy)]
enum Upstream<'a> {
    /// A one-element tensor (checked), read where the work runs.
    Tensor(&'a Tensor),
    /// A value the host knows.
    Known(f64),
}

impl Upstream<'_> {
    /// The value as the loss's dtype holds it (a known value rounded as a fill rounds it), read
    /// to the host: for the CPU path.
    fn host_value(self, dtype: DType) -> Result<f64> {
        match self {
            Upstream::Tensor(g) => Ok(g.to_vec_f64()?[0]),
            Upstream::Known(g) => {
                Tensor::from_f64(&[g], Shape::from(Vec::new()), dtype, Device::Cpu)?.to_vec_f64().map(|v| v[0])
            }
        }
    }
}

#[cfg_attr(not(feature = "cuda"), allow(unused_variables))] // rows are for the CUDA half
fn cross_entropy_backward_of(g: Upstream<'_>, logits: &Tensor, labels: &Labels) -> Result<Tensor> {
    let (rows, classes) = classification("cross_entropy_backward", logits, labels)?;
    if let Upstream::Tensor(g) = g {
        scalar_gradient("cross_entropy_backward", g, logits)?;
    }
    match logits.device() {
        Device::Cpu => {
            check::cpu_work("cross_entropy_backward")?;
            let labels = host_labels("cross_entropy_backward", labels)?;
            cross_entropy_backward_cpu(g.host_value(logits.dtype())?, logits, labels, classes)
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => {
            let table = dtype_table("cross_entropy_backward", logits, ALL_LOSS)?;
            check_launch_len("cross_entropy_backward", logits.elem_count(), logits.dtype())?;
            let device = cuda_device("cross_entropy_backward", logits)?;
            let out = Tensor::empty(logits.shape().clone(), logits.dtype(), logits.device())?;
            let scale = (1.0 / rows as f64) as f32;
            // A known gradient is folded into the scale on the host, in the f32 multiply the
            // kernel does with a read one (the same bits), and `g` is passed as null.
            let (g, scale) = match g {
                Upstream::Tensor(g) => (KernelArg::Input(g), scale),
                Upstream::Known(_) => (KernelArg::U64(0), g.host_value(logits.dtype())? as f32 * scale),
            };
            labels.with_device_ptr("cross_entropy_backward", &device.current_stream(), |labels| {
                let args = [
                    g,
                    KernelArg::Input(logits),
                    KernelArg::U64(labels),
                    KernelArg::Output(&out),
                    KernelArg::U64(rows as u64),
                    KernelArg::U64(classes as u64),
                    KernelArg::F32(scale),
                ];
                // SAFETY: cross_entropy_backward kernels take (g, logits, labels, gx, rows, cols,
                // scale); g is null or holds one element, logits and gx rows * classes, labels
                // one per row.
                unsafe { launch_cross_entropy(&device, table.cross_entropy_backward, rows, classes, &args) }
            })?;
            Ok(out)
        }
        #[cfg(not(feature = "cuda"))]
        device @ Device::Cuda(_) => Err(Error::cuda_disabled("cross_entropy_backward", device)),
    }
}

/// In f64, each output rounded once.
fn cross_entropy_backward_cpu(g: f64, logits: &Tensor, labels: &[u32], classes: usize) -> Result<Tensor> {
    let coef = g / labels.len() as f64;
    let xs = logits.to_vec_f64()?;
    let mut out = Vec::with_capacity(xs.len());
    for (z, &label) in xs.chunks(classes).zip(labels) {
        let (max, sum) = row_max_sum(z);
        let inv = reciprocal_or_zero(sum);
        out.extend(z.iter().enumerate().map(|(c, &v)| {
            let target = if c == label as usize { 1.0 } else { 0.0 };
            ((v - max).exp() * inv - target) * coef
        }));
    }
    Tensor::from_f64(&out, logits.shape().clone(), logits.dtype(), Device::Cpu)
}

/// `mean((pred - target)^2)` over all elements, shape `[]`, the inputs' dtype. The inputs have
/// one shape, dtype and device; an empty pair has no mean ([`Error::InvalidArgument`]).
///
/// On CUDA the differences are squared and summed in f32 in one pass (one f32 partial per warp),
/// then one block adds the partials.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let pred = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3], Device::Cpu)?;
/// let target = Tensor::from_vec(vec![1.0f32, 0.0, 4.0], [3], Device::Cpu)?;
/// assert_eq!(ops::mse_loss(&pred, &target)?.to_vec::<f32>()?, [5.0 / 3.0]);
/// # Ok(()) }
/// ```
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))] // rows are for the CUDA half
pub fn mse_loss(pred: &Tensor, target: &Tensor) -> Result<Tensor> {
    let n = squared_error_operands("mse_loss", pred, target)?;
    match pred.device() {
        Device::Cpu => {
            check::cpu_work("mse_loss")?;
            with_float_type!(pred.dtype(), "mse_loss", pred.device(), T => mse_loss_cpu::<T>(pred, target))
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => {
            let table = dtype_table("mse_loss", pred, ALL_LOSS)?;
            check_launch_len("mse_loss", n, pred.dtype())?;
            reduce_partials("mse_loss", table.mse_partials, &[pred, target], 1.0 / n as f64)
        }
        #[cfg(not(feature = "cuda"))]
        device @ Device::Cuda(_) => Err(Error::cuda_disabled("mse_loss", device)),
    }
}

/// Each difference rounded as the kernels round it (in the arithmetic type), the squares summed
/// in f64, and the mean rounded once.
fn mse_loss_cpu<T: Element>(pred: &Tensor, target: &Tensor) -> Result<Tensor> {
    let (p, t) = (pred.to_vec::<T>()?, target.to_vec::<T>()?);
    let total: f64 = p.iter().zip(&t).map(|(p, t)| Accumulator::to_f64(p.to_acc() - t.to_acc()).powi(2)).sum();
    Tensor::from_f64(&[total / p.len() as f64], Shape::from(Vec::new()), pred.dtype(), Device::Cpu)
}

/// Checks the operands of the squared error and returns their element count.
fn squared_error_operands(op: &'static str, pred: &Tensor, target: &Tensor) -> Result<usize> {
    check::same_layout(op, &[pred, target])?;
    check::float(op, pred)?;
    match pred.elem_count() {
        0 => Err(Error::InvalidArgument { op, reason: "the mean of an empty tensor is undefined".into() }),
        n => Ok(n),
    }
}

/// The backward of [`mse_loss`] for `pred`: `2 * (pred - target) * g / n`, where `g` is the
/// one-element upstream gradient and `n` the element count. The gradient for `target` is its
/// negative. Shape and dtype of `pred`.
///
/// On CUDA this is one kernel that reads `g` on the device.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let pred = Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?;
/// let target = Tensor::from_vec(vec![0.0f32, 4.0], [2], Device::Cpu)?;
/// let g = Tensor::from_vec(vec![1.0f32], [], Device::Cpu)?;
/// assert_eq!(ops::mse_loss_backward(&g, &pred, &target)?.to_vec::<f32>()?, [1.0, -2.0]);
/// # Ok(()) }
/// ```
pub fn mse_loss_backward(g: &Tensor, pred: &Tensor, target: &Tensor) -> Result<Tensor> {
    let n = squared_error_operands("mse_loss_backward", pred, target)?;
    scalar_gradient("mse_loss_backward", g, pred)?;
    let scale = 2.0 / n as f64;
    match pred.device() {
        Device::Cpu => {
            check::cpu_work("mse_loss_backward")?;
            mse_loss_backward_cpu(g, pred, target, scale)
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => {
            let table = dtype_table("mse_loss_backward", pred, ALL_LOSS)?;
            let n = check_launch_len("mse_loss_backward", n, pred.dtype())?;
            let out = Tensor::empty(pred.shape().clone(), pred.dtype(), pred.device())?;
            // The kernel takes one 16-byte pack per thread-iteration.
            let packs = n.div_ceil((16 / pred.dtype().size_in_bytes()) as u64);
            launch(
                &cuda_device("mse_loss_backward", pred)?,
                table.mse_backward,
                packs,
                &[
                    KernelArg::Input(g),
                    KernelArg::Input(pred),
                    KernelArg::Input(target),
                    KernelArg::Output(&out),
                    KernelArg::F32(scale as f32),
                    KernelArg::U64(n),
                ],
            )?;
            Ok(out)
        }
        #[cfg(not(feature = "cuda"))]
        device @ Device::Cuda(_) => Err(Error::cuda_disabled("mse_loss_backward", device)),
    }
}

/// In f64, each output rounded once.
fn mse_loss_backward_cpu(g: &Tensor, pred: &Tensor, target: &Tensor, scale: f64) -> Result<Tensor> {
    let coef = g.to_vec_f64()?[0] * scale;
    let (p, t) = (pred.to_vec_f64()?, target.to_vec_f64()?);
    let out: Vec<f64> = p.iter().zip(&t).map(|(p, t)| (p - t) * coef).collect();
    Tensor::from_f64(&out, pred.shape().clone(), pred.dtype(), Device::Cpu)
}
