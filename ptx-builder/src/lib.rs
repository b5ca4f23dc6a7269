//! Builds a `#![no_std]` Rust kernel crate into one PTX module, from a `build.rs`.
//!
//! This is the step `opsmith-host` uses for its own kernels, exposed so that a downstream crate
//! can build *its* kernel crate the same way and load the PTX with
//! `opsmith::cuda::KernelModule::from_ptx`.
//!
//! The kernel crate is an ordinary library crate with `#![no_std]`, kernels declared as
//! `#[unsafe(no_mangle)] pub unsafe extern "ptx-kernel" fn …` (under
//! `#[cfg(target_arch = "nvptx64")]`) and a `#[panic_handler]`. It needs no `crate-type` and no
//! profile settings: the builder asks for a `cdylib`, fat LTO, one codegen unit and
//! `panic = "abort"` itself, and stands a no-op linker in for the `llvm-bitcode-linker` component
//! (the PTX is rustc's `--emit=asm` output of the LTO'd module).
//!
//! ```no_run
//! // In the build.rs of a crate whose kernel crate is in ./kernels:
//! let ptx = opsmith_ptx_builder::PtxBuilder::new("kernels")
//!     .build()
//!     .unwrap_or_else(|e| panic!("{e}"));
//! println!("cargo::rustc-env=MY_KERNELS_PTX={}", ptx.path.display());
//! // lib.rs: const PTX: &str = include_str!(env!("MY_KERNELS_PTX"));
//! ```
//!
//! What it needs: a nightly toolchain with the `rust-src` component (for `-Zbuild-std=core`).
//! No CUDA toolkit, nvcc or LLVM install. When something is missing, [`PtxBuildError`] says
//! what to install.
#![warn(missing_docs)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The target triple of rustc's PTX backend.
pub const NVPTX_TARGET: &str = "nvptx64-nvidia-cuda";

/// The GPU architecture the PTX is generated for unless [`PtxBuilder::arch`] says otherwise.
///
/// sm_70 (Volta) is the oldest architecture the project supports; the driver compiles this PTX
/// for the GPU it runs on (sm_70 through sm_90 and later), so one module serves them all. The
/// kernels are memory-bound streaming loops, which use no instruction newer than Volta's.
pub const DEFAULT_ARCH: &str = "sm_70";

/// The nightly that opsmith's own kernels are built and tested with (its `rust-toolchain.toml`).
/// Install it with `rustup toolchain install nightly-2026-05-20 --component rust-src`.
pub const PINNED_TOOLCHAIN: &str = "nightly-2026-05-20";

/// Why the PTX build failed, with what to do about it.
///
/// ```
/// use opsmith_ptx_builder::{PINNED_TOOLCHAIN, PtxBuildError, PtxBuilder};
/// let out = std::env::temp_dir().join("opsmith-ptx-builder-doc-missing");
/// let builder = PtxBuilder::new("no/such/kernel/crate").toolchain(PINNED_TOOLCHAIN);
/// let result = builder.out_dir(&out).rerun_if_changed(false).build();
/// match result {
///     Err(PtxBuildError::Cargo { manifest, stderr }) => {
///         assert!(manifest.ends_with("no/such/kernel/crate/Cargo.toml"));
///         println!("cargo said: {stderr}");
///     }
///     other => panic!("expected cargo to fail, got {other:?}"),
/// }
/// ```
#[derive(Debug, thiserror::Error)]
pub enum PtxBuildError {
    /// A tool could not be started at all.
    #[error("could not run `{tool}`: {source}. {hint}")]
    ToolMissing {
        /// The program that could not be started.
        tool: String,
        /// The operating system's error.
        source: std::io::Error,
        /// What to install.
        hint: &'static str,
    },
    /// The active toolchain is not a nightly one.
    #[error(
        "building kernels to PTX needs a nightly rustc (for -Zbuild-std), but `{rustc}` is `{version}`. \
         Install one beside your toolchain with `rustup toolchain install {PINNED_TOOLCHAIN} \
         --component rust-src` and build with `PtxBuilder::toolchain(PINNED_TOOLCHAIN)`, or commit \
         the PTX and embed it, which needs no nightly at all"
    )]
    NotNightly {
        /// The rustc that was asked.
        rustc: String,
        /// What it reported.
        version: String,
    },
    /// The rustup toolchain asked for with [`PtxBuilder::toolchain`] could not run rustc.
    #[error(
        "the toolchain `{toolchain}` could not run rustc ({stderr}). Install it with \
         `rustup toolchain install {toolchain} --component rust-src`"
    )]
    ToolchainMissing {
        /// The toolchain asked for.
        toolchain: String,
        /// What rustup said.
        stderr: String,
    },
    /// The `rust-src` component is missing, so `core` cannot be built for nvptx64.
    #[error(
        "the rust-src component is missing from {sysroot} (needed to build `core` for {NVPTX_TARGET}). \
         Run `rustup component add rust-src`, or `rustup toolchain install` in the repository root"
    )]
    RustSrcMissing {
        /// The sysroot that lacks it.
        sysroot: String,
    },
    /// cargo failed to build the kernel crate.
    #[error("building the kernel crate {manifest} for {NVPTX_TARGET} failed; cargo said:\n{stderr}")]
    Cargo {
        /// The kernel crate's manifest.
        manifest: PathBuf,
        /// The end of cargo's standard error.
        stderr: String,
    },
    /// cargo succeeded but left no PTX where expected.
    #[error("no PTX file was produced at {0}")]
    NoOutput(PathBuf),
    /// The PTX calls a function it does not define, which no driver can resolve.
    #[error(
        "the PTX declares external functions it does not define: {0:?}. A kernel reached a function \
         that core cannot provide on nvptx64 (often a float formatting or panic message path)"
    )]
    UnresolvedExtern(Vec<String>),
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
}

/// A PTX module built from a kernel crate.
///
/// [`PtxBuilder::build`] returns it; its `path` is what a build script hands to `include_str!`
/// through an environment variable, and `entries` are the names to look kernels up by.
///
/// ```
/// use opsmith_ptx_builder::{BuiltPtx, entry_names};
/// let ptx = ".version 7.0\n.target sm_70\n.visible .entry scale_f32(\n";
/// let built = BuiltPtx { path: "scale.ptx".into(), entries: entry_names(ptx) };
/// assert_eq!(built.entries, ["scale_f32"]);
/// ```
#[derive(Clone, Debug)]
pub struct BuiltPtx {
    /// Where the PTX was written.
    pub path: PathBuf,
    /// The `.entry` (kernel) names the module defines, in the order they appear.
    pub entries: Vec<String>,
}

/// Builds one kernel crate into PTX.
///
/// A kernel crate is a `#![no_std]` library whose kernels are `extern "ptx-kernel"` functions.
/// This example writes a one-kernel crate to a temporary folder and builds it, as a build script
/// would (the first build compiles `core` for nvptx64, which takes a little while):
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use opsmith_ptx_builder::{PINNED_TOOLCHAIN, PtxBuilder};
/// let dir = std::env::temp_dir().join("opsmith-ptx-builder-doc");
/// std::fs::create_dir_all(dir.join("src"))?;
/// std::fs::write(
///     dir.join("Cargo.toml"),
///     "[package]\nname = \"doc-kernels\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n[workspace]\n",
/// )?;
/// std::fs::write(dir.join("src/lib.rs"), r#"
/// #![no_std]
/// #![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, stdarch_nvptx))]
///
/// /// `x[i] *= 2` for `i < n`, one thread per element.
/// #[cfg(target_arch = "nvptx64")]
/// #[unsafe(no_mangle)]
/// pub unsafe extern "ptx-kernel" fn double_f32(x: *mut f32, n: u64) {
///     use core::arch::nvptx::{_block_dim_x, _block_idx_x, _thread_idx_x};
///     let i = unsafe { _block_idx_x() * _block_dim_x() + _thread_idx_x() } as u64;
///     if i < n {
///         unsafe { *x.add(i as usize) *= 2.0 };
///     }
/// }
///
/// #[cfg(target_arch = "nvptx64")]
/// #[panic_handler]
/// fn panic(_: &core::panic::PanicInfo) -> ! {
///     unsafe { core::arch::nvptx::trap() }
/// }
/// "#)?;
/// // Through rustup's copy of the pinned nightly, so that this builds from a stable toolchain too.
/// let ptx = PtxBuilder::new(&dir)
///     .toolchain(PINNED_TOOLCHAIN)
///     .arch("sm_80")
///     .out_dir(dir.join("out"))
///     .rerun_if_changed(false)
///     .build()?;
/// assert_eq!(ptx.entries, ["double_f32"]);
/// assert!(std::fs::read_to_string(&ptx.path)?.contains(".target sm_80"));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct PtxBuilder {
    crate_dir: PathBuf,
    arch: String,
    out_dir: Option<PathBuf>,
    rerun_if_changed: bool,
    features: Vec<String>,
    default_features: bool,
    toolchain: Option<String>,
    target_features: Vec<String>,
}

impl PtxBuilder {
    /// A builder for the kernel crate whose `Cargo.toml` is in `crate_dir`.
    ///
    /// ```
    /// use opsmith_ptx_builder::{DEFAULT_ARCH, PtxBuilder};
    /// let builder = PtxBuilder::new("kernels"); // relative to the build script's package
    /// assert!(format!("{builder:?}").contains(DEFAULT_ARCH));
    /// ```
    pub fn new(crate_dir: impl Into<PathBuf>) -> Self {
        Self {
            crate_dir: crate_dir.into(),
            arch: DEFAULT_ARCH.into(),
            out_dir: None,
            rerun_if_changed: true,
            features: Vec::new(),
            default_features: true,
            toolchain: None,
            target_features: Vec::new(),
        }
    }

    /// Cargo features of the kernel crate to enable (as `--features`); with
    /// [`default_features(false)`](Self::default_features), a build can hold a subset of the
    /// crate's kernels, as opsmith builds one module per kernel family.
    ///
    /// ```
    /// use opsmith_ptx_builder::PtxBuilder;
    /// let softmax_only = PtxBuilder::new("kernels-gpu").default_features(false).features(["softmax"]);
    /// assert!(format!("{softmax_only:?}").contains("softmax"));
    /// ```
    pub fn features<I: IntoIterator<Item = S>, S: Into<String>>(mut self, features: I) -> Self {
        self.features.extend(features.into_iter().map(Into::into));
        self
    }

    /// Whether the kernel crate's default features are on (default: yes).
    ///
    /// ```
    /// use opsmith_ptx_builder::PtxBuilder;
    /// let builder = PtxBuilder::new("kernels").default_features(false);
    /// assert!(format!("{builder:?}").contains("default_features: false"));
    /// ```
    pub fn default_features(mut self, yes: bool) -> Self {
        self.default_features = yes;
        self
    }

    /// Builds with this rustup toolchain (`rustup run <toolchain> cargo …`) instead of the one
    /// the build runs under. This lets a crate that builds on stable Rust compile its kernel
    /// crate from its `build.rs` with a nightly that is installed beside it, for example
    /// [`PINNED_TOOLCHAIN`].
    ///
    /// ```
    /// use opsmith_ptx_builder::{PINNED_TOOLCHAIN, PtxBuilder};
    /// let builder = PtxBuilder::new("kernels").toolchain(PINNED_TOOLCHAIN);
    /// assert!(format!("{builder:?}").contains(PINNED_TOOLCHAIN));
    /// ```
    pub fn toolchain(mut self, toolchain: impl Into<String>) -> Self {
        self.toolchain = Some(toolchain.into());
        self
    }

    /// The `sm_XY` architecture to generate PTX for (default [`DEFAULT_ARCH`]).
    ///
    /// ```
    /// use opsmith_ptx_builder::PtxBuilder;
    /// let builder = PtxBuilder::new("kernels").arch("sm_90"); // Hopper only
    /// assert!(format!("{builder:?}").contains("sm_90"));
    /// ```
    pub fn arch(mut self, arch: impl Into<String>) -> Self {
        self.arch = arch.into();
        self
    }

    /// LLVM target features for the build (`-C target-feature`), such as a newer PTX ISA
    /// version than the architecture's oldest (`+ptx81` for sm_90's vector atomics, which
    /// need PTX 8.1). Kernel code can test the architecture with
    /// `cfg(target_feature = "sm_90")`.
    ///
    /// ```
    /// use opsmith_ptx_builder::PtxBuilder;
    /// let builder = PtxBuilder::new("kernels").arch("sm_90").target_features(["+ptx81"]);
    /// assert!(format!("{builder:?}").contains("+ptx81"));
    /// ```
    pub fn target_features<I: IntoIterator<Item = S>, S: Into<String>>(mut self, features: I) -> Self {
        self.target_features.extend(features.into_iter().map(Into::into));
        self
    }

    /// Where to build and write the PTX (default: `$OUT_DIR`, as in a build script).
    ///
    /// Outside a build script there is no `$OUT_DIR`, so [`PtxBuilder::build`] needs this:
    ///
    /// ```
    /// use opsmith_ptx_builder::{PtxBuildError, PtxBuilder};
    /// # if std::env::var_os("OUT_DIR").is_some() { return; }
    /// let without = PtxBuilder::new("kernels").rerun_if_changed(false).build();
    /// assert!(matches!(without, Err(PtxBuildError::Io { .. })));
    /// let with = PtxBuilder::new("kernels").out_dir(std::env::temp_dir().join("my-ptx"));
    /// # let _ = with;
    /// ```
    pub fn out_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.out_dir = Some(dir.into());
        self
    }

    /// Whether to print `cargo::rerun-if-changed` lines for the kernel crate (default: yes, for
    /// use from a build script; turn off when calling from a plain program).
    ///
    /// ```
    /// use opsmith_ptx_builder::PtxBuilder;
    /// // In a plain program (the `opsmith-ptx-build` command), cargo is not listening.
    /// let builder = PtxBuilder::new("kernels").rerun_if_changed(false);
    /// assert!(format!("{builder:?}").contains("rerun_if_changed: false"));
    /// ```
    pub fn rerun_if_changed(mut self, yes: bool) -> Self {
        self.rerun_if_changed = yes;
        self
    }

    /// Builds the crate and returns the PTX file and its kernel names.
    ///
    /// What can go wrong, with what to do about it, is a [`PtxBuildError`]; see [`PtxBuilder`]
    /// for a full build.
    ///
    /// ```
    /// use opsmith_ptx_builder::{PINNED_TOOLCHAIN, PtxBuildError, PtxBuilder};
    /// let out = std::env::temp_dir().join("opsmith-ptx-builder-doc-nothing");
    /// let builder = PtxBuilder::new("/nonexistent").toolchain(PINNED_TOOLCHAIN);
    /// let result = builder.out_dir(&out).rerun_if_changed(false).build();
    /// assert!(matches!(result, Err(PtxBuildError::Cargo { .. })));
    /// ```
    pub fn build(&self) -> Result<BuiltPtx, PtxBuildError> {
        let out_dir = match &self.out_dir {
            Some(dir) => dir.clone(),
            None => PathBuf::from(std::env::var_os("OUT_DIR").ok_or_else(|| PtxBuildError::Io {
                path: "$OUT_DIR".into(),
                source: std::io::Error::other("OUT_DIR is unset: call out_dir() outside a build script"),
            })?),
        };
        let manifest = self.crate_dir.join("Cargo.toml");
        if self.rerun_if_changed {
            println!("cargo::rerun-if-changed={}", self.crate_dir.join("src").display());
            println!("cargo::rerun-if-changed={}", manifest.display());
        }
        check_toolchain(self.toolchain.as_deref())?;

        let target_dir = out_dir.join("ptx-build");
        let (mut cmd, cargo) = match &self.toolchain {
            Some(toolchain) => {
                let mut cmd = Command::new("rustup");
                cmd.args(["run", toolchain, "cargo"]);
                // The parent's tools belong to another toolchain.
                for var in ["CARGO", "RUSTC", "RUSTDOC", "RUSTUP_TOOLCHAIN"] {
                    cmd.env_remove(var);
                }
                (cmd, format!("rustup run {toolchain} cargo"))
            }
            None => {
                let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
                (Command::new(&cargo), cargo)
            }
        };
        // Variables a parent cargo sets for build scripts that would leak host-only settings
        // (rustflags, a clippy or coverage wrapper) into the nvptx build.
        for var in [
            "CARGO_ENCODED_RUSTFLAGS",
            "RUSTFLAGS",
            "RUSTC_WRAPPER",
            "RUSTC_WORKSPACE_WRAPPER",
            "CARGO_BUILD_TARGET",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_RUSTFLAGS",
            "CARGO_PRIMARY_PACKAGE",
        ] {
            cmd.env_remove(var);
        }
        cmd.arg("rustc")
            .arg("--manifest-path")
            .arg(&manifest)
            .args(["--lib", "--release", "--crate-type", "cdylib"])
            .args(["--target", NVPTX_TARGET, "-Zbuild-std=core"]);
        if !self.default_features {
            cmd.arg("--no-default-features");
        }
        if !self.features.is_empty() {
            cmd.arg("--features").arg(self.features.join(","));
        }
        cmd.arg("--target-dir")
            .arg(&target_dir)
            .args(["--config", "profile.release.lto=\"fat\""])
            .args(["--config", "profile.release.panic=\"abort\""])
            .args(["--config", "profile.release.codegen-units=1"])
            .args(["--config", "profile.release.opt-level=3"])
            .args(["--config", "profile.release.debug=false"])
            .args(["--", "--emit=asm", "-C", "linker=true"])
            .arg("-C")
            .arg(format!("target-cpu={}", self.arch));
        if !self.target_features.is_empty() {
            cmd.arg("-C").arg(format!("target-feature={}", self.target_features.join(",")));
        }
        let output = cmd.output().map_err(|source| PtxBuildError::ToolMissing {
            tool: cargo.clone(),
            source,
            hint: "Install Rust with rustup, then run `rustup toolchain install` in the repository root",
        })?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(60).collect();
            let stderr = tail.into_iter().rev().collect::<Vec<_>>().join("\n");
            return Err(PtxBuildError::Cargo { manifest, stderr });
        }

        let crate_name = package_name(&manifest)?.replace('-', "_");
        let asm = target_dir.join(NVPTX_TARGET).join("release").join("deps").join(format!("{crate_name}.s"));
        if !asm.is_file() {
            return Err(PtxBuildError::NoOutput(asm));
        }
        let ptx = read(&asm)?;
        let externs = extern_functions(&ptx);
        if !externs.is_empty() {
            return Err(PtxBuildError::UnresolvedExtern(externs));
        }
        let path = out_dir.join(format!("{crate_name}.{}.ptx", self.arch));
        std::fs::write(&path, &ptx).map_err(|source| PtxBuildError::Io { path: path.clone(), source })?;
        Ok(BuiltPtx { path, entries: entry_names(&ptx) })
    }
}

/// The names of the kernels (`.entry` directives) a PTX module defines.
///
/// ```
/// let ptx = ".visible .entry add_f32(\n\t.param .u64 a\n)\n.visible .entry mul_f32(.param .u64 a)\n";
/// assert_eq!(opsmith_ptx_builder::entry_names(ptx), ["add_f32", "mul_f32"]);
/// ```
pub fn entry_names(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|line| line.trim_start().strip_prefix(".visible .entry "))
        .map(|rest| rest.split(|c: char| c == '(' || c.is_whitespace()).next().unwrap_or("").to_string())
        .collect()
}

/// `ptx` with launch bounds on the entry `kernel`: `.maxntid max_threads, 1, 1` and
/// `.minnctapersm min_blocks` between its parameter list and its body, as CUDA C++'s
/// `__launch_bounds__(max_threads, min_blocks)` writes them. `ptxas` then keeps the kernel to
/// the registers that let `min_blocks` blocks share a multiprocessor, and the driver refuses a
/// launch with larger blocks. Rust has no attribute for them, so they are added to the PTX.
///
/// Fails when `ptx` has no such entry, or the entry has directives there already.
///
/// ```
/// let ptx = ".visible .entry k(\n\t.param .u64 a\n)\n{\n\tret;\n}\n";
/// let bounded = opsmith_ptx_builder::with_launch_bounds(ptx, "k", 128, 3).unwrap();
/// assert_eq!(bounded, ".visible .entry k(\n\t.param .u64 a\n)\n.maxntid 128, 1, 1\n.minnctapersm 3\n{\n\tret;\n}\n");
/// assert!(opsmith_ptx_builder::with_launch_bounds(ptx, "other", 128, 3).is_err());
/// ```
pub fn with_launch_bounds(ptx: &str, kernel: &str, max_threads: u32, min_blocks: u32) -> Result<String, String> {
    let header = format!(".visible .entry {kernel}(");
    let start = ptx
        .match_indices(&header)
        .map(|(at, _)| at)
        .find(|&at| at == 0 || ptx[..at].ends_with('\n'))
        .ok_or_else(|| format!("the PTX has no entry `{kernel}`"))?;
    // The parameter list ends at the first `)` line; the body opens on the next line.
    let close = ptx[start..]
        .find("\n)\n")
        .map(|at| start + at + 3)
        .ok_or_else(|| format!("`{kernel}`: no end of its parameter list"))?;
    if !ptx[close..].starts_with("{") {
        return Err(format!("`{kernel}`: directives between its parameters and body already"));
    }
    Ok(format!("{}.maxntid {max_threads}, 1, 1\n.minnctapersm {min_blocks}\n{}", &ptx[..close], &ptx[close..]))
}

/// The functions a PTX module declares `.extern` (calls it cannot resolve on its own).
///
/// A kernel crate's PTX must have none: [`PtxBuilder::build`] reports them as
/// [`PtxBuildError::UnresolvedExtern`].
///
/// ```
/// let ptx = ".extern .func (.param .b32 r) vprintf(.param .b64 f, .param .b64 a);\n.visible .entry k()\n";
/// assert_eq!(opsmith_ptx_builder::extern_functions(ptx).len(), 1);
/// ```
pub fn extern_functions(ptx: &str) -> Vec<String> {
    ptx.lines().filter(|line| line.contains(".extern .func")).map(|line| line.trim().to_string()).collect()
}

/// Finds NVIDIA's `ptxas`: `$OPSMITH_PTXAS`, else `ptxas` on the `PATH`, else the one that
/// `pip install nvidia-cuda-nvcc` puts beside Python's packages. `None` when there is none.
///
/// ```
/// if let Some(ptxas) = opsmith_ptx_builder::find_ptxas() {
///     println!("assembling with {}", ptxas.display());
/// }
/// ```
pub fn find_ptxas() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("OPSMITH_PTXAS") {
        return Some(path.into());
    }
    if Command::new("ptxas").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return Some("ptxas".into());
    }
    let script = "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'bin', 'ptxas'))";
    let out = Command::new("python3").args(["-c", script]).output().ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    path.is_file().then_some(path)
}

fn read(path: &Path) -> Result<String, PtxBuildError> {
    std::fs::read_to_string(path).map_err(|source| PtxBuildError::Io { path: path.into(), source })
}

/// The `[package] name` of a manifest, read without a TOML parser (the first `name =` line
/// after `[package]`).
fn package_name(manifest: &Path) -> Result<String, PtxBuildError> {
    let text = read(manifest)?;
    let mut in_package = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package && let Some(value) = line.strip_prefix("name") {
            let value = value.trim_start().trim_start_matches('=').trim().trim_matches('"');
            return Ok(value.to_string());
        }
    }
    Err(PtxBuildError::Io { path: manifest.into(), source: std::io::Error::other("no [package] name") })
}

/// Fails early, with an instruction, when the toolchain cannot build for nvptx64.
fn check_toolchain(toolchain: Option<&str>) -> Result<(), PtxBuildError> {
    let rustc = match toolchain {
        Some(toolchain) => format!("rustup run {toolchain} rustc"),
        None => std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()),
    };
    let run = |args: &[&str]| -> Result<String, PtxBuildError> {
        let mut cmd = match toolchain {
            Some(toolchain) => {
                let mut cmd = Command::new("rustup");
                cmd.args(["run", toolchain, "rustc"]).env_remove("RUSTC").env_remove("RUSTUP_TOOLCHAIN");
                cmd
            }
            None => Command::new(&rustc),
        };
        let out = cmd.args(args).output().map_err(|source| PtxBuildError::ToolMissing {
            tool: rustc.clone(),
            source,
            hint: "Install Rust with rustup, then run `rustup toolchain install` in the repository root",
        })?;
        if let (Some(toolchain), false) = (toolchain, out.status.success()) {
            let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
            return Err(PtxBuildError::ToolchainMissing { toolchain: toolchain.into(), stderr });
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let version = run(&["--version"])?;
    if !version.contains("nightly") && !version.contains("-dev") {
        return Err(PtxBuildError::NotNightly { rustc: rustc.clone(), version });
    }
    let sysroot = run(&["--print", "sysroot"])?;
    let core_src = Path::new(&sysroot).join("lib/rustlib/src/rust/library/core/Cargo.toml");
    if !core_src.is_file() {
        return Err(PtxBuildError::RustSrcMissing { sysroot });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
.version 7.0
.target sm_70
.extern .func vprintf(
.visible .entry add_f32(
\t.param .u64 add_f32_param_0
)
  .visible .entry mul_f32(
";

    #[test]
    fn finds_entries_and_externs() {
        assert_eq!(entry_names(SAMPLE), ["add_f32", "mul_f32"]);
        assert_eq!(extern_functions(SAMPLE), [".extern .func vprintf("]);
    }
}
