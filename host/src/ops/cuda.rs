//! The CUDA half of the elementwise ops: one launch of the op's kernel from `kernels-gpu`.
use super::Elementwise;
use crate::cuda::{CudaDevice, DEFAULT_BLOCK, LaunchConfig};
use crate::tensor::storage::with_cuda_ptrs;
use crate::{DType, Device, Error, Result, Tensor};
use opsmith_kernels::{ElementwiseKernels, names};
use std::ffi::c_void;

/// The kernel table for a dtype; f64 has no kernels.
fn kernel_table(op: Elementwise, dtype: DType, device: Device) -> Result<ElementwiseKernels> {
    match dtype {
        DType::F32 => Ok(names::F32),
        DType::F16 => Ok(names::F16),
        DType::BF16 => Ok(names::BF16),
        DType::F64 => Err(Error::UnsupportedDType { op: op.name(), dtype, device }),
    }
}

fn kernel_name(op: Elementwise, table: &ElementwiseKernels) -> &'static str {
    match op {
        Elementwise::Add => table.add,
        Elementwise::Sub => table.sub,
        Elementwise::Mul => table.mul,
        Elementwise::Affine { .. } => table.affine,
        Elementwise::FusedMulAdd => table.fused_mul_add,
        Elementwise::AddMul => table.add_mul,
        Elementwise::AddMulBackward => table.add_mul_backward,
    }
}

/// The kernel table for `t`'s dtype, from a family's tables for f32, f16 and bf16; f64 has no
/// kernels.
pub(crate) fn dtype_table<K>(op: &'static str, t: &Tensor, [f32, f16, bf16]: [K; 3]) -> Result<K> {
    match t.dtype() {
        DType::F32 => Ok(f32),
        DType::F16 => Ok(f16),
        DType::BF16 => Ok(bf16),
        DType::F64 => Err(Error::UnsupportedDType { op, dtype: DType::F64, device: t.device() }),
    }
}

/// The most elements one launch may cover: every byte offset must fit an `isize` (Rust's rule
/// for pointer arithmetic, which the kernels use).
pub(crate) fn check_launch_len(op: &'static str, n: usize, dtype: DType) -> Result<u64> {
    let limit = (isize::MAX as u64) / dtype.size_in_bytes() as u64;
    let n = n as u64;
    if n > limit {
        return Err(Error::TooLarge { op: op.into(), elements: n, limit });
    }
    Ok(n)
}

pub(super) fn elementwise(op: Elementwise, inputs: &[&Tensor], outputs: &[&Tensor]) -> Result<()> {
    let first = inputs[0];
    let Device::Cuda(ordinal) = first.device() else {
        return Err(Error::DeviceMismatch { op: op.name(), lhs: Device::Cuda(0), rhs: first.device() });
    };
    let table = kernel_table(op, first.dtype(), first.device())?;
    let n = check_launch_len(op.name(), first.elem_count(), first.dtype())?;
    if n == 0 {
        return Ok(());
    }
    let device = CudaDevice::get(ordinal)?;
    let kernel = device.kernels()?.kernel(kernel_name(op, &table))?;
    // The kernels take one 16-byte pack per thread-iteration.
    let lanes = (16 / first.dtype().size_in_bytes()) as u64;
    let cfg = LaunchConfig::grid_stride(&kernel, n.div_ceil(lanes), DEFAULT_BLOCK)?;
    let stream = device.current_stream();
    with_cuda_ptrs(&stream, inputs, outputs, |reads, writes| {
        let mut pointers: Vec<u64> = reads.iter().chain(writes).copied().collect();
        let mut scalars: Vec<f32> = match op {
            Elementwise::Affine { alpha, beta } => vec![alpha as f32, beta as f32],
            _ => Vec::new(),
        };
        let mut n = n;
        let mut params: Vec<*mut c_void> = pointers.iter_mut().map(|v| v as *mut u64 as *mut c_void).collect();
        params.extend(scalars.iter_mut().map(|v| v as *mut f32 as *mut c_void));
        params.push(&mut n as *mut u64 as *mut c_void);
        // SAFETY: the kernel takes (inputs…, outputs…, scalars…, n: u64), as
        // `elementwise_family!` defines it; every pointer is valid for `n` elements of the
        // checked dtype on this device, and `check::elementwise` ruled out partial overlaps.
        unsafe { kernel.launch_raw(&stream, cfg, &mut params) }
    })
}
