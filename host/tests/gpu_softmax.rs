//! The GPU suite of softmax, cross-entropy and the squared error (`--features gpu-tests`; needs
//! a CUDA device): the shared cases on `Device::Cuda(0)` against f64, and what only CUDA has:
//! many more rows than resident warps (each warp loops over rows), outputs written over
//! NaN-poisoned memory, and operands on different devices.
mod common;
mod softmax_cases;

use opsmith_host::{DType, Device, Error, Labels, Result, Tensor, ops};
use rand::{Rng, SeedableRng, rngs::StdRng};
use softmax_cases::{random_values, round_to, softmax_reference};

const GPU: Device = Device::Cuda(0);

softmax_cases!(GPU);

/// Frees a NaN-filled block of `n` elements just before an op allocates its output: the
/// device's memory pool hands the same block back, so an element the kernel fails to write
/// reads as NaN rather than as a correct value left by an earlier run.
fn poison_pool(n: usize, dtype: DType) -> Result<()> {
    drop(Tensor::full(f64::NAN, [n], dtype, GPU)?);
    Ok(())
}

/// Thousands of rows per launch (several per warp) at each kernel tier: register-resident
/// short and full rows, and the two-pass long rows; forward with a row mask and backward, every
/// element checked against f64 over poisoned output memory.
#[test]
fn many_rows_per_warp() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(21);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (rows, cols) in [(20_000, 64), (3_000, 4096), (2_000, 1000), (600, 8192)] {
            let n = rows * cols;
            let x = random_values(&mut rng, n, dtype);
            let mut mask = random_values(&mut rng, cols, dtype);
            mask.iter_mut().step_by(3).for_each(|m| *m = f64::NEG_INFINITY);
            let xt = Tensor::from_f64(&x, [rows, cols], dtype, GPU)?;
            let mt = Tensor::from_f64(&mask, [cols], dtype, GPU)?;
            poison_pool(n, dtype)?;
            let y = ops::softmax(&xt, 0.5, Some(&mt))?.to_vec_f64()?;
            let (want, magnitude) = softmax_reference(&x, Some(&mask), cols, 0.5);
            let u = f32::EPSILON as f64 / 2.0;
            let store = if dtype == DType::F32 { 0.0 } else { dtype.unit_roundoff() * 1.01 };
            for i in 0..n {
                if magnitude[i].is_infinite() {
                    assert_eq!(y[i], 0.0, "{dtype} [{rows}, {cols}] element {i}: masked out");
                } else {
                    let tol = want[i] * (u * (16.0 + 4.0 * magnitude[i] + cols as f64 / 16.0) + store) + 2f64.powi(-24);
                    assert!(
                        (y[i] - want[i]).abs() <= tol,
                        "{dtype} [{rows}, {cols}] element {i}: {} vs {}",
                        y[i],
                        want[i]
                    );
                }
            }

            // Backward from the rounded forward output.
            let yr: Vec<f64> = want.iter().map(|&v| round_to(dtype, v)).collect();
            let g = random_values(&mut rng, n, dtype);
            let (gt, yt) =
                (Tensor::from_f64(&g, [rows, cols], dtype, GPU)?, Tensor::from_f64(&yr, [rows, cols], dtype, GPU)?);
            poison_pool(n, dtype)?;
            let gx = ops::softmax_backward(&gt, &yt, 2.0)?.to_vec_f64()?;
            for (r, (grow, yrow)) in g.chunks(cols).zip(yr.chunks(cols)).enumerate() {
                let dot: f64 = grow.iter().zip(yrow).map(|(g, y)| g * y).sum();
                let dot_abs: f64 = grow.iter().zip(yrow).map(|(g, y)| (g * y).abs()).sum();
                for c in 0..cols {
                    let i = r * cols + c;
                    let want = 2.0 * yrow[c] * (grow[c] - dot);
                    let tol =
                        2.0 * yrow[c] * u * ((cols as f64 / 32.0 + 8.0) * dot_abs + 3.0 * (grow[c].abs() + dot.abs()))
                            + store * want.abs()
                            + 2f64.powi(-24);
                    assert!(
                        (gx[i] - want).abs() <= tol,
                        "backward {dtype} [{rows}, {cols}] element {i}: {} vs {want}",
                        gx[i]
                    );
                }
            }
        }
    }
    Ok(())
}

/// Cross-entropy over more rows than resident warps, with labels uploaded on the device, over
/// poisoned memory; the backward reads `g` on the device.
#[test]
fn cross_entropy_many_rows() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(22);
    let (rows, classes) = (50_000, 37);
    let x = random_values(&mut rng, rows * classes, DType::F32);
    let labels: Vec<u32> = (0..rows).map(|_| rng.random_range(0..classes as u32)).collect();
    let xt = Tensor::from_f64(&x, [rows, classes], DType::F32, GPU)?;
    let lt = Labels::new(&labels, GPU)?;
    poison_pool(rows, DType::F32)?;
    let loss = ops::cross_entropy(&xt, &lt)?.to_vec_f64()?[0];
    let mut total = 0.0;
    for (row, &label) in x.chunks(classes).zip(&labels) {
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        total += max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln() - row[label as usize];
    }
    let want = total / rows as f64;
    // Per row: logits up to 16 and 37 exponentials; then 50 000 losses added in one warp.
    let u = f32::EPSILON as f64 / 2.0;
    assert!((loss - want).abs() <= u * (rows as f64 / 32.0 + 150.0) * want.abs(), "{loss} vs {want}");
    let g = Tensor::from_f64(&[3.0], [], DType::F32, GPU)?;
    poison_pool(rows * classes, DType::F32)?;
    let gx = ops::cross_entropy_backward(&g, &xt, &lt)?.to_vec_f64()?;
    let (p, _) = softmax_reference(&x, None, classes, 1.0);
    for i in 0..rows * classes {
        let target = if i % classes == labels[i / classes] as usize { 1.0 } else { 0.0 };
        let want = (p[i] - target) * 3.0 / rows as f64;
        assert!((gx[i] - want).abs() <= 2e-5 * 3.0 / rows as f64, "element {i}: {} vs {want}", gx[i]);
    }
    Ok(())
}

/// Operands on different devices are rejected with the op named, before any launch.
#[test]
fn device_mismatch_is_an_error() -> Result<()> {
    let x = Tensor::from_f64(&[1.0; 6], [2, 3], DType::F32, GPU)?;
    let cpu_mask = Tensor::from_f64(&[0.0; 3], [3], DType::F32, Device::Cpu)?;
    let err = ops::softmax(&x, 1.0, Some(&cpu_mask)).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "softmax", lhs: GPU, rhs: Device::Cpu }), "{err}");
    let cpu_labels = Labels::new(&[0, 1], Device::Cpu)?;
    let err = ops::cross_entropy(&x, &cpu_labels).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "cross_entropy", lhs: GPU, rhs: Device::Cpu }), "{err}");
    let labels = Labels::new(&[0, 1], GPU)?;
    let cpu_g = Tensor::from_f64(&[1.0], [], DType::F32, Device::Cpu)?;
    let err = ops::cross_entropy_backward(&cpu_g, &x, &labels).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "cross_entropy_backward", .. }), "{err}");
    let cpu_x = Tensor::from_f64(&[1.0; 6], [2, 3], DType::F32, Device::Cpu)?;
    let err = ops::mse_loss(&x, &cpu_x).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "mse_loss", .. }), "{err}");
    Ok(())
}
