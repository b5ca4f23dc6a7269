//! `Filter3x3`: a custom autograd op (a fixed 3×3 weighted filter over a 2-D image, zero
//! padded) with a forward and a backward on the CPU and on CUDA, for f32 and f16 images.
//!
//! Its kernels are Rust, in `kernels/`, each declared once with `opsmith_kernels::kernel!`;
//! this crate launches them through [`KernelCrate`] with tensors, checked against those
//! declarations (dtype, device, lengths, overlap), with no `unsafe` and no module cache of its
//! own. The PTX comes ahead of time (`filter3x3.ptx`, committed; any stable Rust builds this
//! crate) or from `build.rs` with `opsmith-ptx-builder` (the `build-kernels` feature; needs the
//! pinned nightly).
use filter3x3_kernels as kernels;
use opsmith::autograd::onnx::{Attribute, Function};
use opsmith::autograd::{CustomOp, Result};
use opsmith::cuda::{Grid, KernelCrate};
use opsmith::host::Error;
use opsmith::{DType, Device, Tensor};

mod cpu;

/// The example's kernels as PTX, built by `build.rs` from `kernels/`.
#[cfg(feature = "build-kernels")]
pub const PTX: &str = include_str!(env!("FILTER3X3_PTX"));

/// The example's kernels as PTX: the committed file, made from `kernels/` by
/// `cargo xtask kernels` (CI checks it is current).
#[cfg(not(feature = "build-kernels"))]
pub const PTX: &str = include_str!("../filter3x3.ptx");

/// Loaded into each device's context on first use, and kept there.
static KERNELS: KernelCrate = KernelCrate::new("filter3x3-kernels", PTX);

/// The ONNX domain of the op's nodes in exported models.
pub const ONNX_DOMAIN: &str = "example.filter";

/// A Laplacian-style stencil, deliberately not symmetric, so that a backward that forgot to
/// flip the stencil fails gradcheck.
pub const LAPLACIAN_LIKE: [f32; 9] = [0.10, 0.25, 0.00, 0.20, -1.00, 0.30, 0.05, 0.15, -0.05];

/// The op: `out = filter(x)`, for images of shape `[height, width]`.
pub struct Filter3x3 {
    weights: [f32; 9],
    /// The weights where the CUDA kernels read them, like a layer's parameters.
    on_device: Tensor,
}

impl Filter3x3 {
    /// A filter with these row-major 3×3 weights, for images on `device`.
    pub fn new(weights: [f32; 9], device: Device) -> Result<Self> {
        Ok(Self { weights, on_device: Tensor::from_slice(&weights, [9], device)? })
    }

    /// `filter(src)`, or its transpose (the backward), with the CUDA kernel for `src`'s dtype.
    fn cuda(&self, src: &Tensor, backward: bool) -> Result<Tensor> {
        let (h, w) = image_dims(src)?;
        let out = Tensor::empty(src.dims(), src.dtype(), src.device())?;
        let kernel = match (src.dtype(), backward) {
            (DType::F32, false) => kernels::filter3x3_forward_f32,
            (DType::F32, true) => kernels::filter3x3_backward_f32,
            (DType::F16, false) => kernels::filter3x3_forward_f16,
            (DType::F16, true) => kernels::filter3x3_backward_f16,
            (dtype, _) => return Err(Error::UnsupportedDType { op: "filter3x3", dtype, device: src.device() }.into()),
        };
        KERNELS.launch(kernel, Grid::stride(h * w), (src, &self.on_device, &out, h, w))?;
        Ok(out)
    }
}

/// `(height, width)` of an image `[height, width]`, or an error naming the op and the shape.
fn image_dims(x: &Tensor) -> Result<(u64, u64)> {
    let &[h, w] = x.dims() else {
        let reason = format!("expects [height, width], got {:?}", x.dims());
        return Err(Error::InvalidArgument { op: "filter3x3", reason }.into());
    };
    Ok((h as u64, w as u64))
}

impl CustomOp for Filter3x3 {
    fn name(&self) -> &'static str {
        "filter3x3"
    }
    fn num_inputs(&self) -> usize {
        1
    }
    fn cpu_forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        cpu::stencil(&self.weights, inputs[0], image_dims(inputs[0])?, false)
    }
    fn cpu_backward(&self, _inputs: &[&Tensor], _output: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(cpu::stencil(&self.weights, grad, image_dims(grad)?, true)?)])
    }
    fn cuda_forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        self.cuda(inputs[0], false)
    }
    fn cuda_backward(&self, _inputs: &[&Tensor], _output: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(self.cuda(grad, true)?)])
    }
    /// In ONNX, a node `example.filter::Filter3x3` whose function is the same stencil as a
    /// standard `Conv`: the image as a batch of one single-channel image, zero padding of one.
    fn onnx_function(&self) -> Option<Function> {
        let weights: Vec<f64> = self.weights.iter().map(|&w| f64::from(w)).collect();
        Some(
            Function::new(ONNX_DOMAIN, "Filter3x3", &["x"], "y")
                .constant_ints("image_axes", &[0, 1])
                .node("Unsqueeze", &["x", "image_axes"], "x4")
                .constant_tensor_like("w", &weights, &[1, 1, 3, 3], "x")
                .node_with("Conv", &["x4", "w"], "y4", vec![Attribute::ints("pads", &[1, 1, 1, 1])])
                .node("Squeeze", &["y4", "image_axes"], "y"),
        )
    }
}
