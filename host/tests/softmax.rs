//! The CPU suite of softmax, cross-entropy and the squared error: the shared cases on
//! `Device::Cpu`, and the finite-difference checks of the backwards (in f64, where central
//! differences are accurate to about 1e-9).
mod common;
mod softmax_cases;

use opsmith_host::{DType, Device, Error, Labels, Result, Tensor, ops};
use rand::{SeedableRng, rngs::StdRng};
use softmax_cases::random_values;

softmax_cases!(Device::Cpu);

const H: f64 = 1e-6;

fn f64_tensor(values: &[f64], shape: &[usize]) -> Result<Tensor> {
    Tensor::from_f64(values, shape.to_vec(), DType::F64, Device::Cpu)
}

/// `(f(v + h e_i) - f(v - h e_i)) / 2h` for every `i`.
fn central_differences(v: &[f64], mut f: impl FnMut(&[f64]) -> Result<f64>) -> Result<Vec<f64>> {
    let mut out = Vec::with_capacity(v.len());
    for i in 0..v.len() {
        let (mut plus, mut minus) = (v.to_vec(), v.to_vec());
        plus[i] += H;
        minus[i] -= H;
        out.push((f(&plus)? - f(&minus)?) / (2.0 * H));
    }
    Ok(out)
}

fn assert_gradient(analytic: &[f64], numeric: &[f64], what: &str) {
    for (i, (a, n)) in analytic.iter().zip(numeric).enumerate() {
        assert!((a - n).abs() <= 1e-7 * (1.0 + n.abs()), "{what}[{i}]: analytic {a:e}, central difference {n:e}");
    }
}

/// The gradient of `sum(g * softmax(scale * x + mask))` for `x` (`softmax_backward` with the
/// scale) and for the mask (scale 1), against central differences; the mask has a `-inf`.
#[test]
fn softmax_backward_matches_finite_differences() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(11);
    let (rows, cols, scale) = (3, 7, -1.25);
    let x = random_values(&mut rng, rows * cols, DType::F64);
    let g = random_values(&mut rng, rows * cols, DType::F64);
    let mut mask = random_values(&mut rng, cols, DType::F64);
    mask[4] = f64::NEG_INFINITY;
    let loss = |x: &[f64], mask: &[f64]| -> Result<f64> {
        let y = ops::softmax(&f64_tensor(x, &[rows, cols])?, scale, Some(&f64_tensor(mask, &[cols])?))?;
        Ok(y.to_vec_f64()?.iter().zip(&g).map(|(y, g)| y * g).sum())
    };
    let y = ops::softmax(&f64_tensor(&x, &[rows, cols])?, scale, Some(&f64_tensor(&mask, &[cols])?))?;
    let gt = f64_tensor(&g, &[rows, cols])?;
    let gx = ops::softmax_backward(&gt, &y, scale)?.to_vec_f64()?;
    assert_gradient(&gx, &central_differences(&x, |x| loss(x, &mask))?, "d/dx");
    // The mask's gradient is the unscaled backward, summed over the rows it is added to.
    let gm = ops::softmax_backward(&gt, &y, 1.0)?.to_vec_f64()?;
    let gm: Vec<f64> = (0..cols).map(|c| (0..rows).map(|r| gm[r * cols + c]).sum()).collect();
    let finite: Vec<usize> = (0..cols).filter(|&c| c != 4).collect();
    let numeric = central_differences(&mask, |m| loss(&x, m))?;
    for c in finite {
        assert_gradient(&gm[c..=c], &numeric[c..=c], "d/dmask");
    }
    assert_eq!(gm[4], 0.0, "a masked-out value has no gradient");
    Ok(())
}

/// The gradient of the mean cross-entropy for the logits against central differences.
#[test]
fn cross_entropy_backward_matches_finite_differences() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(12);
    let (rows, classes) = (4, 5);
    let x = random_values(&mut rng, rows * classes, DType::F64);
    let labels = Labels::new(&[0, 4, 2, 2], Device::Cpu)?;
    let g = f64_tensor(&[0.5], &[])?;
    let analytic = ops::cross_entropy_backward(&g, &f64_tensor(&x, &[rows, classes])?, &labels)?.to_vec_f64()?;
    let numeric = central_differences(&x, |x| {
        Ok(0.5 * ops::cross_entropy(&f64_tensor(x, &[rows, classes])?, &labels)?.to_vec_f64()?[0])
    })?;
    assert_gradient(&analytic, &numeric, "d/dlogits");
    Ok(())
}

/// The gradient of the mean squared error for the prediction against central differences.
#[test]
fn mse_backward_matches_finite_differences() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(13);
    let p = random_values(&mut rng, 9, DType::F64);
    let t = f64_tensor(&random_values(&mut rng, 9, DType::F64), &[3, 3])?;
    let g = f64_tensor(&[-2.0], &[1])?;
    let analytic = ops::mse_loss_backward(&g, &f64_tensor(&p, &[3, 3])?, &t)?.to_vec_f64()?;
    let numeric =
        central_differences(&p, |p| Ok(-2.0 * ops::mse_loss(&f64_tensor(p, &[3, 3])?, &t)?.to_vec_f64()?[0]))?;
    assert_gradient(&analytic, &numeric, "d/dpred");
    Ok(())
}

/// A NaN or infinite scale would make every output NaN: both softmax and its backward refuse
/// it, as attention does, naming the op and the scale.
#[test]
fn softmax_refuses_a_non_finite_scale() -> Result<()> {
    let x = f64_tensor(&[0.5, -1.0, 2.0, 0.0], &[2, 2])?;
    let y = ops::softmax(&x, 1.0, None)?;
    for scale in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        for (name, result) in
            [("softmax", ops::softmax(&x, scale, None)), ("softmax_backward", ops::softmax_backward(&x, &y, scale))]
        {
            match result {
                Err(err @ Error::InvalidArgument { op, .. }) => {
                    assert_eq!(op, name);
                    assert_eq!(err.to_string(), format!("{name}: scale must be finite, got {scale}"));
                }
                other => panic!(
                    "{name} with scale {scale}: expected InvalidArgument, got {:?}",
                    other.map(|t| t.to_vec_f64())
                ),
            }
        }
    }
    // A finite scale still works: [0.5, -1] scaled by 2 is [1, -2], softmax 1 / (1 + e^-3) first.
    let scaled = ops::softmax(&x, 2.0, None)?.to_vec_f64()?;
    assert!((scaled[0] - 1.0 / (1.0 + (-3.0f64).exp())).abs() < 1e-15, "{scaled:?}");
    Ok(())
}
