//! Conversions between f32 and the 16-bit float formats, as bit patterns.
//!
//! bf16 is converted in software: it has no hardware conversion before sm_80, and the embedded
//! PTX targets sm_70. The code is a handful of integer operations, far below the memory time of
//! any streaming kernel. f16 uses the hardware `cvt` instructions on the device
//! (`device::element`); these functions are compiled for the host as well so that the
//! rounding can be tested there.
//!
//! ```
//! use opsmith_kernels::convert::{bf16_bits_to_f32, f32_to_bf16_bits};
//! let x = 3.140625f32; // 8 significant bits: a bf16 value
//! assert_eq!(bf16_bits_to_f32(f32_to_bf16_bits(x)), x);
//! ```

/// Widens a bf16 bit pattern to f32. Exact: every bf16 value is an f32 value.
///
/// ```
/// use opsmith_kernels::convert::bf16_bits_to_f32;
/// assert_eq!(bf16_bits_to_f32(0x3fc0), 1.5);
/// assert_eq!(bf16_bits_to_f32(0xff80), f32::NEG_INFINITY);
/// ```
#[inline(always)]
pub const fn bf16_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Rounds an f32 to the nearest bf16, ties to even, and returns its bit pattern.
///
/// NaN stays NaN (quieted, sign and top payload bits kept); values past the largest finite bf16
/// round to infinity, as IEEE 754 round-to-nearest requires.
///
/// ```
/// use opsmith_kernels::convert::f32_to_bf16_bits;
/// assert_eq!(f32_to_bf16_bits(1.5), 0x3fc0);
/// // 1 + 2^-8 is half-way between bf16 neighbours 1 and 1 + 2^-7: ties go to the even one.
/// assert_eq!(f32_to_bf16_bits(1.0 + 1.0 / 256.0), 0x3f80);
/// assert_eq!(f32_to_bf16_bits(f32::MAX), 0x7f80); // past the largest bf16: infinity
/// ```
#[inline(always)]
pub const fn f32_to_bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    if bits & 0x7fff_ffff > 0x7f80_0000 {
        // NaN: truncate and set the quiet bit so a payload living only in the low bits survives.
        return ((bits >> 16) | 0x0040) as u16;
    }
    // Adding 0x7fff plus the lowest kept bit rounds half-way cases towards the even neighbour.
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    fn check(x: f32) {
        let ours = f32_to_bf16_bits(x);
        let theirs = bf16::from_f32(x).to_bits();
        if x.is_nan() {
            assert!(bf16_bits_to_f32(ours).is_nan(), "{x:?} -> {ours:#06x}");
        } else {
            assert_eq!(ours, theirs, "rounding {x:e} ({:#010x})", x.to_bits());
        }
    }

    #[test]
    fn bf16_rounding_matches_half_on_edge_cases() {
        let edges = [
            0.0f32,
            -0.0,
            1.0,
            -1.0,
            f32::MIN_POSITIVE,
            1.0e-40, // subnormal
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::from_bits(0x3f80_8000), // exactly half-way, even below: rounds down
            f32::from_bits(0x3f81_8000), // exactly half-way, odd below: rounds up
            f32::from_bits(0x3f80_8001), // just past half-way
            f32::from_bits(0x7f7f_ffff), // rounds up to infinity
        ];
        for x in edges {
            check(x);
        }
    }

    #[test]
    fn bf16_rounding_matches_half_on_a_sweep() {
        // Every 997th bit pattern: covers all exponents, both signs, NaNs and subnormals.
        let mut bits = 0u32;
        while let Some(next) = bits.checked_add(997) {
            check(f32::from_bits(bits));
            bits = next;
        }
    }

    #[test]
    fn bf16_widening_is_exact() {
        for bits in [0x3f80u16, 0xbf80, 0x0001, 0x7f7f, 0xff80] {
            assert_eq!(bf16_bits_to_f32(bits), bf16::from_bits(bits).to_f32());
        }
    }
}
