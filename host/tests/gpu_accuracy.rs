//! Accuracy of the f32 reductions on CUDA against f64 (`--features gpu-tests`; needs a GPU):
//! a long `mean`, softmax over rows of 40000 values and its backward. The bars are twice the
//! normwise relative errors PyTorch measured on the H200 for the same shapes (7.2e-8, 2.2e-7,
//! 2.6e-7). With `OPSMITH_ACCURACY_DUMP=DIR` the inputs are written to DIR as raw f32
//! (`benches/accuracy_torch.py` measures PyTorch on exactly them).
use opsmith_host::{Device, Result, Tensor, ops};
use rand::{Rng, SeedableRng, rngs::StdRng};

const GPU: Device = Device::Cuda(0);

/// `‖got - exact‖₂ / ‖exact‖₂`.
fn normwise(got: &[f32], exact: &[f64]) -> f64 {
    let err: f64 = got.iter().zip(exact).map(|(&g, &e)| (g as f64 - e).powi(2)).sum();
    let norm: f64 = exact.iter().map(|e| e * e).sum();
    (err / norm).sqrt()
}

fn dump(name: &str, values: &[f32]) {
    if let Some(dir) = std::env::var_os("OPSMITH_ACCURACY_DUMP") {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(std::path::Path::new(&dir).join(name), bytes).unwrap();
    }
}

#[test]
fn mean_of_many_mixed_sign_values() -> Result<()> {
    let n = 262_145;
    let mut rng = StdRng::seed_from_u64(1);
    let x: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..2.0)).collect();
    dump("mean_x.f32", &x);
    let got = ops::mean(&Tensor::from_vec(x.clone(), [n], GPU)?)?.to_vec::<f32>()?;
    let exact = x.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
    let error = normwise(&got, &[exact]);
    println!("mean of {n}: normwise relative error {error:.3e}");
    assert!(error <= 2.0 * 7.2e-8, "mean: {error:.3e}, more than twice PyTorch's 7.2e-8");
    Ok(())
}

#[test]
fn softmax_and_its_backward_over_rows_of_40000() -> Result<()> {
    let (rows, cols) = (64, 40_000);
    let mut rng = StdRng::seed_from_u64(2);
    let normal = |rng: &mut StdRng| -> f32 {
        // Box-Muller: standard normal values, like torch.randn.
        let (u, v): (f64, f64) = (rng.random_range(f64::EPSILON..1.0), rng.random_range(0.0..1.0));
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    };
    let x: Vec<f32> = (0..rows * cols).map(|_| normal(&mut rng)).collect();
    let g: Vec<f32> = (0..rows * cols).map(|_| normal(&mut rng)).collect();
    dump("softmax_x.f32", &x);
    dump("softmax_g.f32", &g);
    let xt = Tensor::from_vec(x.clone(), [rows, cols], GPU)?;
    let y = ops::softmax(&xt, 1.0, None)?;
    let gx = ops::softmax_backward(&Tensor::from_vec(g.clone(), [rows, cols], GPU)?, &y, 1.0)?;
    let (y, gx) = (y.to_vec::<f32>()?, gx.to_vec::<f32>()?);

    let (mut exact_y, mut exact_gx) = (vec![0f64; rows * cols], vec![0f64; rows * cols]);
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let max = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
        for c in 0..cols {
            exact_y[r * cols + c] = (row[c] as f64 - max).exp() / sum;
        }
        // The backward of the f32 forward the kernel was given: y as computed, g as stored.
        let dot: f64 = (0..cols).map(|c| g[r * cols + c] as f64 * y[r * cols + c] as f64).sum();
        for c in 0..cols {
            let i = r * cols + c;
            exact_gx[i] = y[i] as f64 * (g[i] as f64 - dot);
        }
    }
    let (forward, backward) = (normwise(&y, &exact_y), normwise(&gx, &exact_gx));
    println!("softmax [{rows}, {cols}]: forward {forward:.3e}, backward {backward:.3e}");
    assert!(forward <= 2.0 * 2.2e-7, "softmax forward: {forward:.3e}, more than twice PyTorch's 2.2e-7");
    assert!(backward <= 2.0 * 2.6e-7, "softmax backward: {backward:.3e}, more than twice PyTorch's 2.6e-7");
    Ok(())
}
