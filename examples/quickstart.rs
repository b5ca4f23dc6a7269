//! The first thing to run: the fused ops on CUDA if there is a GPU, else on the CPU, checked
//! against the unfused ops, with what ran where.
//!
//! ```text
//! cargo run --release --example quickstart
//! ```
use opsmith::{Device, Result, Tensor, ops};

fn main() -> Result<()> {
    let device = Device::cuda_if_available();
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(n) => {
            let dev = opsmith::cuda::CudaDevice::get(n)?;
            let (major, minor) = dev.compute_capability()?;
            println!(
                "running on {device}: {} (compute capability {major}.{minor}, {} SMs)",
                dev.name()?,
                dev.sm_count()
            );
        }
        _ => println!("no CUDA device found: running on the CPU backend"),
    }

    let n = 1 << 20;
    let values = |k: f32| (0..n).map(move |i| (i as f32 * 0.37 + k).sin() * 3.0).collect::<Vec<f32>>();
    let a = Tensor::from_vec(values(0.5), [n], device)?;
    let b = Tensor::from_vec(values(-1.0), [n], device)?;
    let c = Tensor::from_vec(values(2.0), [n], device)?;

    // d = a * b + c: one pass instead of two.
    let fused = ops::fused_mul_add(&a, &b, &c)?;
    let unfused = ops::add(&ops::mul(&a, &b)?, &c)?;
    let max_diff = max_abs_diff(&fused, &unfused)?;
    println!(
        "fused_mul_add on {}: {n} elements, max |fused - unfused| = {max_diff:e} (the fused op rounds once, mul then add twice)",
        fused.device()
    );

    // z = (x + y) * w and its fused backward.
    let z = ops::add_mul(&a, &b, &c)?;
    let g = Tensor::full(1.0, [n], opsmith::DType::F32, device)?;
    let (gxy, gw) = ops::add_mul_backward(&g, &a, &b, &c)?;
    let (z, gxy, gw) = (z.to_vec::<f32>()?, gxy.to_vec::<f32>()?, gw.to_vec::<f32>()?);
    println!("add_mul on {device}: z[5] = {}, dz/dx[5] = dz/dy[5] = {}, dz/dw[5] = {}", z[5], gxy[5], gw[5]);
    Ok(())
}

fn max_abs_diff(x: &Tensor, y: &Tensor) -> Result<f32> {
    let (x, y) = (x.to_vec::<f32>()?, y.to_vec::<f32>()?);
    Ok(x.iter().zip(&y).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max))
}
