//! Softmax along the last axis, `softmax(scale * x + mask)`, and its backward. CPU and CUDA
//! halves side by side.
//!
//! On CUDA each is one kernel, and rows of up to 16384 values stay in registers (one read of `x`
//! and the mask, one write): rows of up to 1024 values one warp per row, longer ones one thread
//! block per row (16 values a thread, the block sized to the row, the maximum and sums reduced
//! through shared memory). Longer rows are read twice. The exponentials are
//! `ex2.approx` with the row maximum subtracted, so the result is within a few units in the last
//! place of f32 plus the rounding of `scale * x + mask` itself. The CPU half rounds
//! `scale * x + mask` the same way and does the rest in f64.
use super::check;
#[cfg(feature = "cuda")]
use super::cuda::{check_launch_len, dtype_table};
#[cfg(feature = "cuda")]
use super::reduce::cuda_device;
#[cfg(feature = "cuda")]
use crate::cuda::{CudaDevice, KernelArg, LaunchConfig};
use crate::dtype::{Accumulator, with_float_type};
use crate::{Device, Element, Error, Result, Tensor};
#[cfg(feature = "cuda")]
use opsmith_kernels::names::{ALL_SOFTMAX, RowLaunch};

#[cfg(feature = "cuda")]
/// Threads per block of the one-warp-per-row kernels: small, so that kernels holding a row in
/// many registers a thread still fit several blocks on a multiprocessor.
const ROW_BLOCK: u32 = 128;

#[cfg(feature = "cuda")]
/// Launches a one-warp-per-row kernel over `rows` rows, one wave of resident blocks that loop
/// over the rows.
///
/// # Safety
/// `args` are the parameters `name` declares in `kernels-gpu/src/`, with tensors holding the
/// element counts it indexes.
pub(super) unsafe fn launch_rows(device: &CudaDevice, name: &str, rows: usize, args: &[KernelArg<'_>]) -> Result<()> {
    let kernel = device.kernel(name)?;
    let cfg = LaunchConfig::grid_stride(&kernel, rows as u64 * 32, ROW_BLOCK)?;
    // SAFETY: forwarded from the caller.
    unsafe { kernel.launch(&device.current_stream(), cfg, args) }
}

#[cfg(feature = "cuda")]
/// Launches a softmax kernel over `rows` rows as the table's [`RowLaunch`] says: one warp per
/// row as [`launch_rows`] does, or one block of the given size per row, one wave of resident
/// blocks that loop over the rows.
///
/// # Safety
/// As for [`launch_rows`].
unsafe fn launch_softmax(device: &CudaDevice, launch: RowLaunch, rows: usize, args: &[KernelArg<'_>]) -> Result<()> {
    match launch {
        // SAFETY: forwarded from the caller.
        RowLaunch::Warp(name) => unsafe { launch_rows(device, name, rows, args) },
        RowLaunch::Block { name, block } => {
            let kernel = device.kernel(name)?;
            let cfg = LaunchConfig::grid_stride(&kernel, rows as u64 * block as u64, block)?;
            // SAFETY: forwarded from the caller; the block size is the one the table chose for
            // this row length, so the row fits the block.
            unsafe { kernel.launch(&device.current_stream(), cfg, args) }
        }
    }
}

/// A row's maximum to subtract and its sum of `exp(z - max)`, in f64, with the kernels'
/// conventions: NaN is ignored by the maximum, and a row of `-inf` subtracts 0 (its
/// exponentials are all 0).
pub(super) fn row_max_sum(z: &[f64]) -> (f64, f64) {
    let max = z.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
    let shift = if max == f64::NEG_INFINITY { 0.0 } else { max };
    (shift, z.iter().map(|&v| (v - shift).exp()).sum())
}

/// Row `r` of `scale * x + mask` (`row` holds its `cols` values of `x`), each rounded as the
/// kernels round it: one FMA in the arithmetic type, then widened to f64. The mask's rows repeat
/// over `x`'s leading dims.
pub(super) fn row_logits<T: Element>(row: &[T], r: usize, cols: usize, mask: Option<&[T]>, scale: T::Acc) -> Vec<f64> {
    match mask {
        Some(ms) => {
            let start = (r * cols) % ms.len();
            let mrow = &ms[start..start + cols];
            row.iter().zip(mrow).map(|(x, m)| Accumulator::fma(x.to_acc(), scale, m.to_acc()).to_f64()).collect()
        }
        None => row.iter().map(|x| (x.to_acc() * scale).to_f64()).collect(),
    }
}

/// `1 / sum`, or 0 for a zero sum (a fully masked row, whose outputs are then 0); a NaN sum
/// stays NaN.
pub(super) fn reciprocal_or_zero(sum: f64) -> f64 {
    if sum == 0.0 { 0.0 } else { 1.0 / sum }
}

/// (rows, cols) of `x` seen as a matrix over its last axis.
pub(super) fn rows_cols(op: &'static str, x: &Tensor) -> Result<(usize, usize)> {
    check::float(op, x)?;
    match x.dims().split_last() {
        Some((&cols, lead)) => Ok((lead.iter().product(), cols)),
        None => Err(Error::InvalidArgument { op, reason: "needs a tensor of rank 1 or more, got a scalar".into() }),
    }
}

/// `scale` is finite, as [`attention`](super::attention) requires: a NaN or infinite scale would
/// make every output NaN.
fn finite_scale(op: &'static str, scale: f64) -> Result<()> {
    if !scale.is_finite() {
        return Err(Error::InvalidArgument { op, reason: format!("scale must be finite, got {scale}") });
    }
    Ok(())
}

/// The number of rows of a mask of `x`'s trailing dims, or a shape error.
fn mask_rows(x: &Tensor, mask: &Tensor, cols: usize) -> Result<usize> {
    check::same_device("softmax", &[x, mask])?;
    check::same_dtype("softmax", &[x, mask])?;
    let (xd, md) = (x.dims(), mask.dims());
    if md.is_empty() || md.len() > xd.len() || xd[xd.len() - md.len()..] != *md {
        return Err(Error::ShapeMismatch { op: "softmax", lhs: xd.to_vec(), rhs: md.to_vec() });
    }
    Ok(mask.elem_count().checked_div(cols).unwrap_or(0))
}

/// `softmax(scale * x + mask)` along the last axis: for each row `z = scale * x + mask`,
/// `y = exp(z - max(z)) / sum(exp(z - max(z)))`.
///
/// `x` has any rank of 1 or more; its rows are all leading dims together. `mask`, when given, has
/// `x`'s dtype and device and dims equal to `x`'s trailing dims (`[cols]`, `[seq, seq]` for an
/// `x` of `[batch, heads, seq, seq]`, or `x`'s whole shape); it is added to every row it lines up
/// with. `-inf` in the mask removes a value; a row whose every term is `-inf` gives zeros, not NaN.
/// A NaN or `+inf` in a row makes that row NaN. The result has `x`'s shape and dtype. `scale`
/// must be finite ([`Error::InvalidArgument`] otherwise).
///
/// On CUDA this is one kernel (12 bytes of traffic an f32 element with a full mask); f64 runs on
/// the CPU only.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 1.0, 5.0, 1.0], [2, 2], Device::Cpu)?;
/// let mask = Tensor::from_vec(vec![0.0f32, f32::NEG_INFINITY], [2], Device::Cpu)?;
/// // Row 0: [1, 1] masked to [1, -inf]; row 1: [5, 1] masked to [5, -inf].
/// assert_eq!(ops::softmax(&x, 1.0, Some(&mask))?.to_vec::<f32>()?, [1.0, 0.0, 1.0, 0.0]);
/// let y = ops::softmax(&x, 0.5, None)?.to_vec::<f32>()?;
/// assert_eq!(y[..2], [0.5, 0.5]);
/// # Ok(()) }
/// ```
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))] // rows are for the CUDA half
pub fn softmax(x: &Tensor, scale: f64, mask: Option<&Tensor>) -> Result<Tensor> {
    let (rows, cols) = rows_cols("softmax", x)?;
    let mask_rows = mask.map(|m| mask_rows(x, m, cols)).transpose()?.unwrap_or(0);
    finite_scale("softmax", scale)?;
    match x.device() {
        Device::Cpu => {
            check::cpu_work("softmax")?;
            with_float_type!(x.dtype(), "softmax", x.device(), T => softmax_cpu::<T>(x, scale, mask, cols))
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => {
            let table = dtype_table("softmax", x, ALL_SOFTMAX)?;
            check_launch_len("softmax", x.elem_count(), x.dtype())?;
            let out = Tensor::empty(x.shape().clone(), x.dtype(), x.device())?;
            if rows * cols == 0 {
                return Ok(out);
            }
            let mask_arg = mask.map_or(KernelArg::U64(0), KernelArg::Input);
            let args = [
                KernelArg::Input(x),
                mask_arg,
                KernelArg::Output(&out),
                KernelArg::U64(rows as u64),
                KernelArg::U64(cols as u64),
                KernelArg::U64(mask_rows as u64),
                KernelArg::F32(scale as f32),
            ];
            // SAFETY: softmax kernels take (x, mask, out, rows, cols, mask_rows, scale); x and out
            // hold rows * cols elements, the mask mask_rows * cols (or is null with mask_rows 0),
            // and `forward_for` picks a kernel (and block size) whose row capacity covers `cols`.
            unsafe { launch_softmax(&cuda_device("softmax", x)?, table.forward_for(cols as u64), rows, &args)? };
            Ok(out)
        }
        #[cfg(not(feature = "cuda"))]
        device @ Device::Cuda(_) => Err(Error::cuda_disabled("softmax", device)),
    }
}

/// `scale * x + mask` is rounded as the kernels round it (one FMA in the arithmetic type), the
/// rest is f64, and each output is rounded once.
fn softmax_cpu<T: Element>(x: &Tensor, scale: f64, mask: Option<&Tensor>, cols: usize) -> Result<Tensor> {
    let xs = x.to_vec::<T>()?;
    let ms = mask.map(|m| m.to_vec::<T>()).transpose()?;
    let scale = T::Acc::from_f64(scale);
    let mut out = Vec::with_capacity(xs.len());
    for (r, row) in xs.chunks(cols.max(1)).enumerate() {
        let z = row_logits(row, r, cols, ms.as_deref(), scale);
        let (shift, sum) = row_max_sum(&z);
        let inv = reciprocal_or_zero(sum);
        out.extend(z.iter().map(|&v| T::from_f64((v - shift).exp() * inv)));
    }
    Tensor::from_vec(out, x.shape().clone(), Device::Cpu)
}

/// The backward of [`softmax`] for the upstream gradient `g` and the forward's output `y`:
/// `gx = scale * y * (g - sum_row(g * y))` along the last axis, the gradient with respect to
/// `x`. With `scale = 1` it is the gradient with respect to the mask, or to the logits of a
/// plain softmax.
///
/// `g` and `y` have the same shape, dtype and device; `scale` is finite. On CUDA this is one
/// kernel.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let y = Tensor::from_vec(vec![0.25f32, 0.75], [1, 2], Device::Cpu)?;
/// let g = Tensor::from_vec(vec![1.0f32, 0.0], [1, 2], Device::Cpu)?;
/// // sum(g * y) = 0.25; gx = y * (g - 0.25) = [0.1875, -0.1875].
/// assert_eq!(ops::softmax_backward(&g, &y, 1.0)?.to_vec::<f32>()?, [0.1875, -0.1875]);
/// # Ok(()) }
/// ```
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))] // rows are for the CUDA half
pub fn softmax_backward(g: &Tensor, y: &Tensor, scale: f64) -> Result<Tensor> {
    check::same_layout("softmax_backward", &[g, y])?;
    let (rows, cols) = rows_cols("softmax_backward", y)?;
    finite_scale("softmax_backward", scale)?;
    match y.device() {
        Device::Cpu => {
            check::cpu_work("softmax_backward")?;
            softmax_backward_cpu(g, y, scale, cols)
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => {
            let table = dtype_table("softmax_backward", y, ALL_SOFTMAX)?;
            check_launch_len("softmax_backward", y.elem_count(), y.dtype())?;
            let out = Tensor::empty(y.shape().clone(), y.dtype(), y.device())?;
            if rows * cols == 0 {
                return Ok(out);
            }
            let args = [
                KernelArg::Input(g),
                KernelArg::Input(y),
                KernelArg::Output(&out),
                KernelArg::U64(rows as u64),
                KernelArg::U64(cols as u64),
                KernelArg::F32(scale as f32),
            ];
            // SAFETY: softmax backward kernels take (g, y, gx, rows, cols, scale); all three hold
            // rows * cols elements, and `backward_for` picks a kernel (and block size) whose
            // capacity covers `cols`.
            unsafe {
                launch_softmax(&cuda_device("softmax_backward", y)?, table.backward_for(cols as u64), rows, &args)?
            };
            Ok(out)
        }
        #[cfg(not(feature = "cuda"))]
        device @ Device::Cuda(_) => Err(Error::cuda_disabled("softmax_backward", device)),
    }
}

/// In f64, each output rounded once.
fn softmax_backward_cpu(g: &Tensor, y: &Tensor, scale: f64, cols: usize) -> Result<Tensor> {
    let (gs, ys) = (g.to_vec_f64()?, y.to_vec_f64()?);
    let mut out = Vec::with_capacity(ys.len());
    for (grow, yrow) in gs.chunks(cols.max(1)).zip(ys.chunks(cols.max(1))) {
        let dot: f64 = grow.iter().zip(yrow).map(|(g, y)| g * y).sum();
        out.extend(grow.iter().zip(yrow).map(|(g, y)| y * (g - dot) * scale));
    }
    Tensor::from_f64(&out, y.shape().clone(), y.dtype(), Device::Cpu)
}
