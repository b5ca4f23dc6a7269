//! `bias_gelu`: the fused `y = gelu(x + b) + r` op checked against finite differences (CPU,
//! f64) and, on a GPU machine, its CUDA kernels against the CPU in f32, f16 and bf16, then
//! used in a tape next to opsmith's own ops.
//!
//! ```text
//! cargo run --release -p opsmith-example-bias-gelu          # the binary `bias_gelu`
//! cargo bench -p opsmith-example-bias-gelu                  # fused against composed, in GB/s
//! ```
use opsmith::autograd::{CustomOp, GradcheckOptions, Result, Tape, Var, compare_devices, custom, gradcheck, ops};
use opsmith::{DType, Device, Tensor};
use opsmith_example_bias_gelu::BiasGeluResidual;
use std::sync::Arc;

/// A `[rows, cols]` matrix of values in about ±3 (where gelu bends), from a fixed formula.
fn matrix(rows: usize, cols: usize, phase: f64) -> Result<Tensor> {
    let values: Vec<f64> = (0..rows * cols).map(|i| 3.0 * (i as f64 * 0.73 + phase).sin()).collect();
    Ok(Tensor::from_vec(values, [rows, cols], Device::Cpu)?)
}

fn inputs(rows: usize, cols: usize, dtype: DType) -> Result<Vec<Tensor>> {
    let b = matrix(1, cols, 0.5)?.reshape([cols])?;
    [matrix(rows, cols, 0.0)?, b, matrix(rows, cols, 1.0)?].iter().map(|t| Ok(t.to_dtype(dtype)?)).collect()
}

fn main() -> Result<()> {
    let op: Arc<dyn CustomOp> = Arc::new(BiasGeluResidual);
    let f = |v: &[Var]| custom(&op, &[&v[0], &v[1], &v[2]]);

    let report = gradcheck(f, &inputs(4, 6, DType::F64)?, &GradcheckOptions::for_dtype(DType::F64))?;
    println!("cpu  f64 gradcheck: {} elements, max |error| {:.2e}", report.checked, report.max_abs_error);

    let device = Device::cuda_if_available();
    if device.is_cuda() {
        let x: Vec<Tensor> =
            inputs(4, 6, DType::F32)?.iter().map(|t| t.to_device(device)).collect::<opsmith::host::Result<_>>()?;
        let report = gradcheck(f, &x, &GradcheckOptions::for_dtype(DType::F32))?;
        println!("cuda f32 gradcheck: {} elements, max |error| {:.2e}", report.checked, report.max_abs_error);
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let report = compare_devices(f, &inputs(96, 256, dtype)?, device, &GradcheckOptions::for_dtype(dtype))?;
            println!(
                "cuda vs cpu, {dtype}: {} elements, max |difference| {:.2e}",
                report.checked, report.max_abs_error
            );
        }
    } else {
        println!("no CUDA device: the CUDA kernels were built but not run");
    }

    // In a tape, next to built-in ops: one step of a residual MLP block's tail.
    let tape = Tape::new();
    let [x, b, r] = inputs(8, 16, DType::F32)?.try_into().expect("three inputs");
    let (x, b, r) = (tape.var(x.to_device(device)?), tape.var(b.to_device(device)?), tape.var(r.to_device(device)?));
    let loss = ops::mean(&ops::mul(&f(&[x.clone(), b.clone(), r.clone()])?, &x)?)?;
    let grads = tape.backward(&loss)?;
    let db = grads.get(&b).expect("b requires grad").to_dtype(DType::F64)?.to_vec::<f64>()?;
    println!(
        "on {device}: loss {:.6}, d loss / d b[..4] = {:.5?}",
        loss.value().to_dtype(DType::F64)?.to_vec::<f64>()?[0],
        &db[..4]
    );
    Ok(())
}
