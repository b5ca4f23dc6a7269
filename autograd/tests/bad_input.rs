//! The autograd error classes, each asserting the typed error and unchanged inputs.
use opsmith_autograd::{CustomOp, Error, Result, Tape, Var, custom, ops};
use opsmith_host::{DType, Device, Tensor};
use std::sync::Arc;

fn t(values: &[f64]) -> Tensor {
    Tensor::from_f64(values, values.len(), DType::F32, Device::Cpu).unwrap()
}

const X: [f64; 3] = [0.5, -1.5, 2.0];

struct Square;

impl CustomOp for Square {
    fn name(&self) -> &str {
        "square"
    }
    fn num_inputs(&self) -> usize {
        1
    }
    fn cpu_forward(&self, i: &[&Tensor]) -> Result<Tensor> {
        Ok(opsmith_host::ops::mul(i[0], i[0])?)
    }
    fn cpu_backward(&self, i: &[&Tensor], _: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(opsmith_host::ops::mul(g, &opsmith_host::ops::scale(i[0], 2.0)?)?)])
    }
}

#[test]
fn wrong_arity_in_a_custom_op() {
    let tape = Tape::new();
    let x = tape.var(t(&X));
    let op: Arc<dyn CustomOp> = Arc::new(Square);
    let err = custom(&op, &[&x, &x]).unwrap_err();
    assert!(matches!(&err, Error::Arity { op, what: "inputs", expected: 1, actual: 2 } if op == "square"), "{err}");
    assert!(tape.is_empty(), "nothing recorded");
    assert_eq!(x.value().to_vec_f64().unwrap(), X);
}

#[test]
fn backward_without_requires_grad() {
    let c = Var::constant(t(&X));
    let loss = ops::sum(&c).unwrap();
    let err = Tape::new().backward(&loss).unwrap_err();
    assert!(matches!(err, Error::RequiresGrad { what: "backward" }), "{err}");
    assert_eq!(c.value().to_vec_f64().unwrap(), X);
}

#[test]
fn backward_twice() {
    let tape = Tape::new();
    let x = tape.var(t(&X));
    let loss = ops::sum(&ops::mul(&x, &x).unwrap()).unwrap();
    let grads = tape.backward(&loss).unwrap();
    assert_eq!(grads.get(&x).unwrap().to_vec_f64().unwrap(), [1.0, -3.0, 4.0]);
    let err = tape.backward(&loss).unwrap_err();
    assert!(matches!(err, Error::GraphConsumed), "{err}");
    assert_eq!(x.value().to_vec_f64().unwrap(), X);
}

#[test]
fn non_scalar_loss() {
    let tape = Tape::new();
    let x = tape.var(t(&X));
    let y = ops::scale(&x, 2.0).unwrap();
    let err = tape.backward(&y).unwrap_err();
    assert!(matches!(&err, Error::NonScalarLoss { shape } if shape == &[3]), "{err}");
    assert_eq!(x.value().to_vec_f64().unwrap(), X);
}

#[test]
fn gradient_of_the_wrong_shape_for_backward_with() {
    let tape = Tape::new();
    let x = tape.var(t(&X));
    let y = ops::scale(&x, 2.0).unwrap();
    let err = tape.backward_with(&y, t(&[1.0, 1.0])).unwrap_err();
    assert!(matches!(err, Error::Host(opsmith_host::Error::ShapeMismatch { op: "backward", .. })), "{err}");
}
