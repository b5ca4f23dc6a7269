//! Every variable's gradient from `Tape::backward` is a tensor of its own: writing one in place
//! (as an optimizer or an all-reduce does) changes no other variable's gradient, nor the seed
//! given to `backward_with`. Covers each op that hands one tensor to several inputs (`add`,
//! `add_mul`'s `x` and `y`) or passes its gradient on unchanged (`sub`'s `a`, `add_row`'s `x`,
//! `fused_mul_add`'s `c`), and checks that nothing is copied where nothing is shared.
use opsmith_autograd::{CustomOp, Gradients, Result, Tape, Var, custom, ops};
use opsmith_host::{DType, Device, Tensor, ops as host};
use parking_lot::Mutex;
use std::sync::Arc;

fn t(values: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_f64(values, shape.to_vec(), DType::F32, Device::Cpu).unwrap()
}

fn zip(a: &[f64], b: &[f64], f: impl Fn(f64, f64) -> f64) -> Vec<f64> {
    a.iter().zip(b).map(|(&a, &b)| f(a, b)).collect()
}

fn assert_values(what: &str, tensor: &Tensor, expected: &[f64]) {
    let got = tensor.to_vec_f64().unwrap();
    assert_eq!(got.len(), expected.len(), "{what}");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!((g - e).abs() <= 1e-6 * e.abs().max(1.0), "{what}[{i}]: {g}, expected {e}");
    }
}

/// Checks each variable's gradient against its expected values, that no two of them (nor a
/// gradient and a tensor of `outside`, such as the seed) share memory, and then, writing each in
/// place in turn, that every other keeps its values.
fn assert_isolated(grads: &Gradients, expected: &[(&str, &Var, Vec<f64>)], outside: &[(&str, &Tensor, Vec<f64>)]) {
    assert_eq!(grads.len(), expected.len(), "one gradient per variable");
    let got: Vec<&Tensor> =
        expected.iter().map(|(name, v, _)| grads.get(v).unwrap_or_else(|| panic!("{name}"))).collect();
    for ((name, _, values), g) in expected.iter().zip(&got) {
        assert_values(&format!("gradient of {name}"), g, values);
    }
    for (i, (a, ga)) in expected.iter().zip(&got).enumerate() {
        for (b, gb) in expected[i + 1..].iter().zip(&got[i + 1..]) {
            assert!(!ga.shares_storage(gb), "the gradients of {} and {} share memory", a.0, b.0);
        }
        for (name, o, _) in outside {
            assert!(!ga.shares_storage(o), "the gradient of {} shares memory with {name}", a.0);
        }
    }
    for (name, o, values) in outside {
        assert_values(name, o, values);
        o.fill_(-77.0).unwrap();
        for ((var, _, values), g) in expected.iter().zip(&got) {
            assert_values(&format!("gradient of {var} after writing {name}"), g, values);
        }
    }
    for (k, (name, _, values)) in expected.iter().enumerate() {
        // Both kinds of in-place write: a fill, and a kernel writing into its own input.
        if k % 2 == 0 {
            got[k].fill_(1000.0 + k as f64).unwrap();
            assert_values(&format!("gradient of {name} after fill_"), got[k], &vec![1000.0 + k as f64; values.len()]);
        } else {
            host::add_into(got[k], got[k], got[k]).unwrap();
            let doubled: Vec<f64> = values.iter().map(|v| 2.0 * v).collect();
            assert_values(&format!("gradient of {name} after add_into"), got[k], &doubled);
        }
        for ((other, _, values), g) in expected[k + 1..].iter().zip(&got[k + 1..]) {
            assert_values(&format!("gradient of {other} after writing that of {name}"), g, values);
        }
    }
}

const X: [f64; 4] = [1.5, -2.0, 0.25, 3.0];
const Y: [f64; 4] = [-0.5, 4.0, 1.25, -1.0];
const Z: [f64; 4] = [2.5, 0.75, -3.0, 0.5];
const W: [f64; 4] = [0.5, -1.5, 2.0, 1.25];
const SEED: [f64; 4] = [1.0, -2.0, 0.5, 4.0];

fn vars(tape: &Tape, values: &[&[f64]]) -> Vec<Var> {
    values.iter().map(|v| tape.var(t(v, &[v.len()]))).collect()
}

/// `sum((x + y) * w)`: `mul` hands `add` a gradient tensor, which `add` gives to both `x` and
/// `y`; and `add` straight from a seed gives it to both.
#[test]
fn add() -> Result<()> {
    let tape = Tape::new();
    let v = vars(&tape, &[&X, &Y, &W]);
    let grads = tape.backward(&ops::sum(&ops::mul(&ops::add(&v[0], &v[1])?, &v[2])?)?)?;
    let x_plus_y = zip(&X, &Y, |a, b| a + b);
    assert_isolated(&grads, &[("x", &v[0], W.to_vec()), ("y", &v[1], W.to_vec()), ("w", &v[2], x_plus_y)], &[]);

    let tape = Tape::new();
    let v = vars(&tape, &[&X, &Y]);
    let seed = t(&SEED, &[4]);
    let grads = tape.backward_with(&ops::add(&v[0], &v[1])?, seed.clone())?;
    assert_isolated(
        &grads,
        &[("x", &v[0], SEED.to_vec()), ("y", &v[1], SEED.to_vec())],
        &[("the seed", &seed, SEED.to_vec())],
    );
    Ok(())
}

/// `sum((z + (x − y)) * w)`: `sub` passes on as `x`'s gradient the tensor `add` also gave `z`;
/// and `sub` from a seed passes the seed itself on.
#[test]
fn sub() -> Result<()> {
    let tape = Tape::new();
    let v = vars(&tape, &[&X, &Y, &Z, &W]);
    let (x, y, z, w) = (&v[0], &v[1], &v[2], &v[3]);
    let grads = tape.backward(&ops::sum(&ops::mul(&ops::add(z, &ops::sub(x, y)?)?, w)?)?)?;
    let minus_w: Vec<f64> = W.iter().map(|w| -w).collect();
    let zxy: Vec<f64> = (0..4).map(|i| Z[i] + X[i] - Y[i]).collect();
    assert_isolated(&grads, &[("x", x, W.to_vec()), ("y", y, minus_w), ("z", z, W.to_vec()), ("w", w, zxy)], &[]);

    let tape = Tape::new();
    let v = vars(&tape, &[&X, &Y]);
    let seed = t(&SEED, &[4]);
    let grads = tape.backward_with(&ops::sub(&v[0], &v[1])?, seed.clone())?;
    let minus_seed: Vec<f64> = SEED.iter().map(|s| -s).collect();
    assert_isolated(
        &grads,
        &[("x", &v[0], SEED.to_vec()), ("y", &v[1], minus_seed)],
        &[("the seed", &seed, SEED.to_vec())],
    );
    Ok(())
}

/// `sum((add_row(x, b) + z) * w)`: `add_row` passes on as `x`'s gradient the tensor `add` also
/// gave `z`; and from a seed, the seed itself.
#[test]
fn add_row() -> Result<()> {
    const M: [f64; 6] = [1.0, -2.5, 0.5, 3.0, -1.25, 2.0];
    const N: [f64; 6] = [0.75, 1.5, -2.0, 0.25, 4.0, -0.5];
    const WM: [f64; 6] = [2.0, -0.5, 1.25, 3.0, -1.0, 0.5];
    const B: [f64; 2] = [0.5, -4.0];
    let col_sums = |m: &[f64]| vec![m[0] + m[2] + m[4], m[1] + m[3] + m[5]];
    let tape = Tape::new();
    let (x, z, w) = (tape.var(t(&M, &[3, 2])), tape.var(t(&N, &[3, 2])), tape.var(t(&WM, &[3, 2])));
    let b = tape.var(t(&B, &[2]));
    let grads = tape.backward(&ops::sum(&ops::mul(&ops::add(&ops::add_row(&x, &b)?, &z)?, &w)?)?)?;
    let sum: Vec<f64> = (0..6).map(|i| M[i] + B[i % 2] + N[i]).collect();
    assert_isolated(
        &grads,
        &[("x", &x, WM.to_vec()), ("b", &b, col_sums(&WM)), ("z", &z, WM.to_vec()), ("w", &w, sum)],
        &[],
    );

    let tape = Tape::new();
    let (x, b) = (tape.var(t(&M, &[3, 2])), tape.var(t(&B, &[2])));
    let seed = t(&N, &[3, 2]);
    let grads = tape.backward_with(&ops::add_row(&x, &b)?, seed.clone())?;
    assert_isolated(&grads, &[("x", &x, N.to_vec()), ("b", &b, col_sums(&N))], &[("the seed", &seed, N.to_vec())]);
    Ok(())
}

/// `sum((fused_mul_add(a, b, c) + z) * w)`: `fused_mul_add` passes on as `c`'s gradient the
/// tensor `add` also gave `z`; and from a seed, the seed itself.
#[test]
fn fused_mul_add() -> Result<()> {
    let tape = Tape::new();
    let v = vars(&tape, &[&X, &Y, &Z, &SEED, &W]);
    let (a, b, c, z, w) = (&v[0], &v[1], &v[2], &v[3], &v[4]);
    let grads = tape.backward(&ops::sum(&ops::mul(&ops::add(&ops::fused_mul_add(a, b, c)?, z)?, w)?)?)?;
    let sum: Vec<f64> = (0..4).map(|i| X[i] * Y[i] + Z[i] + SEED[i]).collect();
    assert_isolated(
        &grads,
        &[
            ("a", a, zip(&W, &Y, |w, b| w * b)),
            ("b", b, zip(&W, &X, |w, a| w * a)),
            ("c", c, W.to_vec()),
            ("z", z, W.to_vec()),
            ("w", w, sum),
        ],
        &[],
    );

    let tape = Tape::new();
    let v = vars(&tape, &[&X, &Y, &Z]);
    let seed = t(&SEED, &[4]);
    let grads = tape.backward_with(&ops::fused_mul_add(&v[0], &v[1], &v[2])?, seed.clone())?;
    assert_isolated(
        &grads,
        &[
            ("a", &v[0], zip(&SEED, &Y, |g, b| g * b)),
            ("b", &v[1], zip(&SEED, &X, |g, a| g * a)),
            ("c", &v[2], SEED.to_vec()),
        ],
        &[("the seed", &seed, SEED.to_vec())],
    );
    Ok(())
}

/// `add_mul`'s backward writes `g * w` once for both `x` and `y`: through the uniform path
/// (under `sum` or `mean`), the tensor path, and with `w` a constant (no fused kernel).
#[test]
fn add_mul() -> Result<()> {
    let x_plus_y = zip(&X, &Y, |a, b| a + b);
    // Under sum: a uniform gradient of 1.
    let tape = Tape::new();
    let v = vars(&tape, &[&X, &Y, &W]);
    let grads = tape.backward(&ops::sum(&ops::add_mul(&v[0], &v[1], &v[2])?)?)?;
    assert_isolated(&grads, &[("x", &v[0], W.to_vec()), ("y", &v[1], W.to_vec()), ("w", &v[2], x_plus_y.clone())], &[]);
    // Under mean: a uniform gradient of 1/4.
    let tape = Tape::new();
    let v = vars(&tape, &[&X, &Y, &W]);
    let grads = tape.backward(&ops::mean(&ops::add_mul(&v[0], &v[1], &v[2])?)?)?;
    let quarter = |v: &[f64]| v.iter().map(|v| v / 4.0).collect::<Vec<_>>();
    assert_isolated(
        &grads,
        &[("x", &v[0], quarter(&W)), ("y", &v[1], quarter(&W)), ("w", &v[2], quarter(&x_plus_y))],
        &[],
    );
    // A tensor gradient.
    let tape = Tape::new();
    let v = vars(&tape, &[&X, &Y, &W]);
    let seed = t(&SEED, &[4]);
    let grads = tape.backward_with(&ops::add_mul(&v[0], &v[1], &v[2])?, seed.clone())?;
    let gw = zip(&SEED, &W, |g, w| g * w);
    assert_isolated(
        &grads,
        &[("x", &v[0], gw.clone()), ("y", &v[1], gw.clone()), ("w", &v[2], zip(&SEED, &x_plus_y, |g, s| g * s))],
        &[("the seed", &seed, SEED.to_vec())],
    );
    // A constant w, uniform and tensor gradients.
    for uniform in [true, false] {
        let tape = Tape::new();
        let v = vars(&tape, &[&X, &Y]);
        let w = Var::constant(t(&W, &[4]));
        let z = ops::add_mul(&v[0], &v[1], &w)?;
        let grads = if uniform { tape.backward(&ops::sum(&z)?)? } else { tape.backward_with(&z, t(&SEED, &[4]))? };
        let expected = if uniform { W.to_vec() } else { gw.clone() };
        assert_isolated(&grads, &[("x", &v[0], expected.clone()), ("y", &v[1], expected)], &[]);
    }
    Ok(())
}

/// A variable used twice gets a sum of its own, next to a variable that shares `add`'s
/// gradient: `sum((x + y) * w) + sum(x * x)`.
#[test]
fn accumulated_next_to_shared() -> Result<()> {
    let tape = Tape::new();
    let v = vars(&tape, &[&X, &Y, &W]);
    let (x, y, w) = (&v[0], &v[1], &v[2]);
    let loss = ops::add(&ops::sum(&ops::mul(&ops::add(x, y)?, w)?)?, &ops::sum(&ops::mul(x, x)?)?)?;
    let grads = tape.backward(&loss)?;
    let gx = zip(&W, &X, |w, x| w + 2.0 * x);
    assert_isolated(&grads, &[("x", x, gx), ("y", y, W.to_vec()), ("w", w, zip(&X, &Y, |a, b| a + b))], &[]);
    Ok(())
}

/// The backward of a leaf itself: its gradient is the seed's value, not the caller's tensor.
#[test]
fn backward_of_a_leaf() -> Result<()> {
    let tape = Tape::new();
    let x = tape.var(t(&X, &[4]));
    let seed = t(&SEED, &[4]);
    let grads = tape.backward_with(&x, seed.clone())?;
    assert_isolated(&grads, &[("x", &x, SEED.to_vec())], &[("the seed", &seed, SEED.to_vec())]);
    Ok(())
}

/// The identity, keeping the gradient tensors its backward was given: with it a test can see
/// whether the gradient a variable got is that tensor or a copy.
struct Tap {
    seen: Mutex<Vec<Tensor>>,
}

impl CustomOp for Tap {
    fn name(&self) -> &'static str {
        "tap"
    }
    fn num_inputs(&self) -> usize {
        1
    }
    fn cpu_forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        Ok(inputs[0].copy()?)
    }
    fn cpu_backward(&self, _: &[&Tensor], _: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        self.seen.lock().push(grad.clone());
        Ok(vec![Some(grad.clone())])
    }
}

/// Copies cost only where a tensor would be two variables' gradients: a gradient passed on to a
/// single variable is not copied, even after `add` shared it with a node that has used it up;
/// one shared by two variables is copied once, not twice.
#[test]
fn copies_only_what_is_shared() -> Result<()> {
    let tap = Arc::new(Tap { seen: Mutex::new(Vec::new()) });
    let op: Arc<dyn CustomOp> = tap.clone();
    let seen = |k: usize| tap.seen.lock()[k].clone();

    // sum(tap(x) * w): x's gradient is the tensor the tap passed on.
    let tape = Tape::new();
    let v = vars(&tape, &[&X, &W]);
    let grads = tape.backward(&ops::sum(&ops::mul(&custom(&op, &[&v[0]])?, &v[1])?)?)?;
    assert_values("gradient of x", grads.get(&v[0]).unwrap(), &W);
    assert!(grads.get(&v[0]).unwrap().shares_storage(&seen(0)), "a gradient nobody shares was copied");

    // sum((tap(x) + 2z) * w): add gives one tensor to the tap and to the scale, whose backward
    // makes a new one for z; the tap's is x's alone.
    let tape = Tape::new();
    let v = vars(&tape, &[&X, &Z, &W]);
    let y = ops::add(&custom(&op, &[&v[0]])?, &ops::scale(&v[1], 2.0)?)?;
    let grads = tape.backward(&ops::sum(&ops::mul(&y, &v[2])?)?)?;
    assert_values("gradient of x", grads.get(&v[0]).unwrap(), &W);
    assert_values("gradient of z", grads.get(&v[1]).unwrap(), &W.map(|w| 2.0 * w));
    assert!(grads.get(&v[0]).unwrap().shares_storage(&seen(1)), "a gradient shared only with a used-up one was copied");

    // sum((tap(x) + tap(y)) * w): both taps pass on add's one tensor; one of x and y gets a copy.
    let tape = Tape::new();
    let v = vars(&tape, &[&X, &Y, &W]);
    let y = ops::add(&custom(&op, &[&v[0]])?, &custom(&op, &[&v[1]])?)?;
    let grads = tape.backward(&ops::sum(&ops::mul(&y, &v[2])?)?)?;
    let (gx, gy) = (grads.get(&v[0]).unwrap(), grads.get(&v[1]).unwrap());
    assert!(seen(2).shares_storage(&seen(3)), "add gave both taps one tensor");
    assert_values("gradient of x", gx, &W);
    assert_values("gradient of y", gy, &W);
    assert!(!gx.shares_storage(gy));
    assert!(gx.shares_storage(&seen(2)) != gy.shares_storage(&seen(2)), "exactly one of the two was copied");
    Ok(())
}
