//! Gradient checks: analytic gradients against central finite differences computed in f64 on
//! the CPU, and one device's gradients against another's.
//!
//! ```
//! # fn main() -> opsmith_autograd::Result<()> {
//! use opsmith_autograd::{GradcheckOptions, Var, gradcheck, ops};
//! use opsmith_host::{DType, Device, Tensor};
//! // f(a, b) = mean(a * b + a), checked in f32 against f64 finite differences.
//! let f = |v: &[Var]| ops::mean(&ops::fused_mul_add(&v[0], &v[1], &v[0])?);
//! let a = Tensor::from_vec(vec![0.5f32, -1.25, 2.0], [3], Device::Cpu)?;
//! let b = Tensor::from_vec(vec![1.5f32, 0.75, -0.5], [3], Device::Cpu)?;
//! let report = gradcheck(f, &[a, b], &GradcheckOptions::for_dtype(DType::F32))?;
//! assert_eq!(report.checked, 6);
//! # Ok(()) }
//! ```
use crate::tape::{Tape, Var, no_grad};
use crate::{Error, Result, ops};
use opsmith_host::{DType, Device, Tensor};

/// Tolerances and step of a gradient check. An element passes when
/// `|analytic - reference| <= atol + rtol * |reference|`.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{GradcheckOptions, gradcheck, ops};
/// use opsmith_host::{DType, Device, Tensor};
/// // Looser than the f32 defaults, with a larger step.
/// let options = GradcheckOptions { eps: 1e-4, ..GradcheckOptions::for_dtype(DType::F32) };
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?;
/// gradcheck(|v| ops::mul(&v[0], &v[0]), &[x], &options)?;
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct GradcheckOptions {
    /// The finite-difference step, applied to f64 copies of the inputs.
    pub eps: f64,
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance.
    pub rtol: f64,
}

impl GradcheckOptions {
    /// Tolerances suited to analytic gradients computed in `dtype` (the finite differences are
    /// always in f64).
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::GradcheckOptions;
    /// use opsmith_host::DType;
    /// let (f32, bf16) = (GradcheckOptions::for_dtype(DType::F32), GradcheckOptions::for_dtype(DType::BF16));
    /// assert!(bf16.rtol > f32.rtol); // fewer digits, wider tolerance
    /// # Ok(()) }
    /// ```
    pub fn for_dtype(dtype: DType) -> Self {
        let (atol, rtol) = match dtype {
            DType::F64 => (1e-7, 1e-6),
            DType::F32 => (1e-4, 1e-4),
            DType::F16 | DType::BF16 => (5e-2, 5e-2),
            // Integers have no gradients; a check on them fails at the first op.
            DType::U32 | DType::I64 => (0.0, 0.0),
        };
        Self { eps: 1e-6, atol, rtol }
    }

    /// A positive, finite step and finite, non-negative tolerances: a NaN tolerance would pass
    /// every element and a step of 0 would blame the gradient for a 0 / 0.
    fn check(&self) -> Result<()> {
        let bad = |name: &str, value: f64| Error::InvalidConfig {
            what: "gradcheck",
            reason: format!("GradcheckOptions::{name} = {value} is out of range"),
        };
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return Err(bad("eps", self.eps));
        }
        for (name, value) in [("atol", self.atol), ("rtol", self.rtol)] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(bad(name, value));
            }
        }
        Ok(())
    }
}

/// What a passing check measured.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{GradcheckOptions, gradcheck, ops};
/// use opsmith_host::{DType, Device, Tensor};
/// let x = Tensor::from_vec(vec![0.5f64, 1.5, -2.0], [3], Device::Cpu)?;
/// let report = gradcheck(|v| ops::scale(&v[0], 3.0), &[x], &GradcheckOptions::for_dtype(DType::F64))?;
/// assert_eq!(report.checked, 3);
/// assert!(report.max_abs_error < 1e-8);
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct GradcheckReport {
    /// Elements compared.
    pub checked: usize,
    /// The largest `|analytic - reference|`.
    pub max_abs_error: f64,
}

fn host_f64(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.to_vec_f64()?)
}

fn tensor_from_f64(values: &[f64], like: &Tensor, dtype: DType, device: Device) -> Result<Tensor> {
    Ok(Tensor::from_f64(values, like.shape().clone(), dtype, device)?)
}

/// Fixed pseudo-random weights in ±[0.5, 1.5): the check differentiates `sum(f(x) * r)`, so that
/// every output element contributes with a different weight.
fn projection(n: usize) -> Vec<f64> {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let unit = (state >> 11) as f64 / (1u64 << 53) as f64;
            let v = 0.5 + unit;
            // Values with few mantissa bits are exact in every dtype, so both sides use the same r.
            let v = (v * 64.0).round() / 64.0;
            if state & 1 == 0 { v } else { -v }
        })
        .collect()
}

/// Analytic gradients of `sum(f(inputs) * r)`, as f64, one vector per input.
fn analytic<F: Fn(&[Var]) -> Result<Var>>(f: &F, inputs: &[Tensor]) -> Result<Vec<Vec<f64>>> {
    let tape = Tape::new();
    let vars: Vec<Var> = inputs.iter().map(|t| tape.var(t.clone())).collect();
    let out = f(&vars)?;
    let r = projection(out.value().elem_count());
    let r = Var::constant(tensor_from_f64(&r, out.value(), out.value().dtype(), out.value().device())?);
    let loss = ops::sum(&ops::mul(&out, &r)?)?;
    let grads = tape.backward(&loss)?;
    vars.iter()
        .map(|v| match grads.get(v) {
            Some(g) => host_f64(g),
            None => Ok(vec![0.0; v.value().elem_count()]),
        })
        .collect()
}

/// `sum(f(x) * r)` with every input and all arithmetic in f64 on the CPU.
fn loss_f64<F: Fn(&[Var]) -> Result<Var>>(f: &F, inputs: &[Vec<f64>], like: &[Tensor]) -> Result<f64> {
    let _no_grad = no_grad();
    let vars: Vec<Var> = inputs
        .iter()
        .zip(like)
        .map(|(v, t)| Ok(Var::constant(tensor_from_f64(v, t, DType::F64, Device::Cpu)?)))
        .collect::<Result<_>>()?;
    let out = host_f64(f(&vars)?.value())?;
    Ok(out.iter().zip(projection(out.len())).map(|(o, r)| o * r).sum())
}

fn compare(
    check: &'static str,
    input: usize,
    got: &[f64],
    reference: &[f64],
    options: &GradcheckOptions,
    report: &mut GradcheckReport,
) -> Result<()> {
    for (index, (&a, &r)) in got.iter().zip(reference).enumerate() {
        let difference = (a - r).abs();
        let tolerance = options.atol + options.rtol * r.abs();
        if difference.is_nan() || difference > tolerance {
            return Err(Error::GradcheckFailed {
                check,
                input,
                index,
                analytic: a,
                reference: r,
                difference,
                tolerance,
            });
        }
        report.checked += 1;
        report.max_abs_error = report.max_abs_error.max(difference);
    }
    Ok(())
}

/// Checks the gradients of `f` at `inputs` against central finite differences.
///
/// The analytic gradients are those of `sum(f(x) * r)` for fixed pseudo-random weights `r`,
/// computed by the tape on the inputs' own device and dtype. The reference evaluates the same
/// function with f64 copies of the inputs on the CPU, `(L(x + eps) - L(x - eps)) / 2 eps` for
/// every element of every input. The first element outside the tolerance is returned as
/// [`Error::GradcheckFailed`] with both values. Options out of range (a step that is not
/// positive and finite, a negative or non-finite tolerance) are [`Error::InvalidConfig`].
///
/// `f` must work on f64 CPU tensors as well (every built-in op does).
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{gradcheck, GradcheckOptions, ops};
/// use opsmith_host::{DType, Device, Tensor};
/// let t = |v: Vec<f64>| Tensor::from_vec(v, [3], Device::Cpu);
/// let inputs = [t(vec![0.5, -1.0, 2.0])?, t(vec![1.5, 0.25, -0.75])?, t(vec![2.0, 1.0, -3.0])?];
/// let report = gradcheck(|v| ops::add_mul(&v[0], &v[1], &v[2]), &inputs, &GradcheckOptions::for_dtype(DType::F64))?;
/// assert_eq!(report.checked, 9);
/// # Ok(()) }
/// ```
pub fn gradcheck<F: Fn(&[Var]) -> Result<Var>>(
    f: F,
    inputs: &[Tensor],
    options: &GradcheckOptions,
) -> Result<GradcheckReport> {
    options.check()?;
    let analytic = analytic(&f, inputs)?;
    let base: Vec<Vec<f64>> = inputs.iter().map(host_f64).collect::<Result<_>>()?;
    let mut report = GradcheckReport::default();
    for (k, input) in base.iter().enumerate() {
        let mut numeric = Vec::with_capacity(input.len());
        for i in 0..input.len() {
            let mut shifted = base.clone();
            shifted[k][i] = input[i] + options.eps;
            let plus = loss_f64(&f, &shifted, inputs)?;
            shifted[k][i] = input[i] - options.eps;
            let minus = loss_f64(&f, &shifted, inputs)?;
            numeric.push((plus - minus) / (2.0 * options.eps));
        }
        compare("finite differences", k, &analytic[k], &numeric, options, &mut report)?;
    }
    Ok(report)
}

/// Checks that `f`'s gradients at `inputs` computed on `device` match those computed on the CPU
/// (same inputs, same dtype), within `options`' tolerances.
///
/// On [`Device::Cpu`] this compares the CPU with itself, which passes; pass the device to test.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{GradcheckOptions, compare_devices, ops};
/// use opsmith_host::{DType, Device, Tensor};
/// let x = Tensor::from_vec(vec![0.5f32, 1.5, -2.0, 4.0], [4], Device::Cpu)?;
/// let y = Tensor::from_vec(vec![1.0f32, -1.0, 0.25, 2.0], [4], Device::Cpu)?;
/// let options = GradcheckOptions::for_dtype(DType::F32);
/// let f = |v: &[opsmith_autograd::Var]| ops::mean(&ops::add_mul(&v[0], &v[1], &v[0])?);
/// // On a GPU machine: the CUDA kernels' gradients against the CPU's.
/// let report = compare_devices(f, &[x, y], Device::cuda_if_available(), &options)?;
/// assert_eq!(report.checked, 8);
/// # Ok(()) }
/// ```
pub fn compare_devices<F: Fn(&[Var]) -> Result<Var>>(
    f: F,
    inputs: &[Tensor],
    device: Device,
    options: &GradcheckOptions,
) -> Result<GradcheckReport> {
    let on = |d: Device| -> Result<Vec<Tensor>> { inputs.iter().map(|t| Ok(t.to_device(d)?)).collect() };
    let reference = analytic(&f, &on(Device::Cpu)?)?;
    let got = analytic(&f, &on(device)?)?;
    let mut report = GradcheckReport::default();
    for (k, (g, r)) in got.iter().zip(&reference).enumerate() {
        compare("device vs cpu", k, g, r, options, &mut report)?;
    }
    Ok(report)
}
