//! Checks the shipped kernels (`host/prebuilt/`) without a GPU: each family's PTX defines exactly
//! the kernels the host launches from it, nothing is left unresolved, `ptxas` (when found)
//! accepts it for sm_90 with no register spills, and each shipped cubin is an ELF image for
//! its architecture.
#![cfg(feature = "cuda")]
use opsmith_host::cuda::prebuilt::{self, Family};
use opsmith_kernels::names::ALL_SOFTMAX;
use opsmith_kernels::prebuilt::{CUBIN_ARCHS, cubin_archs};
use opsmith_ptx_builder::{entry_names, extern_functions, find_ptxas};
use std::collections::BTreeSet;
use std::process::Command;

#[test]
fn each_family_defines_exactly_its_kernels() {
    for family in Family::ALL {
        let ptx = prebuilt::ptx(family).unwrap();
        let entries: BTreeSet<String> = entry_names(&ptx).into_iter().collect();
        let expected: BTreeSet<String> = family.kernel_names().map(String::from).collect();
        assert_eq!(entries, expected, "{family:?}");
    }
}

#[test]
fn no_unresolved_functions() {
    for family in Family::ALL {
        let ptx = prebuilt::ptx(family).unwrap();
        assert_eq!(extern_functions(&ptx), Vec::<String>::new(), "{family:?}");
        assert!(ptx.contains(&format!(".target {}", family.ptx_arch())), "{family:?}");
    }
}

#[test]
fn each_cubin_is_an_elf_image_for_its_architecture() {
    for family in Family::ALL {
        // A family that needs a newer GPU ships no cubin for the older architectures.
        for arch in CUBIN_ARCHS.into_iter().filter(|&arch| arch < family.min_arch()) {
            assert!(prebuilt::cubin(family, arch).unwrap().is_none(), "{family:?} sm_{arch}");
        }
        for arch in cubin_archs(family) {
            let cubin = prebuilt::cubin(family, arch).unwrap().unwrap();
            assert_eq!(&cubin[..4], b"\x7fELF", "{family:?} sm_{arch}");
            // A CUDA ELF names its architecture in e_flags (bytes 48..52): the SM number
            // sits in bits 8..16 on recent toolkits, bits 0..8 on older ones.
            let flags = u32::from_le_bytes(cubin[48..52].try_into().unwrap());
            assert!(
                (flags >> 8) & 0xff == arch || flags & 0xff == arch,
                "{family:?} sm_{arch}: e_flags {flags:#x} name another architecture"
            );
        }
    }
}

#[test]
fn ptxas_accepts_every_family_for_sm_90_without_spills() {
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
    for family in Family::ALL {
        let ptx = dir.join(format!("{}.ptx", family.name()));
        std::fs::write(&ptx, prebuilt::ptx(family).unwrap()).unwrap();
        let out = Command::new(&ptxas)
            .args(["-arch=sm_90", "-v", "-o"])
            .arg(dir.join(format!("{}.cubin", family.name())))
            .arg(&ptx)
            .output()
            .expect("running ptxas");
        let log = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "ptxas rejected the {family:?} PTX:\n{log}");
        let functions: Vec<&str> = log.lines().filter_map(|l| l.split("Function properties for ").nth(1)).collect();
        let helpers: Vec<&&str> = functions.iter().filter(|f| !family.kernel_names().any(|k| k == **f)).collect();
        assert!(helpers.is_empty(), "non-inlined device functions (often a panic path): {helpers:?}");
        let spill_lines: Vec<&str> = log.lines().filter(|l| l.contains("spill")).collect();
        assert_eq!(spill_lines.len(), family.kernel_names().count(), "one report per kernel:\n{log}");
        for line in spill_lines {
            assert!(line.contains("0 bytes spill stores, 0 bytes spill loads"), "spills: {line}");
        }
        if family != Family::Softmax {
            continue;
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
