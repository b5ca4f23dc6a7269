//! `Filter3x3`: a custom autograd op (a fixed 3×3 weighted filter over a 2-D image, zero
//! padded) with a CPU forward and backward and CUDA ones whose kernels are Rust, in
//! `kernels/`, compiled to PTX either ahead of time (`filter3x3.ptx`, committed; any stable
//! Rust builds this crate) or by `build.rs` with `opsmith-ptx-builder` (the `build-kernels`
//! feature; needs the pinned nightly).
use opsmith::autograd::{CustomOp, Result};
use opsmith::cuda::{CudaDevice, DEFAULT_BLOCK, KernelArg, KernelModule, LaunchConfig};
use opsmith::{DType, Device, Error, Tensor};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// The example's kernels as PTX, built by `build.rs` from `kernels/`.
#[cfg(feature = "build-kernels")]
pub const PTX: &str = include_str!(env!("FILTER3X3_PTX"));

/// The example's kernels as PTX: the committed file, made from `kernels/` by
/// `cargo xtask kernels` (CI checks it is current).
#[cfg(not(feature = "build-kernels"))]
pub const PTX: &str = include_str!("../filter3x3.ptx");

/// A Laplacian-style stencil, deliberately not symmetric, so that a backward that forgot to
/// flip the stencil fails gradcheck.
pub const LAPLACIAN_LIKE: [f32; 9] = [0.10, 0.25, 0.00, 0.20, -1.00, 0.30, 0.05, 0.15, -0.05];

/// The op: `out = filter(x)`, for images of shape `[height, width]`.
pub struct Filter3x3 {
    weights: [f32; 9],
    /// Per CUDA device: the loaded module and the weights uploaded once.
    cuda: Mutex<HashMap<usize, (Arc<KernelModule>, Tensor)>>,
}

impl Filter3x3 {
    /// A filter with these row-major 3×3 weights.
    pub fn new(weights: [f32; 9]) -> Self {
        Self { weights, cuda: Mutex::new(HashMap::new()) }
    }

    fn dims(&self, x: &Tensor) -> Result<(usize, usize)> {
        match *x.dims() {
            [h, w] => Ok((h, w)),
            _ => Err(Error::InvalidArgument {
                op: "filter3x3",
                reason: format!("expects an image [height, width], got {:?}", x.dims()),
            }
            .into()),
        }
    }

    /// The same stencil computed on the host in f64, for any shape-checked f32 or f64 image;
    /// `transpose` applies the backward (the stencil flipped).
    fn cpu(&self, src: &Tensor, transpose: bool) -> Result<Tensor> {
        let (h, w) = self.dims(src)?;
        let values: Vec<f64> = match src.dtype() {
            DType::F64 => src.to_vec::<f64>()?,
            DType::F32 => src.to_vec::<f32>()?.into_iter().map(f64::from).collect(),
            dtype => return Err(Error::UnsupportedDType { op: "filter3x3", dtype, device: Device::Cpu }.into()),
        };
        let s: i64 = if transpose { -1 } else { 1 };
        let mut out = vec![0.0f64; h * w];
        for r in 0..h as i64 {
            for c in 0..w as i64 {
                let mut acc = 0.0;
                for dr in 0..3i64 {
                    for dc in 0..3i64 {
                        let (rr, cc) = (r + s * (dr - 1), c + s * (dc - 1));
                        if rr >= 0 && cc >= 0 && rr < h as i64 && cc < w as i64 {
                            acc += self.weights[(dr * 3 + dc) as usize] as f64 * values[(rr * w as i64 + cc) as usize];
                        }
                    }
                }
                out[(r * w as i64 + c) as usize] = acc;
            }
        }
        Ok(match src.dtype() {
            DType::F64 => Tensor::from_vec(out, [h, w], Device::Cpu)?,
            _ => Tensor::from_vec(out.into_iter().map(|v| v as f32).collect::<Vec<f32>>(), [h, w], Device::Cpu)?,
        })
    }

    fn cuda(&self, kernel: &str, src: &Tensor) -> Result<Tensor> {
        let (h, w) = self.dims(src)?;
        let Device::Cuda(ordinal) = src.device() else {
            return Err(Error::DeviceMismatch { op: "filter3x3", lhs: Device::Cuda(0), rhs: src.device() }.into());
        };
        if src.dtype() != DType::F32 {
            return Err(Error::UnsupportedDType { op: "filter3x3", dtype: src.dtype(), device: src.device() }.into());
        }
        let (module, weights) = {
            let mut cache = self.cuda.lock();
            match cache.get(&ordinal) {
                Some(entry) => entry.clone(),
                None => {
                    let module = Arc::new(KernelModule::from_ptx(&src.device(), "filter3x3-kernels", PTX)?);
                    let weights = Tensor::from_vec(self.weights.to_vec(), [9], src.device())?;
                    cache.insert(ordinal, (module.clone(), weights.clone()));
                    (module, weights)
                }
            }
        };
        let out = Tensor::zeros([h, w], DType::F32, src.device())?;
        if h * w == 0 {
            return Ok(out);
        }
        let kernel = module.kernel(kernel)?;
        let device = CudaDevice::get(ordinal)?;
        let cfg = LaunchConfig::grid_stride(&kernel, (h * w) as u64, DEFAULT_BLOCK)?;
        let args = [
            KernelArg::Input(src),
            KernelArg::Input(&weights),
            KernelArg::Output(&out),
            KernelArg::U64(h as u64),
            KernelArg::U64(w as u64),
        ];
        // SAFETY: both kernels take (src: *const f32, weights: *const f32, out: *mut f32,
        // height: u64, width: u64) and touch height * width values of src and out and 9 weights,
        // which is what these tensors hold.
        unsafe { kernel.launch(&device.current_stream(), cfg, &args)? };
        Ok(out)
    }
}

impl CustomOp for Filter3x3 {
    fn name(&self) -> &'static str {
        "filter3x3"
    }
    fn num_inputs(&self) -> usize {
        1
    }
    fn cpu_forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        self.cpu(inputs[0], false)
    }
    fn cpu_backward(&self, _inputs: &[&Tensor], _output: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(self.cpu(grad, true)?)])
    }
    fn cuda_forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        self.cuda(filter3x3_kernels::FORWARD, inputs[0])
    }
    fn cuda_backward(&self, _inputs: &[&Tensor], _output: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(self.cuda(filter3x3_kernels::BACKWARD, grad)?)])
    }
}
