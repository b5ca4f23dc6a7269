//! The CPU autograd suite.
mod common;

use opsmith_host::{DType, Device};

shared_cases!(Device::Cpu);

#[test]
fn gradcheck_every_op_f64() -> opsmith_autograd::Result<()> {
    common::gradcheck_every_op(Device::Cpu, DType::F64)
}

#[test]
fn custom_ops() -> opsmith_autograd::Result<()> {
    common::custom_ops_on_cpu()
}

/// A deliberately wrong backward is caught, with the element and both values in the message.
#[test]
fn gradcheck_reports_a_wrong_gradient() {
    use opsmith_autograd::{CustomOp, Error, GradcheckOptions, custom, gradcheck};
    use opsmith_host::Tensor;
    struct WrongSquare;
    impl CustomOp for WrongSquare {
        fn name(&self) -> &str {
            "wrong_square"
        }
        fn num_inputs(&self) -> usize {
            1
        }
        fn cpu_forward(&self, i: &[&Tensor]) -> opsmith_autograd::Result<Tensor> {
            Ok(opsmith_host::ops::mul(i[0], i[0])?)
        }
        fn cpu_backward(&self, i: &[&Tensor], _: &Tensor, g: &Tensor) -> opsmith_autograd::Result<Vec<Option<Tensor>>> {
            Ok(vec![Some(opsmith_host::ops::mul(g, i[0])?)]) // missing the factor 2
        }
    }
    let op: std::sync::Arc<dyn CustomOp> = std::sync::Arc::new(WrongSquare);
    let x = Tensor::from_vec(vec![1.5f64, -2.0], [2], Device::Cpu).unwrap();
    let err = gradcheck(|v| custom(&op, &[&v[0]]), &[x], &GradcheckOptions::for_dtype(DType::F64)).unwrap_err();
    match &err {
        Error::GradcheckFailed { input: 0, index: 0, analytic, reference, .. } => {
            assert!((reference / analytic - 2.0).abs() < 1e-6, "{err}");
        }
        other => panic!("expected GradcheckFailed, got {other}"),
    }
    assert!(err.to_string().contains("element 0"), "{err}");
}
