//! The kernels opsmith ships, embedded in the binary: for each kernel [`Family`], one PTX
//! module and a cubin (machine code) per architecture of
//! `CUBIN_ARCHS` (`opsmith_kernels::prebuilt`), zlib-compressed. `cargo xtask kernels`
//! writes them to `host/prebuilt/` from `kernels-gpu`; building opsmith compiles no kernel.
//!
//! A device loads a family the first time one of its kernels runs, and picks its image with
//! [`choose_image`]: the cubin for the GPU's architecture, so a fresh process compiles nothing,
//! else the PTX, which the driver compiles (and caches on disk, unless `CUDA_CACHE_DISABLE=1`).
//!
//! ```
//! # fn main() -> opsmith_host::Result<()> {
//! use opsmith_host::cuda::prebuilt;
//! use opsmith_kernels::Family;
//! let ptx = prebuilt::ptx(Family::Elementwise)?;
//! assert!(ptx.contains(".visible .entry fused_mul_add_f32("));
//! let cubin = prebuilt::cubin(Family::Elementwise, 90)?.expect("an sm_90 cubin is shipped");
//! assert_eq!(&cubin[..4], b"\x7fELF");
//! # Ok(()) }
//! ```
pub use opsmith_kernels::Family;
use opsmith_kernels::prebuilt::{CUBIN_ARCHS, PTX_ARCH, cubin_for};

use crate::{Error, Result};

/// One family's files: its PTX and its cubins by architecture, compressed.
struct FamilyFiles {
    ptx: &'static [u8],
    /// Every architecture of `cubin_archs(family)`.
    cubins: &'static [(u32, &'static [u8])],
}

/// Embeds a family's files. The architectures are spelled out because `include_bytes!` takes a
/// literal path; the constant block below checks them against `CUBIN_ARCHS`.
macro_rules! family_files {
    ($family:literal) => {
        FamilyFiles {
            ptx: include_bytes!(concat!("../../prebuilt/", $family, ".ptx.zlib")),
            cubins: &[
                (75, include_bytes!(concat!("../../prebuilt/", $family, ".sm_75.cubin.zlib"))),
                (80, include_bytes!(concat!("../../prebuilt/", $family, ".sm_80.cubin.zlib"))),
                (86, include_bytes!(concat!("../../prebuilt/", $family, ".sm_86.cubin.zlib"))),
                (89, include_bytes!(concat!("../../prebuilt/", $family, ".sm_89.cubin.zlib"))),
                (90, include_bytes!(concat!("../../prebuilt/", $family, ".sm_90.cubin.zlib"))),
                (100, include_bytes!(concat!("../../prebuilt/", $family, ".sm_100.cubin.zlib"))),
                (120, include_bytes!(concat!("../../prebuilt/", $family, ".sm_120.cubin.zlib"))),
            ],
        }
    };
    // A family whose minimum architecture is sm_80 (`Family::min_arch`).
    ($family:literal, from sm_80) => {
        FamilyFiles {
            ptx: include_bytes!(concat!("../../prebuilt/", $family, ".ptx.zlib")),
            cubins: &[
                (80, include_bytes!(concat!("../../prebuilt/", $family, ".sm_80.cubin.zlib"))),
                (86, include_bytes!(concat!("../../prebuilt/", $family, ".sm_86.cubin.zlib"))),
                (89, include_bytes!(concat!("../../prebuilt/", $family, ".sm_89.cubin.zlib"))),
                (90, include_bytes!(concat!("../../prebuilt/", $family, ".sm_90.cubin.zlib"))),
                (100, include_bytes!(concat!("../../prebuilt/", $family, ".sm_100.cubin.zlib"))),
                (120, include_bytes!(concat!("../../prebuilt/", $family, ".sm_120.cubin.zlib"))),
            ],
        }
    };
}

const _: () = {
    // A new architecture in CUBIN_ARCHS needs its line in `family_files!`.
    const SHIPPED_ARCHS: [u32; 7] = [75, 80, 86, 89, 90, 100, 120];
    let mut i = 0;
    while i < CUBIN_ARCHS.len() {
        assert!(CUBIN_ARCHS[i] == SHIPPED_ARCHS[i]);
        i += 1;
    }
};

fn files(family: Family) -> &'static FamilyFiles {
    static ELEMENTWISE: FamilyFiles = family_files!("elementwise");
    static REDUCTION: FamilyFiles = family_files!("reduction");
    static ACTIVATION: FamilyFiles = family_files!("activation");
    static OPTIMIZER: FamilyFiles = family_files!("optimizer");
    static SOFTMAX: FamilyFiles = family_files!("softmax");
    static LOSS: FamilyFiles = family_files!("loss");
    static TIMING: FamilyFiles = family_files!("timing");
    static MATMUL: FamilyFiles = family_files!("matmul");
    static ATTENTION: FamilyFiles = family_files!("attention", from sm_80);
    match family {
        Family::Elementwise => &ELEMENTWISE,
        Family::Reduction => &REDUCTION,
        Family::Activation => &ACTIVATION,
        Family::Optimizer => &OPTIMIZER,
        Family::Softmax => &SOFTMAX,
        Family::Loss => &LOSS,
        Family::Timing => &TIMING,
        Family::Matmul => &MATMUL,
        Family::Attention => &ATTENTION,
    }
}

fn inflate(family: Family, what: &str, bytes: &[u8]) -> Result<Vec<u8>> {
    miniz_oxide::inflate::decompress_to_vec_zlib(bytes)
        .map_err(|e| Error::DamagedKernelImage { image: format!("{} {what}", family.name()), reason: format!("{e:?}") })
}

/// The family's PTX text (for its [`Family::ptx_arch`], [`PTX_ARCH`] for most families, which
/// the driver compiles for any newer GPU).
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::cuda::prebuilt::{self, Family};
/// assert!(prebuilt::ptx(Family::Timing)?.contains(".target sm_70"));
/// # Ok(()) }
/// ```
pub fn ptx(family: Family) -> Result<String> {
    let bytes = inflate(family, "PTX", files(family).ptx)?;
    String::from_utf8(bytes)
        .map_err(|_| Error::DamagedKernelImage { image: format!("{} PTX", family.name()), reason: "not UTF-8".into() })
}

/// The family's cubin for `sm_<arch>` (`arch` as `10 * major + minor`), if one is shipped.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::cuda::prebuilt::{self, Family};
/// assert!(prebuilt::cubin(Family::Softmax, 80)?.is_some());
/// assert!(prebuilt::cubin(Family::Softmax, 70)?.is_none()); // Volta gets the PTX
/// # Ok(()) }
/// ```
pub fn cubin(family: Family, arch: u32) -> Result<Option<Vec<u8>>> {
    let Some(&(_, bytes)) = files(family).cubins.iter().find(|(a, _)| *a == arch) else {
        return Ok(None);
    };
    inflate(family, &format!("sm_{arch} cubin"), bytes).map(Some)
}

/// Which of a family's images a device loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelImage {
    /// A shipped cubin for `sm_<arch>`: nothing is compiled at load time.
    Cubin {
        /// The architecture, `10 * major + minor`.
        arch: u32,
    },
    /// The shipped PTX, compiled by the driver for the device's architecture.
    Ptx,
}

impl std::fmt::Display for KernelImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KernelImage::Cubin { arch } => write!(f, "sm_{arch} cubin"),
            KernelImage::Ptx => write!(f, "{PTX_ARCH} PTX, compiled by the driver"),
        }
    }
}

/// The environment variable that forces the PTX path: `OPSMITH_KERNEL_IMAGE=ptx` loads every
/// family from its PTX even where a cubin fits (to compare the two, or to rule a cubin out).
/// Unset, or `auto`, picks a cubin when one fits. Read when a device's first kernel loads.
pub const IMAGE_ENV: &str = "OPSMITH_KERNEL_IMAGE";

/// The image a GPU of compute capability `major.minor` loads: a fitting cubin (see
/// [`cubin_for`]) unless [`IMAGE_ENV`] says `ptx`, else the PTX.
///
/// ```
/// use opsmith_host::cuda::prebuilt::{KernelImage, choose_image};
/// # if std::env::var_os(opsmith_host::cuda::prebuilt::IMAGE_ENV).is_some() { return; }
/// assert_eq!(choose_image(9, 0), KernelImage::Cubin { arch: 90 });
/// assert_eq!(choose_image(8, 9), KernelImage::Cubin { arch: 89 });
/// assert_eq!(choose_image(7, 0), KernelImage::Ptx);
/// ```
pub fn choose_image(major: u32, minor: u32) -> KernelImage {
    let forced_ptx = std::env::var(IMAGE_ENV).is_ok_and(|v| v.eq_ignore_ascii_case("ptx"));
    match cubin_for(major, minor) {
        Some(arch) if !forced_ptx => KernelImage::Cubin { arch },
        _ => KernelImage::Ptx,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_has_every_file_and_they_inflate() {
        for family in Family::ALL {
            let ptx = ptx(family).unwrap();
            for name in family.kernel_names() {
                assert!(ptx.contains(&format!(".visible .entry {name}(")), "{name} missing from {family:?}");
            }
            assert!(ptx.contains(&format!(".target {}", family.ptx_arch())), "{family:?}");
            for arch in CUBIN_ARCHS {
                let shipped = cubin(family, arch).unwrap();
                if arch < family.min_arch() {
                    assert!(shipped.is_none(), "{family:?} needs sm_{}, yet ships sm_{arch}", family.min_arch());
                    continue;
                }
                let cubin = shipped.unwrap();
                assert_eq!(&cubin[..4], b"\x7fELF", "{family:?} sm_{arch}");
            }
        }
    }
}
