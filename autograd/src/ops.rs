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
use crate::tape::{Var, tracking};
use opsmith_host::{Tensor, ops as host};

/// Returns the output as a constant when nothing is tracked, else records it.
macro_rules! record_or_constant {
    ($op:expr, $inputs:expr, $out:expr, |$tape:ident| $record:expr) => {
        match tracking($op, $inputs)? {
            None => Ok(Var::constant($out)),
            Some($tape) => Ok($record),
        }
    };
}

/// The value saved for an input's partner when that input needs a gradient.
fn save_if(needed: bool, t: &Tensor) -> Option<Tensor> {
    needed.then(|| t.clone())
}

fn saved_refs(saved: &[&Option<Tensor>]) -> Vec<Tensor> {
    saved.iter().filter_map(|t| (*t).clone()).collect()
}

/// `a + b`. Backward: `ga = g`, `gb = g`.
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
    let out = host::add(a.value(), b.value())?;
    record_or_constant!("add", &[a, b], out, |tape| tape
        .record("add", &[a, b], out, &[], |g| { Ok(vec![Some(g.clone()), Some(g.clone())]) }))
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
    let out = host::sub(a.value(), b.value())?;
    let b_needs = b.requires_grad();
    record_or_constant!("sub", &[a, b], out, |tape| tape.record("sub", &[a, b], out, &[], move |g| {
        Ok(vec![Some(g.clone()), if b_needs { Some(host::neg(g)?) } else { None }])
    }))
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
    let out = host::mul(a.value(), b.value())?;
    record_or_constant!("mul", &[a, b], out, |tape| {
        let (saved_b, saved_a) = (save_if(a.requires_grad(), b.value()), save_if(b.requires_grad(), a.value()));
        let keep = saved_refs(&[&saved_a, &saved_b]);
        tape.record("mul", &[a, b], out, &keep.iter().collect::<Vec<_>>(), move |g| {
            Ok(vec![saved_b.map(|b| host::mul(g, &b)).transpose()?, saved_a.map(|a| host::mul(g, &a)).transpose()?])
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
    record_or_constant!("scale", &[x], out, |tape| tape
        .record("scale", &[x], out, &[], move |g| { Ok(vec![Some(host::scale(g, alpha)?)]) }))
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
    record_or_constant!("add_scalar", &[x], out, |tape| tape
        .record("add_scalar", &[x], out, &[], |g| { Ok(vec![Some(g.clone())]) }))
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
    record_or_constant!("sum", &[x], out, |tape| {
        let shape = x.value().shape().clone();
        tape.record("sum", &[x], out, &[], move |g| Ok(vec![Some(host::expand_scalar(g, shape, 1.0)?)]))
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
    record_or_constant!("mean", &[x], out, |tape| {
        let shape = x.value().shape().clone();
        tape.record("mean", &[x], out, &[], move |g| Ok(vec![Some(host::expand_scalar(g, shape, 1.0 / n)?)]))
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
    record_or_constant!("fused_mul_add", &[a, b, c], out, |tape| {
        let (saved_b, saved_a) = (save_if(a.requires_grad(), b.value()), save_if(b.requires_grad(), a.value()));
        let keep = saved_refs(&[&saved_a, &saved_b]);
        tape.record("fused_mul_add", &[a, b, c], out, &keep.iter().collect::<Vec<_>>(), move |g| {
            Ok(vec![
                saved_b.map(|b| host::mul(g, &b)).transpose()?,
                saved_a.map(|a| host::mul(g, &a)).transpose()?,
                Some(g.clone()),
            ])
        })
    })
}

/// `z = (x + y) * w` in one kernel.
///
/// Backward: when `w` and `x` or `y` need gradients, one fused kernel writes `g * w` once (the
/// gradient of both `x` and `y`, shared, not copied) and `g * (x + y)`; otherwise only the
/// gradient needed is computed, and only the tensors it needs are saved.
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
/// assert!(gx.shares_storage(gy)); // one tensor for both
/// assert_eq!(grads.get(&w).unwrap().to_vec::<f32>()?, [4.0, 6.0]); // x + y
/// # Ok(()) }
/// ```
pub fn add_mul(x: &Var, y: &Var, w: &Var) -> Result<Var> {
    let out = host::add_mul(x.value(), y.value(), w.value())?;
    record_or_constant!("add_mul", &[x, y, w], out, |tape| {
        let (x_need, y_need, w_need) = (x.requires_grad(), y.requires_grad(), w.requires_grad());
        let saved_w = save_if(x_need || y_need, w.value());
        let saved_x = save_if(w_need, x.value());
        let saved_y = save_if(w_need, y.value());
        let keep = saved_refs(&[&saved_x, &saved_y, &saved_w]);
        tape.record("add_mul", &[x, y, w], out, &keep.iter().collect::<Vec<_>>(), move |g| {
            let (gxy, gw) = match (saved_x, saved_y, saved_w) {
                (Some(x), Some(y), Some(w)) => {
                    let (gxy, gw) = host::add_mul_backward(g, &x, &y, &w)?;
                    (Some(gxy), Some(gw))
                }
                (_, _, Some(w)) => (Some(host::mul(g, &w)?), None),
                // (x + y) * g is the forward's own fused kernel.
                (Some(x), Some(y), None) => (None, Some(host::add_mul(&x, &y, g)?)),
                _ => (None, None),
            };
            Ok(vec![gxy.clone().filter(|_| x_need), gxy.filter(|_| y_need), gw])
        })
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
    record_or_constant!("add_row", &[x, b], out, |tape| tape.record("add_row", &[x, b], out, &[], move |g| {
        Ok(vec![Some(g.clone()), if b_needs { Some(host::sum_rows(g)?) } else { None }])
    }))
}
