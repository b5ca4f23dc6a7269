//! Compiles `kernels-gpu` to PTX with rustc's nvptx64 backend; `src/cuda/module.rs` embeds it.
fn main() {
    let kernels = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels-gpu");
    let arch = std::env::var("OPSMITH_PTX_ARCH").unwrap_or_else(|_| opsmith_ptx_builder::DEFAULT_ARCH.into());
    println!("cargo::rerun-if-env-changed=OPSMITH_PTX_ARCH");
    match opsmith_ptx_builder::PtxBuilder::new(kernels).arch(&arch).build() {
        Ok(ptx) => {
            println!("cargo::rustc-env=OPSMITH_KERNELS_PTX={}", ptx.path.display());
            println!("cargo::rustc-env=OPSMITH_KERNELS_ARCH={arch}");
        }
        Err(e) => {
            // One readable message instead of a wall of nested rustc output.
            println!("cargo::error=opsmith could not compile its GPU kernels to PTX: {e}");
            std::process::exit(1);
        }
    }
}
