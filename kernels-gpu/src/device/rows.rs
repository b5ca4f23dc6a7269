//! One warp per row (rows from [`GridStride::over_warps`](super::index::GridStride::over_warps)):
//! which values of a row each lane holds.
//!
//! A row of `cols` values is cut into tiles of `32 * V` values, and in each tile a lane holds
//! `V` slots. With 16-byte packs (when the row starts and `cols` allow them), lane `l` holds
//! packs `l, l + 32, l + 64, …` of the tile, so each pack load of the warp covers 512
//! contiguous bytes; otherwise lane `l` holds values `l, l + 32, l + 64, …`, one scalar load per
//! slot, still coalesced across the warp. A row of at most `32 * V` values is one tile, which a
//! kernel can keep in registers between its passes.
//!
//! A row held by a whole block (one block per row, rows from
//! [`GridStride::over_blocks`](super::index::GridStride::over_blocks)) is tiled the same way,
//! warp `w` of the block holding tile `w`: every offset inside a thread's share stays a
//! constant, as for one warp, and only the tile index depends on the warp.
use super::element::Element;
use super::memory::{is_pack_aligned, load_pack, store_pack};
use super::unroll::{Count, Unrolled, from_fn, unroll};
use core::marker::PhantomData;

/// Whether rows of `cols` values at every pointer of `rows` start on 16-byte boundaries, so
/// that [`RowLanes`] with `PACKED = true` may serve them: each base is aligned and a row is a
/// whole number of packs.
#[inline(always)]
pub fn rows_packable<T: Element, const N: usize>(cols: u64, rows: [*const T; N]) -> bool {
    cols % T::LANES as u64 == 0 && rows.iter().all(|&p| is_pack_aligned(p))
}

/// Where the calling lane's `V` slots lie in each tile of a row of `cols` values of `T`, and the
/// loads and stores that move them. `PACKED` selects 16-byte pack access (see
/// [`rows_packable`]); `V` is then a multiple of `T::LANES`.
pub struct RowLanes<T, const V: usize, const PACKED: bool> {
    lane: u64,
    cols: u64,
    _element: PhantomData<T>,
}

impl<T, const V: usize, const PACKED: bool> Clone for RowLanes<T, V, PACKED> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T, const V: usize, const PACKED: bool> Copy for RowLanes<T, V, PACKED> {}

impl<T: Element, const V: usize, const PACKED: bool> RowLanes<T, V, PACKED>
where
    Count<V>: Unrolled,
{
    /// Packs per lane per tile.
    const PACKS: u64 = (V / T::LANES) as u64;

    /// The calling lane's slots for rows of `cols` values.
    #[inline(always)]
    pub fn new(cols: u64) -> Self {
        Self { lane: super::warp::lane_id() as u64, cols, _element: PhantomData }
    }

    /// The number of tiles a row takes.
    #[inline(always)]
    pub fn tiles(&self) -> u64 {
        self.cols.div_ceil(32 * V as u64)
    }

    /// The column of the calling lane's slot 0 in tile `tile`.
    #[inline(always)]
    fn first(&self, tile: u64) -> u64 {
        if PACKED { (tile * 32 * Self::PACKS + self.lane) * T::LANES as u64 } else { tile * 32 * V as u64 + self.lane }
    }

    /// How far slot `slot` lies past the lane's slot 0, and how far the start of its access
    /// (its pack, or itself) does. Both are constants once unrolled, so each access is one load
    /// with an immediate offset and each bounds test a comparison with an immediate.
    #[inline(always)]
    fn offset(slot: usize) -> (u64, u64) {
        if PACKED {
            let start = (slot / T::LANES * 32 * T::LANES) as u64;
            (start + (slot % T::LANES) as u64, start)
        } else {
            let at = (slot * 32) as u64;
            (at, at)
        }
    }

    /// The column that slot `slot` of tile `tile` holds; it may lie past the row's end.
    #[inline(always)]
    pub fn col(&self, tile: u64, slot: usize) -> u64 {
        self.first(tile) + Self::offset(slot).0
    }

    /// Tile `tile` of `row`, widened to f32: slot `s` holds column [`col`](Self::col)`(tile, s)`,
    /// and 0 where that lies past the row's end.
    ///
    /// # Safety
    /// `row` is valid for `cols` elements; with `PACKED` it is 16-byte aligned and `cols` is a
    /// multiple of `T::LANES`.
    #[inline(always)]
    pub unsafe fn load(&self, row: *const T, tile: u64) -> [f32; V] {
        // SAFETY: forwarded from the caller.
        unsafe { self.load_map([row], tile, 0.0, |_, [v]| v) }
    }

    /// Tile `tile` of `N` rows read side by side and combined as they arrive: slot `s` holds
    /// `f(s, [value of each row at column col(tile, s)])`, or `pad` where that column lies past
    /// the row's end (`f` is not called there). Combining pack by pack keeps only the result
    /// live, not the `N` tiles.
    ///
    /// # Safety
    /// Every row is valid for `cols` elements; with `PACKED` each is 16-byte aligned and `cols`
    /// is a multiple of `T::LANES`.
    #[inline(always)]
    pub unsafe fn load_map<const N: usize>(
        &self,
        rows: [*const T; N],
        tile: u64,
        pad: f32,
        mut f: impl FnMut(usize, [f32; N]) -> f32,
    ) -> [f32; V] {
        let first = self.first(tile);
        // Columns of the row from the lane's slot 0 on; a slot is inside when its access starts
        // below this (a pack that starts inside the row lies wholly inside it, since `cols` is a
        // whole number of packs). Pointers are formed only for slots inside the row.
        let room = self.cols.saturating_sub(first);
        let mut wide = [T::unpack([0; 4]); N];
        let mut inside = false;
        from_fn::<V>(|slot| {
            let (at, start) = Self::offset(slot);
            if PACKED {
                let lane = slot % T::LANES;
                if lane == 0 {
                    inside = start < room;
                    if inside {
                        for (w, &row) in wide.iter_mut().zip(&rows) {
                            // SAFETY: the pack is inside the row; the caller guarantees alignment
                            // of the row, and `first + start` is a whole number of packs.
                            *w = T::unpack(unsafe { load_pack(row.add((first + start) as usize), 0) });
                        }
                    }
                }
                if inside { f(slot, core::array::from_fn(|k| wide[k][lane])) } else { pad }
            } else if at < room {
                // SAFETY: first + at < cols, and the caller guarantees each row is valid for `cols`.
                f(slot, rows.map(|row| unsafe { row.add((first + at) as usize).read() }.to_f32()))
            } else {
                pad
            }
        })
    }

    /// Calls `f(s, [value of each row at slot s])` for the slots of tile `tile` inside the row,
    /// reading the `N` rows side by side as [`load_map`](Self::load_map) does.
    ///
    /// # Safety
    /// As for [`load_map`](Self::load_map).
    #[inline(always)]
    pub unsafe fn for_each<const N: usize>(&self, rows: [*const T; N], tile: u64, mut f: impl FnMut(usize, [f32; N])) {
        // SAFETY: forwarded from the caller; the unused result is optimised away.
        let _ = unsafe {
            self.load_map(rows, tile, 0.0, |s, v| {
                f(s, v);
                0.0
            })
        };
    }

    /// Reads tile `tile` of the `N` rows `ins` and writes `f(s, [value of each input at slot s])`
    /// to the same columns of `out`, pack by pack, so no more than one pack per input is live.
    ///
    /// # Safety
    /// As for [`load_map`](Self::load_map) for `ins`, and for [`store`](Self::store) for `out`.
    #[inline(always)]
    pub unsafe fn map_store<const N: usize>(
        &self,
        ins: [*const T; N],
        out: *mut T,
        tile: u64,
        mut f: impl FnMut(usize, [f32; N]) -> f32,
    ) {
        let first = self.first(tile);
        let room = self.cols.saturating_sub(first);
        let mut wide_in = [T::unpack([0; 4]); N];
        let mut wide_out = T::unpack([0; 4]);
        unroll::<V>(|slot| {
            let (at, start) = Self::offset(slot);
            if start >= room {
                return;
            }
            if PACKED {
                let lane = slot % T::LANES;
                if lane == 0 {
                    for (w, &row) in wide_in.iter_mut().zip(&ins) {
                        // SAFETY: as in `load_map`.
                        *w = T::unpack(unsafe { load_pack(row.add((first + start) as usize), 0) });
                    }
                }
                wide_out[lane] = f(slot, core::array::from_fn(|k| wide_in[k][lane]));
                if lane == T::LANES - 1 {
                    // SAFETY: as in `store`.
                    unsafe { store_pack(out.add((first + start) as usize), 0, T::pack(wide_out)) };
                }
            } else {
                let at = (first + at) as usize;
                // SAFETY: as in `load_map` and `store`.
                unsafe { out.add(at).write(T::from_f32(f(slot, ins.map(|row| row.add(at).read().to_f32())))) };
            }
        })
    }

    /// Writes the slots of tile `tile` that lie inside the row, narrowed to `T`.
    ///
    /// # Safety
    /// As for [`load`](Self::load), with `row` writable, and no other thread writing these
    /// columns.
    #[inline(always)]
    pub unsafe fn store(&self, row: *mut T, tile: u64, values: &[f32; V]) {
        let first = self.first(tile);
        let room = self.cols.saturating_sub(first);
        let mut wide = T::unpack([0; 4]);
        unroll::<V>(|slot| {
            let (at, start) = Self::offset(slot);
            if PACKED {
                let lane = slot % T::LANES;
                wide[lane] = values[slot];
                // Written as a whole once its last lane is in.
                if lane == T::LANES - 1 && start < room {
                    // SAFETY: as in `load_map`; this lane alone owns the pack.
                    unsafe { store_pack(row.add((first + start) as usize), 0, T::pack(wide)) };
                }
            } else if at < room {
                // SAFETY: first + at < cols; this lane alone owns the column.
                unsafe { row.add((first + at) as usize).write(T::from_f32(values[slot])) };
            }
        })
    }
}
