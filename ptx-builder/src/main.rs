//! `opsmith-ptx-build`: the library's build step as a command, for scripts and for comparing
//! PTX targets.
//!
//! ```text
//! opsmith-ptx-build <kernel-crate-dir> [--arch sm_90] [--out DIR]
//! ```
use opsmith_ptx_builder::{DEFAULT_ARCH, PtxBuilder};

fn main() {
    let mut args = std::env::args().skip(1);
    let mut crate_dir = None;
    let mut arch = DEFAULT_ARCH.to_string();
    let mut out = std::path::PathBuf::from(".");
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--arch" => arch = args.next().unwrap_or_else(|| usage("--arch needs a value")),
            "--out" => out = args.next().unwrap_or_else(|| usage("--out needs a value")).into(),
            "-h" | "--help" => usage(""),
            _ if crate_dir.is_none() => crate_dir = Some(arg),
            _ => usage(&format!("unexpected argument {arg}")),
        }
    }
    let crate_dir = crate_dir.unwrap_or_else(|| usage("missing the kernel crate directory"));
    if let Err(e) = std::fs::create_dir_all(&out) {
        eprintln!("error: {}: {e}", out.display());
        std::process::exit(1);
    }
    let out = std::fs::canonicalize(&out).unwrap_or(out);
    match PtxBuilder::new(crate_dir).arch(&arch).out_dir(&out).rerun_if_changed(false).build() {
        Ok(ptx) => println!("{} ({} kernels)", ptx.path.display(), ptx.entries.len()),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}

fn usage(problem: &str) -> ! {
    if !problem.is_empty() {
        eprintln!("error: {problem}");
    }
    eprintln!("usage: opsmith-ptx-build <kernel-crate-dir> [--arch sm_XY] [--out DIR]");
    std::process::exit(2);
}
