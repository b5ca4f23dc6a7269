//! The model building blocks and optimizers, on the CPU: Adam and SGD against a plain f64
//! implementation, safetensors round trips and bad files, and a training run that learns.
use opsmith_autograd::nn::{Activation, Linear, Mlp};
use opsmith_autograd::optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use opsmith_autograd::{Error, Result, Tape, Var, ops};
use opsmith_host::{DType, Device, Labels, Tensor};

fn t(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_f64(v, shape.to_vec(), DType::F64, Device::Cpu).unwrap()
}

/// Adam on `loss = Σ c·w²` for five steps, against the textbook update written out in f64.
#[test]
fn adam_matches_the_textbook_update() -> Result<()> {
    let c = [0.5, -1.5, 2.0];
    let w0 = [1.0, 2.0, -3.0];
    for weight_decay in [0.0, 0.1] {
        let config = AdamConfig { lr: 0.05, beta1: 0.8, beta2: 0.95, eps: 1e-6, weight_decay };
        let tape = Tape::new();
        let w = tape.var(t(&w0, &[3]));
        let cv = Var::constant(t(&c, &[3]));
        let mut adam = Adam::new(vec![w.clone()], config)?;
        let (mut p, mut m, mut v) = (w0.to_vec(), [0.0; 3], [0.0; 3]);
        for step in 1..=5 {
            let grads = tape.backward(&ops::sum(&ops::mul(&ops::mul(&w, &w)?, &cv)?)?)?;
            adam.step(&grads)?;
            for i in 0..3 {
                let g = 2.0 * c[i] * p[i];
                p[i] -= config.lr * weight_decay * p[i];
                m[i] = config.beta1 * m[i] + (1.0 - config.beta1) * g;
                v[i] = config.beta2 * v[i] + (1.0 - config.beta2) * g * g;
                let m_hat = m[i] / (1.0 - config.beta1.powi(step));
                let v_hat = v[i] / (1.0 - config.beta2.powi(step));
                p[i] -= config.lr * m_hat / (v_hat.sqrt() + config.eps);
            }
        }
        let got = w.value().to_vec::<f64>()?;
        for (g, e) in got.iter().zip(&p) {
            assert!((g - e).abs() < 1e-12, "weight decay {weight_decay}: {got:?} vs {p:?}");
        }
        assert_eq!(adam.steps(), 5);
    }
    Ok(())
}

/// SGD with momentum against the update written out; a parameter without a gradient is untouched.
#[test]
fn sgd_with_momentum_matches_and_skips_unused_parameters() -> Result<()> {
    let tape = Tape::new();
    let w = tape.var(t(&[1.0, -2.0], &[2]));
    let unused = tape.var(t(&[7.0], &[1]));
    let config = SgdConfig { lr: 0.1, momentum: 0.9, weight_decay: 0.01 };
    let mut sgd = Sgd::new(vec![w.clone(), unused.clone()], config)?;
    let (mut p, mut buf) = ([1.0f64, -2.0], [0.0f64; 2]);
    for _ in 0..4 {
        let grads = tape.backward(&ops::sum(&ops::mul(&w, &w)?)?)?;
        sgd.step(&grads)?;
        for i in 0..2 {
            let g = 2.0 * p[i] + config.weight_decay * p[i];
            buf[i] = config.momentum * buf[i] + g;
            p[i] -= config.lr * buf[i];
        }
    }
    let got = w.value().to_vec::<f64>()?;
    assert!(got.iter().zip(&p).all(|(g, e)| (g - e).abs() < 1e-12), "{got:?} vs {p:?}");
    assert_eq!(unused.value().to_vec::<f64>()?, [7.0]);
    Ok(())
}

#[test]
fn optimizers_reject_bad_hyperparameters() {
    let w = Tape::new().var(t(&[1.0], &[1]));
    for config in [
        AdamConfig { lr: f64::NAN, ..AdamConfig::default() },
        AdamConfig { beta1: 1.0, ..AdamConfig::default() },
        AdamConfig { eps: 0.0, ..AdamConfig::default() },
    ] {
        assert!(matches!(Adam::new(vec![w.clone()], config), Err(Error::InvalidConfig { what: "Adam", .. })));
    }
    let bad = SgdConfig { momentum: -0.5, ..SgdConfig::default() };
    assert!(matches!(Sgd::new(vec![w], bad), Err(Error::InvalidConfig { what: "Sgd", .. })));
}

/// Stepping the optimizer between a forward and its backward changes saved weights: the
/// backward reports it rather than using the new values.
#[test]
fn an_update_before_backward_is_caught() -> Result<()> {
    let tape = Tape::new();
    let mlp = Mlp::new(&tape, &[3, 4, 2], Activation::Relu, DType::F32, Device::Cpu, 5)?;
    let x = Var::constant(Tensor::from_vec(vec![0.5f32, -1.0, 2.0], [1, 3], Device::Cpu)?);
    let loss = ops::sum(&mlp.forward(&x)?)?;
    // Scale a saved weight in place, as an optimizer step would.
    let w = &mlp.parameters()[2];
    w.value().copy_from_(&opsmith_host::ops::scale(w.value(), 0.5)?)?;
    assert!(matches!(tape.backward(&loss), Err(Error::SavedTensorModified { .. })));
    Ok(())
}

#[test]
fn mlp_round_trips_through_safetensors_in_every_dtype() -> Result<()> {
    for dtype in [DType::F64, DType::F32, DType::F16, DType::BF16] {
        let mlp = Mlp::new(&Tape::new(), &[3, 5, 4, 2], Activation::Gelu, dtype, Device::Cpu, 11)?;
        let back = Mlp::from_safetensors(&mlp.to_safetensors()?, Device::Cpu, None)?;
        assert_eq!(back.sizes(), [3, 5, 4, 2]);
        assert_eq!(back.activation(), Activation::Gelu);
        for (a, b) in mlp.parameters().iter().zip(back.parameters()) {
            assert_eq!(a.value().dtype(), b.value().dtype());
            assert_eq!(a.value().to_vec_f64()?, b.value().to_vec_f64()?);
            assert!(!b.requires_grad(), "loaded without a tape: constants");
        }
    }
    Ok(())
}

#[test]
fn bad_model_files_are_errors() -> Result<()> {
    assert!(matches!(
        Mlp::from_safetensors(b"not a safetensors file", Device::Cpu, None),
        Err(Error::ModelFile { .. })
    ));
    let missing = Mlp::load_safetensors("/nonexistent/dir/mlp.safetensors", Device::Cpu, None);
    match missing {
        Err(Error::ModelFile { path, .. }) => assert!(path.contains("nonexistent")),
        other => panic!("expected ModelFile, got {:?}", other.map(|m| m.sizes())),
    }
    // A safetensors file that is not an MLP.
    let data = [1.0f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &data).unwrap();
    let foreign = safetensors::serialize(vec![("x", view)], None).unwrap();
    assert!(matches!(Mlp::from_safetensors(&foreign, Device::Cpu, None), Err(Error::ModelFile { .. })));
    // Layers whose widths don't chain.
    let a = Linear::from_tensors(t(&[1.0; 6], &[2, 3]), t(&[0.0; 3], &[3]), None)?;
    let b = Linear::from_tensors(t(&[1.0; 8], &[4, 2]), t(&[0.0; 2], &[2]), None)?;
    assert!(matches!(Mlp::from_layers(vec![a, b], Activation::Relu), Err(Error::InvalidConfig { .. })));
    // A bias that doesn't match the weight.
    assert!(Linear::from_tensors(t(&[1.0; 6], &[2, 3]), t(&[0.0; 2], &[2]), None).is_err());
    Ok(())
}

/// A tiny classification problem: the loss falls by 10× and every point ends up right.
#[test]
fn an_mlp_learns_xor() -> Result<()> {
    let tape = Tape::new();
    let mlp = Mlp::new(&tape, &[2, 16, 2], Activation::Silu, DType::F32, Device::Cpu, 3)?;
    let x = Var::constant(Tensor::from_vec(vec![0.0f32, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0], [4, 2], Device::Cpu)?);
    let labels = Labels::new(&[0, 1, 1, 0], Device::Cpu)?;
    let mut adam = Adam::new(mlp.parameters(), AdamConfig { lr: 0.05, ..AdamConfig::default() })?;
    let mut losses = Vec::new();
    for _ in 0..300 {
        let loss = ops::cross_entropy(&mlp.forward(&x)?, &labels)?;
        losses.push(loss.value().to_vec_f64()?[0]);
        let grads = tape.backward(&loss)?;
        adam.step(&grads)?;
    }
    assert!(losses[299] < losses[0] / 10.0, "loss {} -> {}", losses[0], losses[299]);
    let logits = mlp.forward(&x)?.value().to_vec::<f32>()?;
    let predicted: Vec<u32> = logits.chunks(2).map(|r| u32::from(r[1] > r[0])).collect();
    assert_eq!(predicted, [0, 1, 1, 0]);
    Ok(())
}
