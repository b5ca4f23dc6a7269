//! Ops along a dim and indexing ops on variables: `broadcast_as` (which the binary ops use to
//! broadcast), `sum_dim`, `max_dim`, `index_select` and `gather`. Forwards are the host ops of
//! the same names; backwards run on the tensors' device: a broadcast's gradient is summed back
//! (`sum_to_shape`), a reduction's is broadcast out, and an index op's is scattered back
//! (`index_select_backward`, `gather_backward`).
//!
//! ```
//! # fn main() -> opsmith_autograd::Result<()> {
//! use opsmith_autograd::{Tape, ops};
//! use opsmith_host::{Device, Tensor};
//! let tape = Tape::new();
//! let x = tape.var(Tensor::from_vec(vec![1.0f32, 5.0, 2.0, 4.0, 3.0, 5.0], [2, 3], Device::Cpu)?);
//! let b = tape.var(Tensor::from_vec(vec![10.0f32, 20.0, 30.0], [3], Device::Cpu)?);
//! let y = ops::mul(&x, &b)?; // b broadcast over the rows
//! let m = ops::max_dim(&y, 1, false)?; // of [10, 100, 60] and [40, 60, 150]
//! assert_eq!(m.value().to_vec::<f32>()?, [100.0, 150.0]);
//! let grads = tape.backward(&ops::sum(&m)?)?;
//! assert_eq!(grads.get(&x).unwrap().to_vec::<f32>()?, [0.0, 20.0, 0.0, 0.0, 0.0, 30.0]);
//! assert_eq!(grads.get(&b).unwrap().to_vec::<f32>()?, [0.0, 5.0, 5.0]);
//! # Ok(()) }
//! ```
use crate::Result;
use crate::onnx::trace::{self, Traced};
use crate::tape::{Grad, Like, Var, tracking};
use opsmith_host::{DType, Shape, Tensor, ops as host};

/// `x` repeated along its size-1 dims (and new leading dims) to `shape`, as
/// [`Tensor::broadcast_as`]. Backward: the gradient summed back to `x`'s shape.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0], [2, 1], Device::Cpu)?);
/// let y = ops::broadcast_as(&x, [2, 3])?;
/// assert_eq!(y.value().to_vec::<f32>()?, [1.0, 1.0, 1.0, 2.0, 2.0, 2.0]);
/// let grads = tape.backward(&ops::sum(&ops::mul(&y, &y)?)?)?;
/// assert_eq!(grads.get(&x).unwrap().to_vec::<f32>()?, [6.0, 12.0]); // 3 copies of 2x
/// # Ok(()) }
/// ```
pub fn broadcast_as(x: &Var, shape: impl Into<Shape>) -> Result<Var> {
    broadcast(x, shape.into(), true)
}

/// [`broadcast_as`], told to a running ONNX tracer or not (the binary ops trace themselves on
/// their operands before the broadcast).
fn broadcast(x: &Var, shape: Shape, traced: bool) -> Result<Var> {
    if x.value().dims() == shape.dims() {
        return Ok(x.clone());
    }
    let out = x.value().broadcast_as(shape.clone())?;
    let var = match tracking("broadcast_as", &[x])? {
        None => Var::constant(out),
        Some(tape) => {
            let input = x.value().dims().to_vec();
            let like = Like::of(x.value());
            let copies = (out.elem_count() / x.value().elem_count().max(1)) as f64;
            tape.record_with_uniform(
                "broadcast_as",
                &[x],
                out,
                &[],
                move |g| Ok(vec![Some(host::sum_to_shape(g, &input)?)]),
                move |v| Ok(vec![Some(Grad::uniform(v * copies, &like))]),
            )
        }
    };
    if traced {
        trace::note(|| Traced::BroadcastAs { from: x.value().dims().to_vec(), to: shape.dims().to_vec() }, &[x], &var);
    }
    Ok(var)
}

/// Both operands broadcast to their common shape, for the binary ops (each returned as it is
/// when it has that shape already).
pub(crate) fn broadcast_operands(op: &'static str, a: &Var, b: &Var) -> Result<(Var, Var)> {
    if a.value().dims() == b.value().dims() {
        return Ok((a.clone(), b.clone()));
    }
    let shape = host::broadcast_shape(op, a.value().dims(), b.value().dims())?;
    let shape = Shape::from(shape);
    Ok((broadcast(a, shape.clone(), false)?, broadcast(b, shape, false)?))
}

/// The sum along `dim` (kept with size 1 when `keepdim`), as
/// [`ops::sum_dim`](opsmith_host::ops::sum_dim). Backward: the gradient broadcast back along
/// `dim`.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3], Device::Cpu)?);
/// let rows = ops::sum_dim(&x, 1, false)?;
/// assert_eq!(rows.value().to_vec::<f32>()?, [6.0, 15.0]);
/// let g = Tensor::from_vec(vec![1.0f32, -1.0], [2], Device::Cpu)?;
/// let grads = tape.backward_with(&rows, g)?;
/// assert_eq!(grads.get(&x).unwrap().to_vec::<f32>()?, [1.0, 1.0, 1.0, -1.0, -1.0, -1.0]);
/// # Ok(()) }
/// ```
pub fn sum_dim(x: &Var, dim: usize, keepdim: bool) -> Result<Var> {
    let out = host::sum_dim(x.value(), dim, keepdim)?;
    record_or_constant!("sum_dim", Traced::SumDim { dim, keepdim }, &[x], out, |tape| {
        let (input, like) = (x.value().shape().clone(), Like::of(x.value()));
        let kept = kept_dims(input.dims(), dim);
        tape.record_with_uniform(
            "sum_dim",
            &[x],
            out,
            &[],
            move |g| Ok(vec![Some(g.reshape(kept.clone())?.broadcast_as(input.clone())?)]),
            move |v| Ok(vec![Some(Grad::uniform(v, &like))]),
        )
    })
}

/// `dims` with `dim` of size 1.
fn kept_dims(dims: &[usize], dim: usize) -> Vec<usize> {
    let mut kept = dims.to_vec();
    kept[dim] = 1;
    kept
}

/// The largest value along `dim` (kept with size 1 when `keepdim`), as
/// [`ops::max_dim`](opsmith_host::ops::max_dim). Backward: the gradient goes to the element
/// that was largest (the first, for ties), zeros elsewhere. Its index is
/// [`Var::argmax`](crate::Var::argmax).
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![1.0f32, 3.0, 3.0, -2.0], [2, 2], Device::Cpu)?);
/// let m = ops::max_dim(&x, 0, false)?;
/// assert_eq!(m.value().to_vec::<f32>()?, [3.0, 3.0]);
/// let grads = tape.backward(&ops::sum(&m)?)?;
/// assert_eq!(grads.get(&x).unwrap().to_vec::<f32>()?, [0.0, 1.0, 1.0, 0.0]);
/// # Ok(()) }
/// ```
pub fn max_dim(x: &Var, dim: usize, keepdim: bool) -> Result<Var> {
    let (out, indices) = host::max_dim(x.value(), dim, true)?;
    let kept_shape = out.dims().to_vec();
    let out = if keepdim { out } else { out.squeeze(dim)? };
    record_or_constant!("max_dim", Traced::MaxDim { dim, keepdim }, &[x], out, |tape| {
        let d = x.value().dims()[dim];
        tape.record("max_dim", &[x], out, &[&indices.clone()], move |g| {
            Ok(vec![Some(host::gather_backward(&g.reshape(kept_shape.clone())?, dim, &indices, d)?)])
        })
    })
}

/// Entries along `dim` picked by a 1-D u32 or i64 `index`, as
/// [`ops::index_select`](opsmith_host::ops::index_select) (an embedding lookup along dim 0).
/// Backward: the gradient added back at the picked places (repeats add up).
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let table = tape.var(Tensor::from_vec(vec![0.5f32, 1.0, 1.5, 2.0, 2.5, 3.0], [3, 2], Device::Cpu)?);
/// let tokens = Tensor::from_vec(vec![2i64, 0, 2], [3], Device::Cpu)?;
/// let rows = ops::index_select(&table, 0, &tokens)?;
/// assert_eq!(rows.value().to_vec::<f32>()?, [2.5, 3.0, 0.5, 1.0, 2.5, 3.0]);
/// let grads = tape.backward(&ops::sum(&rows)?)?;
/// assert_eq!(grads.get(&table).unwrap().to_vec::<f32>()?, [1.0, 1.0, 0.0, 0.0, 2.0, 2.0]);
/// # Ok(()) }
/// ```
pub fn index_select(x: &Var, dim: usize, index: &Tensor) -> Result<Var> {
    let out = host::index_select(x.value(), dim, index)?;
    indexed("index_select", Traced::IndexSelect(dim), x, out, dim, index, host::index_select_backward)
}

/// One entry along `dim` per element of `index` (u32 or i64; `x`'s shape except along `dim`),
/// as [`ops::gather`](opsmith_host::ops::gather): picking each row's label score, for one.
/// Backward: the gradient added back at the picked places.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let scores = tape.var(Tensor::from_vec(vec![0.1f32, 0.7, 0.2, 0.5, 0.3, 0.2], [2, 3], Device::Cpu)?);
/// let labels = Tensor::from_vec(vec![1i64, 0], [2, 1], Device::Cpu)?;
/// let picked = ops::gather(&scores, 1, &labels)?;
/// let grads = tape.backward(&ops::sum(&picked)?)?;
/// assert_eq!(grads.get(&scores).unwrap().to_vec::<f32>()?, [0.0, 1.0, 0.0, 1.0, 0.0, 0.0]);
/// # Ok(()) }
/// ```
pub fn gather(x: &Var, dim: usize, index: &Tensor) -> Result<Var> {
    let out = host::gather(x.value(), dim, index)?;
    indexed("gather", Traced::Gather(dim), x, out, dim, index, host::gather_backward)
}

/// Records an op that picks `x`'s entries along `dim` by `index`, whose backward scatters the
/// gradient back (`backward(g, dim, index, size of dim)`); a tracer sees the index as an i64
/// constant input.
fn indexed(
    op: &'static str,
    traced: Traced,
    x: &Var,
    out: Tensor,
    dim: usize,
    index: &Tensor,
    backward: fn(&Tensor, usize, &Tensor, usize) -> opsmith_host::Result<Tensor>,
) -> Result<Var> {
    let var = match tracking(op, &[x])? {
        None => Var::constant(out),
        Some(tape) => {
            let (index, d) = (index.clone(), x.value().dims()[dim]);
            tape.record(op, &[x], out, &[&index.clone()], move |g| Ok(vec![Some(backward(g, dim, &index, d)?)]))
        }
    };
    // Only a tracer needs the i64 copy (a u32 index on CUDA goes through the host for it).
    if trace::active() {
        trace::note(|| traced, &[x, &Var::constant(as_i64(index)?)], &var);
    }
    Ok(var)
}

/// The index as i64 (ONNX's index type), as it is when it already is one.
fn as_i64(index: &Tensor) -> Result<Tensor> {
    Ok(if index.dtype() == DType::I64 { index.clone() } else { index.to_dtype(DType::I64)? })
}

/// Reductions along a dim and indexing, as methods.
impl Var {
    /// The sum along `dim`, which is removed; see [`sum_dim`].
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::Tape;
    /// use opsmith_host::{Device, Tensor};
    /// let tape = Tape::new();
    /// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2], Device::Cpu)?);
    /// assert_eq!(x.sum(0)?.value().to_vec::<f32>()?, [4.0, 6.0]);
    /// # Ok(()) }
    /// ```
    pub fn sum(&self, dim: usize) -> Result<Var> {
        sum_dim(self, dim, false)
    }

    /// The sum along `dim`, kept with size 1.
    pub fn sum_keepdim(&self, dim: usize) -> Result<Var> {
        sum_dim(self, dim, true)
    }

    /// The largest value along `dim`, which is removed; see [`max_dim`].
    pub fn max(&self, dim: usize) -> Result<Var> {
        max_dim(self, dim, false)
    }

    /// The index of the largest value along `dim` (removed), as an i64 tensor: not
    /// differentiable, so a plain tensor.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::Tape;
    /// use opsmith_host::{Device, Tensor};
    /// let tape = Tape::new();
    /// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0, 4.0, 3.0], [2, 2], Device::Cpu)?);
    /// assert_eq!(x.argmax(1)?.to_vec::<i64>()?, [1, 0]);
    /// # Ok(()) }
    /// ```
    pub fn argmax(&self, dim: usize) -> Result<Tensor> {
        Ok(self.value().argmax(dim)?)
    }

    /// Repeated to `shape` by broadcasting; see [`broadcast_as`].
    pub fn broadcast_as(&self, shape: impl Into<Shape>) -> Result<Var> {
        broadcast_as(self, shape)
    }

    /// Entries along `dim` picked by `index`; see [`index_select`].
    pub fn index_select(&self, dim: usize, index: &Tensor) -> Result<Var> {
        index_select(self, dim, index)
    }

    /// One entry along `dim` per element of `index`; see [`gather`].
    pub fn gather(&self, dim: usize, index: &Tensor) -> Result<Var> {
        gather(self, dim, index)
    }
}
