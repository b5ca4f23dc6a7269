//! The small-block cache (`--features gpu-tests`; needs a CUDA device): what it keeps, what it
//! hands out again, and that reuse waits for every stream that used a block.
//!
//! A suite of its own, its tests one at a time: they assert the exact bytes kept on device 0,
//! which any other test allocating there at the same moment would change.
use opsmith_host::cuda::{CudaDevice, KernelArg, LaunchConfig, Stream};
use opsmith_host::{DType, Device, Result, Tensor, ops};
use std::sync::Mutex;

const GPU: Device = Device::Cuda(0);
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Holds `stream` for `ms` milliseconds with the spin kernel, so that what is queued after it
/// there is still waiting when the host does the next thing.
fn hold(stream: &Stream, ms: u64) -> Result<()> {
    let spin = stream.device().kernel(opsmith_kernels::names::SPIN)?;
    let one_warp = LaunchConfig { grid: 1, block: 32, shared_mem_bytes: 0 };
    // SAFETY: `spin_ns(ns: u64)` takes one 64-bit parameter and touches no memory.
    unsafe { spin.launch(stream, one_warp, &[KernelArg::U64(ms * 1_000_000)]) }
}

#[test]
fn small_default_stream_blocks_are_kept_and_reused_by_size() -> Result<()> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dev = CudaDevice::get(0)?;
    dev.release_cached_memory()?;
    assert_eq!(dev.cached_block_bytes(), 0);

    // Kept on drop, by exact size, and handed out again (the same memory) for that size only.
    let n = 12_345;
    let t = Tensor::full(3.0, [n], DType::F32, GPU)?;
    let address = t.device_address();
    drop(t);
    assert_eq!(dev.cached_block_bytes(), 4 * n);
    let other_size = Tensor::full(1.0, [n + 1], DType::F32, GPU)?;
    assert_eq!(dev.cached_block_bytes(), 4 * n, "a block of another size is not handed out");
    let again = Tensor::full(-2.0, [n], DType::F32, GPU)?;
    assert_eq!(again.device_address(), address);
    assert_eq!(dev.cached_block_bytes(), 0);
    assert!(again.to_vec::<f32>()?.iter().all(|&v| v == -2.0));
    drop((again, other_size));
    assert_eq!(dev.cached_block_bytes(), 4 * n + 4 * (n + 1));

    // Not kept: blocks above 1 MiB, and blocks of other streams.
    drop(Tensor::zeros([(1 << 18) + 1], DType::F32, GPU)?);
    let side = dev.new_stream()?;
    {
        let _on = side.make_current();
        drop(Tensor::zeros([1000], DType::F32, GPU)?);
    }
    assert_eq!(dev.cached_block_bytes(), 4 * n + 4 * (n + 1));

    // At most 64 MiB in all: 80 blocks of 1 MiB keep 64 of them.
    let many = (0..80).map(|_| Tensor::zeros([1 << 18], DType::F32, GPU)).collect::<Result<Vec<_>>>()?;
    dev.release_cached_memory()?;
    drop(many);
    assert_eq!(dev.cached_block_bytes(), 64 << 20);
    dev.release_cached_memory()?;
    assert_eq!(dev.cached_block_bytes(), 0);
    Ok(())
}

/// A kept block is reused only after every stream that used it is done with it: `reader` is
/// held back, then reads `a` and `b`; they are dropped and their memory, taken from the cache,
/// is overwritten on the default stream before `reader` has started. Without the wait that the
/// free queues on the default stream, the reader would see -7.
#[test]
fn a_kept_block_is_not_reused_before_another_stream_has_read_it() -> Result<()> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dev = CudaDevice::get(0)?;
    dev.release_cached_memory()?;
    let n = 1 << 16; // 256 KiB a tensor: kept by the cache
    let a = Tensor::full(1.5, [n], DType::F32, GPU)?;
    let b = Tensor::full(2.0, [n], DType::F32, GPU)?;
    let (a_at, b_at) = (a.device_address(), b.device_address());
    let reader = dev.new_stream()?;
    let x = {
        let _on = reader.make_current();
        hold(&reader, 20)?;
        let mut x = ops::mul(&a, &b)?;
        for _ in 0..20 {
            x = ops::fused_mul_add(&x, &b, &a)?; // x * 2 + 1.5
        }
        x
    };
    drop((a, b));
    let reused = (0..2).map(|_| Tensor::full(-7.0, [n], DType::F32, GPU)).collect::<Result<Vec<_>>>()?;
    let mut addresses: Vec<_> = reused.iter().map(Tensor::device_address).collect();
    addresses.sort();
    let mut freed = vec![a_at, b_at];
    freed.sort();
    assert_eq!(addresses, freed, "the new tensors got the freed blocks from the cache");
    // 3 * 2^20 + 1.5 * (2^20 - 1): x starts at 3 and each step doubles it and adds 1.5.
    let expected = 3.0 * 2f64.powi(20) + 1.5 * (2f64.powi(20) - 1.0);
    let got = x.to_vec::<f32>()?;
    assert!(got.iter().all(|&v| v as f64 == expected), "the reader saw reused memory: {}", got[0]);
    for t in &reused {
        assert!(t.to_vec::<f32>()?.iter().all(|&v| v == -7.0));
    }
    Ok(())
}
