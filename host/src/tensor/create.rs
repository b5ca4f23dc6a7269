//! Constructors beyond `zeros`, `full` and `from_vec`: `ones`, the `*_like` family, `arange`
//! and `eye`, as PyTorch and candle name them.
use crate::ops::index::Distribution;
use crate::{DType, Device, Error, Result, Shape, Tensor};

impl Tensor {
    /// A tensor of ones.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor};
    /// let a = Tensor::ones([2, 3], DType::F32, Device::Cpu)?;
    /// assert_eq!(a.to_vec::<f32>()?, [1.0; 6]);
    /// # Ok(()) }
    /// ```
    pub fn ones(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::full(1.0, shape, dtype, device)
    }

    /// Zeros of this tensor's shape, dtype and device.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor};
    /// let a = Tensor::ones([2], DType::F16, Device::Cpu)?;
    /// let z = a.zeros_like()?;
    /// assert_eq!((z.dims(), z.dtype(), z.to_vec_f64()?), (&[2][..], DType::F16, vec![0.0; 2]));
    /// # Ok(()) }
    /// ```
    pub fn zeros_like(&self) -> Result<Tensor> {
        Tensor::zeros(self.shape().clone(), self.dtype(), self.device())
    }

    /// Ones of this tensor's shape, dtype and device.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor};
    /// let z = Tensor::zeros([3], DType::F32, Device::Cpu)?;
    /// assert_eq!(z.ones_like()?.to_vec::<f32>()?, [1.0; 3]);
    /// # Ok(()) }
    /// ```
    pub fn ones_like(&self) -> Result<Tensor> {
        Tensor::ones(self.shape().clone(), self.dtype(), self.device())
    }

    /// `value` (rounded to the dtype) in a tensor of this one's shape, dtype and device.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor};
    /// let z = Tensor::zeros([2], DType::F32, Device::Cpu)?;
    /// assert_eq!(z.full_like(-0.5)?.to_vec::<f32>()?, [-0.5; 2]);
    /// # Ok(()) }
    /// ```
    pub fn full_like(&self, value: f64) -> Result<Tensor> {
        Tensor::full(value, self.shape().clone(), self.dtype(), self.device())
    }

    /// `start, start + step, …` up to but not including `end`, as a 1-D tensor: element `i` is
    /// `start + i·step` computed in f64, then rounded to the dtype. `step` must be finite and
    /// non-zero, and point from `start` towards `end` (else the tensor is empty).
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor};
    /// let x = Tensor::arange(0.0, 6.0, 1.0, DType::F32, Device::Cpu)?.reshape([2, 3])?;
    /// assert_eq!(x.to_vec::<f32>()?, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    /// assert_eq!(Tensor::arange(1.0, 0.0, -0.25, DType::F64, Device::Cpu)?.to_vec::<f64>()?, [1.0, 0.75, 0.5, 0.25]);
    /// assert!(Tensor::arange(0.0, 1.0, 0.0, DType::F32, Device::Cpu).is_err());
    /// # Ok(()) }
    /// ```
    pub fn arange(start: f64, end: f64, step: f64, dtype: DType, device: Device) -> Result<Tensor> {
        const OP: &str = "Tensor::arange";
        if !(start.is_finite() && end.is_finite() && step.is_finite()) || step == 0.0 {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!("start {start}, end {end} and step {step} must be finite, and step non-zero"),
            });
        }
        let count = ((end - start) / step).ceil().max(0.0);
        if count > (isize::MAX as usize / dtype.size_in_bytes()) as f64 {
            return Err(Error::TooLarge {
                op: OP,
                elements: count as u64,
                limit: (isize::MAX as usize / dtype.size_in_bytes()) as u64,
            });
        }
        let values = host_values(OP, count as usize, |i| start + i as f64 * step)?;
        Tensor::from_f64(&values, vec![values.len()], dtype, device)
    }

    /// The `n × n` identity matrix.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor};
    /// assert_eq!(Tensor::eye(2, DType::F32, Device::Cpu)?.to_vec::<f32>()?, [1.0, 0.0, 0.0, 1.0]);
    /// # Ok(()) }
    /// ```
    pub fn eye(n: usize, dtype: DType, device: Device) -> Result<Tensor> {
        let count = n.checked_mul(n).ok_or(Error::TooLarge {
            op: "Tensor::eye",
            elements: u64::MAX,
            limit: usize::MAX as u64,
        })?;
        let values = host_values("Tensor::eye", count, |i| if i % (n + 1) == 0 { 1.0 } else { 0.0 })?;
        Tensor::from_f64(&values, vec![n, n], dtype, device)
    }
}

/// `count` values built on the host, or an error (not an abort) when memory runs out.
fn host_values(op: &'static str, count: usize, value: impl Fn(usize) -> f64) -> Result<Vec<f64>> {
    let mut values = super::host_capacity(op, count)?;
    values.extend((0..count).map(value));
    Ok(values)
}

impl Tensor {
    /// Uniform values in `[0, 1)` from `seed`: element `i` depends only on `seed` and `i`
    /// (Philox4x32-10, a counter-based generator), so CPU and CUDA give the same bits, and a
    /// larger tensor starts with a smaller one's values. A value has as many random bits as the
    /// dtype has significant bits (24 for f32, 11 for f16, 8 for bf16, 53 for f64), so rounding
    /// never makes it 1.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor};
    /// let u = Tensor::rand([2, 3], DType::F32, Device::Cpu, 42)?;
    /// assert!(u.to_vec::<f32>()?.iter().all(|v| (0.0..1.0).contains(v)));
    /// assert_eq!(u.to_vec::<f32>()?, Tensor::rand([2, 3], DType::F32, Device::Cpu, 42)?.to_vec::<f32>()?);
    /// # Ok(()) }
    /// ```
    pub fn rand(shape: impl Into<Shape>, dtype: DType, device: Device, seed: u64) -> Result<Tensor> {
        crate::ops::index::random("Tensor::rand", shape.into(), dtype, device, seed, Distribution::Uniform)
    }

    /// Standard normal values from `seed` (Box–Muller on the same counter-based stream as
    /// [`Tensor::rand`]), made in f32 and rounded to the dtype; the same bits on CPU and CUDA.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor};
    /// let z = Tensor::randn([10_000], DType::F32, Device::Cpu, 7)?.to_vec::<f32>()?;
    /// let mean = z.iter().sum::<f32>() / z.len() as f32;
    /// assert!(mean.abs() < 0.05);
    /// # Ok(()) }
    /// ```
    pub fn randn(shape: impl Into<Shape>, dtype: DType, device: Device, seed: u64) -> Result<Tensor> {
        crate::ops::index::random("Tensor::randn", shape.into(), dtype, device, seed, Distribution::Normal)
    }
}
