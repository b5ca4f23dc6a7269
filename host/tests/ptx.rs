//! Checks the embedded PTX without a GPU: every kernel name the host uses is defined, nothing is
//! left unresolved, and `ptxas` (when found) accepts it for sm_90 with no register spills.
use opsmith_host::cuda::{EMBEDDED_PTX, EMBEDDED_PTX_ARCH};
use opsmith_kernels::names::{ALL_SOFTMAX, all_kernel_names};
use opsmith_ptx_builder::{entry_names, extern_functions};
use std::path::PathBuf;
use std::process::Command;

#[test]
fn every_host_kernel_name_is_an_entry() {
    let entries = entry_names(EMBEDDED_PTX);
    for name in all_kernel_names() {
        assert!(entries.iter().any(|e| e == name), "kernel `{name}` is not in the PTX; entries: {entries:?}");
    }
    assert_eq!(entries.len(), all_kernel_names().count(), "unexpected entries: {entries:?}");
}

#[test]
fn no_unresolved_functions() {
    assert_eq!(extern_functions(EMBEDDED_PTX), Vec::<String>::new());
    assert!(EMBEDDED_PTX.contains(&format!(".target {EMBEDDED_PTX_ARCH}")));
}

/// `OPSMITH_PTXAS`, else `ptxas` on the PATH, else the one pip's `nvidia-cuda-nvcc` installs.
fn find_ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("OPSMITH_PTXAS") {
        return Some(p.into());
    }
    if Command::new("ptxas").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return Some("ptxas".into());
    }
    let out = Command::new("python3")
        .args(["-c", "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'bin', 'ptxas'))"])
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    path.is_file().then_some(path)
}

#[test]
fn ptxas_accepts_the_module_for_sm_90_without_spills() {
    let Some(ptxas) = find_ptxas() else {
        assert!(
            std::env::var_os("OPSMITH_REQUIRE_PTXAS").is_none(),
            "ptxas not found: `pip install nvidia-cuda-nvcc==13.0.88`, or set OPSMITH_PTXAS"
        );
        eprintln!("ptxas not found, skipping the sm_90 check (pip install nvidia-cuda-nvcc==13.0.88)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("opsmith-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ptx = dir.join("kernels.ptx");
    std::fs::write(&ptx, EMBEDDED_PTX).unwrap();
    let out = Command::new(&ptxas)
        .args(["-arch=sm_90", "-v", "-o"])
        .arg(dir.join("kernels.cubin"))
        .arg(&ptx)
        .output()
        .expect("running ptxas");
    let log = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ptxas rejected the PTX:\n{log}");
    let functions: Vec<&str> = log.lines().filter_map(|l| l.split("Function properties for ").nth(1)).collect();
    let helpers: Vec<&&str> = functions.iter().filter(|f| !all_kernel_names().any(|k| k == **f)).collect();
    assert!(helpers.is_empty(), "non-inlined device functions (often a panic path): {helpers:?}");
    let spill_lines: Vec<&str> = log.lines().filter(|l| l.contains("spill")).collect();
    assert_eq!(spill_lines.len(), all_kernel_names().count(), "one report per kernel:\n{log}");
    for line in spill_lines {
        assert!(line.contains("0 bytes spill stores, 0 bytes spill loads"), "spills: {line}");
    }
    // A block-per-row softmax kernel may be launched with 1024 threads, which fit a
    // multiprocessor's 65536 registers only at 64 registers a thread or fewer.
    for kernel in ALL_SOFTMAX.iter().flat_map(|t| t.forward_block.iter().chain(t.backward_block)) {
        let registers = used_registers(&log, kernel.name);
        let limit = 65536 / kernel.max_block as u64;
        assert!(
            registers <= limit,
            "{} uses {registers} registers, over {limit} for a block of {}",
            kernel.name,
            kernel.max_block
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The registers `ptxas -v` reports for `kernel` in `log`.
fn used_registers(log: &str, kernel: &str) -> u64 {
    let header = format!("Compiling entry function '{kernel}'");
    let report = log.lines().skip_while(|l| !l.contains(&header)).find(|l| l.contains("Used "));
    let count = report.and_then(|l| l.split("Used ").nth(1)?.split(' ').next()?.parse().ok());
    count.unwrap_or_else(|| panic!("no register count for {kernel} in:\n{log}"))
}
