//! Element types: [`DType`] names them at run time, [`Element`] is the Rust type behind each.
//!
//! ```
//! use opsmith_host::{DType, Element, bf16};
//! assert_eq!(<bf16 as Element>::DTYPE, DType::BF16);
//! assert_eq!(DType::BF16.size_in_bytes(), 2);
//! ```
use crate::tensor::storage::CpuBuffer;
use half::{bf16, f16};

/// The element type of a tensor.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{DType, Device, Tensor};
/// let t = Tensor::zeros([4], DType::F16, Device::Cpu)?;
/// assert_eq!(t.dtype(), DType::F16);
/// assert_eq!(t.dtype().to_string(), "f16");
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16. Arithmetic runs in f32.
    F16,
    /// bfloat16. Arithmetic runs in f32.
    BF16,
    /// IEEE 754 binary64. CPU ops only; CUDA tensors of f64 can be stored and copied.
    F64,
    /// Unsigned 32-bit integers: indices and labels. Made, copied, converted, printed and
    /// indexed with; the arithmetic ops take floats only.
    U32,
    /// Signed 64-bit integers, PyTorch's index type ([`Tensor::argmax`](crate::Tensor::argmax)
    /// returns them). Like [`DType::U32`], for indices, not arithmetic.
    I64,
}

impl DType {
    /// Bytes per element.
    ///
    /// ```
    /// use opsmith_host::DType;
    /// assert_eq!(DType::F32.size_in_bytes(), 4);
    /// assert_eq!(DType::BF16.size_in_bytes(), 2);
    /// ```
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F64 | DType::I64 => 8,
            DType::U32 => 4,
        }
    }

    /// The lower-case name, as in kernel names (`f32`, `f16`, `bf16`, `f64`).
    ///
    /// ```
    /// use opsmith_host::DType;
    /// assert_eq!(DType::BF16.name(), "bf16");
    /// assert!(opsmith_kernels::names::BF16.add.name().ends_with(DType::BF16.name()));
    /// ```
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::U32 => "u32",
            DType::I64 => "i64",
        }
    }

    /// The unit roundoff (half the gap between 1 and the next value): the scale for tolerances.
    ///
    /// ```
    /// use opsmith_host::{DType, f16};
    /// let u = DType::F16.unit_roundoff();
    /// assert_eq!(f16::from_f64(1.0 + u).to_f64(), 1.0);             // a tie rounds to even
    /// assert_eq!(f16::from_f64(1.0 + 2.0 * u).to_f64(), 1.0 + 2.0 * u); // the next f16
    /// ```
    pub const fn unit_roundoff(self) -> f64 {
        match self {
            DType::F32 => f32::EPSILON as f64 / 2.0,
            DType::F16 => 4.8828125e-4, // 2^-11
            DType::BF16 => 3.90625e-3,  // 2^-8
            DType::F64 => f64::EPSILON / 2.0,
            // Integers are exact: a conversion to them rounds to an integer.
            DType::U32 | DType::I64 => 0.5,
        }
    }

    /// Whether this is a floating-point dtype (every arithmetic op needs one).
    ///
    /// ```
    /// use opsmith_host::DType;
    /// assert!(DType::BF16.is_float() && !DType::I64.is_float());
    /// ```
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }

    /// The floating-point dtypes.
    pub const FLOATS: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::F64];

    /// Every dtype.
    pub const ALL: [DType; 6] = [DType::F32, DType::F16, DType::BF16, DType::F64, DType::U32, DType::I64];
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
    impl Sealed for u32 {}
    impl Sealed for i64 {}
}

/// A Rust type that a tensor can hold: `f32`, `f64`, [`half::f16`], [`half::bf16`], `u32` and `i64`.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{Device, Element, Tensor, f16};
/// // Generic over the element type, as the CPU backend is.
/// fn halve<T: Element>(values: &[T]) -> Vec<T> {
///     values.iter().map(|&v| T::from_f64(v.to_f64() / 2.0)).collect()
/// }
/// let t = Tensor::from_vec(halve(&[f16::from_f32(3.0)]), [1], Device::Cpu)?;
/// assert_eq!(t.to_vec::<f16>()?, [f16::from_f32(1.5)]);
/// # Ok(()) }
/// ```
pub trait Element: sealed::Sealed + bytemuck::Pod + Copy + Send + Sync + std::fmt::Debug + PartialEq + 'static {
    /// The matching [`DType`].
    const DTYPE: DType;
    /// The type CPU arithmetic runs in (f32, or f64 for f64), as on the GPU; f64 for the integers,
    /// which only conversions use.
    type Acc: Accumulator;
    /// Widens to the arithmetic type.
    fn to_acc(self) -> Self::Acc;
    /// Narrows from the arithmetic type, rounding to nearest even.
    fn from_acc(x: Self::Acc) -> Self;
    /// Converts to f64 (exact for every dtype).
    fn to_f64(self) -> f64;
    /// Converts from f64, rounding to nearest even.
    fn from_f64(x: f64) -> Self;
    #[doc(hidden)]
    fn cpu_slice(buf: &CpuBuffer) -> Option<&[Self]>;
    #[doc(hidden)]
    fn cpu_slice_mut(buf: &mut CpuBuffer) -> Option<&mut [Self]>;
    #[doc(hidden)]
    fn into_cpu_buffer(data: Vec<Self>) -> CpuBuffer;
}

/// Arithmetic the CPU backend runs in: f32 or f64.
///
/// ```
/// use opsmith_host::{Element, bf16, dtype::Accumulator};
/// // bf16 computes in f32, and an FMA rounds once.
/// let (a, b, c) = (bf16::from_f32(1.5).to_acc(), bf16::from_f32(2.0).to_acc(), 0.25f32);
/// assert_eq!(<f32 as Accumulator>::fma(a, b, c), 3.25);
/// ```
///
/// It is [`Real`](opsmith_kernels::real::Real), the type the formulas shared with the kernels
/// (activations, optimizer steps) are generic over, so the CPU runs them operation for operation
/// as the GPU does.
pub trait Accumulator: opsmith_kernels::real::Real + ndarray::LinalgScalar {
    /// `a * b + c` with one rounding, as the GPU's `fma.rn`.
    fn fma(a: Self, b: Self, c: Self) -> Self;
    /// Rounds a scalar parameter to this type.
    fn from_f64(x: f64) -> Self;
    /// Widens to f64.
    fn to_f64(self) -> f64;
}

impl Accumulator for f32 {
    #[inline(always)]
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
    fn from_f64(x: f64) -> f32 {
        x as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}

impl Accumulator for f64 {
    #[inline(always)]
    fn fma(a: f64, b: f64, c: f64) -> f64 {
        a.mul_add(b, c)
    }
    fn from_f64(x: f64) -> f64 {
        x
    }
    fn to_f64(self) -> f64 {
        self
    }
}

macro_rules! element {
    ($ty:ty, $dtype:ident, $acc:ty, $to_acc:expr, $from_acc:expr, $to_f64:expr, $from_f64:expr) => {
        impl Element for $ty {
            const DTYPE: DType = DType::$dtype;
            type Acc = $acc;
            #[inline(always)]
            fn to_acc(self) -> $acc {
                $to_acc(self)
            }
            #[inline(always)]
            fn from_acc(x: $acc) -> Self {
                $from_acc(x)
            }
            fn to_f64(self) -> f64 {
                $to_f64(self)
            }
            fn from_f64(x: f64) -> Self {
                $from_f64(x)
            }
            fn cpu_slice(buf: &CpuBuffer) -> Option<&[Self]> {
                match buf {
                    CpuBuffer::$dtype(v) => Some(v),
                    _ => None,
                }
            }
            fn cpu_slice_mut(buf: &mut CpuBuffer) -> Option<&mut [Self]> {
                match buf {
                    CpuBuffer::$dtype(v) => Some(v),
                    _ => None,
                }
            }
            fn into_cpu_buffer(data: Vec<Self>) -> CpuBuffer {
                CpuBuffer::$dtype(data)
            }
        }
    };
}

element!(f32, F32, f32, |x| x, |x| x, |x: f32| x as f64, |x: f64| x as f32);
element!(f64, F64, f64, |x| x, |x| x, |x| x, |x| x);
// Not half's `from_f64`: half 2 rounds some values next to a half-way point the wrong way (see
// `opsmith_kernels::convert::f64_to_bf16_bits`); one correct rounding through f32 rounded to odd.
element!(f16, F16, f32, f16::to_f32, f16::from_f32, f16::to_f64, |x: f64| f16::from_f32(
    opsmith_kernels::convert::f64_to_f32_odd(x)
));
element!(bf16, BF16, f32, bf16::to_f32, bf16::from_f32, bf16::to_f64, |x: f64| bf16::from_bits(
    opsmith_kernels::convert::f64_to_bf16_bits(x)
));
// Integers widen to f64 (exactly for u32, and for i64 up to 2^53 in magnitude); from f64 they
// round to nearest, ties away from zero, and saturate (NaN becomes 0), as `as` casts do.
element!(u32, U32, f64, |x| x as f64, |x: f64| x.round() as u32, |x| x as f64, |x: f64| x.round() as u32);
element!(i64, I64, f64, |x| x as f64, |x: f64| x.round() as i64, |x| x as f64, |x: f64| x.round() as i64);

/// Calls `$body` with `$T` bound to the Rust type of `$dtype`.
macro_rules! with_element_type {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::DType::F16 => {
                type $T = half::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            $crate::DType::U32 => {
                type $T = u32;
                $body
            }
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
        }
    };
}
pub(crate) use with_element_type;

/// Calls `$body` with `$T` bound to the Rust type of `$dtype`, a float; for an integer dtype,
/// returns [`Error::UnsupportedDType`](crate::Error::UnsupportedDType) naming `$op` from the
/// enclosing function instead.
macro_rules! with_float_type {
    ($dtype:expr, $op:expr, $device:expr, $T:ident => $body:expr) => {
        match $dtype {
            dtype @ ($crate::DType::U32 | $crate::DType::I64) => {
                return Err($crate::Error::UnsupportedDType { op: $op, dtype, device: $device }.into())
            }
            float => $crate::dtype::with_element_type!(float, $T => $body),
        }
    };
}
pub(crate) use with_float_type;

#[cfg(test)]
mod tests {
    use super::*;
    use opsmith_kernels::convert::f32_to_bf16_bits;

    /// The CPU's f64 → bf16 and f16 give the kernels' bits (`f32_to_bf16_bits`, `cvt.rn.f16.f32`,
    /// which `half`'s `from_f32` matches) for every f32 value, such as the normal stream that
    /// `randn` rounds on both backends; half's own `from_f64` misrounds four of these 2^16.
    #[test]
    fn from_f64_of_f32_values_rounds_as_the_kernels() {
        for i in 0..1u64 << 16 {
            let x = opsmith_kernels::random::normal_f32(1234, i);
            assert_eq!(<bf16 as Element>::from_f64(x as f64).to_bits(), f32_to_bf16_bits(x), "{x:e}");
            assert_eq!(<f16 as Element>::from_f64(x as f64), f16::from_f32(x), "{x:e}");
        }
        // One of the values half 2's bf16::from_f64 rounds down.
        let x = f32::from_bits(0x3f5e_8004);
        assert_eq!(<bf16 as Element>::from_f64(x as f64).to_bits(), 0x3f5f);
    }
}
