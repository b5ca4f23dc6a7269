//! `+ - * /` and unary `-` on variables, returning [`Result`]: `(&x * &x)?`. Each is the op of
//! the same name in [`crate::ops`], recorded on the tape (and by an ONNX tracer) like it.
//!
//! With an `f64` on the right: `x + s` and `x - s` are [`ops::add_scalar`], `x * s` is
//! [`ops::scale`], and `x / s` divides by a constant `s` of shape `[]`, broadcast (a true
//! division, as for tensors).
//!
//! ```
//! # fn main() -> opsmith_autograd::Result<()> {
//! use opsmith_autograd::{Result, Tape, Var, ops};
//! use opsmith_host::{Device, Tensor};
//! fn loss(x: &Var) -> Result<Var> {
//!     let y = (x * x)?;
//!     ops::sum(&(&y + x)?)
//! }
//! let tape = Tape::new();
//! let x = tape.var(Tensor::from_vec(vec![1.0f32, -3.0], [2], Device::Cpu)?);
//! let l = loss(&x)?;
//! assert_eq!(l.value().to_vec::<f32>()?, [8.0]); // 1 + 1 + 9 - 3
//! assert_eq!(tape.backward(&l)?.get(&x).unwrap().to_vec::<f32>()?, [3.0, -5.0]); // 2x + 1
//! # Ok(()) }
//! ```
use crate::{Result, Var, ops};
use opsmith_host::Tensor;
use std::ops::{Add, Div, Mul, Neg, Sub};

/// Implements `$trait` for every pairing of `Var` and `&Var`, and with an `f64` on the right.
macro_rules! binary_operator {
    ($trait:ident, $method:ident, $op:path, |$x:ident, $s:ident| $scalar:expr) => {
        impl $trait<&Var> for &Var {
            type Output = Result<Var>;
            fn $method(self, rhs: &Var) -> Result<Var> {
                $op(self, rhs)
            }
        }
        impl $trait<Var> for &Var {
            type Output = Result<Var>;
            fn $method(self, rhs: Var) -> Result<Var> {
                $op(self, &rhs)
            }
        }
        impl $trait<&Var> for Var {
            type Output = Result<Var>;
            fn $method(self, rhs: &Var) -> Result<Var> {
                $op(&self, rhs)
            }
        }
        impl $trait<Var> for Var {
            type Output = Result<Var>;
            fn $method(self, rhs: Var) -> Result<Var> {
                $op(&self, &rhs)
            }
        }
        impl $trait<f64> for &Var {
            type Output = Result<Var>;
            fn $method(self, $s: f64) -> Result<Var> {
                let $x = self;
                $scalar
            }
        }
        impl $trait<f64> for Var {
            type Output = Result<Var>;
            fn $method(self, $s: f64) -> Result<Var> {
                let $x = &self;
                $scalar
            }
        }
    };
}

binary_operator!(Add, add, ops::add, |x, s| ops::add_scalar(x, s));
binary_operator!(Sub, sub, ops::sub, |x, s| ops::add_scalar(x, -s));
binary_operator!(Mul, mul, ops::mul, |x, s| ops::scale(x, s));
// A scalar constant (shape `[]`) that broadcasts: an exported graph holds one value, not a
// tensor of the traced batch's size.
binary_operator!(Div, div, ops::div, |x, s| {
    let v = x.value();
    ops::div(x, &Var::constant(Tensor::full(s, Vec::<usize>::new(), v.dtype(), v.device())?))
});

impl Neg for &Var {
    type Output = Result<Var>;
    fn neg(self) -> Result<Var> {
        ops::neg(self)
    }
}

impl Neg for Var {
    type Output = Result<Var>;
    fn neg(self) -> Result<Var> {
        ops::neg(&self)
    }
}
