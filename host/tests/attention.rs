//! The CPU suite of attention (`ops::attention`, `attention_with_lse`, `attention_weights`): the
//! shared cases of `attention_cases` on `Device::Cpu`, every dtype against an f64 reference.
mod attention_cases;

use opsmith_host::Device;

attention_cases!(Device::Cpu);

use opsmith_host::{DType, Tensor, ops};

/// `attention_backward` (the composed path, f64) against central finite differences of
/// `L = Σ out ⊙ dout` through `ops::attention`, for every element of q, k and v, causal or not.
#[test]
fn backward_matches_finite_differences() -> opsmith_host::Result<()> {
    use rand::{Rng, SeedableRng, rngs::StdRng};
    let dims = ([1, 2, 3, 4], [1, 2, 5, 4]);
    let mut rng = StdRng::seed_from_u64(3);
    let mut random =
        |dims: [usize; 4]| -> Vec<f64> { (0..dims.iter().product()).map(|_| rng.random_range(-1.0..1.0)).collect() };
    let (q, k, v, dout) = (random(dims.0), random(dims.1), random(dims.1), random(dims.0));
    let t = |x: &[f64], d: [usize; 4]| Tensor::from_vec(x.to_vec(), d, Device::Cpu);
    for causal in [false, true] {
        let loss = |q: &[f64], k: &[f64], v: &[f64]| -> opsmith_host::Result<f64> {
            let out = ops::attention(&t(q, dims.0)?, &t(k, dims.1)?, &t(v, dims.1)?, 0.7, causal, None)?;
            Ok(out.to_vec::<f64>()?.iter().zip(&dout).map(|(o, g)| o * g).sum())
        };
        let (qt, kt, vt) = (t(&q, dims.0)?, t(&k, dims.1)?, t(&v, dims.1)?);
        let (out, lse) = ops::attention_with_lse(&qt, &kt, &vt, 0.7, causal, None)?;
        let (dq, dk, dv) = ops::attention_backward(&qt, &kt, &vt, &out, &lse, &t(&dout, dims.0)?, 0.7, causal, None)?;
        assert_eq!((dq.dtype(), dk.dims(), dv.dims()), (DType::F64, kt.dims(), vt.dims()));
        let grads = [dq.to_vec::<f64>()?, dk.to_vec::<f64>()?, dv.to_vec::<f64>()?];
        let h = 1e-6;
        for (which, grad) in grads.iter().enumerate() {
            for i in 0..grad.len() {
                let mut inputs = [q.clone(), k.clone(), v.clone()];
                inputs[which][i] += h;
                let up = loss(&inputs[0], &inputs[1], &inputs[2])?;
                inputs[which][i] -= 2.0 * h;
                let down = loss(&inputs[0], &inputs[1], &inputs[2])?;
                let numeric = (up - down) / (2.0 * h);
                assert!(
                    (numeric - grad[i]).abs() <= 1e-7 * (1.0 + numeric.abs()),
                    "causal {causal}: gradient {which} element {i}: {} vs finite difference {numeric}",
                    grad[i]
                );
            }
        }
    }
    Ok(())
}
