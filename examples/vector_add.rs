//! The first kernel, from Rust source to launch.
//!
//! The kernel is `add_f32` in `kernels-gpu/src/elementwise.rs`: a `#[unsafe(no_mangle)] extern
//! "ptx-kernel" fn` whose body hands `|[a, b]| [a + b]` to the streaming driver of
//! `kernels-gpu/src/device/elementwise.rs` (16-byte loads, grid-stride loop, scalar tail).
//! `host/build.rs` compiles that crate with rustc's nvptx64 backend and embeds the PTX; the
//! host loads it once per device and launches it through one checked path.
//!
//! This example launches it twice: through `ops::add`, and by hand through the same path any
//! kernel takes (`Kernel::launch` with typed arguments), then checks both against the CPU.
//!
//! ```text
//! cargo run --release --example vector_add
//! ```
use opsmith::cuda::{CudaDevice, DEFAULT_BLOCK, KernelArg, LaunchConfig};
use opsmith::{DType, Device, Result, Tensor, ops};

fn main() -> Result<()> {
    let n = 1_000_003; // not a multiple of the 4-element pack: the tail runs too
    let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.001).sin()).collect();
    let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.002).cos()).collect();
    let expected: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();

    let device = Device::cuda_if_available();
    let (ta, tb) = (Tensor::from_slice(&a, [n], device)?, Tensor::from_slice(&b, [n], device)?);

    // 1. The op.
    let sum = ops::add(&ta, &tb)?;
    assert_eq!(sum.to_vec::<f32>()?, expected);
    println!("ops::add on {device}: {n} elements, equal to the CPU sum");

    // 2. The same kernel, launched by name.
    let Device::Cuda(ordinal) = device else {
        println!("no CUDA device: the by-hand launch needs one (ops::add ran on the CPU backend)");
        return Ok(());
    };
    let dev = CudaDevice::get(ordinal)?;
    let kernel = dev.kernel(opsmith::kernels::names::F32.add)?;
    let out = Tensor::full(f64::NAN, [n], DType::F32, device)?; // poisoned: unwritten elements show
    let cfg = LaunchConfig::grid_stride(&kernel, (n as u64).div_ceil(4), DEFAULT_BLOCK)?;
    let args = [KernelArg::Input(&ta), KernelArg::Input(&tb), KernelArg::Output(&out), KernelArg::U64(n as u64)];
    // SAFETY: add_f32(a, b, out, n) reads n f32 of a and b and writes n of out, which is what
    // these tensors hold; out overlaps neither input.
    unsafe { kernel.launch(&dev.current_stream(), cfg, &args)? };
    assert_eq!(out.to_vec::<f32>()?, expected);
    println!("add_f32 launched by hand: grid {} × block {}, every element written and right", cfg.grid, cfg.block);
    Ok(())
}
