//! Loops the compiler must unroll.
//!
//! A kernel that keeps a row in a `[f32; V]` array needs every index into it to be a constant
//! once compiled: an index that is not puts the array in local memory (off-chip, behind the L1)
//! instead of registers. LLVM fully unrolls short loops on its own but leaves long ones (64 or
//! 128 slots, each with a load and a bounds test) rolled, and Rust has no unroll pragma. These
//! helpers expand into straight-line code by doubling instead, so every index is a literal.

/// The count `N` as a type, for [`Unrolled`].
pub struct Count<const N: usize>;

/// Counts with an unrolled expansion: the powers of two from 1 to 128.
pub trait Unrolled {
    /// Calls `f(base)`, `f(base + 1)`, …, `f(base + N - 1)` in order, as straight-line code.
    fn each(base: usize, f: &mut impl FnMut(usize));
}

impl Unrolled for Count<1> {
    #[inline(always)]
    fn each(base: usize, f: &mut impl FnMut(usize)) {
        f(base)
    }
}

macro_rules! by_doubling {
    ($($n:literal = 2 * $half:literal),+) => {
        $(
            impl Unrolled for Count<$n> {
                #[inline(always)]
                fn each(base: usize, f: &mut impl FnMut(usize)) {
                    Count::<$half>::each(base, f);
                    Count::<$half>::each(base + $half, f);
                }
            }
        )+
    };
}

by_doubling!(2 = 2 * 1, 4 = 2 * 2, 8 = 2 * 4, 16 = 2 * 8, 32 = 2 * 16, 64 = 2 * 32, 128 = 2 * 64);

/// `f(0)`, `f(1)`, …, `f(N - 1)`, unrolled.
#[inline(always)]
pub fn unroll<const N: usize>(mut f: impl FnMut(usize))
where
    Count<N>: Unrolled,
{
    Count::<N>::each(0, &mut f)
}

/// `[f(0), f(1), …, f(N - 1)]`, unrolled.
#[inline(always)]
pub fn from_fn<const N: usize>(mut f: impl FnMut(usize) -> f32) -> [f32; N]
where
    Count<N>: Unrolled,
{
    let mut out = [0.0; N];
    unroll::<N>(|i| out[i] = f(i));
    out
}

/// `f(… f(f(init, 0), 1) …, N - 1)`, unrolled.
#[inline(always)]
pub fn fold<const N: usize, A: Copy>(init: A, mut f: impl FnMut(A, usize) -> A) -> A
where
    Count<N>: Unrolled,
{
    let mut acc = init;
    unroll::<N>(|i| acc = f(acc, i));
    acc
}

/// `combine` folded, in order, over `load(i)` for the indices `i = start, start + step, …`
/// below `end`, with `N` loads in flight: each batch issues its `N` loads before it combines
/// any of them, the last (partial) batch too.
///
/// A plain loop that loads one value and adds it waits a whole memory latency every turn: the
/// add needs the value, and the next load comes after the add in program order. A batch waits
/// about once. The values are combined in the same order as by the plain loop, so the result is
/// the same bit for bit; only the loads move.
#[inline(always)]
pub fn strided_fold<const N: usize, T: Copy + Default, A: Copy>(
    start: u64,
    end: u64,
    step: u64,
    init: A,
    mut load: impl FnMut(u64) -> T,
    mut combine: impl FnMut(A, T) -> A,
) -> A
where
    Count<N>: Unrolled,
{
    let mut acc = init;
    let mut i = start;
    let span = (N as u64 - 1) * step;
    // Whole batches while the batch's last index is in range (`end - span` cannot wrap there).
    while end > span && i < end - span {
        let mut values = [T::default(); N];
        unroll::<N>(|j| values[j] = load(i + j as u64 * step));
        unroll::<N>(|j| acc = combine(acc, values[j]));
        i += N as u64 * step;
    }
    // The last, partial batch: its loads in flight together as well (a short sum, a few values
    // a thread, is all tail), combined in the same order as the plain loop would.
    // `j * step < end - i` is `i + j * step < end` without a sum that could wrap.
    if i < end {
        let (left, mut values) = (end - i, [T::default(); N]);
        unroll::<N>(|j| {
            if (j as u64) * step < left {
                values[j] = load(i + j as u64 * step);
            }
        });
        unroll::<N>(|j| {
            if (j as u64) * step < left {
                acc = combine(acc, values[j]);
            }
        });
    }
    acc
}
