//! `+ - * /` and unary `-` on tensors, returning [`Result`] as the ops do: `(&a + &b)?`.
//!
//! Each operator is the op of the same name in [`crate::ops`] (same checks, same kernels, same
//! errors): tensors of one shape, dtype and device. With an `f64` on the right, the scalar is
//! applied to every element: `+`, `-` and `*` in one kernel (`affine`, the scalar rounded to
//! the arithmetic type), `/` as a true division (`x / 3.0` is not `x * (1/3)`).
use crate::{Result, Tensor, ops};
use std::ops::{Add, Div, Mul, Neg, Sub};

/// Implements `$trait` for every pairing of `Tensor` and `&Tensor`, and with an `f64` on the
/// right.
macro_rules! binary_operator {
    ($trait:ident, $method:ident, $op:path, |$x:ident, $s:ident| $scalar:expr) => {
        impl $trait<&Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                $op(self, rhs)
            }
        }
        impl $trait<Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                $op(self, &rhs)
            }
        }
        impl $trait<&Tensor> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                $op(&self, rhs)
            }
        }
        impl $trait<Tensor> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                $op(&self, &rhs)
            }
        }
        impl $trait<f64> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, $s: f64) -> Result<Tensor> {
                let $x = self;
                $scalar
            }
        }
        impl $trait<f64> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, $s: f64) -> Result<Tensor> {
                let $x = &self;
                $scalar
            }
        }
    };
}

binary_operator!(Add, add, ops::add, |x, s| ops::add_scalar(x, s));
binary_operator!(Sub, sub, ops::sub, |x, s| ops::add_scalar(x, -s));
binary_operator!(Mul, mul, ops::mul, |x, s| ops::scale(x, s));
binary_operator!(Div, div, ops::div, |x, s| ops::div(x, &Tensor::full(s, x.shape().clone(), x.dtype(), x.device())?));

impl Neg for &Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        ops::neg(self)
    }
}

impl Neg for Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        ops::neg(&self)
    }
}

#[cfg(test)]
mod tests {
    use crate::{DType, Device, Error, Result, Tensor};

    #[test]
    fn operators_are_the_ops() -> Result<()> {
        let a = Tensor::from_vec(vec![1.0f32, -2.0, 3.0], [3], Device::Cpu)?;
        let b = Tensor::from_vec(vec![0.5f32, 4.0, -1.5], [3], Device::Cpu)?;
        assert_eq!((&a + &b)?.to_vec::<f32>()?, [1.5, 2.0, 1.5]);
        assert_eq!((&a - &b)?.to_vec::<f32>()?, [0.5, -6.0, 4.5]);
        assert_eq!((&a * &b)?.to_vec::<f32>()?, [0.5, -8.0, -4.5]);
        assert_eq!((&a / &b)?.to_vec::<f32>()?, [2.0, -0.5, -2.0]);
        assert_eq!((-&a)?.to_vec::<f32>()?, [-1.0, 2.0, -3.0]);
        assert_eq!((&a + 1.0)?.to_vec::<f32>()?, [2.0, -1.0, 4.0]);
        assert_eq!((&a - 1.0)?.to_vec::<f32>()?, [0.0, -3.0, 2.0]);
        assert_eq!((&a * -2.0)?.to_vec::<f32>()?, [-2.0, 4.0, -6.0]);
        // A true division: 1/3 rounded once, not 1 * round(1/3).
        let third = (Tensor::from_vec(vec![1.0f32, 10.0], [2], Device::Cpu)? / 3.0)?.to_vec::<f32>()?;
        assert_eq!(third, [1.0 / 3.0, 10.0 / 3.0]);
        assert_eq!((a.clone() + b.clone())?.to_vec::<f32>()?, (&a + &b)?.to_vec::<f32>()?);
        Ok(())
    }

    #[test]
    fn operator_errors_name_the_op() -> Result<()> {
        let a = Tensor::zeros([3], DType::F32, Device::Cpu)?;
        let b = Tensor::zeros([2], DType::F32, Device::Cpu)?;
        assert!(matches!(&a / &b, Err(Error::ShapeMismatch { op: "div", .. })));
        let h = Tensor::zeros([3], DType::F16, Device::Cpu)?;
        assert!(matches!(&a + &h, Err(Error::DTypeMismatch { op: "add", .. })));
        Ok(())
    }
}
