//! Shape ops on variables: `narrow`, `permute`, `transpose`, `cat`, `stack`, `squeeze`,
//! `unsqueeze`, `reshape`, and the cast `to_dtype`. Each forward is the host tensor op of the
//! same name; each backward moves the gradient back into the input's layout with host tensor
//! ops too, on the tensors' device, and saves no tensor (only shapes and offsets).
//!
//! A uniform gradient (a `sum` or `mean` downstream) passes through every op but `narrow` as a
//! uniform gradient of each input's shape: no device work. `narrow`'s gradient is mostly zeros,
//! so it is always a tensor.
//!
//! A bad argument (a dim out of range, shapes that do not join) is the host's typed error,
//! [`opsmith_host::Error::InvalidArgument`] and the like inside [`crate::Error::Host`], with
//! `op` set to the name of the op called here (`"narrow"`, not `"Tensor::narrow"`).
//!
//! ```
//! # fn main() -> opsmith_autograd::Result<()> {
//! use opsmith_autograd::{Tape, ops};
//! use opsmith_host::{Device, Tensor};
//! let tape = Tape::new();
//! let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3], Device::Cpu)?);
//! let w = tape.var(Tensor::from_vec(vec![1.0f32, 10.0, 100.0, 1000.0], [2, 2], Device::Cpu)?);
//! // The last two columns of x, transposed, times w.
//! let y = ops::mul(&x.narrow(1, 1, 2)?.transpose(0, 1)?, &w)?;
//! assert_eq!(y.value().to_vec::<f32>()?, [2.0, 50.0, 300.0, 6000.0]);
//! let grads = tape.backward(&ops::sum(&y)?)?;
//! assert_eq!(grads.get(&x).unwrap().to_vec::<f32>()?, [0.0, 1.0, 100.0, 0.0, 10.0, 1000.0]);
//! # Ok(()) }
//! ```
use crate::onnx::trace::{self, Traced};
use crate::tape::{Grad, Like, Tape, Var, tracking};
use crate::{Error, Result};
use opsmith_host::{DType, Shape, Tensor};

/// Relabels the host's argument errors with `op`, the op the caller called: the host checks the
/// arguments, the error names the call that failed (`stack`'s bad dim is found by
/// `Tensor::unsqueeze`, for one).
fn named(op: &'static str) -> impl Fn(opsmith_host::Error) -> Error {
    use opsmith_host::Error as E;
    move |e| {
        Error::Host(match e {
            E::InvalidArgument { reason, .. } => E::InvalidArgument { op, reason },
            E::ShapeMismatch { lhs, rhs, .. } => E::ShapeMismatch { op, lhs, rhs },
            E::DTypeMismatch { lhs, rhs, .. } => E::DTypeMismatch { op, lhs, rhs },
            E::DeviceMismatch { lhs, rhs, .. } => E::DeviceMismatch { op, lhs, rhs },
            E::ElementCount { shape, expected, actual, .. } => E::ElementCount { op, shape, expected, actual },
            other => other,
        })
    }
}

/// Records an op that only moves elements: a uniform output gradient is a uniform gradient of
/// every input that needs one, in that input's shape and dtype.
fn record_moving(
    tape: &Tape,
    op: &'static str,
    inputs: &[&Var],
    out: Tensor,
    backward: impl Fn(&Tensor) -> Result<Vec<Option<Tensor>>> + Send + 'static,
) -> Var {
    let likes: Vec<Option<Like>> = inputs.iter().map(|v| v.requires_grad().then(|| Like::of(v.value()))).collect();
    tape.record_with_uniform(op, inputs, out, &[], backward, move |v| {
        Ok(likes.iter().map(|like| like.as_ref().map(|like| Grad::uniform(v, like))).collect())
    })
}

/// Records an op whose output is its input under another shape: the gradient is the output's
/// gradient under the input's shape (a view of it).
fn record_reshape(op: &'static str, traced: Traced, x: &Var, out: Tensor) -> Result<Var> {
    record_or_constant!(op, traced, &[x], out, |tape| {
        let shape = x.value().shape().clone();
        record_moving(&tape, op, &[x], out, move |g| Ok(vec![Some(g.reshape(shape.clone())?)]))
    })
}

/// The gradient of a narrow of an input of shape `input`: `g` in its place along `dim` from
/// `start`, zeros elsewhere.
fn unnarrow(g: &Tensor, input: &Shape, dim: usize, start: usize) -> Result<Tensor> {
    let dims = input.dims();
    let len = g.dims()[dim];
    if len == dims[dim] {
        return Ok(g.clone()); // nothing was cut off
    }
    // With only 1s before `dim`, the narrowed part is one contiguous block of the input: one
    // fill and one copy, rather than zero blocks joined around `g`.
    if g.elem_count() == 0 || dims[..dim].iter().all(|&d| d == 1) {
        let full = Tensor::zeros(input.clone(), g.dtype(), g.device())?;
        if g.elem_count() > 0 {
            let inner: usize = dims[dim + 1..].iter().product();
            full.flat_slice(start * inner, g.elem_count())?.copy_from_(&g.reshape(g.elem_count())?)?;
        }
        return Ok(full);
    }
    let zeros = |size: usize| {
        let mut d = dims.to_vec();
        d[dim] = size;
        Tensor::zeros(d, g.dtype(), g.device())
    };
    let before = (start > 0).then(|| zeros(start)).transpose()?;
    let after = (start + len < dims[dim]).then(|| zeros(dims[dim] - start - len)).transpose()?;
    let parts: Vec<&Tensor> = before.iter().chain([g]).chain(after.iter()).collect();
    Ok(Tensor::cat(&parts, dim)?)
}

/// Elements `start..start + len` along `dim`, as [`Tensor::narrow`]. Backward: the gradient in
/// that place of a zero tensor of `x`'s shape.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3], Device::Cpu)?);
/// let y = ops::narrow(&x, 1, 1, 2)?; // columns 1 and 2
/// assert_eq!(y.value().to_vec::<f32>()?, [2.0, 3.0, 5.0, 6.0]);
/// let grads = tape.backward(&ops::sum(&ops::mul(&y, &y)?)?)?;
/// assert_eq!(grads.get(&x).unwrap().to_vec::<f32>()?, [0.0, 4.0, 6.0, 0.0, 10.0, 12.0]);
/// assert!(ops::narrow(&x, 2, 0, 1).is_err()); // x has no dim 2
/// # Ok(()) }
/// ```
pub fn narrow(x: &Var, dim: usize, start: usize, len: usize) -> Result<Var> {
    let out = x.value().narrow(dim, start, len).map_err(named("narrow"))?;
    record_or_constant!("narrow", Traced::Narrow { dim, start, len }, &[x], out, |tape| {
        let input = x.value().shape().clone();
        tape.record("narrow", &[x], out, &[], move |g| Ok(vec![Some(unnarrow(g, &input, dim, start)?)]))
    })
}

/// The dims reordered, as [`Tensor::permute`]: dim `k` of the result is dim `order[k]` of `x`.
/// Backward: the gradient permuted by the inverse order.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec((0..6).map(|i| i as f32).collect(), [1, 2, 3], Device::Cpu)?);
/// let y = ops::permute(&x, &[2, 0, 1])?;
/// assert_eq!(y.value().dims(), [3, 1, 2]);
/// assert_eq!(y.value().to_vec::<f32>()?, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
/// let g = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [3, 1, 2], Device::Cpu)?;
/// let grads = tape.backward_with(&y, g)?;
/// assert_eq!(grads.get(&x).unwrap().to_vec::<f32>()?, [1.0, 3.0, 5.0, 2.0, 4.0, 6.0]);
/// assert!(ops::permute(&x, &[0, 1]).is_err()); // not a permutation of 3 dims
/// # Ok(()) }
/// ```
pub fn permute(x: &Var, order: &[usize]) -> Result<Var> {
    let out = x.value().permute(order).map_err(named("permute"))?;
    record_or_constant!("permute", Traced::Permute(order.to_vec()), &[x], out, |tape| {
        let mut inverse = vec![0; order.len()];
        for (k, &d) in order.iter().enumerate() {
            inverse[d] = k;
        }
        record_moving(&tape, "permute", &[x], out, move |g| Ok(vec![Some(g.permute(&inverse)?)]))
    })
}

/// Dims `a` and `b` swapped, as [`Tensor::transpose`]. Backward: the gradient with the same
/// dims swapped.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3], Device::Cpu)?);
/// let y = ops::transpose(&x, 0, 1)?;
/// assert_eq!(y.value().to_vec::<f32>()?, [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
/// let g = Tensor::from_vec(vec![10.0f32, 40.0, 20.0, 50.0, 30.0, 60.0], [3, 2], Device::Cpu)?;
/// let grads = tape.backward_with(&y, g)?;
/// assert_eq!(grads.get(&x).unwrap().to_vec::<f32>()?, [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]);
/// # Ok(()) }
/// ```
pub fn transpose(x: &Var, a: usize, b: usize) -> Result<Var> {
    let out = x.value().transpose(a, b).map_err(named("transpose"))?;
    let mut order: Vec<usize> = (0..x.value().dims().len()).collect();
    order.swap(a, b);
    record_or_constant!("transpose", Traced::Permute(order), &[x], out, |tape| {
        record_moving(&tape, "transpose", &[x], out, move |g| Ok(vec![Some(g.transpose(a, b)?)]))
    })
}

/// The variables joined along `dim`, as [`Tensor::cat`] (one dtype and device, the same sizes
/// in the other dims). Backward: each input's part of the gradient, cut out along `dim`.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let a = tape.var(Tensor::from_vec(vec![1.0f32, 2.0], [1, 2], Device::Cpu)?);
/// let b = tape.var(Tensor::from_vec(vec![3.0f32, 4.0, 5.0, 6.0], [2, 2], Device::Cpu)?);
/// let y = ops::cat(&[&a, &b], 0)?;
/// assert_eq!(y.value().dims(), [3, 2]);
/// let w = ops::cat(&[&a, &a, &a], 0)?; // a variable may appear more than once
/// let grads = tape.backward(&ops::sum(&ops::mul(&y, &w)?)?)?;
/// assert_eq!(grads.get(&a).unwrap().to_vec::<f32>()?, [1.0 + 1.0 + 3.0 + 5.0, 2.0 + 2.0 + 4.0 + 6.0]);
/// assert_eq!(grads.get(&b).unwrap().to_vec::<f32>()?, [1.0, 2.0, 1.0, 2.0]);
/// assert!(ops::cat(&[&a, &b], 1).is_err()); // 1 and 2 rows
/// # Ok(()) }
/// ```
pub fn cat(xs: &[&Var], dim: usize) -> Result<Var> {
    let values: Vec<&Tensor> = xs.iter().map(|v| v.value()).collect();
    let out = Tensor::cat(&values, dim).map_err(named("cat"))?;
    record_or_constant!("cat", Traced::Cat(dim), xs, out, |tape| {
        let total = out.dims()[dim];
        // Where each input starts along `dim`, and its shape, for the inputs that need a gradient.
        let mut at = 0;
        let parts: Vec<Option<(usize, Shape)>> = xs
            .iter()
            .map(|v| {
                let start = at;
                at += v.value().dims()[dim];
                v.requires_grad().then(|| (start, v.value().shape().clone()))
            })
            .collect();
        record_moving(&tape, "cat", xs, out, move |g| {
            let part = |(start, shape): &(usize, Shape)| -> Result<Tensor> {
                Ok(match shape.dims()[dim] {
                    len if len == total => g.clone(),
                    // An empty part has no elements to cut out.
                    _ if shape.checked_elem_count() == Some(0) => Tensor::zeros(shape.clone(), g.dtype(), g.device())?,
                    len => g.narrow(dim, *start, len)?,
                })
            };
            parts.iter().map(|p| p.as_ref().map(part).transpose()).collect()
        })
    })
}

/// The variables (all of one shape) stacked along a new dim `dim`, as [`Tensor::stack`].
/// Backward: each input's slice of the gradient, with the stacking dim removed.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let a = tape.var(Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?);
/// let b = tape.var(Tensor::from_vec(vec![3.0f32, 4.0], [2], Device::Cpu)?);
/// let y = ops::stack(&[&a, &b], 1)?;
/// assert_eq!(y.value().dims(), [2, 2]);
/// assert_eq!(y.value().to_vec::<f32>()?, [1.0, 3.0, 2.0, 4.0]);
/// let g = Tensor::from_vec(vec![10.0f32, 30.0, 20.0, 40.0], [2, 2], Device::Cpu)?;
/// let grads = tape.backward_with(&y, g)?;
/// assert_eq!(grads.get(&a).unwrap().to_vec::<f32>()?, [10.0, 20.0]);
/// assert_eq!(grads.get(&b).unwrap().to_vec::<f32>()?, [30.0, 40.0]);
/// assert!(ops::stack(&[&a, &b], 2).is_err()); // rank 1: the new dim goes at 0 or 1
/// # Ok(()) }
/// ```
pub fn stack(xs: &[&Var], dim: usize) -> Result<Var> {
    let values: Vec<&Tensor> = xs.iter().map(|v| v.value()).collect();
    let out = Tensor::stack(&values, dim).map_err(named("stack"))?;
    record_or_constant!("stack", Traced::Stack(dim), xs, out, |tape| {
        let single = xs.len() == 1;
        let shapes: Vec<Option<Shape>> =
            xs.iter().map(|v| v.requires_grad().then(|| v.value().shape().clone())).collect();
        record_moving(&tape, "stack", xs, out, move |g| {
            let part = |k: usize, shape: &Shape| -> Result<Tensor> {
                let slice = if single { g.clone() } else { g.narrow(dim, k, 1)? };
                Ok(slice.reshape(shape.clone())?)
            };
            shapes.iter().enumerate().map(|(k, s)| s.as_ref().map(|s| part(k, s)).transpose()).collect()
        })
    })
}

/// Dim `dim`, of size 1, removed, as [`Tensor::squeeze`]: shares `x`'s memory. Backward: the
/// gradient reshaped to `x`'s shape.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0], [2, 1], Device::Cpu)?);
/// let y = ops::squeeze(&x, 1)?;
/// assert_eq!(y.value().dims(), [2]);
/// let grads = tape.backward(&ops::sum(&ops::scale(&y, 3.0)?)?)?;
/// let gx = grads.get(&x).unwrap();
/// assert_eq!(gx.dims(), [2, 1]);
/// assert_eq!(gx.to_vec::<f32>()?, [3.0, 3.0]);
/// assert!(ops::squeeze(&x, 0).is_err()); // dim 0 has size 2
/// # Ok(()) }
/// ```
pub fn squeeze(x: &Var, dim: usize) -> Result<Var> {
    let out = x.value().squeeze(dim).map_err(named("squeeze"))?;
    record_reshape("squeeze", Traced::Squeeze(dim), x, out)
}

/// A dim of size 1 inserted before dim `dim` (the rank appends one), as [`Tensor::unsqueeze`]:
/// shares `x`'s memory. Backward: the gradient reshaped to `x`'s shape.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?);
/// let y = ops::unsqueeze(&x, 0)?;
/// assert_eq!(y.value().dims(), [1, 2]);
/// let g = Tensor::from_vec(vec![5.0f32, 6.0], [1, 2], Device::Cpu)?;
/// assert_eq!(tape.backward_with(&y, g)?.get(&x).unwrap().dims(), [2]);
/// assert!(ops::unsqueeze(&x, 2).is_err()); // past the rank
/// # Ok(()) }
/// ```
pub fn unsqueeze(x: &Var, dim: usize) -> Result<Var> {
    let out = x.value().unsqueeze(dim).map_err(named("unsqueeze"))?;
    record_reshape("unsqueeze", Traced::Unsqueeze(dim), x, out)
}

/// The same elements under another shape with the same element count, as
/// [`Tensor::reshape`]: shares `x`'s memory. Backward: the gradient reshaped to `x`'s shape.
///
/// In an ONNX export with a dynamic batch, see [`Tracer`](crate::onnx::Tracer) for how the
/// leading dim is written.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3], Device::Cpu)?);
/// let y = ops::reshape(&x, [3, 2])?;
/// let w = tape.var(Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0, 1.0, 0.0], [3, 2], Device::Cpu)?);
/// let grads = tape.backward(&ops::sum(&ops::mul(&y, &w)?)?)?;
/// let gx = grads.get(&x).unwrap();
/// assert_eq!(gx.dims(), [2, 3]);
/// assert_eq!(gx.to_vec::<f32>()?, [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]); // w, in x's shape
/// assert!(ops::reshape(&x, [4, 2]).is_err()); // 8 elements, not 6
/// # Ok(()) }
/// ```
pub fn reshape(x: &Var, shape: impl Into<Shape>) -> Result<Var> {
    let out = x.value().reshape(shape).map_err(named("reshape"))?;
    let traced = Traced::Reshape { from: x.value().dims().to_vec(), to: out.dims().to_vec() };
    record_reshape("reshape", traced, x, out)
}

/// The values converted to `dtype`, as [`Tensor::to_dtype`] (rounded to nearest even).
/// Backward: the gradient converted back to `x`'s dtype.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{DType, Device, Tensor, bf16};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![bf16::from_f32(1.5), bf16::from_f32(-2.0)], [2], Device::Cpu)?);
/// let y = ops::to_dtype(&x, DType::F32)?; // compute in f32
/// assert_eq!(y.value().to_vec::<f32>()?, [1.5, -2.0]);
/// let grads = tape.backward(&ops::sum(&ops::mul(&y, &y)?)?)?;
/// let gx = grads.get(&x).unwrap();
/// assert_eq!(gx.dtype(), DType::BF16); // the gradient has x's dtype
/// assert_eq!(gx.to_vec::<bf16>()?, [bf16::from_f32(3.0), bf16::from_f32(-4.0)]);
/// # Ok(()) }
/// ```
pub fn to_dtype(x: &Var, dtype: DType) -> Result<Var> {
    let out = x.value().to_dtype(dtype).map_err(named("to_dtype"))?;
    record_or_constant!("to_dtype", Traced::ToDtype(dtype), &[x], out, |tape| {
        let from = x.value().dtype();
        record_moving(&tape, "to_dtype", &[x], out, move |g| Ok(vec![Some(g.to_dtype(from)?)]))
    })
}

/// The shape ops as methods, named as on [`Tensor`].
impl Var {
    /// [`ops::narrow`](narrow): elements `start..start + len` along `dim`.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::Var;
    /// use opsmith_host::{Device, Tensor};
    /// let x = Var::constant(Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [4], Device::Cpu)?);
    /// assert_eq!(x.narrow(0, 1, 2)?.value().to_vec::<f32>()?, [2.0, 3.0]);
    /// # Ok(()) }
    /// ```
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Var> {
        narrow(self, dim, start, len)
    }

    /// [`ops::permute`](permute): dim `k` of the result is dim `order[k]` of this variable.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::Var;
    /// use opsmith_host::{DType, Device, Tensor};
    /// let x = Var::constant(Tensor::zeros([2, 3, 4], DType::F32, Device::Cpu)?);
    /// assert_eq!(x.permute(&[1, 2, 0])?.value().dims(), [3, 4, 2]);
    /// # Ok(()) }
    /// ```
    pub fn permute(&self, order: &[usize]) -> Result<Var> {
        permute(self, order)
    }

    /// [`ops::transpose`](transpose): dims `a` and `b` swapped.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::Var;
    /// use opsmith_host::{Device, Tensor};
    /// let x = Var::constant(Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2], Device::Cpu)?);
    /// assert_eq!(x.transpose(0, 1)?.value().to_vec::<f32>()?, [1.0, 3.0, 2.0, 4.0]);
    /// # Ok(()) }
    /// ```
    pub fn transpose(&self, a: usize, b: usize) -> Result<Var> {
        transpose(self, a, b)
    }

    /// [`ops::cat`](cat): the variables joined along `dim`.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::Var;
    /// use opsmith_host::{Device, Tensor};
    /// let a = Var::constant(Tensor::from_vec(vec![1.0f32], [1], Device::Cpu)?);
    /// let b = Var::constant(Tensor::from_vec(vec![2.0f32, 3.0], [2], Device::Cpu)?);
    /// assert_eq!(Var::cat(&[&a, &b], 0)?.value().to_vec::<f32>()?, [1.0, 2.0, 3.0]);
    /// # Ok(()) }
    /// ```
    pub fn cat(vars: &[&Var], dim: usize) -> Result<Var> {
        cat(vars, dim)
    }

    /// [`ops::stack`](stack): the variables stacked along a new dim `dim`.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::Var;
    /// use opsmith_host::{Device, Tensor};
    /// let a = Var::constant(Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?);
    /// assert_eq!(Var::stack(&[&a, &a, &a], 0)?.value().dims(), [3, 2]);
    /// # Ok(()) }
    /// ```
    pub fn stack(vars: &[&Var], dim: usize) -> Result<Var> {
        stack(vars, dim)
    }

    /// [`ops::squeeze`](squeeze): dim `dim`, of size 1, removed.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::Var;
    /// use opsmith_host::{DType, Device, Tensor};
    /// let x = Var::constant(Tensor::zeros([1, 3], DType::F32, Device::Cpu)?);
    /// assert_eq!(x.squeeze(0)?.value().dims(), [3]);
    /// # Ok(()) }
    /// ```
    pub fn squeeze(&self, dim: usize) -> Result<Var> {
        squeeze(self, dim)
    }

    /// [`ops::unsqueeze`](unsqueeze): a dim of size 1 inserted before dim `dim`.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::Var;
    /// use opsmith_host::{DType, Device, Tensor};
    /// let x = Var::constant(Tensor::zeros([3], DType::F32, Device::Cpu)?);
    /// assert_eq!(x.unsqueeze(1)?.value().dims(), [3, 1]);
    /// # Ok(()) }
    /// ```
    pub fn unsqueeze(&self, dim: usize) -> Result<Var> {
        unsqueeze(self, dim)
    }

    /// [`ops::reshape`](reshape): the same elements under another shape.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::Var;
    /// use opsmith_host::{DType, Device, Tensor};
    /// let x = Var::constant(Tensor::zeros([2, 3], DType::F32, Device::Cpu)?);
    /// assert_eq!(x.reshape([6])?.value().dims(), [6]);
    /// # Ok(()) }
    /// ```
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Var> {
        reshape(self, shape)
    }

    /// [`ops::to_dtype`](to_dtype): the values converted to `dtype`.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::Var;
    /// use opsmith_host::{DType, Device, Tensor, f16};
    /// let x = Var::constant(Tensor::from_vec(vec![0.5f32, 65520.0], [2], Device::Cpu)?);
    /// let h = x.to_dtype(DType::F16)?;
    /// assert_eq!(h.value().to_vec::<f16>()?, [f16::from_f32(0.5), f16::INFINITY]);
    /// # Ok(()) }
    /// ```
    pub fn to_dtype(&self, dtype: DType) -> Result<Var> {
        to_dtype(self, dtype)
    }
}
