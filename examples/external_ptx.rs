//! Loading third-party PTX at run time and launching it through opsmith's checked path: how an
//! existing kernel library (PTX from nvcc, Triton, or another Rust crate) plugs in.
//!
//! The PTX in `examples/ptx/scale.ptx` is hand-written: `y[i] = a * x[i]` for `i < n` (a 32-bit
//! n). The GPU test suite launches the same file.
//! Pass a file to load your own: `cargo run --release --example external_ptx -- my.ptx`; the
//! example then only loads it and lists what it finds.
//!
//! ```text
//! cargo run --release --example external_ptx
//! ```
use opsmith::cuda::{CudaDevice, KernelArg, KernelModule, LaunchConfig, len_as_u32};
use opsmith::{Device, Result, Tensor};

/// Hand-written PTX: `scale_f32(x, y, a, n)` writes `y[i] = a * x[i]` for `i < n` (a 32-bit n).
const SCALE_PTX: &str = include_str!("ptx/scale.ptx");

/// Launches hand-written PTX through opsmith's checked path; given a file, only loads it and
/// counts its kernels.
#[derive(clap::Parser)]
#[command(name = "external_ptx")]
struct Args {
    /// A PTX file of your own to load instead.
    #[arg(value_name = "PTX")]
    ptx: Option<String>,
}

fn main() -> Result<()> {
    let args = <Args as clap::Parser>::parse();
    let device = Device::cuda_if_available();
    let Device::Cuda(ordinal) = device else {
        println!("no CUDA device: PTX modules load on CUDA devices only (Device::Cpu has no PTX)");
        return Ok(());
    };
    if let Some(path) = args.ptx {
        let text = std::fs::read_to_string(&path).map_err(|e| opsmith::host::Error::InvalidArgument {
            op: "external_ptx",
            reason: format!("{path}: {e}"),
        })?;
        KernelModule::from_ptx(&device, &path, &text)?;
        let entries = text.lines().filter_map(|l| l.trim_start().strip_prefix(".visible .entry ")).count();
        println!("{path}: loaded on {device}, {entries} kernels");
        return Ok(());
    }

    let module = KernelModule::from_ptx(&device, "scale", SCALE_PTX)?;
    let scale = module.kernel("scale_f32")?;
    let n = 1 << 20;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
    let tx = Tensor::from_slice(&x, [n], device)?;
    let ty = Tensor::full(f64::NAN, [n], opsmith::DType::F32, device)?; // poisoned
    let len = len_as_u32("scale_f32", n)?; // this kernel takes a 32-bit length: checked, not truncated
    let cfg = LaunchConfig { grid: len.div_ceil(256), block: 256, shared_mem_bytes: 0 };
    let dev = CudaDevice::get(ordinal)?;
    let args = [KernelArg::Input(&tx), KernelArg::Output(&ty), KernelArg::F32(2.0), KernelArg::U32(len)];
    // SAFETY: scale_f32(const f32* x, f32* y, f32 a, u32 n) reads n elements of x and writes n
    // of y; both tensors hold n f32 and do not overlap.
    unsafe { scale.launch(&dev.current_stream(), cfg, &args)? };
    let y = ty.to_vec::<f32>()?;
    let wrong = (0..n).filter(|&i| y[i] != 2.0 * x[i]).count();
    println!("scale_f32 from hand-written PTX on {device}: {n} elements, {wrong} wrong");

    // A broken module is an error with the driver's JIT log, not a crash.
    match KernelModule::from_ptx(&device, "broken", ".version 7.0\n.target sm_70\nnot ptx") {
        Err(e) => println!("a broken module is reported: {e}"),
        Ok(_) => println!("unexpected: the broken module loaded"),
    }
    Ok(())
}
