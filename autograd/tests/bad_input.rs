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
    fn name(&self) -> &'static str {
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
    assert!(matches!(err, Error::Arity { op: "square", what: "inputs", expected: 1, actual: 2 }), "{err}");
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

/// The identity, whose backward fails while `fail` is set.
struct Flaky {
    fail: std::sync::atomic::AtomicBool,
}

impl CustomOp for Flaky {
    fn name(&self) -> &'static str {
        "flaky"
    }
    fn num_inputs(&self) -> usize {
        1
    }
    fn cpu_forward(&self, i: &[&Tensor]) -> Result<Tensor> {
        Ok(i[0].copy()?)
    }
    fn cpu_backward(&self, _: &[&Tensor], _: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
        if self.fail.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(opsmith_host::Error::InvalidArgument { op: "flaky", reason: "told to fail".into() }.into());
        }
        Ok(vec![Some(g.clone())])
    }
}

fn is_flaky_error(err: &Error) -> bool {
    matches!(err, Error::Host(opsmith_host::Error::InvalidArgument { op: "flaky", .. }))
}

/// A backward that fails part-way (after `sum` and `scale` ran, at the custom op) keeps every
/// node: the same backward fails the same way again, another loss's backward works, and once
/// the cause is gone the first one works too, with the right gradient.
#[test]
fn failed_backward_keeps_the_graph() {
    let flaky = Arc::new(Flaky { fail: true.into() });
    let op: Arc<dyn CustomOp> = flaky.clone();
    let tape = Tape::new();
    let (x, y) = (tape.var(t(&X)), tape.var(t(&[2.0, -0.5, 1.5])));
    let bad = ops::sum(&ops::scale(&custom(&op, &[&ops::mul(&x, &x).unwrap()]).unwrap(), 3.0).unwrap()).unwrap();
    let good = ops::sum(&ops::mul(&y, &y).unwrap()).unwrap();
    assert_eq!(tape.len(), 6);
    for _ in 0..2 {
        let err = tape.backward(&bad).unwrap_err();
        assert!(is_flaky_error(&err), "{err}");
        assert_eq!(tape.len(), 6, "nothing consumed");
    }
    let gy = tape.backward(&good).unwrap();
    assert_eq!(gy.get(&y).unwrap().to_vec_f64().unwrap(), [4.0, -1.0, 3.0]); // 2y
    assert_eq!(tape.len(), 4, "the failed loss's nodes stay");
    flaky.fail.store(false, std::sync::atomic::Ordering::Relaxed);
    let gx = tape.backward(&bad).unwrap();
    assert_eq!(gx.get(&x).unwrap().to_vec_f64().unwrap(), X.map(|x| 6.0 * x)); // 3 · 2x
    assert!(tape.is_empty());
    assert!(matches!(tape.backward(&bad), Err(Error::GraphConsumed)));
    assert_eq!(x.value().to_vec_f64().unwrap(), X);
}

/// A saved tensor written in place makes backward fail, every time, without consuming the graph:
/// another loss on the tape still gets its gradients.
#[test]
fn saved_tensor_modified_keeps_the_graph() {
    let tape = Tape::new();
    let (x, w, y) = (tape.var(t(&X)), tape.var(t(&[1.0, 2.0, 3.0])), tape.var(t(&[0.5, 0.25, -1.0])));
    let stale = ops::sum(&ops::mul(&x, &w).unwrap()).unwrap();
    let other = ops::sum(&ops::scale(&y, 3.0).unwrap()).unwrap();
    w.value().fill_(2.0).unwrap(); // after mul saved it
    for _ in 0..2 {
        let err = tape.backward(&stale).unwrap_err();
        assert!(matches!(err, Error::SavedTensorModified { op: "mul", .. }), "{err}");
        assert_eq!(tape.len(), 4);
    }
    let grads = tape.backward(&other).unwrap();
    assert_eq!(grads.get(&y).unwrap().to_vec_f64().unwrap(), [3.0; 3]);
    assert_eq!(tape.len(), 2, "the stale loss's nodes stay");
}

#[test]
fn seed_of_another_dtype_for_backward_with() {
    let tape = Tape::new();
    let x = tape.var(t(&X));
    let y = ops::mul(&x, &x).unwrap();
    let seed = Tensor::from_f64(&[1.0; 3], 3, DType::F64, Device::Cpu).unwrap();
    let err = tape.backward_with(&y, seed).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Host(opsmith_host::Error::DTypeMismatch { op: "backward", lhs: DType::F32, rhs: DType::F64 })
        ),
        "{err}"
    );
    // Nothing was consumed: the right seed still works.
    let grads = tape.backward_with(&y, t(&[1.0; 3])).unwrap();
    assert_eq!(grads.get(&x).unwrap().to_vec_f64().unwrap(), [1.0, -3.0, 4.0]);
}

/// A custom op whose backward returns an f64 gradient for an f32 input.
struct WrongDType;

impl CustomOp for WrongDType {
    fn name(&self) -> &'static str {
        "wrong_dtype"
    }
    fn num_inputs(&self) -> usize {
        1
    }
    fn cpu_forward(&self, i: &[&Tensor]) -> Result<Tensor> {
        Ok(opsmith_host::ops::mul(i[0], i[0])?)
    }
    fn cpu_backward(&self, i: &[&Tensor], _: &Tensor, _: &Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(i[0].to_dtype(DType::F64)?)])
    }
}

#[test]
fn custom_backward_gradient_of_another_dtype() {
    let tape = Tape::new();
    let x = tape.var(t(&X));
    let op: Arc<dyn CustomOp> = Arc::new(WrongDType);
    let y = custom(&op, &[&x]).unwrap();
    assert_eq!(y.value().to_vec_f64().unwrap(), [0.25, 2.25, 4.0]);
    let err = tape.backward(&ops::sum(&y).unwrap()).unwrap_err();
    match &err {
        Error::GradientKind { op: "wrong_dtype", input: 0, expected, actual } => {
            assert_eq!((expected.as_str(), actual.as_str()), ("f32 on cpu", "f64 on cpu"), "{err}");
        }
        _ => panic!("expected GradientKind, got {err}"),
    }
    assert_eq!(x.value().to_vec_f64().unwrap(), X);
}

/// Options that cannot check anything (a NaN tolerance passes every element, a step of 0 makes
/// every reference 0 / 0) are refused before any work.
#[test]
fn gradcheck_rejects_options_out_of_range() {
    use opsmith_autograd::{GradcheckOptions, gradcheck};
    let x = Tensor::from_f64(&X, 3, DType::F64, Device::Cpu).unwrap();
    let good = GradcheckOptions::for_dtype(DType::F64);
    let square = |v: &[Var]| ops::mul(&v[0], &v[0]);
    assert_eq!(gradcheck(square, std::slice::from_ref(&x), &good).unwrap().checked, 3);
    for (name, options) in [
        ("eps", GradcheckOptions { eps: 0.0, ..good }),
        ("eps", GradcheckOptions { eps: f64::NAN, ..good }),
        ("atol", GradcheckOptions { atol: f64::NAN, ..good }),
        ("atol", GradcheckOptions { atol: f64::INFINITY, ..good }),
        ("rtol", GradcheckOptions { rtol: -1e-3, ..good }),
    ] {
        let err = gradcheck(square, std::slice::from_ref(&x), &options).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidConfig { what: "gradcheck", reason } if reason.contains(name)),
            "{name}: {err}"
        );
    }
}
