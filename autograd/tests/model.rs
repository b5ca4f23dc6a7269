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

/// One run of [`Adam`] on a linear loss `Σ c_t·w` (so the gradient is `c_t`, whatever `w` is,
/// drawn afresh each step), its learning rate quartered after step `LR_CHANGE` with
/// [`Adam::set_lr`], against the textbook AdamW update in f64 with `powf` bias corrections and
/// the learning rate each step had. The reference stores the parameter in `dtype` after each of
/// AdamW's two in-place updates (the decay, then the step), as the run does. Returns the
/// largest error relative to the reference over every step.
fn adam_against_textbook(dtype: DType, steps: u32, config: AdamConfig) -> Result<f64> {
    use rand::{Rng, SeedableRng, rngs::StdRng};
    const LR_CHANGE: u32 = 600;
    let n = 5;
    // Far enough from 0 that no step crosses it (each moves by about lr at most).
    let w0 = [9.5, -10.0, 12.25, 15.0, -11.75];
    let store = |x: f64| if dtype == DType::F32 { f64::from(x as f32) } else { x };
    let mut rng = StdRng::seed_from_u64(1000);
    let tape = Tape::new();
    let w = tape.var(Tensor::from_f64(&w0, [n], dtype, Device::Cpu)?);
    let mut adam = Adam::new(vec![w.clone()], config)?;
    let (mut p, mut m, mut v) = (w0.to_vec(), vec![0.0; n], vec![0.0; n]);
    let mut lr = config.lr;
    let mut worst = 0.0f64;
    for step in 1..=steps {
        if step == LR_CHANGE + 1 {
            lr = config.lr / 4.0;
            adam.set_lr(lr)?;
        }
        // f32 values, so both dtypes see the same gradients; averaging 0.125, so that the
        // moments do not average out.
        let c: Vec<f64> = (0..n).map(|_| f64::from(rng.random_range(-1.0f32..1.25))).collect();
        let cv = Var::constant(Tensor::from_f64(&c, [n], dtype, Device::Cpu)?);
        adam.step(&tape.backward(&ops::sum(&ops::mul(&w, &cv)?)?)?)?;
        let t = f64::from(step);
        for i in 0..n {
            p[i] = store(p[i] - lr * config.weight_decay * p[i]);
            m[i] = config.beta1 * m[i] + (1.0 - config.beta1) * c[i];
            v[i] = config.beta2 * v[i] + (1.0 - config.beta2) * c[i] * c[i];
            let m_hat = m[i] / (1.0 - config.beta1.powf(t));
            let v_hat = v[i] / (1.0 - config.beta2.powf(t));
            p[i] = store(p[i] - lr * m_hat / (v_hat.sqrt() + config.eps));
        }
        let got = w.value().to_vec_f64()?;
        for (g, e) in got.iter().zip(&p) {
            worst = worst.max((g - e).abs() / e.abs());
        }
    }
    assert_eq!((adam.steps(), adam.device_steps()?), (u64::from(steps), u64::from(steps)));
    assert_eq!(adam.config().lr, lr);
    Ok(worst)
}

/// 1000 steps of Adam (its step count, powers of the betas and learning rate kept as device
/// state, the powers as running products) against the textbook update with `powf`, the
/// learning rate changed after step 600: f64 parameters within 1e-12 of it at every step, f32
/// within 1e-6 (a few f32 roundings). A bias correction one step off, or a learning rate not
/// taken up, is off by 1e-4 or more.
#[test]
fn adam_device_state_matches_the_textbook_over_1000_steps_and_an_lr_change() -> Result<()> {
    for weight_decay in [0.0, 0.01, 0.1] {
        let config = AdamConfig { lr: 1e-2, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay };
        let f64_worst = adam_against_textbook(DType::F64, 1000, config)?;
        let f32_worst = adam_against_textbook(DType::F32, 1000, config)?;
        eprintln!("weight decay {weight_decay}: largest relative error f64 {f64_worst:.1e}, f32 {f32_worst:.1e}");
        assert!(f64_worst < 1e-12, "f64, weight decay {weight_decay}: {f64_worst:e}");
        assert!(f32_worst < 1e-6, "f32, weight decay {weight_decay}: {f32_worst:e}");
    }
    Ok(())
}

/// The learning rate set between steps is the one the next step uses: the same run with it
/// left alone drifts from the reference that changed it.
#[test]
fn set_lr_takes_effect_on_the_next_step() -> Result<()> {
    let config = AdamConfig { lr: 1e-2, ..AdamConfig::default() };
    let tape = Tape::new();
    let w = tape.var(Tensor::from_vec(vec![1.0f64, -1.0], [2], Device::Cpu)?);
    let mut adam = Adam::new(vec![w.clone()], config)?;
    let grads = tape.backward(&ops::sum(&w)?)?; // gradient 1 everywhere
    adam.step(&grads)?;
    let after_one = w.value().to_vec::<f64>()?;
    adam.set_lr(0.0)?;
    adam.step(&grads)?;
    assert_eq!(w.value().to_vec::<f64>()?, after_one, "lr 0: no move (no weight decay)");
    adam.set_lr(2e-2)?;
    adam.step(&grads)?;
    // Step 3 with a constant gradient: m_hat = v_hat = 1, so the move is lr / (1 + eps).
    let moved: Vec<f64> = w.value().to_vec::<f64>()?.iter().zip(&after_one).map(|(a, b)| b - a).collect();
    for d in moved {
        assert!((d - 2e-2 / (1.0 + 1e-8)).abs() < 1e-15, "moved by {d:e}");
    }
    assert!(matches!(adam.set_lr(-1.0), Err(Error::InvalidConfig { what: "Adam", .. })));
    assert_eq!(adam.config().lr, 2e-2);
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

/// An eps that is positive in f64 but 0 in the kernels' f32 would make a step divide 0 by 0.
#[test]
fn adam_rejects_an_eps_that_rounds_to_zero() {
    let w = Tape::new().var(t(&[1.0], &[1]));
    let err = Adam::new(vec![w.clone()], AdamConfig { eps: 1e-300, ..AdamConfig::default() }).err();
    assert!(matches!(&err, Some(Error::InvalidConfig { what: "Adam", reason }) if reason.contains("eps")), "{err:?}");
    // The smallest normal f32 is still fine.
    assert!(Adam::new(vec![w], AdamConfig { eps: f32::MIN_POSITIVE as f64, ..AdamConfig::default() }).is_ok());
}

/// A parameter listed twice (or two that share memory) would be stepped twice a step; an integer
/// tensor has no gradient to step with. Both optimizers say so when built.
#[test]
fn optimizers_reject_repeated_and_integer_parameters() {
    let tape = Tape::new();
    let (a, b) = (tape.var(t(&[1.0, 2.0], &[2])), tape.var(t(&[3.0], &[1])));
    let alias = tape.var(a.value().clone());
    let ints = tape.var(Tensor::from_vec(vec![1u32, 2], [2], Device::Cpu).unwrap());
    let reason_of = |r: Result<()>| match r {
        Err(Error::InvalidConfig { reason, .. }) => reason,
        other => panic!("expected InvalidConfig, got {other:?}"),
    };
    for params in [vec![a.clone(), b.clone(), a.clone()], vec![a.clone(), alias.clone()]] {
        let adam = reason_of(Adam::new(params.clone(), AdamConfig::default()).map(drop));
        let sgd = reason_of(Sgd::new(params, SgdConfig::default()).map(drop));
        for reason in [adam, sgd] {
            assert!(reason.contains("list each parameter once"), "{reason}");
        }
    }
    let adam = reason_of(Adam::new(vec![b.clone(), ints.clone()], AdamConfig::default()).map(drop));
    let sgd = reason_of(Sgd::new(vec![b.clone(), ints], SgdConfig::default()).map(drop));
    for reason in [adam, sgd] {
        assert!(reason.contains("parameter 1 is a u32 tensor"), "{reason}");
    }
    // Distinct float parameters are fine, and the parameters are untouched by the failures.
    assert!(Sgd::new(vec![a.clone(), b.clone()], SgdConfig::default()).is_ok());
    assert_eq!(a.value().to_vec::<f64>().unwrap(), [1.0, 2.0]);
}

/// Layers too large to hold, or of an integer dtype, are errors when built, not aborts.
#[test]
fn layers_too_large_or_integer_are_errors() {
    let tape = Tape::new();
    for (inputs, outputs) in [(usize::MAX, 2), (1 << 33, 1 << 31), (1 << 60, 1)] {
        let err = Linear::new(&tape, inputs, outputs, DType::F32, Device::Cpu, 1).map(|l| l.out_features()).err();
        assert!(
            matches!(&err, Some(Error::InvalidConfig { what: "Linear", reason }) if reason.contains("too large")),
            "[{inputs}, {outputs}]: {err:?}"
        );
    }
    let err = Mlp::new(&tape, &[usize::MAX, 2], Activation::Relu, DType::F32, Device::Cpu, 1).map(|m| m.sizes()).err();
    assert!(matches!(err, Some(Error::InvalidConfig { what: "Linear", .. })), "{err:?}");
    let err = Linear::new(&tape, 2, 2, DType::U32, Device::Cpu, 1).map(|l| l.out_features()).err();
    assert!(matches!(&err, Some(Error::InvalidConfig { what: "Linear", reason }) if reason.contains("u32")), "{err:?}");
    let w = Tensor::from_vec(vec![1u32, 0, 0, 1], [2, 2], Device::Cpu).unwrap();
    let b = Tensor::from_vec(vec![0u32, 0], [2], Device::Cpu).unwrap();
    let err = Linear::from_tensors(w, b, None).map(|l| l.out_features()).err();
    assert!(matches!(err, Some(Error::InvalidConfig { what: "Linear", .. })), "{err:?}");
    assert!(tape.is_empty(), "nothing recorded");
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

/// The bytes of `values` as safetensors stores them (little-endian).
fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn f64_bytes(values: &[f64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// One tensor of a hand-built file: name, dtype, shape and little-endian bytes.
type Entry = (String, safetensors::Dtype, Vec<usize>, Vec<u8>);

/// A file with the opsmith MLP metadata and exactly these tensors, so each test can break one thing.
fn mlp_file(tensors: &[Entry]) -> Vec<u8> {
    let views: Vec<_> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            (name.clone(), safetensors::tensor::TensorView::new(*dtype, shape.clone(), data).unwrap())
        })
        .collect();
    let metadata = std::collections::HashMap::from([
        ("format".to_string(), "opsmith-mlp-v1".to_string()),
        ("activation".to_string(), "relu".to_string()),
    ]);
    safetensors::serialize(views, Some(metadata)).unwrap()
}

/// `layers.{i}` of shape `[inputs, outputs]` in f32, weights `0.5, 1.5, ...` and biases `0.25, ...`.
fn f32_layer(i: usize, inputs: usize, outputs: usize) -> Vec<Entry> {
    let w: Vec<f32> = (0..inputs * outputs).map(|k| k as f32 + 0.5).collect();
    let b: Vec<f32> = (0..outputs).map(|k| k as f32 + 0.25).collect();
    vec![
        (format!("layers.{i}.weight"), safetensors::Dtype::F32, vec![inputs, outputs], f32_bytes(&w)),
        (format!("layers.{i}.bias"), safetensors::Dtype::F32, vec![outputs], f32_bytes(&b)),
    ]
}

fn file_of(layers: &[Vec<Entry>]) -> Vec<u8> {
    mlp_file(&layers.concat())
}

/// Loads `bytes` on `device` and returns the tensor and reason of the `InvalidModel` error it must be.
fn invalid(bytes: &[u8], device: Device) -> (String, String) {
    match Mlp::from_safetensors(bytes, device, None) {
        Err(Error::InvalidModel { tensor, reason, .. }) => (tensor, reason),
        Err(other) => panic!("expected InvalidModel, got {other}"),
        Ok(mlp) => panic!("expected InvalidModel, the file loaded with sizes {:?}", mlp.sizes()),
    }
}

/// The hand-built files below differ from this one in a single tensor: it loads, and computes
/// `relu(x·W0 + b0)·W1 + b1` as written out by hand.
#[test]
fn a_hand_built_model_file_loads_and_computes() -> Result<()> {
    let mlp = Mlp::from_safetensors(&file_of(&[f32_layer(0, 2, 2), f32_layer(1, 2, 1)]), Device::Cpu, None)?;
    assert_eq!(mlp.sizes(), [2, 2, 1]);
    // x = [1, -1]: h = [0.5 - 2.5 + 0.25, 1.5 - 3.5 + 1.25] = [-1.75, -0.75] -> relu -> [0, 0]; y = 0.25.
    // x = [2, 1]:  h = [1 + 2.5 + 0.25, 3 + 3.5 + 1.25] = [3.75, 7.75]; y = 3.75·0.5 + 7.75·1.5 + 0.25 = 13.75.
    let x = Var::constant(Tensor::from_vec(vec![1.0f32, -1.0, 2.0, 1.0], [2, 2], Device::Cpu)?);
    assert_eq!(mlp.forward(&x)?.value().to_vec::<f32>()?, [0.25, 13.75]);
    Ok(())
}

#[test]
fn layers_with_different_dtypes_are_an_error_naming_the_tensor() {
    let mut second = f32_layer(1, 2, 1);
    second[0] = ("layers.1.weight".into(), safetensors::Dtype::F64, vec![2, 1], f64_bytes(&[0.5, 1.5]));
    let (tensor, reason) = invalid(&file_of(&[f32_layer(0, 2, 2), second]), Device::Cpu);
    assert_eq!(tensor, "layers.1.weight");
    assert!(reason.contains("f64") && reason.contains("f32"), "{reason}");
    // A bias in another dtype than its own weight, too.
    let mut first = f32_layer(0, 2, 2);
    first[1] = ("layers.0.bias".into(), safetensors::Dtype::F64, vec![2], f64_bytes(&[0.0, 0.0]));
    assert_eq!(invalid(&file_of(&[first]), Device::Cpu).0, "layers.0.bias");
}

#[test]
fn a_layer_of_width_zero_is_an_error_naming_the_tensor() {
    // Zero classes: today this served 200 with empty outputs.
    let (tensor, reason) = invalid(&file_of(&[f32_layer(0, 2, 4), f32_layer(1, 4, 0)]), Device::Cpu);
    assert_eq!(tensor, "layers.1.weight");
    assert!(reason.contains("[4, 0]"), "{reason}");
    // Zero inputs.
    assert_eq!(invalid(&file_of(&[f32_layer(0, 0, 3)]), Device::Cpu).0, "layers.0.weight");
    // A huge dimension times zero is zero bytes, so the file itself is consistent.
    let huge = vec![
        ("layers.0.weight".into(), safetensors::Dtype::F32, vec![(1usize << 63) - 1, 0], vec![]),
        ("layers.0.bias".into(), safetensors::Dtype::F32, vec![0], vec![]),
    ];
    let (tensor, reason) = invalid(&mlp_file(&huge), Device::Cpu);
    assert_eq!(tensor, "layers.0.weight");
    assert!(reason.contains("9223372036854775807"), "{reason}");
}

#[test]
fn non_finite_weights_are_an_error_naming_the_tensor_and_element() {
    let mut layer = f32_layer(0, 2, 2);
    layer[0].3 = f32_bytes(&[0.5, 1.5, f32::NAN, 3.5]);
    let (tensor, reason) = invalid(&file_of(&[layer]), Device::Cpu);
    assert_eq!(tensor, "layers.0.weight");
    assert!(reason.contains("element 2") && reason.contains("NaN"), "{reason}");
    let mut layer = f32_layer(0, 2, 2);
    layer[1].3 = f32_bytes(&[0.25, f32::NEG_INFINITY]);
    let (tensor, reason) = invalid(&file_of(&[layer]), Device::Cpu);
    assert_eq!(tensor, "layers.0.bias");
    assert!(reason.contains("element 1") && reason.contains("inf"), "{reason}");
    // In f16 as well: 0x7c00 is +inf.
    let inf_f16: Vec<u8> = [0x3c00u16, 0x7c00].iter().flat_map(|v| v.to_le_bytes()).collect();
    let f16: Vec<Entry> = vec![
        ("layers.0.weight".into(), safetensors::Dtype::F16, vec![1, 2], inf_f16),
        ("layers.0.bias".into(), safetensors::Dtype::F16, vec![2], vec![0; 4]),
    ];
    let (tensor, reason) = invalid(&mlp_file(&f16), Device::Cpu);
    assert_eq!(tensor, "layers.0.weight");
    assert!(reason.contains("element 1"), "{reason}");
}

#[test]
fn a_gap_in_the_layer_numbers_is_an_error_naming_the_missing_tensor() {
    // layers.0 and layers.2: today layers.2 was silently dropped.
    let (tensor, reason) = invalid(&file_of(&[f32_layer(0, 2, 2), f32_layer(2, 2, 1)]), Device::Cpu);
    assert_eq!(tensor, "layers.1.weight");
    assert!(reason.contains("missing") && reason.contains("layers.2"), "{reason}");
    // A weight without its bias.
    let mut layer = f32_layer(0, 2, 2);
    layer.pop();
    assert_eq!(invalid(&file_of(&[layer]), Device::Cpu).0, "layers.0.bias");
    // A tensor that belongs to no layer is not ignored either (strict, like load_state_dict).
    let mut extra = f32_layer(0, 2, 2);
    extra.push(("layers.0.scale".into(), safetensors::Dtype::F32, vec![2], f32_bytes(&[1.0, 1.0])));
    let (tensor, reason) = invalid(&file_of(&[extra]), Device::Cpu);
    assert_eq!(tensor, "layers.0.scale");
    assert!(reason.contains("unexpected"), "{reason}");
    // Nor is a numbering that only looks right.
    let mut padded = f32_layer(0, 2, 2);
    padded.extend(f32_layer(1, 2, 1).into_iter().map(|(n, d, s, b)| (n.replace("layers.1", "layers.01"), d, s, b)));
    let (tensor, reason) = invalid(&file_of(&[padded]), Device::Cpu);
    assert!(tensor.starts_with("layers.01."), "{tensor}: {reason}");
}

#[test]
fn widths_that_do_not_chain_are_an_error_naming_the_tensor() {
    let (tensor, reason) = invalid(&file_of(&[f32_layer(0, 2, 3), f32_layer(1, 2, 1)]), Device::Cpu);
    assert_eq!(tensor, "layers.1.weight");
    assert!(reason.contains("3"), "{reason}");
    let mut layer = f32_layer(0, 2, 2);
    layer[1] = ("layers.0.bias".into(), safetensors::Dtype::F32, vec![3], f32_bytes(&[0.0; 3]));
    assert_eq!(invalid(&file_of(&[layer]), Device::Cpu).0, "layers.0.bias");
}

/// CUDA has no f64 matmul: an f64 model bound for a GPU is refused when it is loaded (before any
/// device is touched, so this runs without one), not on every request.
#[test]
fn f64_weights_for_a_cuda_device_are_an_error_at_load_time() -> Result<()> {
    let f64_model = Mlp::new(&Tape::new(), &[2, 3], Activation::Relu, DType::F64, Device::Cpu, 1)?.to_safetensors()?;
    let (tensor, reason) = invalid(&f64_model, Device::Cuda(0));
    assert_eq!(tensor, "layers.0.weight");
    assert!(reason.contains("f64") && reason.contains("cuda:0"), "{reason}");
    // The same file is fine on the CPU.
    assert_eq!(Mlp::from_safetensors(&f64_model, Device::Cpu, None)?.sizes(), [2, 3]);
    Ok(())
}

/// Through a file, the error also names the path.
#[test]
fn invalid_model_errors_from_a_file_name_the_path() -> Result<()> {
    let path = std::env::temp_dir().join(format!("opsmith-invalid-model-{}.safetensors", std::process::id()));
    std::fs::write(&path, file_of(&[f32_layer(0, 2, 2), f32_layer(2, 2, 1)])).unwrap();
    let result = Mlp::load_safetensors(&path, Device::Cpu, None);
    std::fs::remove_file(&path).ok();
    match result {
        Err(Error::InvalidModel { path: p, tensor, .. }) => {
            assert!(p.contains("opsmith-invalid-model"), "{p}");
            assert_eq!(tensor, "layers.1.weight");
        }
        other => panic!("expected InvalidModel, got {:?}", other.map(|m| m.sizes())),
    }
    Ok(())
}

/// Layers built in memory are held to the same rules as a file.
#[test]
fn layers_in_memory_must_agree_and_be_non_empty() -> Result<()> {
    let a = Linear::from_tensors(t(&[1.0; 6], &[2, 3]), t(&[0.0; 3], &[3]), None)?;
    let b32 = Linear::from_tensors(
        Tensor::from_vec(vec![1.0f32; 6], [3, 2], Device::Cpu)?,
        Tensor::from_vec(vec![0.0f32; 2], [2], Device::Cpu)?,
        None,
    )?;
    match Mlp::from_layers(vec![a, b32], Activation::Relu) {
        Err(Error::InvalidConfig { what: "Mlp", reason }) => assert!(reason.contains("f32"), "{reason}"),
        other => panic!("expected InvalidConfig, got {:?}", other.map(|m| m.sizes())),
    }
    let empty = Linear::from_tensors(t(&[], &[2, 0]), t(&[], &[0]), None);
    assert!(matches!(empty, Err(Error::InvalidConfig { what: "Linear", .. })), "{:?}", empty.map(|l| l.out_features()));
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
