//! The numerics shared by softmax and cross-entropy: a row's maximum and its sum of
//! `exp(z - max)`, accumulated tile by tile and then across the warp.
//!
//! Every exponential is `2^(z * log2(e) - max * log2(e))`: one FMA and one `ex2.approx`.
//! Subtracting the maximum keeps every exponent at or below 0, so nothing overflows however
//! large the values. A row whose values are all `-inf` (a fully masked row) has no maximum to
//! subtract; its bias is taken as 0, so every exponential is `2^-inf = 0`, the sum is 0, and
//! [`reciprocal_or_zero`] turns the row into zeros instead of `(-inf) - (-inf) = NaN`.
use super::math::{CompensatedSum, LOG2_E, exp2, fma};
use super::unroll::{Count, Unrolled, fold};
use super::warp::{warp_max, warp_sum};

/// The FMA addend that subtracts `max` inside an exponent: `-max * log2(e)`, or 0 when `max`
/// is `-inf` (an empty or fully masked row, whose exponentials are then all 0).
#[inline(always)]
pub fn exp_bias(max: f32) -> f32 {
    if max == f32::NEG_INFINITY { 0.0 } else { -max * LOG2_E }
}

/// `exp(z - max)` for the `bias` of [`exp_bias`]`(max)`.
#[inline(always)]
pub fn exp_shifted(z: f32, bias: f32) -> f32 {
    exp2(fma(z, LOG2_E, bias))
}

/// `1 / sum`, or 0 when the sum is 0 (a fully masked row, whose outputs become 0). A NaN sum
/// (a NaN or `+inf` value in the row) stays NaN, so the whole row is NaN.
#[inline(always)]
pub fn reciprocal_or_zero(sum: f32) -> f32 {
    if sum == 0.0 { 0.0 } else { 1.0 / sum }
}

/// The largest of `values` (NaN ignored, as `max.f32` does).
#[inline(always)]
pub fn local_max<const V: usize>(values: &[f32; V]) -> f32
where
    Count<V>: Unrolled,
{
    fold::<V, f32>(f32::NEG_INFINITY, |m, s| m.max(values[s]))
}

/// [`ExpSum`] for the many tiles of a long row: the sum is compensated, and rescaled only when
/// the maximum grows. (Rescaling by `exp(max - max)` is not exactly 1 here: the exponent is the
/// rounding residue of `max * log2(e)`, and `ex2.approx` of it, applied once a tile, would bias
/// the sum of a row of thousands of tiles.)
#[derive(Clone, Copy)]
pub struct LongExpSum {
    /// The largest value seen (`-inf` before any).
    pub max: f32,
    /// The sum of `exp(z - max)` over the values seen.
    pub sum: CompensatedSum,
}

impl LongExpSum {
    /// Nothing seen yet.
    pub const EMPTY: LongExpSum = LongExpSum { max: f32::NEG_INFINITY, sum: CompensatedSum::ZERO };

    /// Adds a tile of values (`-inf` in empty slots).
    #[inline(always)]
    pub fn add<const V: usize>(self, values: &[f32; V]) -> LongExpSum
    where
        Count<V>: Unrolled,
    {
        let max = self.max.max(local_max(values));
        let bias = exp_bias(max);
        let sum = if max == self.max { self.sum } else { self.sum.scaled(exp_shifted(self.max, bias)) };
        let sum = fold::<V, CompensatedSum>(sum, |sum, s| sum.add(exp_shifted(values[s], bias)));
        LongExpSum { max, sum }
    }
}

/// A running maximum and sum of `exp(z - max)` over the values seen so far.
#[derive(Clone, Copy)]
pub struct ExpSum {
    /// The largest value seen (`-inf` before any).
    pub max: f32,
    /// The sum of `exp(z - max)` over the values seen.
    pub sum: f32,
}

impl ExpSum {
    /// Nothing seen yet.
    pub const EMPTY: ExpSum = ExpSum { max: f32::NEG_INFINITY, sum: 0.0 };

    /// Adds a tile of values (`-inf` in empty slots): the sum so far is rescaled to the new
    /// maximum, then the tile's exponentials are added.
    #[inline(always)]
    pub fn add<const V: usize>(self, values: &[f32; V]) -> ExpSum
    where
        Count<V>: Unrolled,
    {
        let max = self.max.max(local_max(values));
        let bias = exp_bias(max);
        let sum = fold::<V, f32>(self.sum * exp_shifted(self.max, bias), |sum, s| sum + exp_shifted(values[s], bias));
        ExpSum { max, sum }
    }

    /// The whole warp's maximum and sum, returned to every lane.
    ///
    /// # Safety
    /// All 32 lanes of the warp call it together.
    #[inline(always)]
    pub unsafe fn warp_total(self) -> ExpSum {
        // SAFETY: forwarded from the caller.
        let max = unsafe { warp_max(self.max) };
        // SAFETY: as above.
        let sum = unsafe { warp_sum(self.sum * exp_shifted(self.max, exp_bias(max))) };
        ExpSum { max, sum }
    }
}
