//! The first kernel, from Rust source to launch.
//!
//! The kernel is `add_f32` in `kernels-gpu/src/elementwise.rs`: a `#[unsafe(no_mangle)] extern
//! "ptx-kernel" fn` whose body hands `|[a, b]| [a + b]` to the streaming driver of
//! `kernels-gpu/src/device/elementwise.rs` (16-byte loads, grid-stride loop, scalar tail).
//! `host/build.rs` compiles that crate with rustc's nvptx64 backend and embeds the PTX; the
//! host loads it once per device and launches it through one checked path.
//!
//! This example launches it twice: through `ops::add`, and by hand through the typed launcher
//! any kernel declared with `opsmith::kernels::kernel!` gets, then checks both against the CPU.
//!
//! ```text
//! cargo run --release --example vector_add
//! ```
use opsmith::cuda::{self, Grid};
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

    // 2. The same kernel, launched through its declaration.
    if !device.is_cuda() {
        println!("no CUDA device: the by-hand launch needs one (ops::add ran on the CPU backend)");
        return Ok(());
    }
    // The declaration fixes the arguments' kinds and order at compile time: (a, b, out, n).
    let add = opsmith::kernels::names::F32.add;
    let out = Tensor::full(f64::NAN, [n], DType::F32, device)?; // poisoned: unwritten elements show
    cuda::launch(add, Grid::stride((n as u64).div_ceil(4)), (&ta, &tb, &out, n as u64))?;
    assert_eq!(out.to_vec::<f32>()?, expected);
    println!("{} launched by hand: every element written and right", add.name());
    // Dtype, device and length are checked at run time, before the driver sees anything.
    let err = cuda::launch(add, Grid::stride(1), (&ta, &tb, &out, n as u64 + 1)).unwrap_err();
    println!("a length the tensors do not have is refused: {err}");
    Ok(())
}
