//! The CPU half of [`BiasGeluResidual`](crate::BiasGeluResidual), in f64 with opsmith's own
//! gelu formulas, for every float dtype. It doubles as the reference for the CUDA kernels.
use opsmith::autograd::Result;
use opsmith::kernels::activation::{gelu, gelu_backward};
use opsmith::{DType, Device, Tensor};

fn values(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.to_dtype(DType::F64)?.to_device(Device::Cpu)?.to_vec::<f64>()?)
}

fn tensor(values: Vec<f64>, like: &Tensor) -> Result<Tensor> {
    Ok(Tensor::from_vec(values, like.dims(), Device::Cpu)?.to_dtype(like.dtype())?)
}

/// `gelu(x + b) + r`.
pub(crate) fn forward(x: &Tensor, b: &Tensor, r: &Tensor) -> Result<Tensor> {
    let (xs, bs, rs) = (values(x)?, values(b)?, values(r)?);
    let y = xs.iter().zip(&rs).enumerate().map(|(i, (x, r))| gelu(x + bs[i % bs.len()]) + r).collect();
    tensor(y, x)
}

/// `(dx, db, dr)` for the upstream gradient `g`.
pub(crate) fn backward(x: &Tensor, b: &Tensor, g: &Tensor) -> Result<[Tensor; 3]> {
    let (xs, bs, gs) = (values(x)?, values(b)?, values(g)?);
    let dx: Vec<f64> =
        xs.iter().zip(&gs).enumerate().map(|(i, (x, g))| gelu_backward(*g, x + bs[i % bs.len()])).collect();
    let mut db = vec![0.0; bs.len()];
    for (i, d) in dx.iter().enumerate() {
        db[i % bs.len()] += d;
    }
    Ok([tensor(dx, x)?, tensor(db, b)?, g.clone()])
}
