//! The example op passes gradcheck on the CPU (always) and on CUDA (when a device is present:
//! this test binary is part of the GPU bundle).
use opsmith::autograd::{CustomOp, Error, GradcheckOptions, Var, compare_devices, custom, gradcheck};
use opsmith::{DType, Device, Tensor};
use opsmith_example_custom_op::{Filter3x3, LAPLACIAN_LIKE};
use std::sync::Arc;

fn image(h: usize, w: usize) -> Tensor {
    let values: Vec<f64> = (0..h * w).map(|i| ((i as f64) * 0.37).cos() * (1.0 + (i % 5) as f64 * 0.1)).collect();
    Tensor::from_vec(values, [h, w], Device::Cpu).unwrap()
}

fn op() -> Arc<dyn CustomOp> {
    Arc::new(Filter3x3::new(LAPLACIAN_LIKE))
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
    let filter: Arc<dyn CustomOp> = Arc::new(Unflipped(Filter3x3::new(LAPLACIAN_LIKE)));
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
    compare_devices(f, &[big], device, &GradcheckOptions::for_dtype(DType::F32)).unwrap();
}
