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
        fn name(&self) -> &'static str {
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

/// Backward of one loss consumes that loss's graph only: the nodes of another loss on the same
/// tape, recorded in between, stay, and its backward gives the right gradients afterwards.
#[test]
fn backward_of_one_loss_leaves_a_disjoint_graph() -> opsmith_autograd::Result<()> {
    use opsmith_autograd::{Tape, Var, ops};
    let (xs, ys, cs) = ([1.5, -2.0, 0.25], [0.5, 3.0, -1.25], [2.0, -0.5, 4.0]);
    let tape = Tape::new();
    let x = tape.var(common::tensor(&xs, &[3], DType::F32, Device::Cpu)?);
    let y = tape.var(common::tensor(&ys, &[3], DType::F32, Device::Cpu)?);
    let c = Var::constant(common::tensor(&cs, &[3], DType::F32, Device::Cpu)?);
    // Recorded interleaved: x², y·c, then the two sums.
    let (x2, yc) = (ops::mul(&x, &x)?, ops::mul(&y, &c)?);
    let (l1, l2) = (ops::sum(&x2)?, ops::sum(&yc)?);
    assert_eq!(tape.len(), 4);
    let g1 = tape.backward(&l1)?;
    assert_eq!(g1.len(), 1, "only x");
    assert_eq!(g1.get(&x).unwrap().to_vec_f64()?, xs.map(|x| 2.0 * x));
    assert_eq!(tape.len(), 2, "l2's mul and sum stay");
    let g2 = tape.backward(&l2)?;
    assert_eq!(g2.len(), 1, "only y");
    assert_eq!(g2.get(&y).unwrap().to_vec_f64()?, cs);
    assert!(tape.is_empty());
    Ok(())
}

/// Two losses sharing leaves but no node, in either order: each backward gives that loss's
/// gradients of the shared leaves, and the second is not refused.
#[test]
fn backward_of_losses_sharing_leaves() -> opsmith_autograd::Result<()> {
    use opsmith_autograd::{Tape, ops};
    let (xs, ws) = ([1.5, -2.0, 0.25], [0.5, 3.0, -1.25]);
    for first_the_product in [true, false] {
        let tape = Tape::new();
        let x = tape.var(common::tensor(&xs, &[3], DType::F32, Device::Cpu)?);
        let w = tape.var(common::tensor(&ws, &[3], DType::F32, Device::Cpu)?);
        let product = ops::sum(&ops::mul(&x, &w)?)?; // d/dx = w, d/dw = x
        let square = ops::mean(&ops::mul(&x, &x)?)?; // d/dx = 2x / 3
        let check_product = |tape: &Tape| -> opsmith_autograd::Result<()> {
            let g = tape.backward(&product)?;
            assert_eq!(g.get(&x).unwrap().to_vec_f64()?, ws);
            assert_eq!(g.get(&w).unwrap().to_vec_f64()?, xs);
            Ok(())
        };
        let check_square = |tape: &Tape| -> opsmith_autograd::Result<()> {
            let g = tape.backward(&square)?;
            assert!(g.get(&w).is_none());
            let expected = xs.map(|x| (2.0 * x / 3.0) as f32 as f64);
            assert_eq!(g.get(&x).unwrap().to_vec_f64()?, expected);
            Ok(())
        };
        if first_the_product {
            check_product(&tape)?;
            check_square(&tape)?;
        } else {
            check_square(&tape)?;
            check_product(&tape)?;
        }
        assert!(tape.is_empty());
    }
    Ok(())
}

/// A second loss that needs a node the first loss's backward consumed is refused with
/// GraphConsumed (as in PyTorch without retain_graph), and that refusal consumes nothing.
#[test]
fn backward_through_a_node_another_loss_consumed() -> opsmith_autograd::Result<()> {
    use opsmith_autograd::{Error, Tape, ops};
    let xs = [1.5, -2.0, 0.25];
    let tape = Tape::new();
    let x = tape.var(common::tensor(&xs, &[3], DType::F32, Device::Cpu)?);
    let h = ops::mul(&x, &x)?;
    let (l1, l2) = (ops::sum(&h)?, ops::mean(&h)?);
    assert_eq!(tape.backward(&l1)?.get(&x).unwrap().to_vec_f64()?, xs.map(|x| 2.0 * x));
    assert_eq!(tape.len(), 1, "l2's mean stays");
    assert!(matches!(tape.backward(&l2), Err(Error::GraphConsumed)));
    assert_eq!(tape.len(), 1, "a refused backward takes nothing");
    Ok(())
}
