//! Loading third-party PTX at run time and launching it through opsmith's checked path: how an
//! existing kernel library (PTX from nvcc, Triton, or another Rust crate) plugs in.
//!
//! The PTX below is hand-written `saxpy`: `y[i] = a * x[i] + y[i]` for `i < n` (a 32-bit n).
//! Pass a file to load your own: `cargo run --release --example external_ptx -- my.ptx`; the
//! example then only loads it and lists what it finds.
//!
//! ```text
//! cargo run --release --example external_ptx
//! ```
use opsmith::cuda::{CudaDevice, KernelArg, KernelModule, LaunchConfig, len_as_u32};
use opsmith::{Device, Result, Tensor};

const SAXPY_PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64
.visible .entry saxpy(.param .f32 a, .param .u64 x, .param .u64 y, .param .u32 n)
{
    .reg .pred %p;
    .reg .b32 %r<6>;
    .reg .f32 %f<5>;
    .reg .b64 %rd<6>;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mad.lo.u32 %r4, %r1, %r2, %r3;
    ld.param.u32 %r5, [n];
    setp.ge.u32 %p, %r4, %r5;
    @%p ret;
    ld.param.u64 %rd1, [x];
    ld.param.u64 %rd2, [y];
    mul.wide.u32 %rd3, %r4, 4;
    add.u64 %rd4, %rd1, %rd3;
    add.u64 %rd5, %rd2, %rd3;
    ld.global.f32 %f1, [%rd4];
    ld.global.f32 %f2, [%rd5];
    ld.param.f32 %f3, [a];
    fma.rn.f32 %f4, %f3, %f1, %f2;
    st.global.f32 [%rd5], %f4;
    ret;
}
"#;

fn main() -> Result<()> {
    let device = Device::cuda_if_available();
    let Device::Cuda(ordinal) = device else {
        println!("no CUDA device: PTX modules load on CUDA devices only (Device::Cpu has no PTX)");
        return Ok(());
    };
    if let Some(path) = std::env::args().nth(1) {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| opsmith::Error::InvalidArgument { op: "external_ptx", reason: format!("{path}: {e}") })?;
        KernelModule::from_ptx(&device, &path, &text)?;
        let entries = text.lines().filter_map(|l| l.trim_start().strip_prefix(".visible .entry ")).count();
        println!("{path}: loaded on {device}, {entries} kernels");
        return Ok(());
    }

    let module = KernelModule::from_ptx(&device, "saxpy", SAXPY_PTX)?;
    let saxpy = module.kernel("saxpy")?;
    let n = 1 << 20;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let y0: Vec<f32> = (0..n).map(|i| 1.0 - i as f32).collect();
    let (tx, ty) = (Tensor::from_slice(&x, [n], device)?, Tensor::from_slice(&y0, [n], device)?);
    let len = len_as_u32("saxpy", n)?; // this kernel takes a 32-bit length: checked, not truncated
    let cfg = LaunchConfig { grid: len.div_ceil(256), block: 256, shared_mem_bytes: 0 };
    let dev = CudaDevice::get(ordinal)?;
    // SAFETY: saxpy(f32 a, const f32* x, f32* y, u32 n) reads n elements of x and updates n of
    // y; both tensors hold n f32 and do not overlap.
    unsafe {
        saxpy.launch(
            &dev.current_stream(),
            cfg,
            &[KernelArg::F32(2.0), KernelArg::Input(&tx), KernelArg::Output(&ty), KernelArg::U32(len)],
        )?
    };
    let y = ty.to_vec::<f32>()?;
    let wrong = (0..n).filter(|&i| y[i] != 2.0f32.mul_add(x[i], y0[i])).count();
    println!("saxpy from hand-written PTX on {device}: {n} elements, {wrong} wrong");

    // A broken module is an error with the driver's JIT log, not a crash.
    match KernelModule::from_ptx(&device, "broken", ".version 7.0\n.target sm_70\nnot ptx") {
        Err(e) => println!("a broken module is reported: {e}"),
        Ok(_) => println!("unexpected: the broken module loaded"),
    }
    Ok(())
}
