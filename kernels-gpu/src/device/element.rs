//! The storage dtypes a kernel reads and writes, and their conversion to f32.
//!
//! Arithmetic always runs in f32; a kernel widens what it loads and narrows what it stores.
use super::memory::Pack;
use crate::convert::{bf16_bits_to_f32, f32_to_bf16_bits};
use core::ops::IndexMut;

pub use crate::dtype::{Bf16, F16};

/// A storage dtype: how one value and one 16-byte pack convert to and from f32.
pub trait Element: Copy {
    /// Values per 16-byte pack.
    const LANES: usize;
    /// A pack widened to f32, one entry per lane.
    type Wide: Copy + IndexMut<usize, Output = f32>;
    /// Widens one value.
    fn to_f32(self) -> f32;
    /// Narrows one value, rounding to nearest even.
    fn from_f32(x: f32) -> Self;
    /// Widens a pack; lane `k` is the `k`-th value in memory order.
    fn unpack(pack: Pack) -> Self::Wide;
    /// Narrows a widened pack back to memory order.
    fn pack(wide: Self::Wide) -> Pack;
}

impl Element for f32 {
    const LANES: usize = 4;
    type Wide = [f32; 4];
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline(always)]
    fn unpack(pack: Pack) -> [f32; 4] {
        pack.map(f32::from_bits)
    }
    #[inline(always)]
    fn pack(wide: [f32; 4]) -> Pack {
        wide.map(f32::to_bits)
    }
}

/// Splits four words into eight 16-bit halves, low half first (little-endian memory order).
#[inline(always)]
fn halves(pack: Pack) -> [u16; 8] {
    core::array::from_fn(|k| (pack[k / 2] >> (16 * (k % 2))) as u16)
}

/// Joins eight 16-bit halves into four words, the inverse of [`halves`].
#[inline(always)]
fn words(h: [u16; 8]) -> Pack {
    core::array::from_fn(|k| h[2 * k] as u32 | (h[2 * k + 1] as u32) << 16)
}

impl Element for F16 {
    const LANES: usize = 8;
    type Wide = [f32; 8];
    #[inline(always)]
    fn to_f32(self) -> f32 {
        // `cvt.f32.f16`: exact.
        f16::from_bits(self.0) as f32
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        // `cvt.rn.f16.f32`: round to nearest even, overflow to infinity.
        F16((x as f16).to_bits())
    }
    #[inline(always)]
    fn unpack(pack: Pack) -> [f32; 8] {
        halves(pack).map(|h| F16(h).to_f32())
    }
    #[inline(always)]
    fn pack(wide: [f32; 8]) -> Pack {
        words(wide.map(|x| F16::from_f32(x).0))
    }
}

impl Element for Bf16 {
    const LANES: usize = 8;
    type Wide = [f32; 8];
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16_bits_to_f32(self.0)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        Bf16(f32_to_bf16_bits(x))
    }
    #[inline(always)]
    fn unpack(pack: Pack) -> [f32; 8] {
        halves(pack).map(bf16_bits_to_f32)
    }
    #[inline(always)]
    fn pack(wide: [f32; 8]) -> Pack {
        words(wide.map(f32_to_bf16_bits))
    }
}
