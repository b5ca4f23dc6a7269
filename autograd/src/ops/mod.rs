//! Differentiable ops. Each computes its forward with `opsmith_host::ops` and, when an input
//! requires gradients, records a node that saves only what its backward needs (an input's
//! partner is saved only when that input needs a gradient). Every backward runs on the tensors'
//! device: on CUDA, the gradients never visit the host.
//!
//! ```
//! # fn main() -> opsmith_autograd::Result<()> {
//! use opsmith_autograd::{Tape, ops};
//! use opsmith_host::{Device, Tensor};
//! let device = Device::cuda_if_available();
//! let tape = Tape::new();
//! let x = tape.var(Tensor::from_vec(vec![0.5f32, -1.0, 2.0, 1.5], [2, 2], device)?);
//! let w = tape.var(Tensor::from_vec(vec![2.0f32, 1.0, -1.0, 0.5], [2, 2], device)?);
//! let b = tape.var(Tensor::from_vec(vec![0.25f32, -0.25], [2], device)?);
//! let y = ops::add_row(&ops::mul(&x, &w)?, &b)?; // x * w + b, b added to each row
//! let loss = ops::mean(&ops::mul(&y, &y)?)?;
//! let grads = tape.backward(&loss)?;
//! assert_eq!(grads.get(&b).unwrap().dims(), [2]);
//! # Ok(()) }
//! ```
use crate::Result;
use crate::onnx::trace::{self, Traced};
use crate::tape::{Grad, Like, Var, tracking};
use opsmith_host::{Labels, Tensor, ops as host};

/// Returns the output as a constant when nothing is tracked, else records it.
/// Either way, tells a running ONNX tracer what `$traced` op it was: of `$inputs`, or of
/// `$traced_inputs` when given (a broadcasting op traces its operands before the broadcast,
/// since ONNX's ops broadcast themselves).
macro_rules! record_or_constant {
    ($op:expr, $traced:expr, $inputs:expr, $out:expr, |$tape:ident| $record:expr) => {
        record_or_constant!($op, $traced, $inputs, traced_as $inputs, $out, |$tape| $record)
    };
    ($op:expr, $traced:expr, $inputs:expr, traced_as $traced_inputs:expr, $out:expr, |$tape:ident| $record:expr) => {{
        let var = match tracking($op, $inputs)? {
            None => Var::constant($out),
            Some($tape) => $record,
        };
        trace::note(|| $traced, $traced_inputs, &var);
        Ok(var)
    }};
}

// After the macro, which they use.
mod attention;
mod index;
mod layout;
pub use attention::attention;
pub use index::{broadcast_as, gather, index_select, max_dim, sum_dim};
pub use layout::{cat, narrow, permute, reshape, squeeze, stack, to_dtype, transpose, unsqueeze};

/// `t * v` as a gradient, when `t` was saved (its partner needs a gradient).
fn scaled(t: Option<&Tensor>, v: f64) -> Result<Option<Grad>> {
    Ok(t.map(|t| host::scale(t, v)).transpose()?.map(Grad::Tensor))
}

/// The value saved for an input's partner when that input needs a gradient.
fn save_if(needed: bool, t: &Tensor) -> Option<Tensor> {
    needed.then(|| t.clone())
}

fn saved_refs(saved: &[&Option<Tensor>]) -> Vec<Tensor> {
    saved.iter().filter_map(|t| (*t).clone()).collect()
}

/// `a + b`. Backward: `ga = g`, `gb = g`. Shapes broadcast ([`broadcast_as`] each operand to
/// the common shape, whose backward sums the gradient back), as for [`sub`], [`mul`] and [`div`].
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let a = tape.var(Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?);
/// let b = tape.var(Tensor::from_vec(vec![3.0f32, 4.0], [2], Device::Cpu)?);
/// let c = ops::add(&a, &b)?;
/// assert_eq!(c.value().to_vec::<f32>()?, [4.0, 6.0]);
/// let grads = tape.backward(&ops::sum(&c)?)?;
/// assert_eq!(grads.get(&b).unwrap().to_vec::<f32>()?, [1.0, 1.0]);
/// # Ok(()) }
/// ```
pub fn add(a: &Var, b: &Var) -> Result<Var> {
    let operands = [a, b];
    let (a, b) = &index::broadcast_operands("add", a, b)?;
    let out = host::add(a.value(), b.value())?;
    record_or_constant!("add", Traced::Add, &[a, b], traced_as & operands, out, |tape| {
        let like = Like::of(&out);
        tape.record_with_uniform(
            "add",
            &[a, b],
            out,
            &[],
            |g| Ok(vec![Some(g.clone()), Some(g.clone())]),
            move |v| Ok(vec![Some(Grad::uniform(v, &like)), Some(Grad::uniform(v, &like))]),
        )
    })
}

/// `a - b`. Backward: `ga = g`, `gb = -g`.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let a = tape.var(Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?);
/// let b = tape.var(Tensor::from_vec(vec![3.0f32, 5.0], [2], Device::Cpu)?);
/// let grads = tape.backward(&ops::sum(&ops::sub(&a, &b)?)?)?;
/// assert_eq!(grads.get(&b).unwrap().to_vec::<f32>()?, [-1.0, -1.0]);
/// # Ok(()) }
/// ```
pub fn sub(a: &Var, b: &Var) -> Result<Var> {
    let operands = [a, b];
    let (a, b) = &index::broadcast_operands("sub", a, b)?;
    let out = host::sub(a.value(), b.value())?;
    let b_needs = b.requires_grad();
    record_or_constant!("sub", Traced::Sub, &[a, b], traced_as & operands, out, |tape| {
        let like = Like::of(&out);
        tape.record_with_uniform(
            "sub",
            &[a, b],
            out,
            &[],
            move |g| Ok(vec![Some(g.clone()), if b_needs { Some(host::neg(g)?) } else { None }]),
            move |v| Ok(vec![Some(Grad::uniform(v, &like)), Some(Grad::uniform(-v, &like))]),
        )
    })
}

/// `a * b`. Backward: `ga = g * b`, `gb = g * a`.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let a = tape.var(Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?);
/// let b = tape.var(Tensor::from_vec(vec![3.0f32, 5.0], [2], Device::Cpu)?);
/// let grads = tape.backward(&ops::sum(&ops::mul(&a, &b)?)?)?;
/// assert_eq!(grads.get(&a).unwrap().to_vec::<f32>()?, [3.0, 5.0]); // b
/// assert_eq!(grads.get(&b).unwrap().to_vec::<f32>()?, [1.0, 2.0]); // a
/// # Ok(()) }
/// ```
pub fn mul(a: &Var, b: &Var) -> Result<Var> {
    let operands = [a, b];
    let (a, b) = &index::broadcast_operands("mul", a, b)?;
    let out = host::mul(a.value(), b.value())?;
    record_or_constant!("mul", Traced::Mul, &[a, b], traced_as & operands, out, |tape| {
        let (saved_b, saved_a) = (save_if(a.requires_grad(), b.value()), save_if(b.requires_grad(), a.value()));
        let keep = saved_refs(&[&saved_a, &saved_b]);
        let (uniform_b, uniform_a) = (saved_b.clone(), saved_a.clone());
        tape.record_with_uniform(
            "mul",
            &[a, b],
            out,
            &keep.iter().collect::<Vec<_>>(),
            move |g| {
                Ok(vec![
                    saved_b.as_ref().map(|b| host::mul(g, b)).transpose()?,
                    saved_a.as_ref().map(|a| host::mul(g, a)).transpose()?,
                ])
            },
            // g * b for a uniform g is one scaling kernel, with no gradient tensor to fill.
            move |v| Ok(vec![scaled(uniform_b.as_ref(), v)?, scaled(uniform_a.as_ref(), v)?]),
        )
    })
}

/// `a / b`. Backward: `ga = g / b`, `gb = −g·a/b² = −(g / b)·(a / b)`.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let a = tape.var(Tensor::from_vec(vec![1.0f32, 6.0], [2], Device::Cpu)?);
/// let b = tape.var(Tensor::from_vec(vec![2.0f32, 4.0], [2], Device::Cpu)?);
/// let q = ops::div(&a, &b)?;
/// assert_eq!(q.value().to_vec::<f32>()?, [0.5, 1.5]);
/// let grads = tape.backward(&ops::sum(&q)?)?;
/// assert_eq!(grads.get(&a).unwrap().to_vec::<f32>()?, [0.5, 0.25]); // 1 / b
/// assert_eq!(grads.get(&b).unwrap().to_vec::<f32>()?, [-0.25, -0.375]); // -a / b²
/// # Ok(()) }
/// ```
pub fn div(a: &Var, b: &Var) -> Result<Var> {
    let operands = [a, b];
    let (a, b) = &index::broadcast_operands("div", a, b)?;
    let out = host::div(a.value(), b.value())?;
    record_or_constant!("div", Traced::Div, &[a, b], traced_as & operands, out, |tape| {
        let (a_needs, b_needs) = (a.requires_grad(), b.requires_grad());
        let saved_b = b.value().clone();
        let saved_out = save_if(b_needs, &out);
        let keep = saved_refs(&[&Some(saved_b.clone()), &saved_out]);
        tape.record("div", &[a, b], out, &keep.iter().collect::<Vec<_>>(), move |g| {
            let g_over_b = host::div(g, &saved_b)?;
            let gb = match &saved_out {
                // −(g / b)·(a / b): the quotient is the forward's output.
                Some(q) => Some(host::neg(&host::mul(&g_over_b, q)?)?),
                None => None,
            };
            Ok(vec![a_needs.then_some(g_over_b), gb])
        })
    })
}

/// `-x`. Backward: `-g`.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![1.0f32, -2.0], [2], Device::Cpu)?);
/// let y = ops::neg(&x)?;
/// assert_eq!(y.value().to_vec::<f32>()?, [-1.0, 2.0]);
/// let grads = tape.backward(&ops::sum(&y)?)?;
/// assert_eq!(grads.get(&x).unwrap().to_vec::<f32>()?, [-1.0, -1.0]);
/// # Ok(()) }
/// ```
pub fn neg(x: &Var) -> Result<Var> {
    scale(x, -1.0)
}

/// `x * alpha` for a scalar. Backward: `g * alpha`.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![1.0f32, -2.0], [2], Device::Cpu)?);
/// let grads = tape.backward(&ops::sum(&ops::scale(&x, 0.5)?)?)?;
/// assert_eq!(grads.get(&x).unwrap().to_vec::<f32>()?, [0.5, 0.5]);
/// # Ok(()) }
/// ```
pub fn scale(x: &Var, alpha: f64) -> Result<Var> {
    let out = host::scale(x.value(), alpha)?;
    record_or_constant!("scale", Traced::Scale(alpha), &[x], out, |tape| {
        let like = Like::of(&out);
        tape.record_with_uniform(
            "scale",
            &[x],
            out,
            &[],
            move |g| Ok(vec![Some(host::scale(g, alpha)?)]),
            move |v| Ok(vec![Some(Grad::uniform(v * alpha, &like))]),
        )
    })
}

/// `x + beta` for a scalar. Backward: `g`.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![1.0f32, -2.0], [2], Device::Cpu)?);
/// let y = ops::add_scalar(&x, 1.0)?;
/// assert_eq!(y.value().to_vec::<f32>()?, [2.0, -1.0]);
/// let grads = tape.backward(&ops::sum(&y)?)?;
/// assert_eq!(grads.get(&x).unwrap().to_vec::<f32>()?, [1.0, 1.0]);
/// # Ok(()) }
/// ```
pub fn add_scalar(x: &Var, beta: f64) -> Result<Var> {
    let out = host::add_scalar(x.value(), beta)?;
    record_or_constant!("add_scalar", Traced::AddScalar(beta), &[x], out, |tape| {
        let like = Like::of(&out);
        tape.record_with_uniform(
            "add_scalar",
            &[x],
            out,
            &[],
            |g| Ok(vec![Some(g.clone())]),
            move |v| Ok(vec![Some(Grad::uniform(v, &like))]),
        )
    })
}

/// The sum of all elements (shape `[]`). Backward: `g` broadcast to `x`'s shape.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2], Device::Cpu)?);
/// let total = ops::sum(&x)?;
/// assert_eq!(total.value().to_vec::<f32>()?, [10.0]);
/// let grads = tape.backward(&total)?;
/// assert_eq!(grads.get(&x).unwrap().to_vec::<f32>()?, [1.0; 4]);
/// # Ok(()) }
/// ```
pub fn sum(x: &Var) -> Result<Var> {
    let out = host::sum(x.value())?;
    record_or_constant!("sum", Traced::Sum, &[x], out, |tape| {
        let shape = x.value().shape().clone();
        let like = Like::of(x.value());
        tape.record_with_uniform(
            "sum",
            &[x],
            out,
            &[],
            move |g| Ok(vec![Some(host::expand_scalar(g, shape.clone(), 1.0)?)]),
            move |v| Ok(vec![Some(Grad::uniform(v, &like))]),
        )
    })
}

/// The mean of all elements (shape `[]`). Backward: `g / n` broadcast to `x`'s shape.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 6.0], [4], Device::Cpu)?);
/// let mean = ops::mean(&x)?;
/// assert_eq!(mean.value().to_vec::<f32>()?, [3.0]);
/// let grads = tape.backward(&mean)?;
/// assert_eq!(grads.get(&x).unwrap().to_vec::<f32>()?, [0.25; 4]);
/// # Ok(()) }
/// ```
pub fn mean(x: &Var) -> Result<Var> {
    let out = host::mean(x.value())?;
    let n = x.value().elem_count() as f64;
    record_or_constant!("mean", Traced::Mean, &[x], out, |tape| {
        let shape = x.value().shape().clone();
        let like = Like::of(x.value());
        tape.record_with_uniform(
            "mean",
            &[x],
            out,
            &[],
            move |g| Ok(vec![Some(host::expand_scalar(g, shape.clone(), 1.0 / n)?)]),
            move |v| Ok(vec![Some(Grad::uniform(v / n, &like))]),
        )
    })
}

/// `a * b + c` in one kernel. Backward: `ga = g * b`, `gb = g * a`, `gc = g`.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let a = tape.var(Tensor::from_vec(vec![2.0f32, 3.0], [2], Device::Cpu)?);
/// let b = tape.var(Tensor::from_vec(vec![4.0f32, 5.0], [2], Device::Cpu)?);
/// let c = tape.var(Tensor::from_vec(vec![1.0f32, -1.0], [2], Device::Cpu)?);
/// let d = ops::fused_mul_add(&a, &b, &c)?;
/// assert_eq!(d.value().to_vec::<f32>()?, [9.0, 14.0]);
/// let grads = tape.backward(&ops::sum(&d)?)?;
/// assert_eq!(grads.get(&a).unwrap().to_vec::<f32>()?, [4.0, 5.0]);
/// assert_eq!(grads.get(&c).unwrap().to_vec::<f32>()?, [1.0, 1.0]);
/// # Ok(()) }
/// ```
pub fn fused_mul_add(a: &Var, b: &Var, c: &Var) -> Result<Var> {
    let out = host::fused_mul_add(a.value(), b.value(), c.value())?;
    record_or_constant!("fused_mul_add", Traced::FusedMulAdd, &[a, b, c], out, |tape| {
        let (saved_b, saved_a) = (save_if(a.requires_grad(), b.value()), save_if(b.requires_grad(), a.value()));
        let keep = saved_refs(&[&saved_a, &saved_b]);
        let (uniform_b, uniform_a, like) = (saved_b.clone(), saved_a.clone(), Like::of(&out));
        tape.record_with_uniform(
            "fused_mul_add",
            &[a, b, c],
            out,
            &keep.iter().collect::<Vec<_>>(),
            move |g| {
                Ok(vec![
                    saved_b.as_ref().map(|b| host::mul(g, b)).transpose()?,
                    saved_a.as_ref().map(|a| host::mul(g, a)).transpose()?,
                    Some(g.clone()),
                ])
            },
            move |v| {
                Ok(vec![scaled(uniform_b.as_ref(), v)?, scaled(uniform_a.as_ref(), v)?, Some(Grad::uniform(v, &like))])
            },
        )
    })
}

/// `z = (x + y) * w` in one kernel.
///
/// Backward: when `w` and `x` or `y` need gradients, one fused kernel writes `g * w` (the
/// gradient of both `x` and `y`) and `g * (x + y)`. When `x`, `y` and `w` all need gradients,
/// that kernel writes `g * w` into two tensors, one for `x` and one for `y`, as no two
/// variables' gradients share memory. Otherwise only the gradient needed is computed, and only
/// the tensors it needs are saved (when both `x` and `y` need `g * w` but `w` needs nothing,
/// [`Tape::backward`](crate::Tape::backward) gives one of them a copy).
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?);
/// let y = tape.var(Tensor::from_vec(vec![3.0f32, 4.0], [2], Device::Cpu)?);
/// let w = tape.var(Tensor::from_vec(vec![0.5f32, 2.0], [2], Device::Cpu)?);
/// let z = ops::add_mul(&x, &y, &w)?;
/// assert_eq!(z.value().to_vec::<f32>()?, [2.0, 12.0]);
/// let grads = tape.backward(&ops::sum(&z)?)?;
/// let (gx, gy) = (grads.get(&x).unwrap(), grads.get(&y).unwrap());
/// assert_eq!(gx.to_vec::<f32>()?, [0.5, 2.0]); // w
/// assert_eq!(gy.to_vec::<f32>()?, [0.5, 2.0]); // w too
/// assert!(!gx.shares_storage(gy)); // each its own tensor
/// assert_eq!(grads.get(&w).unwrap().to_vec::<f32>()?, [4.0, 6.0]); // x + y
/// # Ok(()) }
/// ```
pub fn add_mul(x: &Var, y: &Var, w: &Var) -> Result<Var> {
    let out = host::add_mul(x.value(), y.value(), w.value())?;
    record_or_constant!("add_mul", Traced::AddMul, &[x, y, w], out, |tape| {
        let (x_need, y_need, w_need) = (x.requires_grad(), y.requires_grad(), w.requires_grad());
        // Two variables that each need `g * w`: the kernel writes it twice, so neither needs a
        // copy at the end of backward.
        let split = x_need && y_need && w_need && x.id() != y.id();
        let saved_w = save_if(x_need || y_need, w.value());
        let saved_x = save_if(w_need, x.value());
        let saved_y = save_if(w_need, y.value());
        let keep = saved_refs(&[&saved_x, &saved_y, &saved_w]);
        let saved = (saved_x, saved_y, saved_w);
        let uniform_saved = saved.clone();
        let like = Like::of(&out);
        tape.record_with_uniform(
            "add_mul",
            &[x, y, w],
            out,
            &keep.iter().collect::<Vec<_>>(),
            move |g| {
                let (gxy, gw) = match &saved {
                    (Some(x), Some(y), Some(w)) if split => {
                        let (gx, gy, gw) = host::add_mul_backward_split(g, x, y, w)?;
                        return Ok(vec![Some(gx), Some(gy), Some(gw)]);
                    }
                    (Some(x), Some(y), Some(w)) => {
                        let (gxy, gw) = host::add_mul_backward(g, x, y, w)?;
                        (Some(gxy), Some(gw))
                    }
                    (_, _, Some(w)) => (Some(host::mul(g, w)?), None),
                    // (x + y) * g is the forward's own fused kernel.
                    (Some(x), Some(y), None) => (None, Some(host::add_mul(x, y, g)?)),
                    _ => (None, None),
                };
                Ok(vec![gxy.clone().filter(|_| x_need), gxy.filter(|_| y_need), gw])
            },
            // A uniform g (under a sum or mean) is a kernel parameter: no gradient tensor to fill
            // or read.
            move |v| {
                let (gxy, gw) = match &uniform_saved {
                    (Some(x), Some(y), Some(w)) if split => {
                        let (gx, gy, gw) = host::add_mul_backward_split_uniform(v, x, y, w)?;
                        return Ok([gx, gy, gw].map(|t| Some(Grad::Tensor(t))).into());
                    }
                    (Some(x), Some(y), Some(w)) => {
                        let (gxy, gw) = host::add_mul_backward_uniform(v, x, y, w)?;
                        (Some(gxy), Some(gw))
                    }
                    (_, _, Some(w)) => (Some(host::scale(w, v)?), None),
                    (Some(x), Some(y), None) => (None, Some(host::add_mul(x, y, &like.fill(v)?)?)),
                    _ => (None, None),
                };
                let gxy = gxy.map(Grad::Tensor);
                let gw = gw.map(Grad::Tensor);
                Ok(vec![gxy.as_ref().filter(|_| x_need).map(Grad::share), gxy.filter(|_| y_need), gw])
            },
        )
    })
}

/// `x + b` for a matrix `x` of shape `[rows, cols]` and a bias row `b` of shape `[cols]`.
/// Backward: `gx = g`, `gb = g` summed over rows.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [3, 2], Device::Cpu)?);
/// let b = tape.var(Tensor::from_vec(vec![10.0f32, 20.0], [2], Device::Cpu)?);
/// let y = ops::add_row(&x, &b)?;
/// assert_eq!(y.value().to_vec::<f32>()?, [11.0, 22.0, 13.0, 24.0, 15.0, 26.0]);
/// let grads = tape.backward(&ops::sum(&y)?)?;
/// assert_eq!(grads.get(&b).unwrap().to_vec::<f32>()?, [3.0, 3.0]); // one per row
/// # Ok(()) }
/// ```
pub fn add_row(x: &Var, b: &Var) -> Result<Var> {
    let out = host::add_row(x.value(), b.value())?;
    let b_needs = b.requires_grad();
    record_or_constant!("add_row", Traced::AddRow, &[x, b], out, |tape| tape.record(
        "add_row",
        &[x, b],
        out,
        &[],
        move |g| { Ok(vec![Some(g.clone()), if b_needs { Some(host::sum_rows(g)?) } else { None }]) }
    ))
}

/// `a · b`: matrices `[m, k] · [k, n]`, or batches `[B, m, k] · [B, k, n]`; on CUDA through
/// cuBLAS. Backward: `ga = g · bᵀ`, `gb = aᵀ · g`, each one GEMM with a transpose flag (no copy).
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let a = tape.var(Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2], Device::Cpu)?);
/// let b = tape.var(Tensor::from_vec(vec![0.5f32, -1.0], [2, 1], Device::Cpu)?);
/// let y = ops::matmul(&a, &b)?;
/// assert_eq!(y.value().to_vec::<f32>()?, [-1.5, -2.5]);
/// let grads = tape.backward(&ops::sum(&y)?)?;
/// assert_eq!(grads.get(&b).unwrap().to_vec::<f32>()?, [4.0, 6.0]); // column sums of a
/// # Ok(()) }
/// ```
pub fn matmul(a: &Var, b: &Var) -> Result<Var> {
    let out = host::matmul(a.value(), b.value())?;
    record_or_constant!("matmul", Traced::Matmul, &[a, b], out, |tape| {
        let (saved_b, saved_a) = (save_if(a.requires_grad(), b.value()), save_if(b.requires_grad(), a.value()));
        let keep = saved_refs(&[&saved_a, &saved_b]);
        tape.record("matmul", &[a, b], out, &keep.iter().collect::<Vec<_>>(), move |g| {
            Ok(vec![
                saved_b.as_ref().map(|b| host::matmul_t(g, false, b, true)).transpose()?,
                saved_a.as_ref().map(|a| host::matmul_t(a, true, g, false)).transpose()?,
            ])
        })
    })
}

/// A linear layer, `x · w + b` for `x [m, k]`, `w [k, n]` and a bias `b [n]`: one op, on CUDA
/// one kernel for a small product (see [`opsmith_host::ops::linear`]). Backward:
/// `gx = g · wᵀ`, `gw = xᵀ · g`, `gb = g` summed over rows, each computed only when wanted.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2], Device::Cpu)?);
/// let w = tape.var(Tensor::from_vec(vec![1.0f32, -1.0], [2, 1], Device::Cpu)?);
/// let b = tape.var(Tensor::from_vec(vec![0.5f32], [1], Device::Cpu)?);
/// let y = ops::linear(&x, &w, &b)?;
/// assert_eq!(y.value().to_vec::<f32>()?, [-0.5, -0.5]);
/// let grads = tape.backward(&ops::sum(&y)?)?;
/// assert_eq!(grads.get(&w).unwrap().to_vec::<f32>()?, [4.0, 6.0]); // column sums of x
/// assert_eq!(grads.get(&b).unwrap().to_vec::<f32>()?, [2.0]); // one per row
/// # Ok(()) }
/// ```
pub fn linear(x: &Var, w: &Var, b: &Var) -> Result<Var> {
    linear_layer(x, w, b, false)
}

/// A linear layer then a ReLU, `max(x · w + b, 0)`: one op, on CUDA one kernel for a small
/// product (see [`opsmith_host::ops::linear_relu`]). Backward: `d = g · [y > 0]` from the
/// output `y`, then `gx = d · wᵀ`, `gw = xᵀ · d`, `gb = d` summed over rows.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2], Device::Cpu)?);
/// let w = tape.var(Tensor::from_vec(vec![1.0f32, -1.0], [2, 1], Device::Cpu)?);
/// let b = tape.var(Tensor::from_vec(vec![1.5f32], [1], Device::Cpu)?);
/// let y = ops::linear_relu(&x, &w, &b)?; // rows: 1 - 2 + 1.5, 3 - 4 + 1.5
/// assert_eq!(y.value().to_vec::<f32>()?, [0.5, 0.5]);
/// let grads = tape.backward(&ops::sum(&y)?)?;
/// assert_eq!(grads.get(&x).unwrap().to_vec::<f32>()?, [1.0, -1.0, 1.0, -1.0]);
/// # Ok(()) }
/// ```
pub fn linear_relu(x: &Var, w: &Var, b: &Var) -> Result<Var> {
    linear_layer(x, w, b, true)
}

/// [`linear`], or [`linear_relu`] when `relu`.
fn linear_layer(x: &Var, w: &Var, b: &Var, relu: bool) -> Result<Var> {
    let op = if relu { "linear_relu" } else { "linear" };
    let out = if relu {
        host::linear_relu(x.value(), w.value(), b.value())?
    } else {
        host::linear(x.value(), w.value(), b.value())?
    };
    record_or_constant!(op, Traced::Linear { relu }, &[x, w, b], out, |tape| {
        let (saved_w, saved_x) = (save_if(x.requires_grad(), w.value()), save_if(w.requires_grad(), x.value()));
        let b_needs = b.requires_grad();
        // The ReLU's gradient needs only where the output is positive.
        let saved_y = relu.then(|| out.clone());
        let keep = saved_refs(&[&saved_w, &saved_x, &saved_y]);
        tape.record(op, &[x, w, b], out, &keep.iter().collect::<Vec<_>>(), move |g| {
            // Both parameters' gradients come from one op (on CUDA one launch, which reads `g`
            // through the ReLU's mask), so the masked gradient is a tensor only when the
            // input's gradient, or a lone parameter's, needs it.
            let both = saved_x.is_some() && b_needs;
            let masked = match &saved_y {
                Some(y) if saved_w.is_some() || !both => Some(host::relu_backward(g, y)?),
                _ => None,
            };
            let d = masked.as_ref().unwrap_or(g);
            let dx = saved_w.as_ref().map(|w| host::matmul_t(d, false, w, true)).transpose()?;
            let (dw, db) = match &saved_x {
                Some(x) if both => {
                    let mask = if masked.is_none() { saved_y.as_ref() } else { None };
                    let (dw, db) = host::linear_grads(x, d, mask)?;
                    (Some(dw), Some(db))
                }
                _ => (
                    saved_x.as_ref().map(|x| host::matmul_t(x, true, d, false)).transpose()?,
                    if b_needs { Some(host::sum_rows(d)?) } else { None },
                ),
            };
            Ok(vec![dx, dw, db])
        })
    })
}

/// A two-layer block, `relu(x · w1 + b1) · w2 + b2` for `x [m, d_in]`, `w1 [d_in, hidden]`,
/// `w2 [hidden, d_out]`: the values of [`linear_relu`] then [`linear`] as one op, which on CUDA,
/// for narrow inputs and outputs, is one launch forward (see
/// [`opsmith_host::ops::linear_relu_linear`]). [`nn::Mlp`](crate::nn::Mlp) takes it for its
/// last two layers when its activation is ReLU.
///
/// Backward, with `d = (g · w2ᵀ) · [h > 0]` the hidden layer's gradient: `gw2 = hᵀ · g`,
/// `gb2 = Σ_rows g` (one [`linear_grads`](opsmith_host::ops::linear_grads) launch),
/// `gw1 = xᵀ · d`, `gb1 = Σ_rows d` (one launch that computes `d` as it reads it, when `x` needs
/// no gradient) and `gx = d · w1ᵀ`, each only when wanted. The values are the separate layers'
/// (on CUDA the same bits with 33 to 256 hidden units and up to 1024 rows).
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0], [1, 2], Device::Cpu)?);
/// let w1 = tape.var(Tensor::from_vec(vec![1.0f32, -1.0, 1.0, -1.0], [2, 2], Device::Cpu)?);
/// let b1 = tape.var(Tensor::from_vec(vec![0.5f32, 0.5], [2], Device::Cpu)?);
/// let w2 = tape.var(Tensor::from_vec(vec![2.0f32, 1.0], [2, 1], Device::Cpu)?);
/// let b2 = tape.var(Tensor::from_vec(vec![-1.0f32], [1], Device::Cpu)?);
/// let y = ops::linear_relu_linear(&x, &w1, &b1, &w2, &b2)?; // h = [3.5, 0]
/// assert_eq!(y.value().to_vec::<f32>()?, [6.0]);
/// let grads = tape.backward(&ops::sum(&y)?)?;
/// assert_eq!(grads.get(&w2).unwrap().to_vec::<f32>()?, [3.5, 0.0]); // hᵀ
/// assert_eq!(grads.get(&b1).unwrap().to_vec::<f32>()?, [2.0, 0.0]); // w2ᵀ where h > 0
/// assert_eq!(grads.get(&x).unwrap().to_vec::<f32>()?, [2.0, 2.0]); // d · w1ᵀ
/// # Ok(()) }
/// ```
pub fn linear_relu_linear(x: &Var, w1: &Var, b1: &Var, w2: &Var, b2: &Var) -> Result<Var> {
    let op = "linear_relu_linear";
    let (out, h) = host::linear_relu_linear(x.value(), w1.value(), b1.value(), w2.value(), b2.value())?;
    record_or_constant!(op, Traced::LinearReluLinear, &[x, w1, b1, w2, b2], out, |tape| {
        let (x_needs, w1_needs, b1_needs) = (x.requires_grad(), w1.requires_grad(), b1.requires_grad());
        let (w2_needs, b2_needs) = (w2.requires_grad(), b2.requires_grad());
        let first_needs = x_needs || w1_needs || b1_needs;
        // The hidden layer is saved when either layer's gradients need it; `w2` when the first
        // layer's do; `x` for `gw1`, `w1` for `gx`.
        let saved_h = (first_needs || w2_needs).then(|| h.clone());
        let saved_w2 = save_if(first_needs, w2.value());
        let (saved_x, saved_w1) = (save_if(w1_needs, x.value()), save_if(x_needs, w1.value()));
        let keep = saved_refs(&[&saved_h, &saved_w2, &saved_x, &saved_w1]);
        tape.record(op, &[x, w1, b1, w2, b2], out, &keep.iter().collect::<Vec<_>>(), move |g| {
            // The second layer: a plain linear layer's gradients over the hidden layer.
            let (dw2, db2) = match &saved_h {
                Some(h) if w2_needs && b2_needs => {
                    let (dw2, db2) = host::linear_grads(h, g, None)?;
                    (Some(dw2), Some(db2))
                }
                saved_h => (
                    saved_h.as_ref().filter(|_| w2_needs).map(|h| host::matmul_t(h, true, g, false)).transpose()?,
                    if b2_needs { Some(host::sum_rows(g)?) } else { None },
                ),
            };
            let (mut dx, mut dw1, mut db1) = (None, None, None);
            if let (Some(h), Some(w2)) = (&saved_h, &saved_w2) {
                match &saved_x {
                    // Both parameters and not the input: one op, the hidden gradient never a tensor.
                    Some(x) if b1_needs && !x_needs => {
                        let (w, b) = host::linear_relu_linear_first_grads(x, h, g, w2)?;
                        (dw1, db1) = (Some(w), Some(b));
                    }
                    saved_x => {
                        let d = host::relu_backward(&host::matmul_t(g, false, w2, true)?, h)?;
                        dx = saved_w1.as_ref().map(|w1| host::matmul_t(&d, false, w1, true)).transpose()?;
                        (dw1, db1) = match saved_x {
                            Some(x) if b1_needs => {
                                let (w, b) = host::linear_grads(x, &d, None)?;
                                (Some(w), Some(b))
                            }
                            _ => (
                                saved_x.as_ref().map(|x| host::matmul_t(x, true, &d, false)).transpose()?,
                                if b1_needs { Some(host::sum_rows(&d)?) } else { None },
                            ),
                        };
                    }
                }
            }
            Ok(vec![dx, dw1, db1, dw2, db2])
        })
    })
}

/// Records an activation `f(x)` whose backward is one fused kernel of `(g, x)`.
fn activation(
    op: &'static str,
    traced: Traced,
    x: &Var,
    forward: fn(&Tensor) -> opsmith_host::Result<Tensor>,
    backward: fn(&Tensor, &Tensor) -> opsmith_host::Result<Tensor>,
) -> Result<Var> {
    let out = forward(x.value())?;
    record_or_constant!(op, traced, &[x], out, |tape| {
        let saved_x = x.value().clone();
        tape.record(op, &[x], out, &[&saved_x.clone()], move |g| Ok(vec![Some(backward(g, &saved_x)?)]))
    })
}

/// `max(x, 0)`, one kernel. Backward: `g · [x > 0]`, one kernel.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![-1.0f32, 2.0], [2], Device::Cpu)?);
/// let grads = tape.backward(&ops::sum(&ops::relu(&x)?)?)?;
/// assert_eq!(grads.get(&x).unwrap().to_vec::<f32>()?, [0.0, 1.0]);
/// # Ok(()) }
/// ```
pub fn relu(x: &Var) -> Result<Var> {
    activation("relu", Traced::Relu, x, host::relu, host::relu_backward)
}

/// GELU in its tanh form, `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, one kernel; the backward
/// is one kernel too.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let x = opsmith_autograd::Var::constant(Tensor::from_vec(vec![0.0f64, 1.0], [2], Device::Cpu)?);
/// let y = ops::gelu(&x)?.value().to_vec::<f64>()?;
/// assert!(y[0] == 0.0 && (y[1] - 0.841192).abs() < 1e-5);
/// # Ok(()) }
/// ```
pub fn gelu(x: &Var) -> Result<Var> {
    activation("gelu", Traced::Gelu, x, host::gelu, host::gelu_backward)
}

/// SiLU (swish), `x·σ(x)`, one kernel; the backward is one kernel too.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Var, ops};
/// use opsmith_host::{Device, Tensor};
/// let x = Var::constant(Tensor::from_vec(vec![0.0f64, 2.0], [2], Device::Cpu)?);
/// let y = ops::silu(&x)?.value().to_vec::<f64>()?;
/// assert!(y[0] == 0.0 && (y[1] - 2.0 / (1.0 + (-2.0f64).exp())).abs() < 1e-12);
/// # Ok(()) }
/// ```
pub fn silu(x: &Var) -> Result<Var> {
    activation("silu", Traced::Silu, x, host::silu, host::silu_backward)
}

/// `softmax(scale·x + mask)` along the last axis, in one kernel; `mask` (additive, e.g. `-inf`
/// where attention is not allowed) has `x`'s trailing dims and is broadcast over the leading
/// ones. Backward: one kernel, `gx = scale · y ⊙ (g − Σ g⊙y)`; the mask's gradient (rarely
/// wanted) is the same without the scale, summed over the broadcast dims.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![1.0f64, 1.0, 5.0], [1, 3], Device::Cpu)?);
/// let mask = Tensor::from_vec(vec![0.0f64, 0.0, f64::NEG_INFINITY], [3], Device::Cpu)?;
/// let y = ops::softmax(&x, 2.0, Some(&opsmith_autograd::Var::constant(mask)))?;
/// assert_eq!(y.value().to_vec::<f64>()?, [0.5, 0.5, 0.0]);
/// # Ok(()) }
/// ```
pub fn softmax(x: &Var, scale: f64, mask: Option<&Var>) -> Result<Var> {
    let out = host::softmax(x.value(), scale, mask.map(Var::value))?;
    let inputs: Vec<&Var> = std::iter::once(x).chain(mask).collect();
    record_or_constant!("softmax", Traced::Softmax { scale, masked: mask.is_some() }, &inputs, out, |tape| {
        let y = out.clone();
        let x_needs = x.requires_grad();
        let has_mask = mask.is_some();
        let mask_shape = mask.filter(|m| m.requires_grad()).map(|m| m.value().shape().clone());
        tape.record("softmax", &inputs, out, &[&y.clone()], move |g| {
            let gx = x_needs.then(|| host::softmax_backward(g, &y, scale)).transpose()?;
            let gmask = match &mask_shape {
                Some(shape) => Some(sum_to_trailing(&host::softmax_backward(g, &y, 1.0)?, shape.clone())?),
                None => None,
            };
            Ok(if has_mask { vec![gx, gmask] } else { vec![gx] })
        })
    })
}

/// Sums `g` over its leading dims down to `shape`, a suffix of its dims (the backward of a
/// broadcast over leading dims).
fn sum_to_trailing(g: &Tensor, shape: opsmith_host::Shape) -> Result<Tensor> {
    let inner = shape.checked_elem_count().unwrap_or(0);
    if inner == g.elem_count() || inner == 0 {
        return Ok(g.reshape(shape)?);
    }
    let rows = g.elem_count() / inner.max(1);
    Ok(host::sum_rows(&g.reshape([rows, inner])?)?.reshape(shape)?)
}

/// Cross-entropy from logits `[rows, classes]` and one class label per row, averaged over rows
/// (shape `[]`): a fused log-softmax, one kernel each way. Backward:
/// `(softmax(logits) − onehot(labels)) · g / rows`.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Labels, Tensor};
/// let tape = Tape::new();
/// let logits = tape.var(Tensor::from_vec(vec![0.0f64, 0.0], [1, 2], Device::Cpu)?);
/// let loss = ops::cross_entropy(&logits, &Labels::new(&[1], Device::Cpu)?)?;
/// assert!((loss.value().to_vec::<f64>()?[0] - 2f64.ln()).abs() < 1e-12);
/// let grads = tape.backward(&loss)?;
/// assert_eq!(grads.get(&logits).unwrap().to_vec::<f64>()?, [0.5, -0.5]);
/// # Ok(()) }
/// ```
pub fn cross_entropy(logits: &Var, labels: &Labels) -> Result<Var> {
    let out = host::cross_entropy(logits.value(), labels)?;
    record_or_constant!("cross_entropy", Traced::CrossEntropy(labels.clone()), &[logits], out, |tape| {
        let (saved, labels) = (logits.value().clone(), labels.clone());
        let (uniform_saved, uniform_labels) = (saved.clone(), labels.clone());
        tape.record_with_uniform(
            "cross_entropy",
            &[logits],
            out,
            &[&saved.clone()],
            move |g| Ok(vec![Some(host::cross_entropy_backward(g, &saved, &labels)?)]),
            // A loss's seed (or a scaled one) goes to the kernel as a scalar: no gradient
            // tensor to fill first.
            move |v| {
                Ok(vec![Some(Grad::Tensor(host::cross_entropy_backward_scalar(v, &uniform_saved, &uniform_labels)?))])
            },
        )
    })
}

/// The mean squared error `mean((pred − target)²)`, shape `[]`. Backward:
/// `gpred = 2·(pred − target)·g / n`, and its negative for `target`.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, Var, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let pred = tape.var(Tensor::from_vec(vec![1.0f32, 3.0], [2], Device::Cpu)?);
/// let target = Var::constant(Tensor::from_vec(vec![0.0f32, 1.0], [2], Device::Cpu)?);
/// let loss = ops::mse_loss(&pred, &target)?;
/// assert_eq!(loss.value().to_vec::<f32>()?, [2.5]);
/// let grads = tape.backward(&loss)?;
/// assert_eq!(grads.get(&pred).unwrap().to_vec::<f32>()?, [1.0, 2.0]);
/// # Ok(()) }
/// ```
pub fn mse_loss(pred: &Var, target: &Var) -> Result<Var> {
    let out = host::mse_loss(pred.value(), target.value())?;
    record_or_constant!("mse_loss", Traced::MseLoss, &[pred, target], out, |tape| {
        let (p, t) = (pred.value().clone(), target.value().clone());
        let target_needs = target.requires_grad();
        tape.record("mse_loss", &[pred, target], out, &[&p.clone(), &t.clone()], move |g| {
            let gp = host::mse_loss_backward(g, &p, &t)?;
            let gt = target_needs.then(|| host::neg(&gp)).transpose()?;
            Ok(vec![Some(gp), gt])
        })
    })
}
