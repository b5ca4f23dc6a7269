//! The example op against independent references: gradcheck and the adjoint identity on the
//! CPU (always), and on CUDA, in f32 and f16, when a device is present (this test binary is
//! part of the GPU bundle).
use opsmith::autograd::{CustomOp, Error, GradcheckOptions, Var, compare_devices, custom, gradcheck};
use opsmith::{DType, Device, Tensor};
use opsmith_example_custom_op::{Filter3x3, LAPLACIAN_LIKE};
use std::sync::Arc;

fn image(h: usize, w: usize) -> Tensor {
    let values: Vec<f64> = (0..h * w).map(|i| ((i as f64) * 0.37).cos() * (1.0 + (i % 5) as f64 * 0.1)).collect();
    Tensor::from_vec(values, [h, w], Device::Cpu).unwrap()
}

fn op() -> Arc<dyn CustomOp> {
    Arc::new(Filter3x3::new(LAPLACIAN_LIKE, Device::cuda_if_available()).unwrap())
}

/// The filter written differently from the op: over a zero-padded copy of the image.
fn padded_reference(x: &[f64], h: usize, w: usize) -> Vec<f64> {
    let mut padded = vec![0.0; (h + 2) * (w + 2)];
    for r in 0..h {
        padded[(r + 1) * (w + 2) + 1..][..w].copy_from_slice(&x[r * w..][..w]);
    }
    let mut out = vec![0.0; h * w];
    for (i, o) in out.iter_mut().enumerate() {
        let (r, c) = (i / w, i % w);
        *o = (0..9).map(|k| f64::from(LAPLACIAN_LIKE[k]) * padded[(r + k / 3) * (w + 2) + c + k % 3]).sum();
    }
    out
}

/// `(Σ aᵢbᵢ, Σ |aᵢbᵢ|)`: the dot product and the scale its rounding errors are relative to.
fn dot(a: &Tensor, b: &Tensor) -> (f64, f64) {
    let (a, b) = (a.to_dtype(DType::F64).unwrap(), b.to_dtype(DType::F64).unwrap());
    let products = a.to_vec::<f64>().unwrap().into_iter().zip(b.to_vec::<f64>().unwrap()).map(|(x, y)| x * y);
    products.fold((0.0, 0.0), |(sum, scale), p| (sum + p, scale + p.abs()))
}

/// Forward against the padded reference, and the backward as the forward's adjoint:
/// `<filter(x), g> = <x, filter_backward(g)>`. Returns the forward's largest absolute error and
/// the identity's error relative to the scale of its terms.
fn check_against_reference(filter: &Arc<dyn CustomOp>, h: usize, w: usize, dtype: DType, device: Device) -> (f64, f64) {
    let x = image(h, w).to_dtype(dtype).unwrap();
    let g = image(w, h).reshape([h, w]).unwrap().to_dtype(dtype).unwrap();
    let expected = padded_reference(&x.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(), h, w);
    let (xd, gd) = (x.to_device(device).unwrap(), g.to_device(device).unwrap());
    let (y, gx) = match device {
        Device::Cpu => (filter.cpu_forward(&[&xd]).unwrap(), filter.cpu_backward(&[&xd], &xd, &gd).unwrap()),
        Device::Cuda(_) => (filter.cuda_forward(&[&xd]).unwrap(), filter.cuda_backward(&[&xd], &xd, &gd).unwrap()),
    };
    let gx = gx.into_iter().next().unwrap().unwrap();
    assert_eq!((y.dims(), y.dtype(), gx.dims(), gx.dtype()), (&[h, w][..], dtype, &[h, w][..], dtype));
    let y = y.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
    let forward = y.iter().zip(&expected).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    let y = Tensor::from_vec(y, [h, w], Device::Cpu).unwrap();
    let ((lhs, lhs_scale), (rhs, rhs_scale)) = (dot(&y, &g), dot(&x, &gx.to_device(Device::Cpu).unwrap()));
    (forward, (lhs - rhs).abs() / (lhs_scale + rhs_scale))
}

#[test]
fn cpu_forward_and_adjoint_match_an_independent_reference() {
    let filter: Arc<dyn CustomOp> = Arc::new(Filter3x3::new(LAPLACIAN_LIKE, Device::Cpu).unwrap());
    for (h, w) in [(1, 1), (2, 7), (5, 4), (16, 9)] {
        let (forward, adjoint) = check_against_reference(&filter, h, w, DType::F64, Device::Cpu);
        assert!(forward < 1e-12 && adjoint < 1e-12, "{h}x{w}: forward {forward:e}, adjoint {adjoint:e}");
    }
}

#[test]
fn a_non_image_is_a_typed_error() {
    let filter = Filter3x3::new(LAPLACIAN_LIKE, Device::Cpu).unwrap();
    let cube = Tensor::zeros([2, 2, 2], DType::F32, Device::Cpu).unwrap();
    let err = filter.cpu_forward(&[&cube]).unwrap_err();
    assert!(err.to_string().contains("filter3x3") && err.to_string().contains("[2, 2, 2]"), "{err}");
}

#[test]
fn cpu_gradcheck_in_f64() {
    let filter = op();
    for (h, w) in [(1, 1), (1, 5), (4, 3), (7, 6)] {
        gradcheck(|v: &[Var]| custom(&filter, &[&v[0]]), &[image(h, w)], &GradcheckOptions::for_dtype(DType::F64))
            .unwrap_or_else(|e| panic!("{h}x{w}: {e}"));
    }
}

#[test]
fn a_backward_without_the_flip_fails_gradcheck() {
    // The transpose of an asymmetric stencil is not the stencil: using the forward as its own
    // backward must be caught.
    struct Unflipped(Filter3x3);
    impl CustomOp for Unflipped {
        fn name(&self) -> &'static str {
            "unflipped"
        }
        fn num_inputs(&self) -> usize {
            1
        }
        fn cpu_forward(&self, i: &[&Tensor]) -> opsmith::autograd::Result<Tensor> {
            self.0.cpu_forward(i)
        }
        fn cpu_backward(
            &self,
            _: &[&Tensor],
            _: &Tensor,
            g: &Tensor,
        ) -> opsmith::autograd::Result<Vec<Option<Tensor>>> {
            Ok(vec![Some(self.0.cpu_forward(&[g])?)])
        }
    }
    let filter: Arc<dyn CustomOp> = Arc::new(Unflipped(Filter3x3::new(LAPLACIAN_LIKE, Device::Cpu).unwrap()));
    let err =
        gradcheck(|v: &[Var]| custom(&filter, &[&v[0]]), &[image(4, 4)], &GradcheckOptions::for_dtype(DType::F64));
    assert!(matches!(err, Err(Error::GradcheckFailed { .. })));
}

#[test]
fn cuda_gradcheck_when_a_device_is_present() {
    let device = Device::cuda_if_available();
    if !device.is_cuda() {
        eprintln!("no CUDA device: skipping the CUDA half (it runs in the GPU bundle)");
        return;
    }
    let filter = op();
    let f = |v: &[Var]| custom(&filter, &[&v[0]]);
    for (h, w) in [(1, 1), (3, 5), (9, 8)] {
        let x = image(h, w).to_dtype(DType::F32).unwrap().to_device(device).unwrap();
        gradcheck(f, &[x], &GradcheckOptions::for_dtype(DType::F32)).unwrap_or_else(|e| panic!("cuda {h}x{w}: {e}"));
    }
    let big = image(130, 257).to_dtype(DType::F32).unwrap();
    compare_devices(f, std::slice::from_ref(&big), device, &GradcheckOptions::for_dtype(DType::F32)).unwrap();
    compare_devices(f, &[big.to_dtype(DType::F16).unwrap()], device, &GradcheckOptions::for_dtype(DType::F16)).unwrap();
}

#[test]
fn cuda_kernels_match_the_reference_in_f32_and_f16() {
    let device = Device::cuda_if_available();
    if !device.is_cuda() {
        eprintln!("no CUDA device: skipping (it runs in the GPU bundle)");
        return;
    }
    let filter = op();
    for (h, w) in [(1, 1), (3, 5), (64, 33), (257, 130)] {
        // f32: fma accumulation of 9 terms; f16: one rounding of values up to ~3 (ulp 2^-9).
        for (dtype, tol) in [(DType::F32, 1e-5), (DType::F16, 4e-3)] {
            let (forward, adjoint) = check_against_reference(&filter, h, w, dtype, device);
            assert!(forward < tol && adjoint < 2e-3, "{dtype} {h}x{w}: forward {forward:e}, adjoint {adjoint:e}");
        }
    }
}

#[test]
fn cuda_misuse_is_a_typed_error() {
    let device = Device::cuda_if_available();
    if !device.is_cuda() {
        eprintln!("no CUDA device: skipping (it runs in the GPU bundle)");
        return;
    }
    let x = image(4, 4).to_device(device).unwrap(); // f64: the kernels take f32 and f16
    let err = op().cuda_forward(&[&x]).unwrap_err();
    assert!(err.to_string().contains("filter3x3") && err.to_string().contains("f64"), "{err}");
    // Weights on the CPU, image on the GPU: the launcher refuses, naming the kernel.
    let cpu_weights = Filter3x3::new(LAPLACIAN_LIKE, Device::Cpu).unwrap();
    let x = x.to_dtype(DType::F32).unwrap();
    let err = cpu_weights.cuda_forward(&[&x]).unwrap_err();
    assert!(err.to_string().contains("filter3x3_forward_f32"), "{err}");
}
