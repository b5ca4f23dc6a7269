//! Reductions and broadcasts: whole-tensor sums (for `sum` and `mean`), the broadcast of a
//! scalar gradient back to a shape, and the row-vector bias (`x + b` over rows, and its backward,
//! the sum over rows).
//!
//! The whole-tensor sum is two launches with a fixed order of additions, so it gives the same
//! bits on every run: `sum_partials` leaves one f32 partial per warp in a scratch buffer, and
//! `sum_finish` adds the partials in one block. Each thread's sequential share of either pass
//! (a thousand values a thread at 2^28 elements, hundreds of partials a lane) is a compensated
//! sum, so the error is that of the warps' trees, not of the long chains.
use crate::names::ReductionKernels;

macro_rules! reduction_family {
    (
        $(#[$table_doc:meta])*
        $table:ident, $elem:ty, {
            sum_partials: $partials:ident,
            sum_finish: $finish:ident,
            broadcast_scalar: $broadcast:ident,
            add_row: $add_row:ident,
            sum_rows: $sum_rows:ident,
            sum_rows_by_column: $sum_rows_by_column:ident $(,)?
        }
    ) => {
        $(#[$table_doc])*
        pub const $table: ReductionKernels = ReductionKernels {
            sum_partials: stringify!($partials),
            sum_finish: stringify!($finish),
            broadcast_scalar: stringify!($broadcast),
            add_row: stringify!($add_row),
            sum_rows: stringify!($sum_rows),
            sum_rows_by_column: stringify!($sum_rows_by_column),
        };

        /// First pass of a sum: each thread adds its grid-stride share of `x[..n]` in f32, each
        /// warp adds its lanes, and lane 0 writes `partials[warp]`, where `warp` is the warp's
        /// index in the grid.
        ///
        /// # Safety
        /// `x` is valid for `n` elements; `partials` is valid for `gridDim.x * blockDim.x / 32`
        /// f32 values and overlaps nothing. `blockDim.x` is a multiple of 32.
        #[cfg(target_arch = "nvptx64")]
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $partials(x: *const $elem, partials: *mut f32, n: u64) {
            crate::device::dependent_launch::prologue();
            use crate::device::{element::Element, index, math::CompensatedSum, warp};
            let mut acc = CompensatedSum::ZERO;
            for i in index::GridStride::over(0, n) {
                // SAFETY: i < n.
                acc = acc.add(unsafe { x.add(i as usize).read() }.to_f32());
            }
            // SAFETY: every lane of every warp reaches this point (the loop above has no early
            // exit), and `partials` holds one value per warp of the grid.
            unsafe { warp::store_warp_total(acc.total(), partials) };
        }

        /// Second pass of a sum, launched as one block:
        /// `out[0] = scale * (partials[0] + … + partials[count - 1])`, rounded to the dtype.
        ///
        /// Thread `t` adds partials `t, t + blockDim.x, …` (compensated), then the block adds the
        /// threads' totals ([`BlockReduce`](crate::device::block::BlockReduce)). Every thread
        /// issues its few loads at once, so a thousand partials cost a few memory latencies, not
        /// the thirty-odd dependent ones of a single warp. The order of the additions depends
        /// only on `count` and the block size, so a given launch gives the same bits every run.
        ///
        /// # Safety
        /// `partials` is valid for `count` values and `out` for one element; the launch is one
        /// block (`gridDim = 1`) whose `blockDim.x` is a multiple of 32, at most 1024, with
        /// `blockDim.y = blockDim.z = 1`.
        #[cfg(target_arch = "nvptx64")]
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $finish(partials: *const f32, out: *mut $elem, count: u64, scale: f32) {
            crate::device::dependent_launch::prologue();
            use crate::device::{block::BlockReduce, element::Element, math::CompensatedSum, unroll::strided_fold};
            use core::arch::nvptx;
            let mut block = BlockReduce::new();
            // SAFETY: reading the special registers has no preconditions.
            let (thread, threads) = unsafe { (nvptx::_thread_idx_x() as u64, nvptx::_block_dim_x() as u64) };
            let acc = strided_fold::<4, f32, CompensatedSum>(
                thread,
                count,
                threads,
                CompensatedSum::ZERO,
                // SAFETY: i < count.
                |i| unsafe { partials.add(i as usize).read() },
                CompensatedSum::add,
            );
            // SAFETY: every thread of the one block reaches this call once; the block shape is
            // this kernel's contract.
            let total = unsafe { block.sum(acc.total()) };
            if thread == 0 {
                // SAFETY: `out` is valid for one element.
                unsafe { out.write(<$elem>::from_f32(total * scale)) };
            }
        }

        /// `out[i] = g[0] * scale` for `i < n`: a scalar gradient broadcast back to a shape,
        /// read from device memory so that backward needs no host round trip.
        ///
        /// Thread mapping: grid-stride over elements.
        ///
        /// # Safety
        /// `g` is valid for one element, `out` for `n`; they do not overlap.
        #[cfg(target_arch = "nvptx64")]
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $broadcast(g: *const $elem, out: *mut $elem, scale: f32, n: u64) {
            crate::device::dependent_launch::prologue();
            use crate::device::{element::Element, index};
            // SAFETY: `g` is valid for one element.
            let value = <$elem>::from_f32(unsafe { g.read() }.to_f32() * scale);
            for i in index::GridStride::over(0, n) {
                // SAFETY: i < n.
                unsafe { out.add(i as usize).write(value) };
            }
        }

        /// `out[r, c] = x[r, c] + b[c]` over a row-major `rows × cols` matrix: a bias row
        /// broadcast down the rows.
        ///
        /// Thread mapping: grid-stride over the `rows * cols` elements.
        ///
        /// # Safety
        /// `x` and `out` are valid for `rows * cols` elements, `b` for `cols`; `out` is exactly
        /// `x` or overlaps neither input.
        #[cfg(target_arch = "nvptx64")]
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $add_row(x: *const $elem, b: *const $elem, out: *mut $elem, rows: u64, cols: u64) {
            crate::device::dependent_launch::prologue();
            use crate::device::{element::Element, index};
            if cols == 0 {
                // Nothing to do, and it spares the modulo below a division-by-zero panic path.
                return;
            }
            for i in index::GridStride::over(0, rows * cols) {
                // SAFETY: i < rows * cols and i % cols < cols.
                unsafe {
                    let v = x.add(i as usize).read().to_f32() + b.add((i % cols) as usize).read().to_f32();
                    out.add(i as usize).write(<$elem>::from_f32(v));
                }
            }
        }

        /// `out[c] = g[0, c] + g[1, c] + … + g[rows - 1, c]`, added in f32: the backward of the
        /// bias row.
        ///
        /// Thread mapping: a block takes 32 neighbouring columns at a time (block-stride over
        /// tiles of 32), lane `l` of every warp column `l` of the tile, so each warp reads 32
        /// neighbouring values of a row (coalesced). The block's `W` warps split the rows: warp
        /// `w` adds rows `w, w + W, …` in order (eight loads in flight), and the warps' sums are added in warp order
        /// ([`LaneSums`](crate::device::block::LaneSums)). With a few columns, all of a block's
        /// warps still read rows at once; the order of the additions depends only on the block
        /// size, so every run gives the same bits.
        ///
        /// # Safety
        /// `g` is valid for `rows * cols` elements and `out` for `cols`; they do not overlap.
        /// `blockDim.x` is a multiple of 32, at most 1024, and `blockDim.y = blockDim.z = 1`.
        #[cfg(target_arch = "nvptx64")]
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $sum_rows(g: *const $elem, out: *mut $elem, rows: u64, cols: u64) {
            crate::device::dependent_launch::prologue();
            use crate::device::{block::LaneSums, element::Element, index, unroll::strided_fold};
            use core::arch::nvptx;
            let mut sums = LaneSums::new();
            // SAFETY: reading the special registers has no preconditions.
            let (thread, threads) = unsafe { (nvptx::_thread_idx_x() as u64, nvptx::_block_dim_x() as u64) };
            let (lane, warp, warps) = (thread % 32, thread / 32, (threads / 32).max(1));
            // Every thread of a block takes the same tiles, so all reach each barrier together.
            for tile in index::GridStride::over_blocks(cols.div_ceil(32)) {
                let c = tile * 32 + lane;
                let mut acc = 0.0f32;
                if c < cols {
                    // Rows w, w + W, … in order, eight loads in flight.
                    acc = strided_fold::<8, f32, f32>(
                        warp,
                        rows,
                        warps,
                        0.0,
                        // SAFETY: r < rows and c < cols.
                        |r| unsafe { g.add((r * cols + c) as usize).read() }.to_f32(),
                        |acc, v| acc + v,
                    );
                }
                // SAFETY: every thread of the block calls it, once per tile (see above).
                let total = unsafe { sums.sum_to_first_warp(acc) };
                if warp == 0 && c < cols {
                    // SAFETY: c < cols.
                    unsafe { out.add(c as usize).write(<$elem>::from_f32(total)) };
                }
            }
        }

        /// `out[c] = g[0, c] + … + g[rows - 1, c]`, added in f32, with one block per column:
        /// the backward of a narrow bias row, where the tiled `sum_rows` of this family would
        /// put all the rows of a few tiles on a few SMs.
        ///
        /// Thread mapping: blocks grid-stride over the columns; thread `t` adds rows `t,
        /// t + blockDim.x, …` of its block's column in order (four loads in flight), and the
        /// block adds its threads' sums ([`BlockReduce`](crate::device::block::BlockReduce)).
        /// The order of the additions depends only on the block size, so every run gives the
        /// same bits.
        ///
        /// # Safety
        /// `g` is valid for `rows * cols` elements and `out` for `cols`; they do not overlap.
        /// `blockDim.x` is a multiple of 32, at most 1024, and `blockDim.y = blockDim.z = 1`.
        #[cfg(target_arch = "nvptx64")]
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $sum_rows_by_column(g: *const $elem, out: *mut $elem, rows: u64, cols: u64) {
            crate::device::dependent_launch::prologue();
            use crate::device::{block::BlockReduce, element::Element, index, unroll::strided_fold};
            use core::arch::nvptx;
            let mut reduce = BlockReduce::new();
            // SAFETY: reading the special registers has no preconditions.
            let (thread, threads) = unsafe { (nvptx::_thread_idx_x() as u64, nvptx::_block_dim_x() as u64) };
            // Every thread of a block takes the same columns, so all reach each barrier together.
            for c in index::GridStride::over_blocks(cols) {
                let acc = strided_fold::<4, f32, f32>(
                    thread,
                    rows,
                    threads,
                    0.0,
                    // SAFETY: r < rows and c < cols.
                    |r| unsafe { g.add((r * cols + c) as usize).read() }.to_f32(),
                    |acc, v| acc + v,
                );
                // SAFETY: every thread of the block calls it, once per column (see above).
                let total = unsafe { reduce.sum(acc) };
                if thread == 0 {
                    // SAFETY: c < cols.
                    unsafe { out.add(c as usize).write(<$elem>::from_f32(total)) };
                }
            }
        }
    };
}

reduction_family! {
    /// The reduction kernels for f32 tensors.
    F32, f32, {
        sum_partials: sum_partials_f32,
        sum_finish: sum_finish_f32,
        broadcast_scalar: broadcast_scalar_f32,
        add_row: add_row_f32,
        sum_rows: sum_rows_f32,
        sum_rows_by_column: sum_rows_by_column_f32,
    }
}

reduction_family! {
    /// The reduction kernels for f16 tensors (arithmetic in f32).
    F16, crate::device::element::F16, {
        sum_partials: sum_partials_f16,
        sum_finish: sum_finish_f16,
        broadcast_scalar: broadcast_scalar_f16,
        add_row: add_row_f16,
        sum_rows: sum_rows_f16,
        sum_rows_by_column: sum_rows_by_column_f16,
    }
}

reduction_family! {
    /// The reduction kernels for bf16 tensors (arithmetic in f32).
    BF16, crate::device::element::Bf16, {
        sum_partials: sum_partials_bf16,
        sum_finish: sum_finish_bf16,
        broadcast_scalar: broadcast_scalar_bf16,
        add_row: add_row_bf16,
        sum_rows: sum_rows_bf16,
        sum_rows_by_column: sum_rows_by_column_bf16,
    }
}
