//! Training steps as CUDA graphs (`--features gpu-tests`; needs a CUDA device): train_mlp's
//! model replayed for 100 steps equals 100 eager steps bit for bit, also across a learning-rate
//! change, and a replayed Adam is still right a thousand steps in.
//!
//! One test at a time, each on a stream of its own: a device holds one capture at a time.
use opsmith_autograd::nn::{Activation, Mlp};
use opsmith_autograd::optim::{Adam, AdamConfig, Optimizer};
use opsmith_autograd::{Result, Tape, Var, ops};
use opsmith_host::cuda::{CudaDevice, Graph};
use opsmith_host::{DType, Device, Labels, Tensor};
use std::sync::Mutex;

const GPU: Device = Device::Cuda(0);
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// train_mlp's setup at a smaller size: a [2, 64, 2] MLP on 256 labelled points, and Adam.
struct Model {
    tape: Tape,
    mlp: Mlp,
    adam: Adam,
    x: Var,
    labels: Labels,
}

impl Model {
    fn new() -> Result<Model> {
        let points = 256;
        // Two classes split by the line x0 = x1: a few steps of training make progress on it.
        let features: Vec<f32> = (0..points * 2).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect();
        let classes: Vec<u32> = features.chunks(2).map(|f| u32::from(f[0] > f[1])).collect();
        let tape = Tape::new();
        let mlp = Mlp::new(&tape, &[2, 64, 2], Activation::Relu, DType::F32, GPU, 7)?;
        let adam = Adam::new(mlp.parameters(), AdamConfig { lr: 0.02, weight_decay: 0.01, ..AdamConfig::default() })?;
        let x = Var::constant(Tensor::from_vec(features, [points, 2], GPU)?);
        Ok(Model { tape, mlp, adam, x, labels: Labels::new(&classes, GPU)? })
    }

    fn step(&mut self) -> Result<Var> {
        let loss = ops::cross_entropy(&self.mlp.forward(&self.x)?, &self.labels)?;
        let grads = self.tape.backward(&loss)?;
        self.adam.step(&grads)?;
        Ok(loss)
    }

    fn parameter_bits(&self) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        for p in self.mlp.parameters() {
            out.extend(p.value().to_vec::<f32>()?.iter().map(|v| v.to_bits()));
        }
        Ok(out)
    }
}

fn loss_bits(loss: &Var) -> Result<u32> {
    Ok(loss.value().to_vec::<f32>()?[0].to_bits())
}

#[test]
fn a_hundred_replayed_steps_equal_a_hundred_eager_steps_bit_for_bit() -> Result<()> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dev = CudaDevice::get(0)?;
    let stream = dev.new_stream()?;
    let _on = stream.make_current();
    let lr_change_at = 60;

    let mut eager = Model::new()?;
    let mut eager_losses = Vec::new();
    for step in 1..=101 {
        if step == lr_change_at {
            eager.adam.set_lr(0.005)?;
        }
        eager_losses.push(loss_bits(&eager.step()?)?);
    }

    // Step 1 eagerly (the warm-up), step 2 captured, then replays.
    let mut graphed = Model::new()?;
    let mut graphed_losses = vec![loss_bits(&graphed.step()?)?];
    let (graph, loss) = Graph::capture(&dev, || graphed.step())?;
    for step in 2..=101 {
        if step == lr_change_at {
            graphed.adam.set_lr(0.005)?; // read from device memory by the next replay
        }
        graph.replay()?;
        graphed_losses.push(loss_bits(&loss)?);
    }
    assert_eq!(graphed_losses, eager_losses);
    assert_eq!(graphed.parameter_bits()?, eager.parameter_bits()?);
    // The loss fell: the replays trained the model.
    let (first, last) = (f32::from_bits(eager_losses[0]), f32::from_bits(eager_losses[100]));
    assert!(last < 0.7 * first, "loss {first} -> {last}");
    Ok(())
}

#[test]
fn a_replayed_adam_step_is_right_a_thousand_steps_in() -> Result<()> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dev = CudaDevice::get(0)?;
    let stream = dev.new_stream()?;
    let _on = stream.make_current();
    // loss = Σ c·w², gradient 2·c·w: Adam's textbook update, written out in f64 with powf.
    let c = [0.5f64, -1.5, 2.0, 0.25];
    let w0 = [1.0f64, -0.5, 0.75, 2.0];
    let config = AdamConfig { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };
    let tape = Tape::new();
    let w = tape.var(Tensor::from_vec(w0.map(|v| v as f32).to_vec(), [4], GPU)?);
    let coefficients = Tensor::from_vec(c.map(|v| v as f32).to_vec(), [4], GPU)?;
    let mut adam = Adam::new(vec![w.clone()], config)?;
    let mut step = || -> Result<()> {
        let loss = ops::sum(&ops::mul(&ops::mul(&w, &w)?, &Var::constant(coefficients.clone()))?)?;
        let grads = tape.backward(&loss)?;
        adam.step(&grads)
    };
    step()?;
    let (graph, ()) = Graph::capture(&dev, &mut step)?;
    for _ in 2..=1000 {
        graph.replay()?;
    }
    assert_eq!(adam.device_steps()?, 1000);

    let (mut p, mut m, mut v) = (w0, [0.0f64; 4], [0.0f64; 4]);
    for t in 1..=1000 {
        for i in 0..4 {
            let g = 2.0 * c[i] * p[i];
            m[i] = config.beta1 * m[i] + (1.0 - config.beta1) * g;
            v[i] = config.beta2 * v[i] + (1.0 - config.beta2) * g * g;
            let m_hat = m[i] / (1.0 - config.beta1.powi(t));
            let v_hat = v[i] / (1.0 - config.beta2.powi(t));
            p[i] -= config.lr * m_hat / (v_hat.sqrt() + config.eps);
        }
    }
    let got = w.value().to_vec::<f32>()?;
    for i in 0..4 {
        // f32 rounding over 1000 steps of size ~1e-3: within 1e-4 of the f64 path.
        assert!((got[i] as f64 - p[i]).abs() < 1e-4, "w[{i}] = {} vs {}", got[i], p[i]);
        assert!((got[i] as f64 - w0[i]).abs() > 0.1, "w[{i}] moved: {} from {}", got[i], w0[i]);
    }
    Ok(())
}
