//! What `opsmith-host` ships for each kernel [`Family`](crate::Family): one PTX module, for
//! the driver to compile on any GPU from Volta on, and cubins (machine code) for the
//! architectures people run, so that a fresh process on those GPUs compiles nothing.
//!
//! `cargo xtask kernels` writes `host/prebuilt/<family>.ptx` and
//! `host/prebuilt/<family>.sm_<XY>.cubin` from these lists; `opsmith-host` embeds them.
//!
//! ```
//! use opsmith_kernels::prebuilt::{CUBIN_ARCHS, PTX_ARCH, cubin_for};
//! assert_eq!(PTX_ARCH, "sm_70");
//! assert!(CUBIN_ARCHS.contains(&90));
//! assert_eq!(cubin_for(9, 0), Some(90)); // an H100 or H200: its own cubin
//! assert_eq!(cubin_for(8, 7), Some(86)); // Jetson Orin: sm_86's machine code runs on sm_87
//! assert_eq!(cubin_for(7, 0), None); // a V100: the PTX, compiled by the driver
//! ```

/// The architecture the shipped PTX targets: the oldest GPU opsmith supports. The driver
/// compiles it for any newer GPU that has no cubin here.
pub const PTX_ARCH: &str = "sm_70";

/// The architectures a cubin is shipped for, as `10 * major + minor`: Turing (T4), Ampere
/// (A100, A10/RTX 30), Ada (L4/L40/RTX 40), Hopper (H100/H200), Blackwell data-center
/// (B200) and consumer (RTX 50).
pub const CUBIN_ARCHS: [u32; 7] = [75, 80, 86, 89, 90, 100, 120];

/// The architectures a cubin of `family` is shipped for: those of [`CUBIN_ARCHS`] at least as
/// new as the family's [`min_arch`](crate::Family::min_arch).
///
/// ```
/// use opsmith_kernels::{Family, prebuilt::cubin_archs};
/// assert_eq!(cubin_archs(Family::Attention).first(), Some(&80));
/// assert_eq!(cubin_archs(Family::Loss).len(), 7);
/// ```
#[cfg(not(target_arch = "nvptx64"))]
pub fn cubin_archs(family: crate::Family) -> std::vec::Vec<u32> {
    CUBIN_ARCHS.iter().copied().filter(|&arch| arch >= family.min_arch()).collect()
}

/// The shipped cubin that runs on a GPU of compute capability `major.minor`: its own
/// architecture's, else the newest one of the same major version that is not newer than the
/// GPU (NVIDIA guarantees machine code for `X.y` runs on `X.z` for `z >= y`), else none, and
/// the PTX is compiled instead.
pub fn cubin_for(major: u32, minor: u32) -> Option<u32> {
    let wanted = 10 * major + minor;
    CUBIN_ARCHS.iter().copied().filter(|&arch| arch / 10 == major && arch <= wanted).max()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_exact_then_older_minor_of_the_same_major() {
        assert_eq!(cubin_for(7, 5), Some(75));
        assert_eq!(cubin_for(8, 0), Some(80));
        assert_eq!(cubin_for(8, 6), Some(86));
        assert_eq!(cubin_for(8, 9), Some(89));
        assert_eq!(cubin_for(8, 8), Some(86));
        assert_eq!(cubin_for(9, 0), Some(90));
        assert_eq!(cubin_for(10, 3), Some(100));
        assert_eq!(cubin_for(12, 1), Some(120));
        // Not across majors, and never a newer architecture than the GPU.
        assert_eq!(cubin_for(7, 2), None);
        assert_eq!(cubin_for(11, 0), None);
        assert_eq!(cubin_for(6, 1), None);
    }
}
