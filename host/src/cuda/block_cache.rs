//! Small freed allocations, kept for the next allocation of the same size without a driver call.
//!
//! Memory comes from the driver's stream-ordered pool, which already keeps freed memory for
//! reuse; but each allocation and each free is still a driver call (`cuMemAllocAsync`,
//! `cuMemFreeAsync`), about 1 µs of host time together on the H200 machine, as much as
//! queueing a small op's kernel. Freed blocks of at most [`MAX_BLOCK`] bytes that were
//! allocated on the device's default stream are therefore kept here, by exact size, up to
//! [`MAX_TOTAL`] bytes in all, and handed to the next allocation of that size on that stream.
//!
//! Reuse is safe in stream order. Before a block is freed, its home stream (here the default
//! stream) waits for every other stream that used it (`StreamUses::before_free`); whatever the
//! default stream queues after that, including the first use of the block's next tensor, runs
//! after every earlier use. Blocks of other streams are freed as before: a stream can end, and
//! a block cached for it would have no stream left to order its reuse.
//!
//! [`CudaDevice::release_cached_memory`](super::CudaDevice::release_cached_memory) frees the
//! blocks held here too, as an allocation that runs out of memory does before it retries. There
//! is no eviction: once the cache is full, blocks of sizes it does not hold are freed as
//! before, until a release empties it.
use super::CudaDevice;
use super::stream_order::StreamUses;
use cudarc::driver::CudaSlice;
use parking_lot::Mutex;
use std::collections::HashMap;

/// The largest block kept: above it the driver calls cost little next to the work on the data.
pub(crate) const MAX_BLOCK: usize = 1 << 20;

/// The most bytes kept per device.
pub(crate) const MAX_TOTAL: usize = 64 << 20;

/// Freed default-stream blocks by size: see the module docs.
#[derive(Default)]
pub(crate) struct BlockCache {
    state: Mutex<Blocks>,
}

#[derive(Default)]
struct Blocks {
    by_size: HashMap<usize, Vec<CudaSlice<u8>>>,
    bytes: usize,
}

impl BlockCache {
    /// A kept block of exactly `bytes` bytes, if there is one.
    pub(crate) fn take(&self, bytes: usize) -> Option<CudaSlice<u8>> {
        let mut blocks = self.state.lock();
        let same_size = blocks.by_size.get_mut(&bytes)?;
        let block = same_size.pop()?;
        if same_size.is_empty() {
            blocks.by_size.remove(&bytes); // sizes come and go with shapes: keep no empty lists
        }
        blocks.bytes -= bytes;
        Some(block)
    }

    /// Keeps `block`, freed on the default stream after its other users (see the module docs),
    /// or hands it back when it is too large or the cache is full.
    pub(crate) fn put(&self, block: CudaSlice<u8>) -> Option<CudaSlice<u8>> {
        let bytes = block.len();
        let mut blocks = self.state.lock();
        if bytes == 0 || bytes > MAX_BLOCK || blocks.bytes + bytes > MAX_TOTAL {
            return Some(block);
        }
        blocks.bytes += bytes;
        blocks.by_size.entry(bytes).or_default().push(block);
        None
    }

    /// The bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.state.lock().bytes
    }

    /// Frees every block held (on the default stream, in its order).
    pub(crate) fn clear(&self) {
        let taken = std::mem::take(&mut *self.state.lock());
        drop(taken);
    }
}

/// Frees `block`, a device allocation whose stream uses are `uses`, on the stream that allocated
/// it after every other stream that used it; a small block of the default stream is kept here
/// for the next allocation of its size there instead.
pub(crate) fn release(device: &CudaDevice, block: CudaSlice<u8>, uses: &StreamUses) {
    uses.before_free();
    if uses.home_is_default() {
        // Handed back (and freed here) when too large or the cache is full.
        drop(device.block_cache().put(block));
    } else {
        drop(block);
    }
}
