//! Copies between layouts: what `narrow`, `transpose`/`permute`, `cat` and `stack` are made of.
//!
//! Tensors are contiguous, so each of these ops builds a new tensor from pieces. A [`Piece`]
//! says which elements of a source go where in the output: a shape of rank up to
//! [`MAX_RANK`], the source's strides over it, and the output's offset and strides. On CUDA
//! each piece is one launch of the `strided_copy` kernel (f32, f16, bf16); on the CPU, and for
//! f64 tensors on CUDA (copied through the host), the same loop runs in Rust.
use crate::dtype::with_element_type;
use crate::{Device, Element, Error, Result, Shape, Tensor};

/// The highest rank the layout ops take.
pub const MAX_RANK: usize = 6;

/// Elements of `src` copied into the output of an assembly.
pub(crate) struct Piece<'a> {
    pub(crate) src: &'a Tensor,
    /// The shape walked, padded to [`MAX_RANK`] with leading 1s.
    pub(crate) dims: [usize; MAX_RANK],
    /// Where element `(i0, …)` is in `src`: `Σ ik·src_strides[k]`.
    pub(crate) src_strides: [usize; MAX_RANK],
    /// Where it goes in the output: `dst_offset + Σ ik·dst_strides[k]`.
    pub(crate) dst_offset: usize,
    pub(crate) dst_strides: [usize; MAX_RANK],
}

/// The row-major strides of `dims`.
pub(crate) fn contiguous_strides(dims: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; dims.len()];
    for k in (0..dims.len().saturating_sub(1)).rev() {
        strides[k] = strides[k + 1] * dims[k + 1];
    }
    strides
}

/// `values` padded at the front with `fill` to [`MAX_RANK`] entries; an error naming `op` past
/// that rank.
pub(crate) fn padded(op: &'static str, values: &[usize], fill: usize) -> Result<[usize; MAX_RANK]> {
    if values.len() > MAX_RANK {
        return Err(Error::InvalidArgument {
            op,
            reason: format!(
                "tensors of rank {} (shape {values:?}): at most {MAX_RANK} dims are supported",
                values.len()
            ),
        });
    }
    let mut out = [fill; MAX_RANK];
    out[MAX_RANK - values.len()..].copy_from_slice(values);
    Ok(out)
}

/// The loop of the `strided_copy` kernel, on host slices.
fn copy_piece<T: Copy>(src: &[T], dst: &mut [T], p: &Piece<'_>) {
    let n: usize = p.dims.iter().product();
    for i in 0..n {
        let (mut rest, mut from, mut to) = (i, 0, p.dst_offset);
        for k in (0..MAX_RANK).rev() {
            let index = rest % p.dims[k];
            rest /= p.dims[k];
            from += index * p.src_strides[k];
            to += index * p.dst_strides[k];
        }
        dst[to] = src[from];
    }
}

/// A new tensor of `shape`, with the dtype and device of the pieces' sources, filled by the
/// pieces (which together cover every element). The caller has checked that every piece stays
/// inside its source and the output, and that the sources share a dtype and a device.
pub(crate) fn assemble(
    op: &'static str,
    shape: Shape,
    dtype: crate::DType,
    device: Device,
    pieces: &[Piece<'_>],
) -> Result<Tensor> {
    let n = shape.checked_elem_count().ok_or_else(|| Error::InvalidArgument {
        op,
        reason: format!("the output shape {:?} has too many elements", shape.dims()),
    })?;
    #[cfg(feature = "cuda")]
    let kernels = match dtype {
        crate::DType::F32 => Some(opsmith_kernels::names::F32),
        crate::DType::F16 => Some(opsmith_kernels::names::F16),
        crate::DType::BF16 => Some(opsmith_kernels::names::BF16),
        // u32 moves as f32 does: the copy kernels move bits and never round.
        crate::DType::U32 => Some(opsmith_kernels::names::F32),
        crate::DType::F64 | crate::DType::I64 => None,
    };
    #[cfg(feature = "cuda")]
    if let (Device::Cuda(_), Some(kernels)) = (device, kernels) {
        let out = Tensor::empty(shape, dtype, device)?;
        for p in pieces {
            let count: usize = p.dims.iter().product();
            if count == 0 {
                continue;
            }
            let dst = out.flat_slice(p.dst_offset, n - p.dst_offset)?;
            let (d, s, t) =
                (p.dims.map(|v| v as u64), p.src_strides.map(|v| v as u64), p.dst_strides.map(|v| v as u64));
            crate::cuda::launch(
                kernels.strided_copy,
                crate::cuda::Grid::stride(count as u64),
                (
                    p.src,
                    &dst,
                    count as u64,
                    p.src.elem_count() as u64,
                    dst.elem_count() as u64,
                    d[0],
                    d[1],
                    d[2],
                    d[3],
                    d[4],
                    d[5],
                    s[0],
                    s[1],
                    s[2],
                    s[3],
                    s[4],
                    s[5],
                    t[0],
                    t[1],
                    t[2],
                    t[3],
                    t[4],
                    t[5],
                ),
            )?;
        }
        return Ok(out);
    }
    // The CPU, and f64 on CUDA (no kernel): through host memory.
    with_element_type!(dtype, T => {
        // A broadcast's output can be far larger than its inputs: an error, not an abort.
        let mut out = crate::tensor::host_vec(op, n, T::from_f64(0.0))?;
        for p in pieces {
            copy_piece(&p.src.to_vec::<T>()?, &mut out, p);
        }
        Tensor::from_vec(out, shape, device)
    })
}
