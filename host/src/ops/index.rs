//! Ops along one dim and ops that index: `sum_dim`, `max_dim`, `argmax`, `index_select`,
//! `gather`, the random fills behind `Tensor::rand`/`randn`, and broadcasting.
//!
//! A dim splits a contiguous tensor into an `[outer, d, inner]` view (see
//! `opsmith_kernels`' indexing kernels), which every op here works on: one CUDA kernel per op
//! serves every rank. On the CPU the same loops run in Rust, in f64 for the reductions.
use super::check;
use super::layout::{MAX_RANK, Piece, assemble, contiguous_strides, padded};
use crate::dtype::{with_element_type, with_float_type};
use crate::{DType, Device, Element, Error, Result, Shape, Tensor};

/// `[outer, d, inner]` of `dims` split at `dim`, or an error naming `op` for a dim past the
/// rank.
fn split_at(op: &'static str, dims: &[usize], dim: usize) -> Result<(usize, usize, usize)> {
    if dim >= dims.len() {
        return Err(Error::InvalidArgument {
            op,
            reason: format!("dim {dim} is out of range for a tensor of shape {dims:?} (rank {})", dims.len()),
        });
    }
    Ok((dims[..dim].iter().product(), dims[dim], dims[dim + 1..].iter().product()))
}

/// The element count of `dims`, or [`Error::TooLarge`] when it overflows.
fn element_count(op: &'static str, dims: &[usize]) -> Result<usize> {
    dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).ok_or(Error::TooLarge {
        op,
        elements: u64::MAX,
        limit: usize::MAX as u64,
    })
}

/// `dims` without `dim`, or with it as 1 when `keepdim`.
fn reduced_dims(dims: &[usize], dim: usize, keepdim: bool) -> Vec<usize> {
    let mut out = dims.to_vec();
    if keepdim {
        out[dim] = 1;
    } else {
        out.remove(dim);
    }
    out
}

#[cfg(feature = "cuda")]
fn dim_table(op: &'static str, t: &Tensor) -> Result<opsmith_kernels::names::DimKernels> {
    use opsmith_kernels::names::dim;
    super::cuda::dtype_table(op, t, [dim::F32, dim::F16, dim::BF16])
}

/// The sum along `dim`, accumulated in f64 on the CPU and in f32 (compensated) on CUDA, rounded
/// once to the dtype. `keepdim` keeps the dim with size 1 (`[2, 3]` along 1 gives `[2, 1]`),
/// else it is removed (`[2]`). Summing an empty dim gives zeros.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3], Device::Cpu)?;
/// assert_eq!(ops::sum_dim(&x, 0, false)?.to_vec::<f32>()?, [5.0, 7.0, 9.0]);
/// assert_eq!(ops::sum_dim(&x, 1, true)?.dims(), [2, 1]);
/// # Ok(()) }
/// ```
pub fn sum_dim(x: &Tensor, dim: usize, keepdim: bool) -> Result<Tensor> {
    const OP: &str = "sum_dim";
    check::float(OP, x)?;
    let (outer, d, inner) = split_at(OP, x.dims(), dim)?;
    let dims = reduced_dims(x.dims(), dim, keepdim);
    match x.device() {
        Device::Cpu => {
            check::cpu_work(OP)?;
            let values = x.to_vec_f64()?;
            let mut sums = crate::tensor::host_vec(OP, outer * inner, 0.0f64)?;
            // No elements: the loops would only count (to 2^64 for a shape like [usize::MAX, 0]).
            let outer = if x.elem_count() == 0 { 0 } else { outer };
            for a in 0..outer {
                for j in 0..d {
                    let row = &values[(a * d + j) * inner..][..inner];
                    for (s, v) in sums[a * inner..][..inner].iter_mut().zip(row) {
                        *s += v;
                    }
                }
            }
            Tensor::from_f64(&sums, dims, x.dtype(), Device::Cpu)
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => {
            let kernels = dim_table(OP, x)?;
            let out = Tensor::empty(dims, x.dtype(), x.device())?;
            if d == 0 {
                out.fill_(0.0)?;
            } else if outer * inner > 0 {
                let grid = crate::cuda::Grid::stride((outer * inner) as u64);
                crate::cuda::launch(kernels.sum_dim, grid, (x, &out, outer as u64, d as u64, inner as u64))?;
            }
            Ok(out)
        }
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => Err(Error::cuda_disabled(OP, x.device())),
    }
}

/// The largest value along `dim` and its index (the first, for ties), as PyTorch's
/// `torch.max(x, dim)`: `(values, indices)`, the indices an [`DType::I64`] tensor. A NaN counts
/// as the largest value. The dim must not be empty.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 7.0, 7.0, -4.0, -2.0, -3.0], [2, 3], Device::Cpu)?;
/// let (values, indices) = ops::max_dim(&x, 1, false)?;
/// assert_eq!(values.to_vec::<f32>()?, [7.0, -2.0]);
/// assert_eq!(indices.to_vec::<i64>()?, [1, 1]);
/// # Ok(()) }
/// ```
pub fn max_dim(x: &Tensor, dim: usize, keepdim: bool) -> Result<(Tensor, Tensor)> {
    const OP: &str = "max_dim";
    check::float(OP, x)?;
    let (outer, d, inner) = split_at(OP, x.dims(), dim)?;
    if d == 0 {
        return Err(Error::InvalidArgument {
            op: OP,
            reason: format!("dim {dim} of shape {:?} is empty: it has no largest value", x.dims()),
        });
    }
    let dims = reduced_dims(x.dims(), dim, keepdim);
    match x.device() {
        Device::Cpu => {
            check::cpu_work(OP)?;
            let values = x.to_vec_f64()?;
            let mut best = crate::tensor::host_capacity(OP, outer * inner)?;
            let mut at = crate::tensor::host_capacity(OP, outer * inner)?;
            // No elements: the loops would only count, as in `sum_dim`.
            let outer = if x.elem_count() == 0 { 0 } else { outer };
            for a in 0..outer {
                for i in 0..inner {
                    let value = |j: usize| values[(a * d + j) * inner + i];
                    let (mut b, mut k) = (value(0), 0);
                    for j in 1..d {
                        if b.is_nan() {
                            break;
                        }
                        if value(j) > b || value(j).is_nan() {
                            (b, k) = (value(j), j);
                        }
                    }
                    best.push(b);
                    at.push(k as i64);
                }
            }
            // The values are elements of x, so converting back is exact.
            Ok((
                Tensor::from_f64(&best, dims.clone(), x.dtype(), Device::Cpu)?,
                Tensor::from_vec(at, dims, Device::Cpu)?,
            ))
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => {
            let kernels = dim_table(OP, x)?;
            let values = Tensor::empty(dims.clone(), x.dtype(), x.device())?;
            let indices = Tensor::empty(dims, DType::I64, x.device())?;
            if outer * inner > 0 {
                let grid = crate::cuda::Grid::stride((outer * inner) as u64);
                let args = (x, &values, &indices, outer as u64, d as u64, inner as u64);
                crate::cuda::launch(kernels.max_dim, grid, args)?;
            }
            Ok((values, indices))
        }
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => Err(Error::cuda_disabled(OP, x.device())),
    }
}

/// The index of the largest value along `dim` (the first, for ties; a NaN counts as largest),
/// as an [`DType::I64`] tensor.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let x = Tensor::from_vec(vec![0.5f32, 2.0, -1.0, 3.0], [2, 2], Device::Cpu)?;
/// assert_eq!(ops::argmax(&x, 1, false)?.to_vec::<i64>()?, [1, 1]);
/// assert_eq!(ops::argmax(&x, 0, false)?.to_vec::<i64>()?, [0, 1]);
/// # Ok(()) }
/// ```
pub fn argmax(x: &Tensor, dim: usize, keepdim: bool) -> Result<Tensor> {
    max_dim(x, dim, keepdim).map(|(_, indices)| indices)
}

/// Index tensors as the kernels take them: on the CPU as they are, on CUDA as i64.
fn index_operand(op: &'static str, x: &Tensor, index: &Tensor) -> Result<Tensor> {
    check::same_device(op, &[x, index])?;
    match index.dtype() {
        DType::I64 => Ok(index.clone()),
        // CUDA's kernels read i64 (the conversion goes through the host).
        DType::U32 if index.device().is_cuda() => index.to_dtype(DType::I64),
        DType::U32 => Ok(index.clone()),
        dtype => Err(Error::InvalidArgument {
            op,
            reason: format!("indices must be a u32 or i64 tensor, got {dtype} (convert with to_dtype)"),
        }),
    }
}

/// The indices of a CPU index tensor as `usize`, each checked against the dim size `d`.
fn host_indices(op: &'static str, index: &Tensor, d: usize) -> Result<Vec<usize>> {
    let raw: Vec<i64> = match index.dtype() {
        DType::U32 => index.to_vec::<u32>()?.into_iter().map(i64::from).collect(),
        _ => index.to_vec::<i64>()?,
    };
    raw.into_iter()
        .map(|j| {
            usize::try_from(j).ok().filter(|&j| j < d).ok_or_else(|| Error::InvalidArgument {
                op,
                reason: format!("index {j} is out of range for a dim of size {d}"),
            })
        })
        .collect()
}

/// Picks entries along `dim` by a 1-D index tensor (u32 or i64, on the same device):
/// `out[.., j, ..] = x[.., index[j], ..]`, so the dim's size becomes `index.len()`.
///
/// On the CPU an out-of-range index is [`Error::InvalidArgument`]. On CUDA, checking would
/// read the indices back (a sync), so the kernel never reads outside `x` and writes all-ones
/// bits (NaN for floats) for an out-of-range index instead.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3], Device::Cpu)?;
/// let index = Tensor::from_vec(vec![2i64, 0, 2], [3], Device::Cpu)?;
/// assert_eq!(ops::index_select(&x, 1, &index)?.to_vec::<f32>()?, [3.0, 1.0, 3.0, 6.0, 4.0, 6.0]);
/// # Ok(()) }
/// ```
pub fn index_select(x: &Tensor, dim: usize, index: &Tensor) -> Result<Tensor> {
    const OP: &str = "index_select";
    let (outer, d, inner) = split_at(OP, x.dims(), dim)?;
    if index.dims().len() != 1 {
        return Err(Error::InvalidArgument {
            op: OP,
            reason: format!("expects a 1-D index tensor, got shape {:?}", index.dims()),
        });
    }
    let index = index_operand(OP, x, index)?;
    let k = index.elem_count();
    let mut dims = x.dims().to_vec();
    dims[dim] = k;
    gather_impl(OP, x, &index, dims, (outer, d, inner, k), false)
}

/// Picks one entry along `dim` per element of `index`:
/// `out[a, j, i] = x[a, index[a, j, i], i]`, as PyTorch's `gather`. `index` (u32 or i64, same
/// device) has `x`'s shape except along `dim`, and so has the output. Out-of-range indices are
/// handled as in [`index_select`].
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let logits = Tensor::from_vec(vec![0.1f32, 0.7, 0.2, 0.5, 0.3, 0.2], [2, 3], Device::Cpu)?;
/// let labels = Tensor::from_vec(vec![1i64, 0], [2, 1], Device::Cpu)?;
/// assert_eq!(ops::gather(&logits, 1, &labels)?.to_vec::<f32>()?, [0.7, 0.5]);
/// # Ok(()) }
/// ```
pub fn gather(x: &Tensor, dim: usize, index: &Tensor) -> Result<Tensor> {
    const OP: &str = "gather";
    let (outer, d, inner) = split_at(OP, x.dims(), dim)?;
    let fits = index.dims().len() == x.dims().len()
        && index.dims().iter().zip(x.dims()).enumerate().all(|(k, (i, s))| k == dim || i == s);
    if !fits {
        return Err(Error::ShapeMismatch { op: OP, lhs: x.dims().to_vec(), rhs: index.dims().to_vec() });
    }
    let index = index_operand(OP, x, &index.clone())?;
    let k = index.dims()[dim];
    gather_impl(OP, x, &index, index.dims().to_vec(), (outer, d, inner, k), true)
}

/// The backward of [`index_select`]: `g` (the output's gradient) added back into zeros of the
/// input's shape, where dim `dim` has size `dim_size`: `out[.., index[j], ..] += g[.., j, ..]`.
/// Repeated indices add up. In f64 on the CPU; in f32 with atomic adds on CUDA (the order of
/// the additions to one element is not fixed), rounded once to the dtype.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let g = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3], Device::Cpu)?;
/// let index = Tensor::from_vec(vec![2i64, 0, 2], [3], Device::Cpu)?;
/// assert_eq!(ops::index_select_backward(&g, 0, &index, 4)?.to_vec::<f32>()?, [2.0, 0.0, 4.0, 0.0]);
/// # Ok(()) }
/// ```
pub fn index_select_backward(g: &Tensor, dim: usize, index: &Tensor, dim_size: usize) -> Result<Tensor> {
    const OP: &str = "index_select_backward";
    check::float(OP, g)?;
    let (outer, k, inner) = split_at(OP, g.dims(), dim)?;
    if index.dims() != [k] {
        return Err(Error::ShapeMismatch { op: OP, lhs: vec![k], rhs: index.dims().to_vec() });
    }
    let index = index_operand(OP, g, index)?;
    scatter_add(OP, g, &index, dim, dim_size, (outer, k, inner), false)
}

/// The backward of [`gather`]: `out[a, index[a, j, i], i] += g[a, j, i]` into zeros of the
/// input's shape (`index`'s shape with dim `dim` of size `dim_size`). Arithmetic as in
/// [`index_select_backward`].
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let g = Tensor::from_vec(vec![1.0f32, -1.0], [2, 1], Device::Cpu)?;
/// let labels = Tensor::from_vec(vec![1i64, 0], [2, 1], Device::Cpu)?;
/// assert_eq!(ops::gather_backward(&g, 1, &labels, 3)?.to_vec::<f32>()?, [0.0, 1.0, 0.0, -1.0, 0.0, 0.0]);
/// # Ok(()) }
/// ```
pub fn gather_backward(g: &Tensor, dim: usize, index: &Tensor, dim_size: usize) -> Result<Tensor> {
    const OP: &str = "gather_backward";
    check::float(OP, g)?;
    let (outer, k, inner) = split_at(OP, g.dims(), dim)?;
    if index.dims() != g.dims() {
        return Err(Error::ShapeMismatch { op: OP, lhs: g.dims().to_vec(), rhs: index.dims().to_vec() });
    }
    let index = index_operand(OP, g, index)?;
    scatter_add(OP, g, &index, dim, dim_size, (outer, k, inner), true)
}

/// The scatter-add behind both backwards.
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))] // `outer` sizes the CUDA launch
fn scatter_add(
    op: &'static str,
    g: &Tensor,
    index: &Tensor,
    dim: usize,
    d: usize,
    (outer, k, inner): (usize, usize, usize),
    per_element: bool,
) -> Result<Tensor> {
    let mut dims = g.dims().to_vec();
    dims[dim] = d;
    match g.device() {
        Device::Cpu => {
            check::cpu_work(op)?;
            let at = host_indices(op, index, d)?;
            let values = g.to_vec_f64()?;
            let count = element_count(op, &dims)?; // `d` is the caller's: no overflow
            let mut out = crate::tensor::host_vec(op, count, 0.0f64)?;
            for (o, v) in values.iter().enumerate() {
                let (rest, i) = (o / inner, o % inner);
                let (a, j) = (rest / k, rest % k);
                out[(a * d + if per_element { at[o] } else { at[j] }) * inner + i] += v;
            }
            Tensor::from_f64(&out, dims, g.dtype(), Device::Cpu)
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => {
            let kernels = dim_table(op, g)?;
            let sums = Tensor::zeros(dims, DType::F32, g.device())?;
            let n = outer * k * inner;
            if n > 0 {
                let args = (g, index, &sums, outer as u64, d as u64, inner as u64, k as u64, index.elem_count() as u64);
                crate::cuda::launch(kernels.scatter_add, crate::cuda::Grid::stride(n as u64), args)?;
            }
            if g.dtype() == DType::F32 { Ok(sums) } else { sums.to_dtype(g.dtype()) }
        }
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => Err(Error::cuda_disabled(op, g.device())),
    }
}

/// `index_select` (`per_element` false: one index per `j`) or `gather` (one per output).
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))] // `outer` sizes the CUDA launch
fn gather_impl(
    op: &'static str,
    x: &Tensor,
    index: &Tensor,
    dims: Vec<usize>,
    (outer, d, inner, k): (usize, usize, usize, usize),
    per_element: bool,
) -> Result<Tensor> {
    let n = element_count(op, &dims)?; // `k` comes from the index: no overflow
    match x.device() {
        Device::Cpu => {
            check::cpu_work(op)?;
            let at = host_indices(op, index, d)?;
            with_element_type!(x.dtype(), T => {
                let src = x.to_vec::<T>()?;
                let mut out: Vec<T> = crate::tensor::host_capacity(op, n)?;
                for o in 0..n {
                    let (rest, i) = (o / inner, o % inner);
                    let (a, j) = (rest / k, rest % k);
                    let jj = if per_element { at[o] } else { at[j] };
                    out.push(src[(a * d + jj) * inner + i]);
                }
                Tensor::from_vec(out, dims, Device::Cpu)
            })
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => {
            use opsmith_kernels::names::gather as g;
            let table = match x.dtype() {
                DType::F32 => g::F32,
                DType::F16 => g::F16,
                DType::BF16 => g::BF16,
                DType::F64 => g::F64,
                DType::U32 => g::U32,
                DType::I64 => g::I64,
            };
            let out = Tensor::empty(dims, x.dtype(), x.device())?;
            if n > 0 {
                let kernel = if per_element { table.gather } else { table.index_select };
                let args = (x, index, &out, outer as u64, d as u64, inner as u64, k as u64);
                crate::cuda::launch(kernel, crate::cuda::Grid::stride(n as u64), args)?;
            }
            Ok(out)
        }
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => Err(Error::cuda_disabled(op, x.device())),
    }
}

/// Which random stream a fill draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Distribution {
    /// Uniform in `[0, 1)`.
    Uniform,
    /// Standard normal.
    Normal,
}

/// A tensor of `shape` filled from the counter-based stream of `seed`
/// (`opsmith_kernels::random`): element `i` depends only on `seed` and `i`, so the CPU and
/// CUDA give the same bits, and a tensor's first elements do not depend on its size.
pub(crate) fn random(
    op: &'static str,
    shape: Shape,
    dtype: DType,
    device: Device,
    seed: u64,
    distribution: Distribution,
) -> Result<Tensor> {
    use opsmith_kernels::random::{normal_f32, uniform_f32, uniform_f64};
    let n = shape.checked_elem_count().ok_or(Error::TooLarge { op, elements: u64::MAX, limit: usize::MAX as u64 })?;
    #[cfg(feature = "cuda")]
    if device.is_cuda() && matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
        let out = Tensor::empty(shape, dtype, device)?;
        let kernels = dim_table(op, &out)?;
        if n > 0 {
            let kernel = match distribution {
                Distribution::Uniform => kernels.uniform,
                Distribution::Normal => kernels.normal,
            };
            crate::cuda::launch(kernel, crate::cuda::Grid::stride(n as u64), (&out, n as u64, seed))?;
        }
        return Ok(out);
    }
    // The CPU, and f64 on CUDA (made on the host, the same way).
    let bits = match dtype {
        DType::F16 => 11,
        DType::BF16 => 8,
        _ => 24,
    };
    with_float_type!(dtype, op, device, T => {
        let mut values: Vec<T> = crate::tensor::host_capacity(op, n)?;
        values.extend((0..n as u64).map(|i| match (distribution, dtype) {
            (Distribution::Uniform, DType::F64) => <T as Element>::from_f64(uniform_f64(seed, i)),
            (Distribution::Uniform, _) => <T as Element>::from_f64(uniform_f32(seed, i, bits) as f64),
            (Distribution::Normal, _) => <T as Element>::from_f64(normal_f32(seed, i) as f64),
        }));
        Tensor::from_vec(values, shape, device)
    })
}

/// The shape that `a` and `b` broadcast to, by NumPy's rules: aligned from the last dim, each
/// pair of sizes equal or one of them 1. [`Error::ShapeMismatch`] names `op` otherwise.
///
/// ```
/// use opsmith_host::ops::broadcast_shape;
/// assert_eq!(broadcast_shape("add", &[2, 1, 3], &[4, 1])?, [2, 4, 3]);
/// assert!(broadcast_shape("add", &[2, 3], &[2]).is_err());
/// # Ok::<(), opsmith_host::Error>(())
/// ```
pub fn broadcast_shape(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let rank = a.len().max(b.len());
    let size = |dims: &[usize], k: usize| if k < rank - dims.len() { 1 } else { dims[k - (rank - dims.len())] };
    (0..rank)
        .map(|k| match (size(a, k), size(b, k)) {
            (x, y) if x == y || y == 1 => Ok(x),
            (1, y) => Ok(y),
            _ => Err(Error::ShapeMismatch { op, lhs: a.to_vec(), rhs: b.to_vec() }),
        })
        .collect()
}

/// `x` repeated along the dims where it has size 1 (or that it lacks, in front) to `shape`,
/// as a new contiguous tensor (one strided copy). Every tensor is contiguous in opsmith, so this
/// copies where PyTorch would make a view.
pub(crate) fn broadcast_to(op: &'static str, x: &Tensor, shape: &[usize]) -> Result<Tensor> {
    if x.dims() == shape {
        return Ok(x.clone());
    }
    let fits =
        x.dims().len() <= shape.len() && x.dims().iter().rev().zip(shape.iter().rev()).all(|(&s, &t)| s == t || s == 1);
    if !fits {
        return Err(Error::ShapeMismatch { op, lhs: x.dims().to_vec(), rhs: shape.to_vec() });
    }
    let src_dims = padded(op, x.dims(), 1)?;
    let contiguous = padded(op, &contiguous_strides(x.dims()), 0)?;
    let dims = padded(op, shape, 1)?;
    let mut src_strides = [0; MAX_RANK];
    for k in 0..MAX_RANK {
        // A size-1 dim repeats: stride 0.
        src_strides[k] = if src_dims[k] == 1 { 0 } else { contiguous[k] };
    }
    let dst_strides = padded(op, &contiguous_strides(shape), 0)?;
    let piece = Piece { src: x, dims, src_strides, dst_offset: 0, dst_strides };
    assemble(op, Shape::from(shape.to_vec()), x.dtype(), x.device(), &[piece])
}

/// Both operands broadcast to their common shape (each unchanged when it already has it).
pub(crate) fn broadcast_pair(op: &'static str, a: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor)> {
    if a.dims() == b.dims() {
        return Ok((a.clone(), b.clone()));
    }
    check::same_device(op, &[a, b])?;
    check::same_dtype(op, &[a, b])?;
    let shape = broadcast_shape(op, a.dims(), b.dims())?;
    Ok((broadcast_to(op, a, &shape)?, broadcast_to(op, b, &shape)?))
}

/// `g` summed down to `shape`, the shape it was broadcast from: over the leading dims `shape`
/// lacks and over the dims where `shape` has 1. The backward of a broadcast.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let g = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3], Device::Cpu)?;
/// assert_eq!(ops::sum_to_shape(&g, &[3])?.to_vec::<f32>()?, [5.0, 7.0, 9.0]);
/// assert_eq!(ops::sum_to_shape(&g, &[2, 1])?.to_vec::<f32>()?, [6.0, 15.0]);
/// # Ok(()) }
/// ```
pub fn sum_to_shape(g: &Tensor, shape: &[usize]) -> Result<Tensor> {
    const OP: &str = "sum_to_shape";
    if g.dims() == shape {
        return Ok(g.clone());
    }
    let lead = g.dims().len().checked_sub(shape.len());
    let fits = lead.is_some_and(|lead| shape.iter().zip(&g.dims()[lead..]).all(|(&s, &t)| s == t || s == 1));
    let Some(lead) = lead.filter(|_| fits) else {
        return Err(Error::ShapeMismatch { op: OP, lhs: g.dims().to_vec(), rhs: shape.to_vec() });
    };
    let mut out = g.clone();
    for _ in 0..lead {
        out = sum_dim(&out, 0, false)?;
    }
    for (k, &s) in shape.iter().enumerate() {
        if s == 1 && out.dims()[k] != 1 {
            out = sum_dim(&out, k, true)?;
        }
    }
    Ok(out)
}
