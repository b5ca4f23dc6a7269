//! `ops::attention` on variables, on the CPU: its value and gradients against an independent
//! composition of the ops it stands for (`matmul`, `softmax`, `matmul` on variables, with the
//! causal mask built here), only the gradients asked for, the saved mask's version check, and
//! errors. (`gradcheck_every_op` checks its gradients against finite differences too.)
mod common;

use opsmith_autograd::{Error, Result, Tape, Var, no_grad, ops};
use opsmith_host::{DType, Device, Tensor};
use rand::{Rng, SeedableRng, rngs::StdRng};

fn random(rng: &mut StdRng, dims: &[usize], dtype: DType) -> Result<Tensor> {
    let n: usize = dims.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.random_range(-2.0..2.0)).collect();
    Ok(Tensor::from_f64(&v, dims.to_vec(), dtype, Device::Cpu)?)
}

/// `softmax(scale · q·kᵀ + mask) · v` from the generic ops: `k` transposed by a copy, the causal
/// mask (key `j > i` removed) written out here and added to `mask`.
fn composed(q: &Var, k: &Var, v: &Var, scale: f64, causal: bool, mask: Option<&[f64]>) -> Result<Var> {
    let (&[b, h, sq, d], &[_, _, sk, dv]) = (q.value().dims(), v.value().dims()) else { panic!("rank 4") };
    let q3 = ops::reshape(q, [b * h, sq, d])?;
    let k_t = ops::reshape(k, [b * h, sk, d])?.transpose(1, 2)?;
    let scores = ops::reshape(&ops::matmul(&q3, &k_t)?, [b, h, sq, sk])?;
    let mut m = vec![0.0; sq * sk];
    for i in 0..sq {
        for j in 0..sk {
            let causal_term = if causal && j > i { f64::NEG_INFINITY } else { 0.0 };
            m[i * sk + j] = causal_term + mask.map_or(0.0, |m| m[i * sk + j]);
        }
    }
    let mask = Var::constant(Tensor::from_f64(&m, [sq, sk], q.value().dtype(), Device::Cpu)?);
    let p = ops::softmax(&scores, scale, Some(&mask))?;
    let out = ops::matmul(&ops::reshape(&p, [b * h, sq, sk])?, &ops::reshape(v, [b * h, sk, dv])?)?;
    ops::reshape(&out, [b, h, sq, dv])
}

/// The value and the gradients of `sum(f(q, k, v) * r)` for a random `r`.
fn value_and_grads(
    inputs: &[Tensor; 3],
    r: &Tensor,
    f: impl Fn(&Var, &Var, &Var) -> Result<Var>,
) -> Result<(Vec<f64>, [Vec<f64>; 3])> {
    let tape = Tape::new();
    let [q, k, v] = inputs.clone().map(|t| tape.var(t));
    let out = f(&q, &k, &v)?;
    let grads = tape.backward(&ops::sum(&ops::mul(&out, &Var::constant(r.clone()))?)?)?;
    let g = |x: &Var| grads.get(x).expect("a gradient").to_vec_f64();
    Ok((out.value().to_vec_f64()?, [g(&q)?, g(&k)?, g(&v)?]))
}

fn assert_close(got: &[f64], want: &[f64], rel: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    assert!(scale > 0.0, "{what}: an all-zero reference proves nothing");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= rel * scale, "{what}[{i}]: attention {g:e}, composed ops {w:e} (scale {scale:e})");
    }
}

/// Value and gradients equal the composition's, in f64 (to rounding) and f32, for seq_q below,
/// equal to and above seq_k, head sizes of v apart from q's, causal or not, with a mask or not.
#[test]
fn gradients_match_the_composed_ops() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(20);
    let shapes = [(2, 3, 17, 33, 8, 12), (1, 2, 33, 33, 16, 16), (2, 1, 40, 9, 5, 3)];
    for (dtype, rel) in [(DType::F64, 1e-12), (DType::F32, 2e-5)] {
        for &(b, h, sq, sk, d, dv) in &shapes {
            for (causal, masked) in [(false, false), (true, false), (false, true), (true, true)] {
                let what = format!("{dtype} [{b}, {h}, {sq}/{sk}, {d}/{dv}] causal {causal} masked {masked}");
                let inputs = [
                    random(&mut rng, &[b, h, sq, d], dtype)?,
                    random(&mut rng, &[b, h, sk, d], dtype)?,
                    random(&mut rng, &[b, h, sk, dv], dtype)?,
                ];
                let r = random(&mut rng, &[b, h, sq, dv], dtype)?;
                // Finite values in [-1, 1), and -inf for one key in seven; never key 0, so no
                // row is fully masked.
                let mask: Vec<f64> = (0..sq * sk)
                    .map(|i| if i % sk != 0 && i % 7 == 3 { f64::NEG_INFINITY } else { rng.random_range(-1.0..1.0) })
                    .map(|x: f64| {
                        Tensor::from_f64(&[x], [1], dtype, Device::Cpu).and_then(|t| t.to_vec_f64()).unwrap()[0]
                    })
                    .collect();
                let mask_t = Tensor::from_f64(&mask, [sq, sk], dtype, Device::Cpu)?;
                let scale = 1.0 / (d as f64).sqrt();
                let m = masked.then_some(&mask_t);
                let (out, grads) = value_and_grads(&inputs, &r, |q, k, v| ops::attention(q, k, v, scale, causal, m))?;
                let mref = masked.then_some(mask.as_slice());
                let (want_out, want) = value_and_grads(&inputs, &r, |q, k, v| composed(q, k, v, scale, causal, mref))?;
                assert_close(&out, &want_out, rel, &format!("{what}: out"));
                for (name, (g, w)) in ["dq", "dk", "dv"].iter().zip(grads.iter().zip(&want)) {
                    assert_close(g, w, rel, &format!("{what}: {name}"));
                }
            }
        }
    }
    Ok(())
}

/// Inputs that require no gradient get none; the others get the same gradients as when all do.
#[test]
fn only_the_gradients_asked_for() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(3);
    let inputs = [
        random(&mut rng, &[1, 2, 5, 4], DType::F64)?,
        random(&mut rng, &[1, 2, 7, 4], DType::F64)?,
        random(&mut rng, &[1, 2, 7, 3], DType::F64)?,
    ];
    let r = random(&mut rng, &[1, 2, 5, 3], DType::F64)?;
    let (_, all) = value_and_grads(&inputs, &r, |q, k, v| ops::attention(q, k, v, 0.5, true, None))?;
    for needs in [[true, false, false], [false, true, false], [false, false, true], [true, false, true]] {
        let tape = Tape::new();
        let vars: Vec<Var> = inputs
            .iter()
            .zip(needs)
            .map(|(t, n)| if n { tape.var(t.clone()) } else { Var::constant(t.clone()) })
            .collect();
        let out = ops::attention(&vars[0], &vars[1], &vars[2], 0.5, true, None)?;
        let grads = tape.backward(&ops::sum(&ops::mul(&out, &Var::constant(r.clone()))?)?)?;
        for (k, (var, need)) in vars.iter().zip(needs).enumerate() {
            match grads.get(var) {
                Some(g) => {
                    assert!(need, "{needs:?}: input {k} got a gradient");
                    assert_eq!(g.to_vec_f64()?, all[k], "{needs:?}: input {k}");
                }
                None => assert!(!need, "{needs:?}: input {k} got none"),
            }
        }
    }
    // Nothing tracked: a constant, and no node.
    let tape = Tape::new();
    let [q, k, v] = inputs.clone().map(|t| tape.var(t));
    let _off = no_grad();
    assert!(!ops::attention(&q, &k, &v, 0.5, false, None)?.requires_grad());
    assert!(tape.is_empty());
    Ok(())
}

/// The node saves the mask: changing it in place before backward is an error naming the op.
#[test]
fn a_modified_mask_is_caught() -> Result<()> {
    let tape = Tape::new();
    let ins = common::inputs(&[&[1, 2, 3, 4], &[1, 2, 5, 4], &[1, 2, 5, 4]], DType::F32, Device::Cpu, 1)?;
    let [q, k, v] = [0, 1, 2].map(|i| tape.var(ins[i].clone()));
    let mask = common::attention_mask(&ins[0])?;
    let loss = ops::sum(&ops::attention(&q, &k, &v, 0.5, false, Some(&mask))?)?;
    mask.fill_(0.0)?;
    match tape.backward(&loss) {
        Err(Error::SavedTensorModified { op: "attention", .. }) => Ok(()),
        other => panic!("expected SavedTensorModified, got {:?}", other.map(|g| g.len())),
    }
}

/// The host's errors come through, naming "attention"; variables from two tapes are refused.
#[test]
fn errors() -> Result<()> {
    let tape = Tape::new();
    let t = |dims: &[usize]| Tensor::zeros(dims.to_vec(), DType::F32, Device::Cpu);
    let (q, k, v) = (tape.var(t(&[1, 2, 3, 4])?), tape.var(t(&[1, 2, 5, 4])?), tape.var(t(&[1, 2, 5, 4])?));
    let bad_v = tape.var(t(&[1, 2, 4, 4])?);
    let e = ops::attention(&q, &k, &bad_v, 1.0, false, None).unwrap_err();
    assert!(matches!(&e, Error::Host(opsmith_host::Error::ShapeMismatch { op: "attention", .. })), "{e}");
    let flat = tape.var(t(&[3, 4])?);
    let e = ops::attention(&flat, &k, &v, 1.0, false, None).unwrap_err();
    assert!(matches!(&e, Error::Host(opsmith_host::Error::InvalidArgument { op: "attention", .. })), "{e}");
    let mask = Tensor::zeros([5, 3], DType::F32, Device::Cpu)?;
    let e = ops::attention(&q, &k, &v, 1.0, true, Some(&mask)).unwrap_err();
    assert!(matches!(&e, Error::Host(opsmith_host::Error::ShapeMismatch { op: "attention", .. })), "{e}");
    let other = Tape::new().var(t(&[1, 2, 5, 4])?);
    assert!(matches!(ops::attention(&q, &other, &v, 1.0, false, None), Err(Error::TapeMismatch { op: "attention" })));
    assert!(tape.is_empty(), "a failed call recorded nothing");
    Ok(())
}
