//! How long a fresh process takes to its first CUDA result, step by step: loading the driver,
//! creating the context, uploading the inputs, and the first `fused_mul_add` (which loads the
//! elementwise kernels: the shipped cubin for this GPU, or the PTX, which the driver compiles).
//!
//! ```text
//! CUDA_CACHE_DISABLE=1 cargo run --release --example cold_start   # as a fresh container sees it
//! OPSMITH_KERNEL_IMAGE=ptx CUDA_CACHE_DISABLE=1 cargo run --release --example cold_start   # the PTX path
//! ```
use opsmith::cuda::{self, CudaDevice};
use opsmith::{Device, Tensor, ops};
use std::time::Instant;

fn main() -> opsmith::Result<()> {
    let start = Instant::now();
    let mut last = start;
    let mut steps: Vec<(&str, f64)> = Vec::new();
    let mut lap = |what| {
        let now = Instant::now();
        steps.push((what, (now - last).as_secs_f64() * 1e3));
        last = now;
    };
    let gpus = cuda::device_count().unwrap_or(0);
    lap("load the driver, cuInit, count devices");
    if gpus == 0 {
        println!("cold_start: no CUDA device found; this measures a GPU's first op, so there is nothing to do.");
        return Ok(());
    }
    let dev = CudaDevice::get(0)?;
    lap("create the context and default stream");
    let n = 1 << 20;
    let a = Tensor::from_vec((0..n).map(|i| (i % 5) as f32).collect(), [n], Device::Cuda(0))?;
    let b = Tensor::from_vec(vec![2.0f32; n], [n], Device::Cuda(0))?;
    lap("upload two 4 MiB inputs");
    let d = ops::fused_mul_add(&a, &b, &b)?;
    let values = d.to_vec::<f32>()?;
    lap("first fused_mul_add (loads its kernels), result on the host");
    let _again = ops::fused_mul_add(&a, &b, &b)?.to_vec::<f32>()?;
    lap("second fused_mul_add, result on the host");
    let total_ms = steps.iter().take(4).map(|(_, ms)| ms).sum::<f64>();

    let wrong = values.iter().enumerate().filter(|&(i, &v)| v != (i % 5) as f32 * 2.0 + 2.0).count();
    let (major, minor) = dev.compute_capability()?;
    println!("{} (sm_{major}{minor}); JIT cache {}", dev.name()?, jit_cache());
    println!("| step | ms |\n|---|---|");
    for (what, ms) in &steps {
        println!("| {what} | {ms:.1} |");
    }
    for m in dev.loaded_modules() {
        println!(
            "| of which: load {} from the {} | {:.1} |",
            m.family.name(),
            m.image,
            m.load_time.as_secs_f64() * 1e3
        );
    }
    println!("first CUDA result {total_ms:.1} ms after main() began");
    if wrong > 0 {
        eprintln!("{wrong} wrong values");
        std::process::exit(1);
    }
    Ok(())
}

fn jit_cache() -> &'static str {
    if std::env::var("CUDA_CACHE_DISABLE").is_ok_and(|v| v == "1") { "off" } else { "on" }
}
