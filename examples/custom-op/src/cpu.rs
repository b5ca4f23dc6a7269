//! The CPU half of [`Filter3x3`](crate::Filter3x3): the same stencil in f64, for images of any
//! float dtype. It doubles as the reference the CUDA kernels are tested against.
use opsmith::autograd::Result;
use opsmith::{DType, Device, Tensor};

/// `filter(src)` (or, with `transpose`, the backward: the stencil flipped) of an `h × w` image.
pub(crate) fn stencil(weights: &[f32; 9], src: &Tensor, (h, w): (u64, u64), transpose: bool) -> Result<Tensor> {
    let (h, w) = (h as usize, w as usize);
    let values = src.to_dtype(DType::F64)?.to_vec::<f64>()?;
    let s: i64 = if transpose { -1 } else { 1 };
    let (hi, wi) = (h as i64, w as i64);
    let mut out = vec![0.0f64; h * w];
    for r in 0..hi {
        for c in 0..wi {
            let mut acc = 0.0;
            for dr in 0..3i64 {
                for dc in 0..3i64 {
                    let (rr, cc) = (r + s * (dr - 1), c + s * (dc - 1));
                    if (0..hi).contains(&rr) && (0..wi).contains(&cc) {
                        acc += f64::from(weights[(dr * 3 + dc) as usize]) * values[(rr * wi + cc) as usize];
                    }
                }
            }
            out[(r * wi + c) as usize] = acc;
        }
    }
    Ok(Tensor::from_vec(out, [h, w], Device::Cpu)?.to_dtype(src.dtype())?)
}
