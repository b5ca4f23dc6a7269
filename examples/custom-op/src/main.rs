//! Step 4, `custom_op`: a 3×3 weighted filter whose CUDA kernels are Rust in `kernels/`, a
//! kernel crate of its own, wired into autograd with its own backward, and checked with
//! gradcheck.
//!
//! It is this package's binary rather than an example of the `opsmith` package because the
//! kernel crate needs a build script of its own (`build.rs`, with `opsmith-ptx-builder`), as
//! your crate would.
//!
//! ```text
//! cargo run --release -p opsmith-example-custom-op      # the binary `custom_op`
//! ```
use opsmith::autograd::{CustomOp, GradcheckOptions, Result, Tape, compare_devices, custom, gradcheck, ops};
use opsmith::{DType, Device, Tensor};
use opsmith_example_custom_op::{Filter3x3, LAPLACIAN_LIKE};
use std::sync::Arc;

fn image(h: usize, w: usize, dtype: DType) -> Result<Tensor> {
    let values: Vec<f64> = (0..h * w).map(|i| ((i as f64) * 0.61).sin() + 0.25 * ((i / w) as f64)).collect();
    Ok(Tensor::from_vec(values, [h, w], Device::Cpu)?.to_dtype(dtype)?)
}

fn main() -> Result<()> {
    let device = Device::cuda_if_available();
    let filter: Arc<dyn CustomOp> = Arc::new(Filter3x3::new(LAPLACIAN_LIKE, device)?);
    let f = |v: &[opsmith::autograd::Var]| custom(&filter, &[&v[0]]);

    // 1. gradcheck on the CPU, in f64: the backward (the flipped stencil) against finite differences.
    let report = gradcheck(f, &[image(6, 7, DType::F64)?], &GradcheckOptions::for_dtype(DType::F64))?;
    println!("cpu  f64 gradcheck: {} elements, max |error| {:.2e}", report.checked, report.max_abs_error);

    // 2. On CUDA, if present: the Rust kernels' gradients against finite differences, and
    //    against the CPU implementation, in f32 and in f16.
    if device.is_cuda() {
        let x = image(6, 7, DType::F32)?.to_device(device)?;
        let report = gradcheck(f, &[x], &GradcheckOptions::for_dtype(DType::F32))?;
        println!("cuda f32 gradcheck: {} elements, max |error| {:.2e}", report.checked, report.max_abs_error);
        let report =
            compare_devices(f, &[image(64, 48, DType::F32)?], device, &GradcheckOptions::for_dtype(DType::F32))?;
        println!("cuda vs cpu gradients: {} elements, max |difference| {:.2e}", report.checked, report.max_abs_error);
        let report =
            compare_devices(f, &[image(64, 48, DType::F16)?], device, &GradcheckOptions::for_dtype(DType::F16))?;
        println!("cuda vs cpu, f16: {} elements, max |difference| {:.2e}", report.checked, report.max_abs_error);
    } else {
        println!("no CUDA device: the CUDA kernels were built but not run");
    }

    // 3. Used inside a larger graph: smooth an image towards a target by gradient steps.
    let target = image(32, 32, DType::F32)?.to_device(device)?;
    let mut x = Tensor::zeros([32, 32], DType::F32, device)?;
    for step in 0..=40 {
        let tape = Tape::new();
        let xv = tape.var(x.clone());
        // loss = mean((filter(x) - filter(target))²)
        let diff = ops::sub(
            &custom(&filter, &[&xv])?,
            &opsmith::autograd::Var::constant(filter.cpu_or_cuda_forward(&target)?),
        )?;
        let loss = ops::mean(&ops::mul(&diff, &diff)?)?;
        let grads = tape.backward(&loss)?;
        if step % 10 == 0 {
            println!("step {step:2}: loss {:.6}", loss.value().to_dtype(DType::F64)?.to_vec::<f64>()?[0]);
        }
        x = opsmith::ops::fused_mul_add(
            grads.get(&xv).expect("x requires grad"),
            &Tensor::full(-20.0, [32, 32], DType::F32, device)?,
            &x,
        )?;
    }
    Ok(())
}

/// Runs the op's forward on whichever device the tensor is on.
trait ForwardAnywhere {
    fn cpu_or_cuda_forward(&self, x: &Tensor) -> Result<Tensor>;
}

impl ForwardAnywhere for Arc<dyn CustomOp> {
    fn cpu_or_cuda_forward(&self, x: &Tensor) -> Result<Tensor> {
        match x.device() {
            Device::Cpu => self.cpu_forward(&[x]),
            Device::Cuda(_) => self.cuda_forward(&[x]),
        }
    }
}
