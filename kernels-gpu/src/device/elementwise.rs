//! The streaming driver behind every elementwise kernel.
use super::element::Element;
use super::index::{global_thread_index, grid_thread_count};
use super::memory::{Pack, is_pack_aligned, load_pack, store_pack};

/// Streams `I` inputs to `O` outputs of `n` elements each: `outs[k][i] = f(ins[..][i])[k]`.
///
/// Thread mapping: when every pointer is 16-byte aligned, thread `t` of `T` takes packs (4 f32
/// or 8 f16/bf16) `t`, `t + T`, `t + 2T`, … two at a time: both packs' loads of every input are
/// issued before any arithmetic, so a thread has `2 I` independent 16-byte loads in flight, and
/// each load instruction stays coalesced across the warp. The `n % LANES` leftover elements then
/// go one at a time. When any pointer is not 16-byte aligned (views at odd offsets) every
/// element takes the scalar path. Any grid size is correct.
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
    // SAFETY: forwarded from this function's contract.
    unsafe { map_elementwise_as(global_thread_index(), grid_thread_count(), ins, outs, n, f) }
}

/// [`map_elementwise`] with the calling thread taking the part of thread `rank` of `threads`
/// (`rank < threads`, every rank taken by exactly one thread of the grid): a kernel that streams
/// several arrays one after another can rotate the ranks per array, so that each thread's first
/// packs lie in different arrays and the arrays are read in parallel, not in turn.
///
/// # Safety
/// As for [`map_elementwise`]; besides, the threads of the grid take the ranks `0..threads`
/// once each.
#[inline(always)]
pub unsafe fn map_elementwise_as<T: Element, const I: usize, const O: usize>(
    rank: u64,
    threads: u64,
    ins: [*const T; I],
    outs: [*mut T; O],
    n: u64,
    f: impl Fn([f32; I]) -> [f32; O],
) {
    let all_aligned = ins.iter().all(|&p| is_pack_aligned(p)) && outs.iter().all(|&p| is_pack_aligned(p as *const T));
    let mut scalar_from = 0;
    if all_aligned && I > 0 {
        let packs = n / T::LANES as u64;
        let step = threads;
        let mut p = rank;
        while p + step < packs {
            // SAFETY: packs p and p + step lie inside the first `packs * LANES <= n` elements,
            // all pointers are 16-byte aligned (checked above), and the caller guarantees validity.
            let (first, second) = unsafe { (load_packs(ins, p), load_packs(ins, p + step)) };
            // SAFETY: as above; the caller guarantees the outputs are exclusive.
            unsafe {
                compute_and_store::<T, I, O>(first, outs, p, &f);
                compute_and_store::<T, I, O>(second, outs, p + step, &f);
            }
            p += 2 * step;
        }
        if p < packs {
            // SAFETY: as above, for the one pack left to this thread.
            unsafe { compute_and_store::<T, I, O>(load_packs(ins, p), outs, p, &f) };
        }
        scalar_from = packs * T::LANES as u64;
    }
    let mut i = scalar_from + rank;
    while i < n {
        // SAFETY: `i < n`, and the caller guarantees every pointer is valid for `n` elements.
        let x: [f32; I] = core::array::from_fn(|k| unsafe { ins[k].add(i as usize).read() }.to_f32());
        let r = f(x);
        for k in 0..O {
            // SAFETY: as above.
            unsafe { outs[k].add(i as usize).write(T::from_f32(r[k])) };
        }
        i += threads;
    }
}

/// Pack `p` of every input.
///
/// # Safety
/// Every pointer is 16-byte aligned and pack `p` of each is readable.
#[inline(always)]
unsafe fn load_packs<T, const I: usize>(ins: [*const T; I], p: u64) -> [Pack; I] {
    // SAFETY: forwarded from the caller.
    core::array::from_fn(|k| unsafe { load_pack(ins[k], p) })
}

/// Applies `f` lane by lane to one pack of every input and stores pack `p` of every output.
///
/// # Safety
/// Every output is 16-byte aligned, pack `p` of each is writable, and no other thread writes it.
#[inline(always)]
unsafe fn compute_and_store<T: Element, const I: usize, const O: usize>(
    raw: [Pack; I],
    outs: [*mut T; O],
    p: u64,
    f: &impl Fn([f32; I]) -> [f32; O],
) {
    let wide: [T::Wide; I] = raw.map(T::unpack);
    let mut result: [T::Wide; O] = [wide[0]; O];
    for lane in 0..T::LANES {
        let r = f(core::array::from_fn(|k| wide[k][lane]));
        for k in 0..O {
            result[k][lane] = r[k];
        }
    }
    for k in 0..O {
        // SAFETY: forwarded from the caller.
        unsafe { store_pack(outs[k], p, T::pack(result[k])) };
    }
}
