//! With the `build-kernels` feature, builds ./kernels to PTX with the same builder opsmith
//! uses for its own kernels, through the pinned nightly (which rustup runs beside whatever
//! toolchain builds this crate). Without it there is nothing to do: `src/lib.rs` embeds the
//! committed `filter3x3.ptx`, which `cargo xtask kernels` regenerates.
fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    #[cfg(feature = "build-kernels")]
    {
        use opsmith_ptx_builder::{PINNED_TOOLCHAIN, PtxBuilder};
        let kernels = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
        match PtxBuilder::new(kernels).toolchain(PINNED_TOOLCHAIN).build() {
            Ok(ptx) => println!("cargo::rustc-env=FILTER3X3_PTX={}", ptx.path.display()),
            Err(e) => {
                println!("cargo::error=building the filter3x3 kernels failed: {e}");
                std::process::exit(1);
            }
        }
    }
}
