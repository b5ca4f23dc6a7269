//! Reductions and broadcasts: `sum`, `mean`, `expand_scalar` (a scalar broadcast to a shape),
//! and the bias row (`add_row`, with its backward `sum_rows`). CPU and CUDA halves side by side.
use super::check;
#[cfg(feature = "cuda")]
use crate::DType;
#[cfg(feature = "cuda")]
use crate::cuda::{CudaDevice, DEFAULT_BLOCK, KernelArg, LaunchConfig};
use crate::dtype::with_float_type;
use crate::{Device, Element, Error, Result, Shape, Tensor};
#[cfg(feature = "cuda")]
use opsmith_kernels::{ReductionKernels, names::reduction};

#[cfg(feature = "cuda")]
pub(super) fn table(op: &'static str, t: &Tensor) -> Result<ReductionKernels> {
    super::cuda::dtype_table(op, t, [reduction::F32, reduction::F16, reduction::BF16])
}

#[cfg(feature = "cuda")]
/// The CUDA device `t` lives on, for the CUDA half of `op`; a CPU tensor is an
/// [`Error::InvalidArgument`] naming `op`.
pub(super) fn cuda_device(op: &'static str, t: &Tensor) -> Result<CudaDevice> {
    match t.device() {
        Device::Cuda(n) => CudaDevice::get(n),
        Device::Cpu => Err(Error::InvalidArgument { op, reason: "the CUDA half got a tensor on the CPU".into() }),
    }
}

#[cfg(feature = "cuda")]
/// Launches one of opsmith's own kernels through the checked path, grid-stride over
/// `work_items`.
pub(super) fn launch(device: &CudaDevice, name: &str, work_items: u64, args: &[KernelArg<'_>]) -> Result<()> {
    let kernel = device.kernel(name)?;
    let cfg = LaunchConfig::grid_stride(&kernel, work_items, DEFAULT_BLOCK)?;
    // SAFETY: each caller passes the arguments its kernel declares in `kernels-gpu/src/`, with
    // tensors checked to hold the element counts the kernel indexes.
    unsafe { kernel.launch(&device.current_stream(), cfg, args) }
}

#[cfg(feature = "cuda")]
/// Threads per block of `sum_rows`: 32 warps, each adding every 32nd row of a tile's columns.
const SUM_ROWS_BLOCK: u32 = 1024;

#[cfg(feature = "cuda")]
/// Whether `sum_rows` over `[rows, cols]` takes a block per column: when the tiles of 32
/// columns would leave most of the SMs idle and the matrix is small (a block per column reads
/// each warp's 32 rows from 32 lines, which a large matrix would pay for in L2 traffic). A
/// function of the shape and the device only, so a given sum adds in one order every run.
fn by_column(device: &CudaDevice, rows: usize, cols: usize) -> bool {
    let tiles = cols.div_ceil(32);
    tiles < device.sm_count() as usize / 2 && rows.saturating_mul(cols) <= 1 << 20
}

#[cfg(feature = "cuda")]
/// `out[0] = scale * (partials[0] + … + partials[count - 1])` on CUDA, rounded to `out`'s dtype:
/// the last launch of every whole-tensor reduction, one block of up to 1024 threads.
pub(super) fn finish_sum(op: &'static str, partials: &Tensor, count: usize, scale: f64, out: &Tensor) -> Result<()> {
    let device = cuda_device(op, out)?;
    let kernel = device.kernel(table(op, out)?.sum_finish)?;
    let cfg = LaunchConfig { grid: 1, block: finish_block(count), shared_mem_bytes: 0 };
    let args = [
        KernelArg::Input(partials),
        KernelArg::Output(out),
        KernelArg::U64(count as u64),
        KernelArg::F32(scale as f32),
    ];
    // SAFETY: `sum_finish` takes (partials, out, count, scale); `partials` holds `count` f32
    // values and `out` one element (the callers' shapes), and the launch is one block whose size
    // is a multiple of 32 up to 1024, as the kernel requires.
    unsafe { kernel.launch(&device.current_stream(), cfg, &args) }
}

#[cfg(feature = "cuda")]
/// The block of `sum_finish` over `count` partials: one thread per partial, in whole warps,
/// up to 1024 threads. A function of `count` only, so a given sum adds in the same order on
/// every run.
pub(super) fn finish_block(count: usize) -> u32 {
    count.clamp(1, 1024).next_multiple_of(32) as u32
}

#[cfg(feature = "cuda")]
/// A whole-tensor reduction on CUDA, as a tensor of shape `[]` of the inputs' dtype: the kernel
/// `first_pass(inputs…, partials, n)` leaves one f32 partial per warp over the `n` elements of
/// each input, and `scale` times their sum is the result.
pub(super) fn reduce_partials(op: &'static str, first_pass: &str, inputs: &[&Tensor], scale: f64) -> Result<Tensor> {
    let x = inputs[0];
    let n = x.elem_count();
    let device = cuda_device(op, x)?;
    let out = Tensor::empty(Shape::from(Vec::new()), x.dtype(), x.device())?;
    let partials_kernel = device.kernel(first_pass)?;
    let cfg = LaunchConfig::grid_stride(&partials_kernel, n as u64, DEFAULT_BLOCK)?;
    let warps = (cfg.grid * cfg.block / 32) as usize;
    let partials = Tensor::empty(Shape::from(warps), DType::F32, x.device())?;
    let mut args: Vec<KernelArg<'_>> = inputs.iter().map(|t| KernelArg::Input(t)).collect();
    args.extend([KernelArg::Output(&partials), KernelArg::U64(n as u64)]);
    // SAFETY: every first-pass kernel takes (inputs…, partials, n); each input holds n elements
    // (the caller checked the shapes) and partials one f32 per warp of this exact configuration.
    unsafe { partials_kernel.launch(&device.current_stream(), cfg, &args)? };
    finish_sum(op, &partials, warps, scale, &out)?;
    Ok(out)
}

fn reduce_all(op: &'static str, x: &Tensor, scale: f64) -> Result<Tensor> {
    check::float(op, x)?;
    match x.device() {
        Device::Cpu => {
            check::cpu_work(op)?;
            // Accumulated in f64, then rounded once.
            let total: f64 = x.to_vec_f64()?.iter().sum();
            Tensor::from_f64(&[total * scale], Shape::from(Vec::new()), x.dtype(), Device::Cpu)
        }
        // A small f32 tensor is already what the second pass adds up: one launch, not two.
        #[cfg(feature = "cuda")]
        Device::Cuda(_) if x.dtype() == DType::F32 && x.elem_count() <= ONE_BLOCK_SUM_MAX => {
            let out = Tensor::empty(Shape::from(Vec::new()), x.dtype(), x.device())?;
            finish_sum(op, x, x.elem_count(), scale, &out)?;
            Ok(out)
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => reduce_partials(op, table(op, x)?.sum_partials, &[x], scale),
        #[cfg(not(feature = "cuda"))]
        device @ Device::Cuda(_) => Err(Error::cuda_disabled(op, device)),
    }
}

#[cfg(feature = "cuda")]
/// Up to this many f32 elements a whole-tensor sum on CUDA is one block's work (16 values a
/// thread): one launch instead of two, which is most of its cost at that size.
const ONE_BLOCK_SUM_MAX: usize = 16384;

/// The sum of all elements, as a tensor of shape `[]` (one element) of the same dtype.
///
/// On CUDA the sum is accumulated in f32 in a fixed order (the same bits every run), each
/// thread's share compensated (Kahan–Neumaier) and the threads' totals added as trees, so the
/// error does not grow with the length; on the CPU in f64.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.5], [3], Device::Cpu)?;
/// let s = ops::sum(&x)?;
/// assert_eq!(s.dims(), [0usize; 0]);
/// assert_eq!(s.to_vec::<f32>()?, [6.5]);
/// # Ok(()) }
/// ```
pub fn sum(x: &Tensor) -> Result<Tensor> {
    reduce_all("sum", x, 1.0)
}

/// The mean of all elements, as a tensor of shape `[]`. An empty tensor has no mean:
/// [`Error::InvalidArgument`].
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 6.0], [2, 2], Device::Cpu)?;
/// assert_eq!(ops::mean(&x)?.to_vec::<f32>()?, [3.0]);
/// # Ok(()) }
/// ```
pub fn mean(x: &Tensor) -> Result<Tensor> {
    let n = x.elem_count();
    if n == 0 {
        return Err(Error::InvalidArgument { op: "mean", reason: "the mean of an empty tensor is undefined".into() });
    }
    reduce_all("mean", x, 1.0 / n as f64)
}

/// A tensor of `shape` whose every element is `g * scale`, where `g` holds one element: the
/// backward of `sum` (scale 1) and `mean` (scale 1/n). On CUDA the value is read on the device.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let g = Tensor::from_vec(vec![3.0f32], [1], Device::Cpu)?;
/// assert_eq!(ops::expand_scalar(&g, [2, 2], 0.5)?.to_vec::<f32>()?, [1.5; 4]);
/// # Ok(()) }
/// ```
pub fn expand_scalar(g: &Tensor, shape: impl Into<Shape>, scale: f64) -> Result<Tensor> {
    let shape = shape.into();
    check::float("expand_scalar", g)?;
    if g.elem_count() != 1 {
        return Err(Error::ShapeMismatch { op: "expand_scalar", lhs: vec![1], rhs: g.dims().to_vec() });
    }
    match g.device() {
        Device::Cpu => {
            check::cpu_work("expand_scalar")?;
            let value = g.to_vec_f64()?[0];
            Tensor::full(value * scale, shape, g.dtype(), Device::Cpu)
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => {
            let kernels = table("expand_scalar", g)?;
            let device = cuda_device("expand_scalar", g)?;
            let out = Tensor::empty(shape, g.dtype(), g.device())?;
            let n = out.elem_count() as u64;
            if n > 0 {
                launch(
                    &device,
                    kernels.broadcast_scalar,
                    n,
                    &[KernelArg::Input(g), KernelArg::Output(&out), KernelArg::F32(scale as f32), KernelArg::U64(n)],
                )?;
            }
            Ok(out)
        }
        #[cfg(not(feature = "cuda"))]
        device @ Device::Cuda(_) => Err(Error::cuda_disabled("expand_scalar", device)),
    }
}

/// (rows, cols) of a matrix operand, or a shape error naming `op`.
fn matrix_dims(op: &'static str, x: &Tensor) -> Result<(usize, usize)> {
    check::float(op, x)?;
    match *x.dims() {
        [rows, cols] => Ok((rows, cols)),
        _ => Err(Error::InvalidArgument { op, reason: format!("expects a 2-D matrix, got shape {:?}", x.dims()) }),
    }
}

/// `x + b` for a matrix `x` of shape `[rows, cols]` and a bias row `b` of shape `[cols]`: `b` is
/// added to every row.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2], Device::Cpu)?;
/// let b = Tensor::from_vec(vec![10.0f32, 20.0], [2], Device::Cpu)?;
/// assert_eq!(ops::add_row(&x, &b)?.to_vec::<f32>()?, [11.0, 22.0, 13.0, 24.0]);
/// # Ok(()) }
/// ```
pub fn add_row(x: &Tensor, b: &Tensor) -> Result<Tensor> {
    check::same_device("add_row", &[x, b])?;
    check::same_dtype("add_row", &[x, b])?;
    let (rows, cols) = matrix_dims("add_row", x)?;
    if b.dims() != [cols] {
        return Err(Error::ShapeMismatch { op: "add_row", lhs: vec![cols], rhs: b.dims().to_vec() });
    }
    match x.device() {
        Device::Cpu => {
            check::cpu_work("add_row")?;
            let (xv, bv) = (x.to_vec_f64()?, b.to_vec_f64()?);
            with_float_type!(x.dtype(), "add_row", x.device(), T => {
                // Round through the arithmetic type, as the kernels do.
                let out: Vec<T> = xv
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| T::from_acc(T::from_f64(v).to_acc() + T::from_f64(bv[i % cols]).to_acc()))
                    .collect();
                Tensor::from_vec(out, [rows, cols], Device::Cpu)
            })
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => {
            let kernels = table("add_row", x)?;
            let device = cuda_device("add_row", x)?;
            let out = Tensor::empty(x.shape().clone(), x.dtype(), x.device())?;
            let n = (rows * cols) as u64;
            if n > 0 {
                launch(
                    &device,
                    kernels.add_row,
                    n,
                    &[
                        KernelArg::Input(x),
                        KernelArg::Input(b),
                        KernelArg::Output(&out),
                        KernelArg::U64(rows as u64),
                        KernelArg::U64(cols as u64),
                    ],
                )?;
            }
            Ok(out)
        }
        #[cfg(not(feature = "cuda"))]
        device @ Device::Cuda(_) => Err(Error::cuda_disabled("add_row", device)),
    }
}

/// The sum over rows of a `[rows, cols]` matrix, shape `[cols]`: the backward of [`add_row`]
/// for the bias.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let g = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [3, 2], Device::Cpu)?;
/// assert_eq!(ops::sum_rows(&g)?.to_vec::<f32>()?, [9.0, 12.0]);
/// # Ok(()) }
/// ```
pub fn sum_rows(g: &Tensor) -> Result<Tensor> {
    let (rows, cols) = matrix_dims("sum_rows", g)?;
    match g.device() {
        Device::Cpu => {
            check::cpu_work("sum_rows")?;
            let gv = g.to_vec_f64()?;
            let mut sums = crate::tensor::host_vec("sum_rows", cols, 0.0f64)?;
            for (c, sum) in sums.iter_mut().enumerate() {
                *sum = (0..rows).map(|r| gv[r * cols + c]).sum();
            }
            Tensor::from_f64(&sums, [cols], g.dtype(), Device::Cpu)
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => {
            let kernels = table("sum_rows", g)?;
            let device = cuda_device("sum_rows", g)?;
            let out = Tensor::empty(Shape::from(cols), g.dtype(), g.device())?;
            if cols > 0 {
                let (kernel, cfg) = if by_column(&device, rows, cols) {
                    // A block per column: the few columns' rows spread over many SMs.
                    let kernel = device.kernel(kernels.sum_rows_by_column)?;
                    let cfg = LaunchConfig::grid_stride(&kernel, cols as u64 * DEFAULT_BLOCK as u64, DEFAULT_BLOCK)?;
                    (kernel, cfg)
                } else {
                    // A block of 32 warps per tile of 32 columns (as many tiles as the grid can
                    // hold at once): the warps split the rows, and every load is coalesced.
                    let kernel = device.kernel(kernels.sum_rows)?;
                    let tiles = (cols as u64).div_ceil(32);
                    let cfg = LaunchConfig::grid_stride(&kernel, tiles * SUM_ROWS_BLOCK as u64, SUM_ROWS_BLOCK)?;
                    (kernel, cfg)
                };
                let args = [
                    KernelArg::Input(g),
                    KernelArg::Output(&out),
                    KernelArg::U64(rows as u64),
                    KernelArg::U64(cols as u64),
                ];
                // SAFETY: `sum_rows(g, out, rows, cols)` as declared in kernels-gpu; `g` holds
                // rows × cols elements and `out` cols (made here), of the kernel's dtype; the
                // block is 1-D, a multiple of 32 and at most 1024 threads.
                unsafe { kernel.launch(&device.current_stream(), cfg, &args)? };
            }
            Ok(out)
        }
        #[cfg(not(feature = "cuda"))]
        device @ Device::Cuda(_) => Err(Error::cuda_disabled("sum_rows", device)),
    }
}
