//! What opsmith sees on this machine, and the fix for each problem it finds: the first thing to
//! run when something does not work.
//!
//! ```text
//! cargo run --release --example doctor
//! ```
use opsmith::cuda::{self, CudaDevice, prebuilt};
use opsmith::kernels::Family;
use opsmith::kernels::prebuilt::{CUBIN_ARCHS, PTX_ARCH};
use std::process::Command;

fn main() {
    let mut problems: Vec<(String, String)> = Vec::new();
    println!("opsmith {}", env!("CARGO_PKG_VERSION"));
    let ptx_version = prebuilt::ptx(Family::Elementwise)
        .ok()
        .and_then(|ptx| ptx.lines().find_map(|l| l.strip_prefix(".version ").map(String::from)))
        .unwrap_or_else(|| "?".into());
    let archs: Vec<String> = CUBIN_ARCHS.iter().map(|a| format!("sm_{a}")).collect();
    println!(
        "shipped kernels: {} in {} families; PTX for {PTX_ARCH} (PTX ISA {ptx_version}), cubins for {}",
        opsmith::kernels::names::all_kernel_names().count(),
        Family::ALL.len(),
        archs.join(", ")
    );
    println!("driver JIT cache (used for PTX only): {}", jit_cache());

    // The driver and the GPUs.
    if !cuda::driver_available() {
        println!("CUDA driver: not found (libcuda could not be loaded)");
        problems.push((
            "no CUDA driver".into(),
            "install the NVIDIA driver (it provides libcuda.so.1), or use Device::Cpu: every op also runs on the CPU"
                .into(),
        ));
    } else {
        match cuda::driver_version() {
            Ok((major, minor)) => println!("CUDA driver: supports CUDA {major}.{minor}"),
            Err(e) => problems.push((format!("cuDriverGetVersion failed: {e}"), "reinstall the NVIDIA driver".into())),
        }
        match cuda::device_count() {
            Ok(0) => {
                problems.push(("the driver sees no GPU".into(), "check `nvidia-smi` and CUDA_VISIBLE_DEVICES".into()))
            }
            Ok(n) => {
                for ordinal in 0..n {
                    describe(ordinal, &mut problems);
                }
                peers(n);
            }
            Err(e) => problems.push((
                format!("counting devices failed: {e}"),
                "check `nvidia-smi`; a driver/library version mismatch shows here".into(),
            )),
        }
    }

    // cuBLAS, which matmul uses on CUDA (the CPU needs none).
    #[cfg(not(feature = "cublas"))]
    println!("cuBLAS: not compiled in (the `cublas` feature is off): matmul runs on the CPU only");
    #[cfg(feature = "cublas")]
    match cuda::require_cublas("matmul") {
        Ok(()) => println!("cuBLAS: loads (every matmul on CUDA is available)"),
        Err(opsmith::host::Error::LibraryMissing { lib, fix, .. }) => {
            println!("cuBLAS: not found ({lib} could not be loaded)");
            if cuda::driver_available() {
                problems.push((
                    "cuBLAS is missing: matmul on CUDA fails beyond small products; everything else works".into(),
                    fix,
                ));
            } else {
                // Not a problem without a GPU, but say how to fix it for when there is one.
                println!("    (needed only for matmul on CUDA beyond small products; fix: {fix})");
            }
        }
        Err(e) => problems.push((format!("checking for cuBLAS failed: {e}"), "report this as a bug".into())),
    }

    // NCCL, for several GPUs (opsmith::host::dist); everything else works without it.
    #[cfg(not(feature = "nccl"))]
    println!("NCCL: not compiled in (the `nccl` feature is off; needed only for several GPUs)");
    #[cfg(feature = "nccl")]
    match opsmith::host::dist::nccl_version() {
        Ok((major, minor, patch)) => println!("NCCL: {major}.{minor}.{patch} loads (multi-GPU collectives available)"),
        Err(opsmith::host::Error::LibraryMissing { fix, .. }) => {
            println!("NCCL: not loadable (only needed for several GPUs)");
            if cuda::driver_available() {
                problems.push(("NCCL cannot be loaded, so opsmith::host::dist cannot run collectives".into(), fix));
            } else {
                println!("    (needed only for collectives between GPUs; fix: {fix})");
            }
        }
        Err(e) => problems.push((format!("NCCL: {e}"), "reinstall NCCL".into())),
    }

    // Building opsmith needs any stable rustc; only writing kernels of your own needs a
    // nightly with rust-src, so this is information, not a problem.
    let rustc = Command::new("rustc")
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    match rustc {
        Some(v) if v.contains("nightly") => println!("rustc: {v} (can build kernels of your own, with rust-src)"),
        Some(v) => println!("rustc: {v} (builds opsmith; kernels of your own need a nightly with rust-src)"),
        None => println!("rustc: not on PATH (only needed to build)"),
    }

    println!();
    if problems.is_empty() {
        println!("no problems found");
    } else {
        for (problem, fix) in &problems {
            println!("problem: {problem}\n    fix: {fix}");
        }
    }
}

fn describe(ordinal: usize, problems: &mut Vec<(String, String)>) {
    let dev = match CudaDevice::get(ordinal) {
        Ok(dev) => dev,
        Err(e) => {
            problems.push((
                format!("cuda:{ordinal} cannot be opened: {e}"),
                "check `nvidia-smi` for the device's state".into(),
            ));
            return;
        }
    };
    let name = dev.name().unwrap_or_else(|e| format!("? ({e})"));
    let (major, minor) = dev.compute_capability().unwrap_or((0, 0));
    let (free, total) = dev.memory_info().unwrap_or((0, 0));
    println!(
        "cuda:{ordinal}: {name}, compute capability {major}.{minor}, {} SMs, {:.1} of {:.1} GiB free",
        dev.sm_count(),
        free as f64 / (1u64 << 30) as f64,
        total as f64 / (1u64 << 30) as f64
    );
    if major < 7 {
        problems.push((
            format!(
                "cuda:{ordinal} has compute capability {major}.{minor}; the embedded PTX needs 7.0 (Volta) or newer"
            ),
            "use a newer GPU, or Device::Cpu".into(),
        ));
    }
    println!("cuda:{ordinal}: kernels load from the {}", prebuilt::choose_image(major, minor));
    for family in Family::ALL {
        if 10 * major + minor < family.min_arch() {
            println!(
                "    {:>12}: not loaded: needs sm_{} (its ops take their other path here)",
                family.name(),
                family.min_arch()
            );
            continue;
        }
        if let Err(e) = dev.module(family) {
            problems.push((
                format!("cuda:{ordinal} cannot load the {} kernels: {e}", family.name()),
                "the driver is older than the PTX ISA version above: update the NVIDIA driver".into(),
            ));
        }
    }
    for m in dev.loaded_modules() {
        let note = m.note.map(|n| format!(" ({n})")).unwrap_or_default();
        let early = if m.dependent_launch { ", dependent launch" } else { "" };
        println!("    {:>12}: {}{early} in {:.1} ms{note}", m.family.name(), m.image, m.load_time.as_secs_f64() * 1e3);
    }
}

/// The driver's on-disk cache of compiled PTX, as its environment variables set it.
fn jit_cache() -> String {
    let var = |name| std::env::var(name).ok().filter(|v| !v.is_empty());
    if var("CUDA_CACHE_DISABLE").is_some_and(|v| v == "1") {
        return "off (CUDA_CACHE_DISABLE=1): PTX is compiled again in every process".into();
    }
    let path = var("CUDA_CACHE_PATH").unwrap_or_else(|| "~/.nv/ComputeCache".into());
    let size = var("CUDA_CACHE_MAXSIZE").map(|s| format!(", at most {s} bytes")).unwrap_or_default();
    format!("on, in {path}{size}")
}

/// Which pairs of GPUs copy to each other directly (`Tensor::to_device` between them skips the
/// host); the others stage through host memory, which works but is slower.
fn peers(n: usize) {
    for a in 0..n {
        for b in a + 1..n {
            let direct = cuda::can_access_peer(a, b).unwrap_or(false) && cuda::can_access_peer(b, a).unwrap_or(false);
            println!("cuda:{a} <-> cuda:{b}: {}", if direct { "peer-to-peer" } else { "through the host" });
        }
    }
}
