//! Fused `y = gelu(x + b) + r` against the same computation composed from opsmith's own ops
//! (`add_row`, `gelu`, `add`), forward and backward, on CUDA: event-timed medians after
//! warm-up, bytes each version must move, GB/s, and that as a share of a device-to-device copy
//! of the same size.
//!
//! ```text
//! cargo bench -p opsmith-example-bias-gelu
//! ```
//! Without a CUDA device it says so and exits.
use opsmith::autograd::CustomOp;
use opsmith::cuda::{CudaDevice, time_runs};
use opsmith::{DType, Device, Result, Tensor, ops};
use opsmith_example_bias_gelu::BiasGeluResidual;

const WARMUP: usize = 5;
const REPS: usize = 30;

/// A `[rows, cols]` tensor (or `[cols]` when `rows` is 0) of values in ±3 from a fixed formula,
/// built on the host in f32 and converted.
fn values(rows: usize, cols: usize, phase: f32, dtype: DType, device: Device) -> Result<Tensor> {
    let n = rows.max(1) * cols;
    let v: Vec<f32> = (0..n).map(|i| 3.0 * ((i % 9973) as f32 * 0.37 + phase).sin()).collect();
    let shape: Vec<usize> = if rows == 0 { vec![cols] } else { vec![rows, cols] };
    Ok(Tensor::from_vec(v, shape, Device::Cpu)?.to_dtype(dtype)?.to_device(device)?)
}

fn main() -> Result<()> {
    let device = Device::cuda_if_available();
    if !device.is_cuda() {
        println!("no CUDA device: nothing to time");
        return Ok(());
    }
    let dev = CudaDevice::get(0)?;
    let stream = dev.current_stream();
    let op = BiasGeluResidual;
    println!("{} ({} SMs)", dev.name()?, dev.sm_count());
    println!("| what | dtype | rows × cols | median µs | bytes moved | GB/s | % of copy | fused speed-up |");
    println!("|---|---|---|---|---|---|---|---|");
    // A transformer MLP's hidden width, at a few token counts (2^22 .. 2^26 elements).
    for (dtype, (rows, cols)) in [DType::F32, DType::BF16]
        .into_iter()
        .flat_map(|d| [(1024, 4096), (4096, 4096), (16384, 4096)].map(move |s| (d, s)))
    {
        let x = values(rows, cols, 0.0, dtype, device)?;
        let b = values(0, cols, 0.5, dtype, device)?;
        let r = values(rows, cols, 1.0, dtype, device)?;
        let g = values(rows, cols, 1.5, dtype, device)?;
        let (n, s) = ((rows * cols) as f64, dtype.size_in_bytes() as f64);

        let copy = Tensor::zeros([rows, cols], dtype, device)?;
        let copy_us = 1e3 * time_runs(&stream, WARMUP, REPS, || copy.copy_from_(&x))?.median_ms();
        let copy_gbs = 2.0 * n * s / copy_us / 1e3;

        let fused_fwd = time_runs(&stream, WARMUP, REPS, || op.cuda_forward(&[&x, &b, &r]).map(drop))?;
        let composed_fwd =
            time_runs(&stream, WARMUP, REPS, || ops::add(&ops::gelu(&ops::add_row(&x, &b)?)?, &r).map(drop))?;
        // The composed backward needs z = x + b, which its forward would have kept.
        let z = ops::add_row(&x, &b)?;
        let y = op.cuda_forward(&[&x, &b, &r])?;
        let fused_bwd = time_runs(&stream, WARMUP, REPS, || op.cuda_backward(&[&x, &b, &r], &y, &g).map(drop))?;
        let composed_bwd = time_runs(&stream, WARMUP, REPS, || {
            let dz = ops::gelu_backward(&g, &z)?;
            ops::sum_rows(&dz).map(drop)
        })?;

        // Passes over the activations each version makes, reads plus writes (the bias row and
        // the backward's f32 band sums, at most 1/16 of a pass, are left out): fused forward x,
        // r, y; composed x→z, z→gelu, gelu + r→y; fused backward g, x, dx; composed backward g,
        // z, dz, then dz again to sum its rows.
        let rows_out = [
            ("forward, fused", fused_fwd.median_ms(), 3.0, composed_fwd.median_ms()),
            ("forward, composed", composed_fwd.median_ms(), 7.0, f64::NAN),
            ("backward, fused", fused_bwd.median_ms(), 3.0, composed_bwd.median_ms()),
            ("backward, composed", composed_bwd.median_ms(), 4.0, f64::NAN),
        ];
        for (what, ms, passes, baseline_ms) in rows_out {
            let bytes = passes * n * s;
            let gbs = bytes / ms / 1e6;
            let speedup = if baseline_ms.is_nan() { String::from("") } else { format!("{:.2}×", baseline_ms / ms) };
            println!(
                "| {what} | {dtype} | {rows} × {cols} | {:.1} | {:.0} MB | {gbs:.0} | {:.0}% | {speedup} |",
                ms * 1e3,
                bytes / 1e6,
                100.0 * gbs / copy_gbs
            );
        }
        println!(
            "| copy | {dtype} | {rows} × {cols} | {copy_us:.1} | {:.0} MB | {copy_gbs:.0} | 100% | |",
            2.0 * n * s / 1e6
        );
    }
    Ok(())
}
