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

/// `x` rounded to f32 *to odd*: toward zero, with the lowest bit set when inexact. Rounded again
/// to a format of at least two bits fewer (f16, bf16), ties to even, it gives the same result
/// as one rounding of `x`, where rounding to nearest twice can err on a value just past a
/// half-way point. Infinities and NaN pass through `as f32`.
///
/// ```
/// use opsmith_kernels::convert::f64_to_f32_odd;
/// assert_eq!(f64_to_f32_odd(1.5), 1.5); // exact: unchanged
/// assert_eq!(f64_to_f32_odd(1.0 + 1e-12).to_bits(), 1.0f32.to_bits() | 1); // inexact: odd
/// ```
#[inline(always)]
pub fn f64_to_f32_odd(x: f64) -> f32 {
    if !x.is_finite() {
        return x as f32;
    }
    let mut f = x as f32;
    if (f as f64).abs() > x.abs() {
        // Rounded away from zero: step back toward it (for finite f, one step down in magnitude).
        f = f32::from_bits(f.to_bits() - 1);
    }
    if f as f64 != x {
        f = f32::from_bits(f.to_bits() | 1);
    }
    f
}

/// Rounds an f64 to the nearest bf16, ties to even, and returns its bit pattern: one rounding,
/// as [`f32_to_bf16_bits`] for f32, through [`f64_to_f32_odd`]. (`half` 2's `bf16::from_f64`
/// rounds some values just past a half-way point down, e.g. `0.869140863…`, f32 bits
/// `0x3f5e8004`, to `0x3f5e`; its `f16::from_f64` some just below one up.)
///
/// ```
/// use opsmith_kernels::convert::f64_to_bf16_bits;
/// assert_eq!(f64_to_bf16_bits(f32::from_bits(0x3f5e_8004) as f64), 0x3f5f);
/// assert_eq!(f64_to_bf16_bits(1.0 + 1.0 / 256.0), 0x3f80); // a tie: to even
/// assert_eq!(f64_to_bf16_bits(1.0 + 1.0 / 256.0 + 1e-12), 0x3f81); // just past it: up
/// ```
#[inline(always)]
pub fn f64_to_bf16_bits(x: f64) -> u16 {
    f32_to_bf16_bits(f64_to_f32_odd(x))
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    /// The nearest bf16 to `x` (ties to even) by comparing distances exactly in f64: the two
    /// bf16 neighbours of `x` are exact in f64, and so are their distances to an f64 near them.
    fn nearest_bf16(x: f64) -> u16 {
        let below = {
            let b = f32_to_bf16_bits(x as f32);
            if bf16_bits_to_f32(b) as f64 > x { if x >= 0.0 { b - 1 } else { b + 1 } } else { b }
        };
        let above = if x >= 0.0 {
            below + 1
        } else if below == 0x8000 {
            0x0001
        } else {
            below - 1
        };
        let (lo, hi) = (bf16_bits_to_f32(below) as f64, bf16_bits_to_f32(above) as f64);
        let (dl, dh) = (x - lo, hi - x);
        if dl < dh || (dl == dh && below % 2 == 0) { below } else { above }
    }

    #[test]
    fn f64_rounding_is_the_nearest_bf16() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..200_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            // Values near bf16 half-way points (most of them), and anywhere in [-4, 4).
            let x = if i % 2 == 0 {
                // A half-way point (low 16 bits 0x8000) of random sign and a finite exponent.
                let sign = ((seed >> 20) as u32 & 1) << 31;
                let mid = f32::from_bits(sign | ((seed >> 40) as u32 & 0x3fff) << 16 | 0x2000_8000) as f64;
                let nudge = ((seed & 0xffff) as f64 - 32768.0) * 1e-12 * mid;
                mid + nudge
            } else {
                (seed >> 11) as f64 / (1u64 << 53) as f64 * 8.0 - 4.0
            };
            assert_eq!(f64_to_bf16_bits(x), nearest_bf16(x), "{x:e}");
        }
        assert_eq!(f64_to_bf16_bits(f64::INFINITY), 0x7f80);
        assert_eq!(f64_to_bf16_bits(-1e300), 0xff80);
        assert!(bf16_bits_to_f32(f64_to_bf16_bits(f64::NAN)).is_nan());
        assert_eq!(f64_to_bf16_bits(-0.0), 0x8000);
    }

    /// f16 through f64_to_f32_odd: the nearest f16 by exact distances, next to half-way points.
    #[test]
    fn f64_rounding_to_f16_through_odd_is_the_nearest() {
        use half::f16;
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..200_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let x = ((seed >> 11) as f64 / (1u64 << 53) as f64 * 8.0 - 4.0) as f32 as f64;
            let x = x + ((seed & 0xff) as f64 - 128.0) * 1e-13;
            let got = f16::from_f32(f64_to_f32_odd(x));
            let (a, b) = (f16::from_f32(x as f32), f16::from_bits(f16::from_f32(x as f32).to_bits() ^ 1));
            // The nearest of the candidates around x (x as f32 rounds to one of its neighbours).
            let candidates =
                [a, b, f16::from_bits(a.to_bits().wrapping_add(1)), f16::from_bits(a.to_bits().wrapping_sub(1))];
            let best = candidates
                .into_iter()
                .filter(|c| c.is_finite())
                .map(|c| ((c.to_f64() - x).abs(), c.to_bits() % 2, c))
                .min_by(|p, q| p.0.total_cmp(&q.0).then(p.1.cmp(&q.1)))
                .unwrap()
                .2;
            assert_eq!(got, best, "{x:e}");
        }
    }

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
