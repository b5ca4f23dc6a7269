//! Builds ./kernels to PTX with the same builder opsmith uses for its own kernels.
fn main() {
    let kernels = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    match opsmith_ptx_builder::PtxBuilder::new(kernels).build() {
        Ok(ptx) => println!("cargo::rustc-env=FILTER3X3_PTX={}", ptx.path.display()),
        Err(e) => {
            println!("cargo::error=building the filter3x3 kernels failed: {e}");
            std::process::exit(1);
        }
    }
}
