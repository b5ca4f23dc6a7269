//! The streaming driver behind every elementwise kernel.
use super::element::Element;
use super::index::GridStride;
use super::memory::{is_pack_aligned, load_pack, store_pack};

/// Streams `I` inputs to `O` outputs of `n` elements each: `outs[k][i] = f(ins[..][i])[k]`.
///
/// Thread mapping: when every pointer is 16-byte aligned, threads take whole packs (4 f32 or
/// 8 f16/bf16) in grid-stride order, then the `n % LANES` leftover elements one at a time.
/// Otherwise (views at odd offsets) every element takes the scalar path. All inputs of a pack are
/// loaded before any arithmetic, so each thread has `I` independent 16-byte loads in flight.
///
/// # Safety
/// * every pointer is valid for `n` elements of `T` and aligned to `T`;
/// * an output either is exactly one of the inputs (in-place) or overlaps no other array, and
///   outputs do not overlap each other.
#[inline(always)]
pub unsafe fn map_elementwise<T: Element, const I: usize, const O: usize>(
    ins: [*const T; I],
    outs: [*mut T; O],
    n: u64,
    f: impl Fn([f32; I]) -> [f32; O],
) {
    let all_aligned = ins.iter().all(|&p| is_pack_aligned(p)) && outs.iter().all(|&p| is_pack_aligned(p as *const T));
    let mut scalar_from = 0;
    if all_aligned && I > 0 {
        let packs = n / T::LANES as u64;
        for p in GridStride::over(0, packs) {
            // SAFETY: pack `p` lies inside the first `packs * LANES <= n` elements, all pointers
            // are 16-byte aligned (checked above), and the caller guarantees validity.
            let wide: [T::Wide; I] = core::array::from_fn(|k| T::unpack(unsafe { load_pack(ins[k], p) }));
            let mut result: [T::Wide; O] = [wide[0]; O];
            for lane in 0..T::LANES {
                let r = f(core::array::from_fn(|k| wide[k][lane]));
                for k in 0..O {
                    result[k][lane] = r[k];
                }
            }
            for k in 0..O {
                // SAFETY: as for the loads; the caller guarantees the outputs are exclusive.
                unsafe { store_pack(outs[k], p, T::pack(result[k])) };
            }
        }
        scalar_from = packs * T::LANES as u64;
    }
    for i in GridStride::over(scalar_from, n) {
        // SAFETY: `i < n`, and the caller guarantees every pointer is valid for `n` elements.
        let x: [f32; I] = core::array::from_fn(|k| unsafe { ins[k].add(i as usize).read() }.to_f32());
        let r = f(x);
        for k in 0..O {
            // SAFETY: as above.
            unsafe { outs[k].add(i as usize).write(T::from_f32(r[k])) };
        }
    }
}
