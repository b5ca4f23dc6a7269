//! 16-byte vector memory access.
//!
//! A "pack" is 16 bytes: 4 f32 or 8 f16/bf16. A pack load compiles to one `ld.global.v4.b32`,
//! the widest load a thread can issue, which is what lets a streaming kernel reach the memory
//! bandwidth with few instructions in flight per byte.
use core::simd::Simd;

/// Sixteen bytes of raw data, as four 32-bit words in memory order.
pub type Pack = [u32; 4];

/// Whether `ptr` may be read and written with pack accesses.
#[inline(always)]
pub fn is_pack_aligned<T>(ptr: *const T) -> bool {
    (ptr as usize) % 16 == 0
}

/// Loads pack number `index` (bytes `16 * index .. 16 * index + 16`) from `base`.
///
/// # Safety
/// `base` must be 16-byte aligned, and those 16 bytes must be readable global memory.
#[inline(always)]
pub unsafe fn load_pack<T>(base: *const T, index: u64) -> Pack {
    // SAFETY: the caller guarantees alignment and that the bytes are readable.
    unsafe { (base as *const Simd<u32, 4>).add(index as usize).read().to_array() }
}

/// Stores `pack` as pack number `index` of `base`.
///
/// # Safety
/// `base` must be 16-byte aligned, and those 16 bytes must be writable global memory that no
/// other thread accesses during the kernel.
#[inline(always)]
pub unsafe fn store_pack<T>(base: *mut T, index: u64, pack: Pack) {
    // SAFETY: the caller guarantees alignment and exclusive access to the bytes.
    unsafe { (base as *mut Simd<u32, 4>).add(index as usize).write(Simd::from_array(pack)) }
}
