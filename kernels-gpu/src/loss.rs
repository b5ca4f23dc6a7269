//! Loss functions: cross-entropy from logits (with the log-softmax fused in) and the mean
//! squared error, each with its backward.
//!
//! Both forwards leave f32 partials that the reduction family's `sum_finish` turns into the
//! mean, in a fixed order (the same bits every run): one loss per row for cross-entropy, one
//! partial sum of squares per warp for the squared error. Both backwards read the upstream
//! gradient `g[0]` on the device, so a training step needs no host round trip (or, for
//! cross-entropy, take one the host knows, folded into the scale: no tensor to fill with it).
//!
//! A cross-entropy row of at most [`THREAD_ROW_MAX_COLS`] classes is read by one thread, longer
//! rows by one warp; both kernels branch on `cols` once per launch.
use crate::names::LossKernels;

/// The most classes a cross-entropy row may have to be read by one thread instead of a warp
/// (the host launches a thread per row up to it, a warp per row past it).
///
/// A warp per row costs the same for any row of up to 1024 values: 32 slots a lane, each with
/// a bounds test, then a shuffle reduction for the maximum and one for the sum, about 580
/// instructions a warp for the backward (an ncu count at 2 classes), in which a row of 2
/// values leaves 30 lanes idle. A thread per row works on a copy of the row held in registers
/// and sized to it (the next power of two), with no shuffle: its backward's loop runs 61
/// instructions a row at 2 classes and 284 at 16 (sm_90 SASS), still under the warp's count,
/// for 32 rows a warp. Past 16 the thread's share grows with the row while the warp's does not:
/// the held values and their exponentials (two registers a value, 32 at 16), the serial
/// maximum and sum chains and the code of each copy size double with every power of two.
pub const THREAD_ROW_MAX_COLS: u64 = 16;

/// Slots per lane per tile of a cross-entropy row.
#[cfg(target_arch = "nvptx64")]
const TILE: usize = 32;

#[cfg(target_arch = "nvptx64")]
mod imp {
    use super::{THREAD_ROW_MAX_COLS, TILE};
    use crate::device::element::Element;
    use crate::device::index::GridStride;
    use crate::device::logsumexp::{ExpSum, exp_bias, exp_shifted, local_max, reciprocal_or_zero};
    use crate::device::math::{LN_2, log2};
    use crate::device::rows::{RowLanes, rows_packable};
    use crate::device::unroll::{Count, Unrolled, fold, from_fn, unroll};
    use crate::device::warp::lane_id;

    /// Calls `$f::<T, N>(p)` with the copy of a row sized for rows of `cols` values: the
    /// smallest power of two `N` of at least `cols`, up to [`THREAD_ROW_MAX_COLS`]. Then
    /// `cols >= N / 2`, which [`ThreadRow::load`] relies on.
    macro_rules! by_row_length {
        ($cols:expr, $f:ident::<$t:ty>($p:expr)) => {
            match $cols {
                0..=1 => $f::<$t, 1>($p),
                2 => $f::<$t, 2>($p),
                3..=4 => $f::<$t, 4>($p),
                5..=8 => $f::<$t, 8>($p),
                _ => $f::<$t, 16>($p),
            }
        };
    }
    const _: () = assert!(THREAD_ROW_MAX_COLS == 16, "by_row_length! stops at 16");

    /// The cross-entropy kernels' parameters; `out` is the f32 loss per row (forward) or the
    /// gradient (backward, with `coef = g[0] * scale`).
    #[derive(Clone, Copy)]
    pub struct Rows<T, O> {
        pub logits: *const T,
        pub labels: *const u32,
        pub out: *mut O,
        pub rows: u64,
        pub cols: u64,
        pub coef: f32,
    }

    /// # Safety
    /// The entry points' contract.
    #[inline(always)]
    pub unsafe fn cross_entropy<T: Element>(p: Rows<T, f32>) {
        // SAFETY: forwarded; `packed` was checked for the one row pointer read in packs.
        unsafe {
            if p.cols <= THREAD_ROW_MAX_COLS {
                by_row_length!(p.cols, cross_entropy_thread_rows::<T>(p))
            } else if rows_packable(p.cols, [p.logits]) {
                cross_entropy_rows::<T, true>(p)
            } else {
                cross_entropy_rows::<T, false>(p)
            }
        }
    }

    /// # Safety
    /// The entry points' contract.
    #[inline(always)]
    pub unsafe fn cross_entropy_backward<T: Element>(p: Rows<T, T>) {
        // SAFETY: as for `cross_entropy`.
        unsafe {
            if p.cols <= THREAD_ROW_MAX_COLS {
                by_row_length!(p.cols, cross_entropy_backward_thread_rows::<T>(p))
            } else if rows_packable(p.cols, [p.logits, p.out as *const T]) {
                cross_entropy_backward_rows::<T, true>(p)
            } else {
                cross_entropy_backward_rows::<T, false>(p)
            }
        }
    }

    /// The row's maximum and sum of `exp(x - max)`, over the whole warp.
    ///
    /// # Safety
    /// `x` is a row of `cols` values valid for `lanes`; every lane of the warp calls it.
    #[inline(always)]
    unsafe fn row_stats<T: Element, const PACKED: bool>(lanes: RowLanes<T, TILE, PACKED>, x: *const T) -> ExpSum {
        // SAFETY: forwarded from the caller.
        unsafe {
            (0..lanes.tiles())
                .fold(ExpSum::EMPTY, |s, k| s.add(&lanes.load_map([x], k, f32::NEG_INFINITY, |_, [v]| v)))
                .warp_total()
        }
    }

    #[inline(always)]
    unsafe fn cross_entropy_rows<T: Element, const PACKED: bool>(p: Rows<T, f32>) {
        let lanes = RowLanes::<T, TILE, PACKED>::new(p.cols);
        for r in GridStride::over_warps(p.rows) {
            // SAFETY: r < rows, so the row and its label are inside their arrays; every lane of
            // the warp runs the same rows, so the warp is converged in `row_stats`.
            let (x, label) = unsafe { (p.logits.add((r * p.cols) as usize), p.labels.add(r as usize).read() as u64) };
            // SAFETY: as above.
            let total = unsafe { row_stats(lanes, x) };
            // The host rejects labels out of range; one that slips through reads nothing.
            // SAFETY: label < cols.
            let target = if label < p.cols { unsafe { x.add(label as usize).read() }.to_f32() } else { f32::NAN };
            // logsumexp - x[label] = (max - x[label]) + ln(sum): the difference first, so a
            // confident right answer gives a loss near 0 without cancellation.
            let loss = (total.max - target) + log2(total.sum) * LN_2;
            if lane_id() == 0 {
                // SAFETY: r < rows; one lane writes.
                unsafe { p.out.add(r as usize).write(loss) };
            }
        }
    }

    #[inline(always)]
    unsafe fn cross_entropy_backward_rows<T: Element, const PACKED: bool>(p: Rows<T, T>) {
        let lanes = RowLanes::<T, TILE, PACKED>::new(p.cols);
        for r in GridStride::over_warps(p.rows) {
            let start = (r * p.cols) as usize;
            // SAFETY: r < rows, so the rows and the label are inside their arrays.
            let (x, gx, label) = unsafe { (p.logits.add(start), p.out.add(start), p.labels.add(r as usize).read()) };
            // SAFETY: every lane of the warp runs the same rows, so the warp is converged.
            let total = unsafe { row_stats(lanes, x) };
            let (bias, inv) = (exp_bias(total.max), reciprocal_or_zero(total.sum));
            for k in 0..lanes.tiles() {
                let grad = |s, v| {
                    let target = if lanes.col(k, s) == label as u64 { 1.0 } else { 0.0 };
                    (exp_shifted(v, bias) * inv - target) * p.coef
                };
                // SAFETY: the rows hold `cols` values; the output row is this warp's alone.
                unsafe { lanes.map_store([x], gx, k, |s, [v]| grad(s, v)) };
            }
        }
    }

    /// A row of `cols` values (`N / 2 <= cols <= N`) held by one thread: the values widened to
    /// f32 (`-inf` in the `N - cols` slots past the row's end), their maximum, each
    /// `exp(x - max)` (0 past the end) and the sum of those.
    struct ThreadRow<const N: usize> {
        values: [f32; N],
        exps: [f32; N],
        max: f32,
        sum: f32,
    }

    impl<const N: usize> ThreadRow<N>
    where
        Count<N>: Unrolled,
    {
        /// Whether slot `c` lies inside a row of `cols` values. The slots below `N / 2` lie
        /// inside every row that `by_row_length!` gives this `N`, so only the upper half is
        /// tested.
        #[inline(always)]
        fn inside(c: usize, cols: u64) -> bool {
            c < N / 2 || (c as u64) < cols
        }

        /// Reads the row at `x`: every load is issued before any is used, so a thread waits
        /// about one memory latency for the whole row. The maximum, then the exponentials with
        /// the warp path's formulas ([`exp_bias`], [`exp_shifted`]), summed in column order.
        ///
        /// # Safety
        /// `x` is valid for `cols` elements, and `N / 2 <= cols <= N`.
        #[inline(always)]
        unsafe fn load<T: Element>(x: *const T, cols: u64) -> Self {
            let values = from_fn::<N>(|c| {
                // SAFETY: c < cols, and `x` is valid for `cols` elements.
                if Self::inside(c, cols) { unsafe { x.add(c).read() }.to_f32() } else { f32::NEG_INFINITY }
            });
            let max = local_max(&values);
            let bias = exp_bias(max);
            let exps = from_fn::<N>(|c| exp_shifted(values[c], bias));
            let sum = fold::<N, f32>(0.0, |sum, c| sum + exps[c]);
            Self { values, exps, max, sum }
        }
    }

    /// The forward for rows of at most `N` values, one thread per row.
    ///
    /// # Safety
    /// The entry points' contract, and `N / 2 <= cols <= N`.
    #[inline(always)]
    unsafe fn cross_entropy_thread_rows<T: Element, const N: usize>(p: Rows<T, f32>)
    where
        Count<N>: Unrolled,
    {
        for r in GridStride::over(0, p.rows) {
            // SAFETY: r < rows (the caller's contract covers the rest).
            let loss = unsafe { thread_row_loss::<T, N, f32>(&p, r) };
            // SAFETY: r < rows; the thread's row is its own.
            unsafe { p.out.add(r as usize).write(loss) };
        }
    }

    /// The cross-entropy of row `r` of at most `N` values, read by the calling thread alone.
    ///
    /// # Safety
    /// `r < rows`; the entry points' contract, and `N / 2 <= cols <= N`.
    #[inline(always)]
    unsafe fn thread_row_loss<T: Element, const N: usize, O>(p: &Rows<T, O>, r: u64) -> f32
    where
        Count<N>: Unrolled,
    {
        // SAFETY: r < rows, so the label and the row are inside their arrays.
        let (label, row) = unsafe {
            let label = p.labels.add(r as usize).read() as u64;
            (label, ThreadRow::<N>::load(p.logits.add((r * p.cols) as usize), p.cols))
        };
        // The label's value picked from the registers (no second, dependent load); a label
        // of `cols` or more, which the host rejects, gives NaN, as in the warp path.
        let picked = fold::<N, f32>(f32::NAN, |t, c| if c as u64 == label { row.values[c] } else { t });
        let target = if label < p.cols { picked } else { f32::NAN };
        // As in the warp path: the difference first, then ln(sum).
        (row.max - target) + log2(row.sum) * LN_2
    }

    /// # Safety
    /// The entry point's contract.
    #[inline(always)]
    pub unsafe fn cross_entropy_mean<T: Element>(p: Rows<T, T>) {
        // The row sizes of `by_row_length!`, with fewer rows in flight for longer rows (each row
        // held takes 2 registers a value): the same additions in the same order, without a
        // stack frame.
        if p.cols <= 1 {
            // SAFETY: forwarded; cols <= 1, read with `by_row_length!`'s first size.
            unsafe { cross_entropy_mean_thread_rows::<T, 1, 4>(p) }
        } else if p.cols == 2 {
            // SAFETY: forwarded; cols = 2.
            unsafe { cross_entropy_mean_thread_rows::<T, 2, 4>(p) }
        } else if p.cols <= 4 {
            // SAFETY: forwarded; 2 <= cols <= 4.
            unsafe { cross_entropy_mean_thread_rows::<T, 4, 4>(p) }
        } else if p.cols <= 8 {
            // SAFETY: forwarded; 4 <= cols <= 8.
            unsafe { cross_entropy_mean_thread_rows::<T, 8, 2>(p) }
        } else if p.cols <= THREAD_ROW_MAX_COLS {
            // SAFETY: forwarded; 8 <= cols <= 16.
            unsafe { cross_entropy_mean_thread_rows::<T, 16, 1>(p) }
        } else if crate::device::index::global_thread_index() == 0 {
            // Rows this long are not for this kernel: a NaN, not a wrong mean.
            // SAFETY: `out` is valid for one element.
            unsafe { p.out.write(T::from_f32(f32::NAN)) };
        }
    }

    /// The mean of rows of at most `N` values in one block, `ROWS` rows in flight a thread:
    /// thread `t` takes rows `t, t + B, …` of the `B` threads, adds their losses (compensated)
    /// as `sum_finish` adds the partials `t, t + B, …`, and the block adds the threads' totals
    /// as `sum_finish` does. So with the block `sum_finish` would get, the result is the bits of
    /// `cross_entropy` and `sum_finish`.
    ///
    /// # Safety
    /// The entry point's contract, and `N / 2 <= cols <= N`.
    #[inline(always)]
    unsafe fn cross_entropy_mean_thread_rows<T: Element, const N: usize, const ROWS: usize>(p: Rows<T, T>)
    where
        Count<N>: Unrolled,
        Count<ROWS>: Unrolled,
    {
        use crate::device::{block::BlockReduce, math::CompensatedSum, unroll::strided_fold};
        use core::arch::nvptx;
        let mut block = BlockReduce::new();
        // SAFETY: reading the special registers has no preconditions.
        let (thread, threads) = unsafe { (nvptx::_thread_idx_x() as u64, nvptx::_block_dim_x() as u64) };
        let acc = if ROWS == 1 {
            // The plain loop: through `strided_fold`, LLVM keeps the longest rows' loss out of
            // line (a call and a stack frame). The same additions in the same order.
            let (mut acc, mut r) = (CompensatedSum::ZERO, thread);
            while r < p.rows {
                // SAFETY: r < rows; the rest is the caller's contract.
                acc = acc.add(unsafe { thread_row_loss::<T, N, T>(&p, r) });
                r += threads;
            }
            acc
        } else {
            strided_fold::<ROWS, f32, CompensatedSum>(
                thread,
                p.rows,
                threads,
                CompensatedSum::ZERO,
                // SAFETY: `strided_fold` passes indices below `rows`; the rest is the caller's
                // contract.
                |r| unsafe { thread_row_loss::<T, N, T>(&p, r) },
                CompensatedSum::add,
            )
        };
        // SAFETY: every thread of the one block reaches this call once (the branch above is
        // the same for the whole block); the block shape is the entry point's contract.
        let total = unsafe { block.sum(acc.total()) };
        if thread == 0 {
            // SAFETY: `out` is valid for one element.
            unsafe { p.out.write(T::from_f32(total * p.coef)) };
        }
    }

    /// The backward for rows of at most `N` values, one thread per row: the exponentials of
    /// the forward pass over the row, kept in registers, make the gradient.
    ///
    /// # Safety
    /// The entry points' contract, and `N / 2 <= cols <= N`.
    #[inline(always)]
    unsafe fn cross_entropy_backward_thread_rows<T: Element, const N: usize>(p: Rows<T, T>)
    where
        Count<N>: Unrolled,
    {
        for r in GridStride::over(0, p.rows) {
            let start = (r * p.cols) as usize;
            // SAFETY: r < rows, so the label and the row are inside their arrays.
            let (label, row) =
                unsafe { (p.labels.add(r as usize).read() as u64, ThreadRow::<N>::load(p.logits.add(start), p.cols)) };
            let inv = reciprocal_or_zero(row.sum);
            unroll::<N>(|c| {
                if ThreadRow::<N>::inside(c, p.cols) {
                    let target = if c as u64 == label { 1.0 } else { 0.0 };
                    let grad = (row.exps[c] * inv - target) * p.coef;
                    // SAFETY: c < cols, so the element is inside this thread's output row.
                    unsafe { p.out.add(start + c).write(T::from_f32(grad)) };
                }
            });
        }
    }
}

macro_rules! loss_family {
    (
        $(#[$table_doc:meta])*
        $table:ident, $elem:ty, {
            cross_entropy: $ce:ident,
            cross_entropy_mean: $ce_mean:ident,
            cross_entropy_backward: $ce_bwd:ident,
            mse_partials: $mse:ident,
            mse_backward: $mse_bwd:ident $(,)?
        }
    ) => {
        $(#[$table_doc])*
        pub const $table: LossKernels = LossKernels {
            cross_entropy: stringify!($ce),
            cross_entropy_mean: stringify!($ce_mean),
            cross_entropy_backward: stringify!($ce_bwd),
            mse_partials: stringify!($mse),
            mse_backward: stringify!($mse_bwd),
        };

        /// The cross-entropy of each row of a `rows × cols` matrix of logits against its class
        /// label, in f32: `losses[r] = ln(sum_c exp(logits[r, c])) - logits[r, labels[r]]`.
        ///
        /// Thread mapping: for `cols <= THREAD_ROW_MAX_COLS`, one thread per row (threads loop
        /// over rows), which holds the row in registers and writes its loss. Otherwise one warp
        /// per row (warps loop over rows); the row is read once, in tiles, with the maximum and
        /// the sum of exponentials kept online; 16-byte packs when `cols` is a whole number of
        /// packs and `logits` is 16-byte aligned. Lane 0 writes the row's loss. Any grid is
        /// correct.
        ///
        /// # Safety
        /// `logits` is valid for `rows * cols` elements, `labels` for `rows` values and `losses`
        /// for `rows` f32 values, which overlap nothing; `blockDim.x` is a multiple of 32. A label
        /// of `cols` or more gives a NaN loss (nothing is read for it).
        #[cfg(target_arch = "nvptx64")]
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $ce(logits: *const $elem, labels: *const u32, losses: *mut f32, rows: u64, cols: u64) {
            crate::device::dependent_launch::prologue();
            // SAFETY: forwarded from this kernel's contract.
            unsafe { imp::cross_entropy::<$elem>(imp::Rows { logits, labels, out: losses, rows, cols, coef: 1.0 }) }
        }

        /// The mean cross-entropy of a few short rows in one launch:
        /// `out[0] = scale * (losses[0] + … + losses[rows - 1])`, rounded to the dtype, with
        /// each row's loss as the cross-entropy kernel of this family computes it. For
        /// `cols <= THREAD_ROW_MAX_COLS` only (longer rows give NaN).
        ///
        /// Thread mapping: one block; thread `t` computes the losses of rows `t, t + blockDim.x,
        /// …` and adds them as `sum_finish` adds its partials, and the block adds the threads'
        /// totals as `sum_finish` does. Launched with the block `sum_finish` gets for `rows`
        /// partials, it gives the bits of the cross-entropy kernel and `sum_finish` in one
        /// launch (a node, in a graph) instead of two.
        ///
        /// # Safety
        /// `logits` is valid for `rows * cols` elements, `labels` for `rows` values, `out` for
        /// one element, which overlaps neither; the launch is one block (`gridDim = 1`) whose
        /// `blockDim.x` is a multiple of 32, at most 1024, with `blockDim.y = blockDim.z = 1`.
        /// A label of `cols` or more gives a NaN mean (nothing is read for it).
        #[cfg(target_arch = "nvptx64")]
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $ce_mean(
            logits: *const $elem, labels: *const u32, out: *mut $elem, rows: u64, cols: u64, scale: f32,
        ) {
            crate::device::dependent_launch::prologue();
            // SAFETY: forwarded from this kernel's contract.
            unsafe { imp::cross_entropy_mean::<$elem>(imp::Rows { logits, labels, out, rows, cols, coef: scale }) }
        }

        /// The backward of the mean cross-entropy:
        /// `gx[r, c] = (softmax(logits[r, :])[c] - (c == labels[r])) * g[0] * scale`, with
        /// `scale = 1 / rows` for the mean. A null `g` stands for `g[0] * scale = scale`: the
        /// host folds a gradient it knows (a loss's seed of 1) into `scale`, so that no tensor
        /// has to be filled with it first.
        ///
        /// Thread mapping as for the forward: for `cols <= THREAD_ROW_MAX_COLS`, one thread per
        /// row, which reads the row once and keeps its exponentials in registers for the
        /// gradient; otherwise one warp per row, two passes over the row in tiles (the maximum
        /// and sum, then the gradient). Any grid is correct.
        ///
        /// # Safety
        /// `g` is null or valid for one element, `logits` and `gx` for `rows * cols`, `labels`
        /// for `rows` values; `gx` overlaps no input; `blockDim.x` is a multiple of 32.
        #[cfg(target_arch = "nvptx64")]
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $ce_bwd(
            g: *const $elem, logits: *const $elem, labels: *const u32, gx: *mut $elem, rows: u64, cols: u64, scale: f32,
        ) {
            crate::device::dependent_launch::prologue();
            use crate::device::element::Element;
            // SAFETY: a non-null `g` is valid for one element.
            let coef = if g.is_null() { scale } else { unsafe { g.read() }.to_f32() * scale };
            // SAFETY: forwarded from this kernel's contract.
            unsafe { imp::cross_entropy_backward::<$elem>(imp::Rows { logits, labels, out: gx, rows, cols, coef }) }
        }

        /// First pass of the mean squared error: each thread adds `(pred[i] - target[i])^2` over
        /// its grid-stride share in f32, each warp adds its lanes, and lane 0 writes
        /// `partials[warp]` (the warp's index in the grid), for `sum_finish`.
        ///
        /// # Safety
        /// `pred` and `target` are valid for `n` elements; `partials` is valid for
        /// `gridDim.x * blockDim.x / 32` f32 values and overlaps nothing; `blockDim.x` is a
        /// multiple of 32.
        #[cfg(target_arch = "nvptx64")]
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $mse(pred: *const $elem, target: *const $elem, partials: *mut f32, n: u64) {
            crate::device::dependent_launch::prologue();
            use crate::device::{element::Element, index, math::fma, warp};
            let mut acc = 0.0f32;
            for i in index::GridStride::over(0, n) {
                // SAFETY: i < n.
                let d = unsafe { pred.add(i as usize).read().to_f32() - target.add(i as usize).read().to_f32() };
                acc = fma(d, d, acc);
            }
            // SAFETY: every lane of every warp reaches this point (the loop has no early exit).
            unsafe { warp::store_warp_total(acc, partials) };
        }

        /// The backward of the mean squared error for `pred`:
        /// `out[i] = (pred[i] - target[i]) * g[0] * scale`, with `scale = 2 / n` for the mean.
        ///
        /// Thread mapping as for the elementwise kernels: 16-byte packs in grid-stride order when
        /// every pointer is aligned, scalar otherwise.
        ///
        /// # Safety
        /// `g` is valid for one element; `pred`, `target` and `out` for `n` elements, aligned to
        /// the element type; `out` is exactly `pred` or `target`, or overlaps neither.
        #[cfg(target_arch = "nvptx64")]
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $mse_bwd(
            g: *const $elem, pred: *const $elem, target: *const $elem, out: *mut $elem, scale: f32, n: u64,
        ) {
            crate::device::dependent_launch::prologue();
            use crate::device::element::Element;
            // SAFETY: `g` is valid for one element.
            let coef = unsafe { g.read() }.to_f32() * scale;
            // SAFETY: forwarded from this kernel's contract.
            unsafe {
                crate::device::elementwise::map_elementwise::<$elem, 2, 1>([pred, target], [out], n, |[p, t]| [(p - t) * coef])
            }
        }
    };
}

loss_family! {
    /// The loss kernels for f32 tensors.
    F32, f32, {
        cross_entropy: cross_entropy_f32,
        cross_entropy_mean: cross_entropy_mean_f32,
        cross_entropy_backward: cross_entropy_backward_f32,
        mse_partials: mse_partials_f32,
        mse_backward: mse_backward_f32,
    }
}

loss_family! {
    /// The loss kernels for f16 tensors (arithmetic in f32).
    F16, crate::device::element::F16, {
        cross_entropy: cross_entropy_f16,
        cross_entropy_mean: cross_entropy_mean_f16,
        cross_entropy_backward: cross_entropy_backward_f16,
        mse_partials: mse_partials_f16,
        mse_backward: mse_backward_f16,
    }
}

loss_family! {
    /// The loss kernels for bf16 tensors (arithmetic in f32).
    BF16, crate::device::element::Bf16, {
        cross_entropy: cross_entropy_bf16,
        cross_entropy_mean: cross_entropy_mean_bf16,
        cross_entropy_backward: cross_entropy_backward_bf16,
        mse_partials: mse_partials_bf16,
        mse_backward: mse_backward_bf16,
    }
}
