//! With the `build-kernels` feature, builds ./kernels to PTX through the pinned nightly (see
//! the custom-op example's build.rs). Without it, `src/lib.rs` embeds the committed
//! `bias_gelu.ptx`, which `cargo xtask kernels` regenerates.
fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    #[cfg(feature = "build-kernels")]
    {
        use opsmith_ptx_builder::{PINNED_TOOLCHAIN, PtxBuilder};
        let kernels = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
        match PtxBuilder::new(kernels).toolchain(PINNED_TOOLCHAIN).build() {
            Ok(ptx) => println!("cargo::rustc-env=BIAS_GELU_PTX={}", ptx.path.display()),
            Err(e) => {
                println!("cargo::error=building the bias-gelu kernels failed: {e}");
                std::process::exit(1);
            }
        }
    }
}
