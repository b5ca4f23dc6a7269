//! opsmith's maintenance commands, run as `cargo xtask <task>` (an alias in .cargo/config.toml).
//!
//! ```text
//! cargo xtask kernels           regenerate host/prebuilt/ (per kernel family, the PTX and a cubin per architecture,
//!                               zlib-compressed) and the examples' committed PTX (EXAMPLE_KERNELS)
//! cargo xtask kernels --check   regenerate into a scratch folder and fail if any of them differs
//! ```
//!
//! `kernels` needs the pinned nightly with `rust-src` (`rustup toolchain install` in the
//! repository root) and `ptxas` (`pip install nvidia-cuda-nvcc==13.0.88`, or `OPSMITH_PTXAS`).
//! The output is deterministic: the same sources, nightly and ptxas give the same bytes.
use opsmith_kernels::Family;
use opsmith_kernels::prebuilt::cubin_archs;
use opsmith_ptx_builder::{PtxBuilder, entry_names, find_ptxas, with_launch_bounds};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

/// The version of `ptxas` the shipped cubins are made with; another one makes other bytes.
const PTXAS_VERSION: &str = "V13.0.88";

/// The examples' kernel crates and the PTX file each host crate embeds.
const EXAMPLE_KERNELS: [(&str, &str); 2] = [
    ("examples/custom-op/kernels", "examples/custom-op/filter3x3.ptx"),
    ("examples/bias-gelu/kernels", "examples/bias-gelu/bias_gelu.ptx"),
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["kernels"] => kernels(false),
        ["kernels", "--check"] => kernels(true),
        _ => Err("usage: cargo xtask kernels [--check]".to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace root").to_path_buf()
}

/// Builds every family's PTX and cubins into a scratch folder, then copies them into
/// `host/prebuilt/` (or, with `check`, compares them with what is there).
fn kernels(check: bool) -> Result<(), String> {
    let root = root();
    let prebuilt = root.join("host/prebuilt");
    let scratch = root.join("target/xtask-kernels");
    let fresh = scratch.join("out");
    let _ = std::fs::remove_dir_all(&fresh);
    std::fs::create_dir_all(&fresh).map_err(|e| format!("{}: {e}", fresh.display()))?;

    let ptxas = find_ptxas().ok_or("ptxas not found: `pip install nvidia-cuda-nvcc==13.0.88`, or set OPSMITH_PTXAS")?;
    let version = run(Command::new(&ptxas).arg("--version"))?;
    if !version.contains(PTXAS_VERSION) {
        return Err(format!(
            "{} is not ptxas {PTXAS_VERSION}, which the shipped cubins are made with:\n{version}",
            ptxas.display()
        ));
    }

    for family in Family::ALL {
        let started = Instant::now();
        let name = family.name();
        let ptx = family_ptx(&root, &scratch, family, family.ptx_arch(), &[])?;
        let ptx_path = scratch.join(format!("{name}.ptx"));
        write(&ptx_path, ptx.as_bytes())?;
        write(&fresh.join(format!("{name}.ptx.zlib")), &deflate(ptx.as_bytes()))?;
        // A family with sm_90 code of its own gets its cubins from sm_90 on from a second
        // build; only the portable PTX is shipped as text.
        let sm90_path = if family.has_sm90_build() {
            let sm90 = family_ptx(&root, &scratch, family, "sm_90", &["+ptx81"])?;
            let path = scratch.join(format!("{name}.sm_90.ptx"));
            write(&path, sm90.as_bytes())?;
            // host/tests/ptx.rs holds the shipped PTX to no spills at sm_90; this build is
            // not shipped as text, so its check is here (`-v` changes the cubin's bytes, so
            // not on the shipped one).
            let check = scratch.join(format!("{name}.sm_90.check.cubin"));
            let log = run(Command::new(&ptxas).args(["-arch=sm_90", "-v", "-o"]).arg(&check).arg(&path))?;
            if let Some(spill) =
                log.lines().find(|l| l.contains("spill") && !l.contains(" 0 bytes spill stores, 0 bytes spill loads"))
            {
                return Err(format!("{name} (sm_90 build): ptxas spills registers: {}", spill.trim()));
            }
            // The host launches these kernels early (programmatic dependent launch): each must
            // wait for its predecessors before it touches memory.
            check_waits_before_memory(&sm90).map_err(|e| format!("{name} (sm_90 build): {e}"))?;
            Some(path)
        } else {
            None
        };
        // ptxas runs once per architecture, in parallel.
        let archs = cubin_archs(family);
        let results: Vec<Result<(), String>> = std::thread::scope(|s| {
            let jobs: Vec<_> = archs
                .iter()
                .map(|arch| {
                    let (ptxas, scratch, fresh) = (&ptxas, &scratch, &fresh);
                    let source = match &sm90_path {
                        Some(sm90) if *arch >= 90 => sm90,
                        _ => &ptx_path,
                    };
                    s.spawn(move || {
                        let file = format!("{name}.sm_{arch}.cubin");
                        let cubin = scratch.join(&file);
                        run(Command::new(ptxas).arg(format!("-arch=sm_{arch}")).arg("-o").arg(&cubin).arg(source))?;
                        let bytes = std::fs::read(&cubin).map_err(|e| format!("{}: {e}", cubin.display()))?;
                        write(&fresh.join(format!("{file}.zlib")), &deflate(&bytes))
                    })
                })
                .collect();
            jobs.into_iter().map(|job| job.join().unwrap_or_else(|_| Err("a ptxas thread panicked".into()))).collect()
        });
        results.into_iter().collect::<Result<Vec<()>, String>>()?;
        println!(
            "{name:>12}: {} kernels, PTX {} KiB, {} cubins, {:.1} s",
            entry_names(&ptx).len(),
            ptx.len() / 1024,
            archs.len(),
            started.elapsed().as_secs_f64()
        );
    }

    // The examples' kernel crates, which their host crates embed as plain PTX.
    for (kernels, committed) in EXAMPLE_KERNELS {
        let built = PtxBuilder::new(root.join(kernels))
            .out_dir(scratch.join(kernels))
            .rerun_if_changed(false)
            .build()
            .map_err(|e| format!("{kernels}: {e}"))?;
        let ptx = std::fs::read(&built.path).map_err(|e| format!("{}: {e}", built.path.display()))?;
        let file = root.join(committed);
        if check {
            if std::fs::read(&file).ok().as_deref() != Some(&ptx[..]) {
                return Err(format!("{} is stale; run `cargo xtask kernels` and commit the result", file.display()));
            }
        } else {
            write(&file, &ptx)?;
        }
    }

    let wanted = file_names(&fresh)?;
    if check {
        let present = file_names(&prebuilt).unwrap_or_default();
        let mut problems = Vec::new();
        for name in wanted.union(&present) {
            let (new, old) = (std::fs::read(fresh.join(name)).ok(), std::fs::read(prebuilt.join(name)).ok());
            match (new, old) {
                (Some(new), Some(old)) if new == old => {}
                (Some(_), Some(_)) => problems.push(format!("{name} differs")),
                (Some(_), None) => problems.push(format!("{name} is missing")),
                (None, _) => problems.push(format!("{name} is not generated any more")),
            }
        }
        if !problems.is_empty() {
            return Err(format!(
                "host/prebuilt/ is stale; run `cargo xtask kernels` and commit the result:\n  {}",
                problems.join("\n  ")
            ));
        }
        println!("host/prebuilt/ matches a fresh build ({} files)", wanted.len());
    } else {
        std::fs::create_dir_all(&prebuilt).map_err(|e| format!("{}: {e}", prebuilt.display()))?;
        for stale in file_names(&prebuilt)?.difference(&wanted) {
            std::fs::remove_file(prebuilt.join(stale)).map_err(|e| format!("{stale}: {e}"))?;
        }
        for name in &wanted {
            std::fs::copy(fresh.join(name), prebuilt.join(name)).map_err(|e| format!("{name}: {e}"))?;
        }
        println!("wrote {} files to {}", wanted.len(), prebuilt.display());
    }
    Ok(())
}

/// The family's PTX for `arch` with LLVM `target_features`, launch bounds written in, checked
/// to define exactly the family's kernels.
fn family_ptx(
    root: &Path,
    scratch: &Path,
    family: Family,
    arch: &str,
    target_features: &[&str],
) -> Result<String, String> {
    let name = family.name();
    let built = PtxBuilder::new(root.join("kernels-gpu"))
        .default_features(false)
        .features([name])
        .arch(arch)
        .target_features(target_features.iter().copied())
        .out_dir(scratch.join(format!("{name}.{arch}")))
        .rerun_if_changed(false)
        .build()
        .map_err(|e| format!("{name} ({arch}): {e}"))?;
    let mut ptx = std::fs::read_to_string(&built.path).map_err(|e| format!("{}: {e}", built.path.display()))?;
    for bounds in family.launch_bounds() {
        ptx = with_launch_bounds(&ptx, bounds.kernel, bounds.max_threads, bounds.min_blocks)
            .map_err(|e| format!("{name}: {e}"))?;
    }
    let defined: BTreeSet<&str> = built.entries.iter().map(String::as_str).collect();
    let expected: BTreeSet<&str> = family.kernel_names().collect();
    if defined != expected {
        return Err(format!("{name} ({arch}): the PTX defines {defined:?}, the name tables say {expected:?}"));
    }
    Ok(ptx)
}

/// Checks that every kernel of an sm_90 build runs `griddepcontrol.wait` before its first
/// load, store or atomic (parameter loads aside), so that a dependent launch is safe.
fn check_waits_before_memory(ptx: &str) -> Result<(), String> {
    const MEMORY: [&str; 5] = ["ld.", "st.", "atom.", "red.", "cp.async"];
    for entry in ptx.split(".entry ").skip(1) {
        let kernel = entry.split(['(', ' ', '\n']).next().unwrap_or("?");
        let mut waited = false;
        for line in entry.lines().map(str::trim) {
            if line.starts_with("griddepcontrol.wait") {
                waited = true;
                break;
            }
            let op = line.trim_start_matches(|c: char| c == '@' || c == '!' || c == '%' || c.is_alphanumeric());
            let op = if line.starts_with('@') { op.trim_start() } else { line };
            if MEMORY.iter().any(|m| op.starts_with(m)) && !op.starts_with("ld.param") {
                return Err(format!("kernel {kernel} accesses memory before griddepcontrol.wait: `{line}`"));
            }
        }
        if !waited {
            return Err(format!("kernel {kernel} has no griddepcontrol.wait"));
        }
    }
    Ok(())
}

/// The shipped files in `dir`.
fn file_names(dir: &Path) -> Result<BTreeSet<String>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.ends_with(".zlib")).collect())
}

/// zlib at the highest level: the files are made once and inflated at every load, and the
/// format's checksum catches a damaged file. The same input gives the same bytes.
fn deflate(bytes: &[u8]) -> Vec<u8> {
    miniz_oxide::deflate::compress_to_vec_zlib(bytes, 10)
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), String> {
    std::fs::write(path, bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// Runs a command and returns its output, or its error output as the error.
fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    if out.status.success() { Ok(text) } else { Err(format!("{cmd:?} failed:\n{text}")) }
}

#[cfg(test)]
mod tests {
    use super::check_waits_before_memory;

    const HEAD: &str = ".visible .entry k(\n\t.param .u64 k_param_0\n)\n{\n\tld.param.b64 %rd1, [k_param_0];\n";

    #[test]
    fn a_kernel_must_wait_before_its_first_memory_access() {
        let waits = format!("{HEAD}\tgriddepcontrol.wait;\n\tld.global.f32 %f1, [%rd1];\n\tret;\n}}\n");
        assert_eq!(check_waits_before_memory(&waits), Ok(()));
        let loads_first = format!("{HEAD}\t@%p1 ld.global.f32 %f1, [%rd1];\n\tgriddepcontrol.wait;\n\tret;\n}}\n");
        assert!(check_waits_before_memory(&loads_first).unwrap_err().contains("kernel k accesses memory"));
        let stores_first = format!("{HEAD}\tst.global.f32 [%rd1], %f1;\n\tgriddepcontrol.wait;\n\tret;\n}}\n");
        assert!(check_waits_before_memory(&stores_first).is_err());
        let never = format!("{HEAD}\tret;\n}}\n");
        assert_eq!(check_waits_before_memory(&never), Err("kernel k has no griddepcontrol.wait".into()));
    }
}
