//! The CUDA half of the elementwise ops: one launch of the op's kernel from `kernels-gpu`.
use super::{Activation, Elementwise};
use crate::cuda::{CudaDevice, DEFAULT_BLOCK, LaunchConfig};
use crate::tensor::storage::with_cuda_ptrs;
use crate::{DType, Device, Error, Result, Tensor};
use opsmith_kernels::names::{self, activation, optim};
use smallvec::SmallVec;
use std::ffi::c_void;

/// A family's table for `dtype`, from its f32, f16 and bf16 tables; f64 has no kernels.
fn by_dtype<T>(op: Elementwise, dtype: DType, device: Device, [f32, f16, bf16]: [T; 3]) -> Result<T> {
    match dtype {
        DType::F32 => Ok(f32),
        DType::F16 => Ok(f16),
        DType::BF16 => Ok(bf16),
        DType::F64 => Err(Error::UnsupportedDType { op: op.name(), dtype, device }),
    }
}

/// The op's kernel for a dtype.
fn kernel_name(op: Elementwise, dtype: DType, device: Device) -> Result<&'static str> {
    let elementwise = || by_dtype(op, dtype, device, [names::F32, names::F16, names::BF16]);
    let activations = || by_dtype(op, dtype, device, [activation::F32, activation::F16, activation::BF16]);
    let optimizers = || match dtype {
        DType::F32 => Ok(optim::F32),
        _ => Err(Error::UnsupportedDType { op: op.name(), dtype, device }),
    };
    Ok(match op {
        Elementwise::Add => elementwise()?.add,
        Elementwise::Sub => elementwise()?.sub,
        Elementwise::Mul => elementwise()?.mul,
        Elementwise::Affine { .. } => elementwise()?.affine,
        Elementwise::FusedMulAdd => elementwise()?.fused_mul_add,
        Elementwise::AddMul => elementwise()?.add_mul,
        Elementwise::AddMulBackward => elementwise()?.add_mul_backward,
        Elementwise::AddMulBackwardUniform { .. } => elementwise()?.add_mul_backward_uniform,
        Elementwise::Activation(Activation::Relu) => activations()?.relu,
        Elementwise::Activation(Activation::Gelu) => activations()?.gelu,
        Elementwise::Activation(Activation::Silu) => activations()?.silu,
        Elementwise::ActivationBackward(Activation::Relu) => activations()?.relu_backward,
        Elementwise::ActivationBackward(Activation::Gelu) => activations()?.gelu_backward,
        Elementwise::ActivationBackward(Activation::Silu) => activations()?.silu_backward,
        Elementwise::Sgd(step) if step.uses_buffer() => optimizers()?.sgd_momentum,
        Elementwise::Sgd(_) => optimizers()?.sgd,
        Elementwise::Adam(_) => optimizers()?.adam,
    })
}

/// The op's scalar kernel parameters, after its tensors and before `n`, rounded to f32.
fn scalars(op: Elementwise) -> SmallVec<[f32; 8]> {
    let f64s: SmallVec<[f64; 8]> = match op {
        Elementwise::Affine { alpha, beta } => [alpha, beta].into_iter().collect(),
        Elementwise::AddMulBackwardUniform { g } => [g].into_iter().collect(),
        Elementwise::Sgd(step) if step.uses_buffer() => {
            [step.lr, step.momentum, step.weight_decay].into_iter().collect()
        }
        Elementwise::Sgd(step) => [step.lr, step.weight_decay].into_iter().collect(),
        Elementwise::Adam(step) => step.coefficients().to_array().into_iter().collect(),
        _ => SmallVec::new(),
    };
    f64s.into_iter().map(|v| v as f32).collect()
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
        return Err(Error::TooLarge { op, elements: n, limit });
    }
    Ok(n)
}

pub(super) fn elementwise(op: Elementwise, inputs: &[&Tensor], outputs: &[&Tensor]) -> Result<()> {
    let first = inputs[0];
    let Device::Cuda(ordinal) = first.device() else {
        return Err(Error::DeviceMismatch { op: op.name(), lhs: Device::Cuda(0), rhs: first.device() });
    };
    let name = kernel_name(op, first.dtype(), first.device())?;
    let n = check_launch_len(op.name(), first.elem_count(), first.dtype())?;
    if n == 0 {
        // Nothing to launch, but the outputs count as written, as on the CPU.
        outputs.iter().for_each(|t| t.storage.bump_version());
        return Ok(());
    }
    let device = CudaDevice::get(ordinal)?;
    let kernel = device.kernel(name)?;
    // One 16-byte pack per thread.
    let lanes = (16 / first.dtype().size_in_bytes()) as u64;
    let cfg = LaunchConfig::covering(name, n.div_ceil(lanes), DEFAULT_BLOCK)?;
    let stream = device.current_stream();
    with_cuda_ptrs(op.name(), &stream, inputs, outputs, |reads, writes| {
        let mut pointers: SmallVec<[u64; 8]> = reads.iter().chain(writes).copied().collect();
        let mut scalars = scalars(op);
        let mut n = n;
        let mut params: SmallVec<[*mut c_void; 16]> =
            pointers.iter_mut().map(|v| v as *mut u64 as *mut c_void).collect();
        params.extend(scalars.iter_mut().map(|v| v as *mut f32 as *mut c_void));
        params.push(&mut n as *mut u64 as *mut c_void);
        // SAFETY: the kernel takes (inputs…, outputs…, scalars…, n: u64), as the family macros
        // of `kernels-gpu` define it (`scalars` lists the op's scalars in parameter order); every pointer is valid for `n` elements of the
        // checked dtype on this device, and `check::elementwise` ruled out partial overlaps.
        unsafe { kernel.launch_raw(&stream, cfg, &mut params) }
    })
}
