//! Counter-based random numbers: Philox4x32-10 (Salmon et al., SC'11), and the arithmetic that
//! turns its words into uniform and normal values.
//!
//! Element `i` of a random tensor depends only on the seed and `i`, so any thread can make any
//! element, and the host and the kernels share this code: the CPU backend runs these functions
//! as they are, and the `uniform_*`/`normal_*` kernels call them per element. The arithmetic
//! is integer operations, `+ - * /`, fma and square root, all correctly rounded on both sides
//! (no approximate `lg2`/`sin`), so a seed gives the same bits on the CPU and on CUDA.
//!
//! ```
//! use opsmith_kernels::random::{normal_f32, philox4x32, uniform_f32};
//! let words = philox4x32([0, 0, 0, 0], [0, 0]);
//! assert_eq!(words, [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]); // the published test vector
//! let u = uniform_f32(7, 123, 24);
//! assert!((0.0..1.0).contains(&u));
//! let z = normal_f32(7, 123);
//! assert!(z.is_finite());
//! ```

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

#[inline(always)]
fn mul_hi_lo(a: u32, b: u32) -> (u32, u32) {
    let product = a as u64 * b as u64;
    ((product >> 32) as u32, product as u32)
}

/// Philox4x32 with 10 rounds: four random words from a 128-bit counter and a 64-bit key.
#[inline(always)]
pub fn philox4x32(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    let mut round = 0;
    while round < 10 {
        let (hi0, lo0) = mul_hi_lo(M0, c[0]);
        let (hi1, lo1) = mul_hi_lo(M1, c[2]);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
        k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        round += 1;
    }
    c
}

/// The four words of block `block` for `seed`.
#[inline(always)]
fn block_words(seed: u64, block: u64) -> [u32; 4] {
    philox4x32([block as u32, (block >> 32) as u32, 0, 0], [seed as u32, (seed >> 32) as u32])
}

/// Element `i`'s uniform value in `[0, 1)`, with `bits` random bits (at most 24): a multiple of
/// `2^-bits`, so it is exact in any dtype with `bits` significant bits (24 for f32, 11 for f16,
/// 8 for bf16), and rounding to that dtype can never make it 1.
#[inline(always)]
pub fn uniform_f32(seed: u64, i: u64, bits: u32) -> f32 {
    let word = block_words(seed, i / 4)[(i % 4) as usize];
    let bits = if bits == 0 || bits > 24 { 24 } else { bits };
    (word >> (32 - bits)) as f32 * f32::from_bits((127 - bits) << 23)
}

/// Element `i`'s uniform value in `[0, 1)` with 53 random bits, from two words (f64 tensors).
#[inline(always)]
pub fn uniform_f64(seed: u64, i: u64) -> f64 {
    let w = block_words(seed, i / 2);
    let pair = 2 * (i % 2) as usize;
    let value = ((w[pair] as u64) << 21) ^ (w[pair + 1] as u64 >> 11);
    value as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Element `i`'s standard normal value (Box–Muller on two words of block `i / 2`), in f32.
#[inline(always)]
pub fn normal_f32(seed: u64, i: u64) -> f32 {
    let w = block_words(seed, i / 2);
    let pair = 2 * (i % 2) as usize;
    // u1 in (0, 1], so its log is finite; the angle from the other word's top 24 bits.
    let u1 = ((w[pair] >> 8) + 1) as f32 * f32::from_bits((127 - 24) << 23);
    let radius = sqrt(-2.0 * ln_unit(u1));
    radius * cos_turns(w[pair + 1] >> 8)
}

#[inline(always)]
fn fma(a: f32, b: f32, c: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    return crate::device::math::fma(a, b, c);
    #[cfg(not(target_arch = "nvptx64"))]
    return a.mul_add(b, c);
}

#[inline(always)]
fn sqrt(x: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    return crate::device::math::sqrt(x);
    #[cfg(not(target_arch = "nvptx64"))]
    return x.sqrt();
}

/// `ln(x)` for `x` in `[2^-24, 1]`, within a few ulps: `x = m·2^e` with `m` in
/// `[√½, √2)`, and `ln m = 2·atanh(s)`, `s = (m - 1)/(m + 1)`, as an odd series in `s`
/// (`|s| < 0.172`, so six terms reach f32's precision).
#[inline(always)]
pub fn ln_unit(x: f32) -> f32 {
    let bits = x.to_bits();
    let mut e = ((bits >> 23) & 0xff) as i32 - 127;
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    if m > core::f32::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let mut p = 2.0 / 11.0;
    p = fma(p, s2, 2.0 / 9.0);
    p = fma(p, s2, 2.0 / 7.0);
    p = fma(p, s2, 2.0 / 5.0);
    p = fma(p, s2, 2.0 / 3.0);
    p = fma(p, s2, 2.0);
    // ln 2 in two parts, so that e·ln2 keeps its precision.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let e = e as f32;
    fma(e, LN2_HI, fma(e, LN2_LO, s * p))
}

/// `cos(2π·t)` for `t = turns / 2^24` (`turns < 2^24`), within a few ulps: the nearest
/// quarter turn is taken off exactly in integers, leaving an angle within ±π/4 for two short
/// Taylor series.
#[inline(always)]
pub fn cos_turns(turns: u32) -> f32 {
    let quarter = (turns + (1 << 21)) >> 22; // 0..=4
    let rest = turns as i32 - (quarter << 22) as i32; // in [-2^21, 2^21)
    let theta = rest as f32 * (core::f32::consts::TAU * f32::from_bits((127 - 24) << 23));
    let t2 = theta * theta;
    let mut c = 1.0 / 3_628_800.0;
    c = fma(c, -t2, 1.0 / 40_320.0);
    c = fma(c, -t2, 1.0 / 720.0);
    c = fma(c, -t2, 1.0 / 24.0);
    c = fma(c, -t2, 0.5);
    c = fma(c, -t2, 1.0);
    let mut s = 1.0 / 39_916_800.0;
    s = fma(s, -t2, 1.0 / 362_880.0);
    s = fma(s, -t2, 1.0 / 5_040.0);
    s = fma(s, -t2, 1.0 / 120.0);
    s = fma(s, -t2, 1.0 / 6.0);
    s = fma(s, -t2, 1.0);
    let s = s * theta;
    // cos(θ + q·π/2)
    match quarter & 3 {
        0 => c,
        1 => -s,
        2 => -c,
        _ => s,
    }
}

#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests {
    extern crate std;
    use super::*;

    fn ulps(got: f32, exact: f64) -> f64 {
        let step = (exact.abs() as f32).max(f32::MIN_POSITIVE);
        let ulp = (f32::from_bits(step.to_bits() + 1) - step) as f64;
        (got as f64 - exact).abs() / ulp
    }

    #[test]
    fn philox_matches_the_published_vectors() {
        // Random123's known-answer tests for philox4x32_10.
        assert_eq!(philox4x32([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
        assert_eq!(philox4x32([u32::MAX; 4], [u32::MAX; 2]), [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]);
        assert_eq!(
            philox4x32([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0]),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn log_and_cosine_are_within_a_few_ulps() {
        let mut worst = (0.0f64, 0.0f64);
        for k in 0..200_000u32 {
            let word = k.wrapping_mul(2_654_435_761);
            let x = ((word >> 8) + 1) as f32 / (1u32 << 24) as f32;
            let exact = (x as f64).ln();
            if exact != 0.0 {
                worst.0 = worst.0.max(ulps(ln_unit(x), exact));
            }
            let turns = word >> 8;
            let exact = (std::f64::consts::TAU * turns as f64 / (1u32 << 24) as f64).cos();
            // Near a zero of the cosine, ulps of the result mean little: compare absolutely.
            let err = (cos_turns(turns) as f64 - exact).abs();
            worst.1 = worst.1.max(if exact.abs() > 1e-3 { ulps(cos_turns(turns), exact) } else { err / 6e-8 });
        }
        assert!(worst.0 <= 4.0, "ln: {} ulps", worst.0);
        assert!(worst.1 <= 4.0, "cos: {} ulps", worst.1);
        assert_eq!(ln_unit(1.0), 0.0);
        assert_eq!(cos_turns(0), 1.0);
    }

    #[test]
    fn uniform_values_are_exact_multiples_and_below_one() {
        for i in 0..10_000 {
            for bits in [8, 11, 24] {
                let u = uniform_f32(42, i, bits);
                assert!((0.0..1.0).contains(&u));
                let scaled = u * (1u32 << bits) as f32;
                assert_eq!(scaled, scaled.trunc());
            }
            assert!((0.0..1.0).contains(&uniform_f64(42, i)));
        }
    }
}
