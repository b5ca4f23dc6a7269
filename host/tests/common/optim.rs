//! Optimizer test bodies, shared by the CPU suite (`optim.rs`) and the GPU suite
//! (`gpu_activation.rs`): several steps of SGD and Adam against plain f64 implementations
//! written here from the definitions.
use super::{SENTINEL, padded_view, random_values, tensor, values};
use opsmith_host::ops::{AdamHyper, AdamState, AdamStep, SgdStep};
use opsmith_host::{DType, Device, Error, Result, Tensor, ops};
use rand::{SeedableRng, rngs::StdRng};

pub const OPTIM_SIZES: [usize; 4] = [0, 1, 7, 1029];
pub const STEPS: u64 = 5;

pub const SGD_CASES: [SgdStep; 4] = [
    SgdStep { lr: 0.1, momentum: 0.0, weight_decay: 0.0 },
    SgdStep { lr: 0.1, momentum: 0.0, weight_decay: 0.1 },
    SgdStep { lr: 0.05, momentum: 0.9, weight_decay: 0.0 },
    SgdStep { lr: 0.05, momentum: 0.9, weight_decay: 0.01 },
];

/// Each is run for [`STEPS`] steps from its `step`.
pub const ADAM_CASES: [AdamStep; 4] = [
    AdamStep { lr: 1e-2, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0, step: 1 },
    AdamStep { lr: 1e-3, beta1: 0.8, beta2: 0.99, eps: 1e-6, weight_decay: 0.1, step: 1 },
    AdamStep { lr: 0.1, beta1: 0.0, beta2: 0.5, eps: 1e-3, weight_decay: 0.05, step: 1 },
    AdamStep { lr: 1e-2, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, step: 1000 },
];

/// The dtypes the optimizers implement on `device`.
pub fn optimizer_supported(dtype: DType, device: Device) -> bool {
    dtype == DType::F32 || (dtype == DType::F64 && !device.is_cuda())
}

/// Roundoff of the arithmetic the optimizers run in for `dtype`.
fn roundoff(dtype: DType) -> f64 {
    if dtype == DType::F64 { f64::EPSILON / 2.0 } else { f64::from(f32::EPSILON) / 2.0 }
}

/// A state tensor: a view at `offset` of a sentinel-padded buffer, holding `v`.
struct State {
    buf: Tensor,
    view: Tensor,
    offset: usize,
}

impl State {
    fn new(v: &[f64], offset: usize, dtype: DType, device: Device) -> Result<State> {
        let (buf, view) = padded_view(v.len(), offset, 0.0, dtype, device)?;
        view.copy_from_(&tensor(v, dtype, device)?)?;
        Ok(State { buf, view, offset })
    }

    /// The view's values, after checking that nothing outside it was written.
    fn read(&self, context: &str) -> Result<Vec<f64>> {
        let all = values(&self.buf)?;
        let n = self.view.elem_count();
        let outside = all[..self.offset].iter().chain(&all[self.offset + n..]);
        assert!(outside.into_iter().all(|&s| s == SENTINEL), "{context}: wrote outside the view");
        Ok(all[self.offset..self.offset + n].to_vec())
    }
}

/// `got` within `tol[i]` of `want`, elementwise.
fn assert_close(context: &str, got: &[f64], want: &[f64], tol: &[f64]) {
    for i in 0..want.len() {
        assert!(
            (got[i] - want[i]).abs() <= tol[i],
            "{context}[{i}]: got {:e}, f64 reference {:e}, tolerance {:e}",
            got[i],
            want[i],
            tol[i]
        );
    }
}

/// [`STEPS`] SGD steps per case, dtype, size and offset against plain f64 SGD. The tolerance
/// grows with the magnitudes each step adds up (64 roundoffs of them), since every step rounds
/// again.
pub fn sgd_against_f64(device: Device) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(71);
    for (k, step) in SGD_CASES.iter().enumerate() {
        for dtype in [DType::F32, DType::F64] {
            for n in OPTIM_SIZES {
                for offset in [0, 1] {
                    let context = format!("sgd case {k} {dtype} on {device}, n={n} offset={offset}");
                    let mut p = random_values(&mut rng, n, dtype);
                    let mut buf = vec![0.0; n];
                    let param = State::new(&p, offset, dtype, device)?;
                    let momentum = State::new(&buf, offset + 2, dtype, device)?;
                    let momentum_buf = (step.momentum > 0.0).then_some(&momentum.view);
                    let (mut p_scale, mut buf_scale) = (vec![0.0; n], vec![0.0; n]);
                    for t in 0..STEPS {
                        let g = random_values(&mut rng, n, dtype);
                        let grad = State::new(&g, (offset + 3) % 4, dtype, device)?;
                        if !optimizer_supported(dtype, device) {
                            let err = ops::sgd_step(&param.view, &grad.view, momentum_buf, step).unwrap_err();
                            assert!(matches!(err, Error::UnsupportedDType { op: "sgd_step", .. }), "{err}");
                            break;
                        }
                        let versions = (param.view.version(), momentum.view.version(), grad.view.version());
                        ops::sgd_step(&param.view, &grad.view, momentum_buf, step)?;
                        assert!(param.view.version() > versions.0, "{context}: param version");
                        assert_eq!(momentum.view.version() > versions.1, step.momentum > 0.0, "{context}: buf version");
                        assert_eq!(grad.view.version(), versions.2, "{context}: grad version");
                        assert_eq!(grad.read(&context)?, g, "{context}: grad changed");
                        for i in 0..n {
                            let d = g[i] + step.weight_decay * p[i];
                            // The terms of d, which may cancel.
                            let d_terms = g[i].abs() + (step.weight_decay * p[i]).abs();
                            let update = if step.momentum > 0.0 {
                                buf[i] = step.momentum * buf[i] + d;
                                buf_scale[i] += buf[i].abs() + d_terms;
                                step.lr * buf[i]
                            } else {
                                step.lr * d
                            };
                            p[i] -= update;
                            p_scale[i] += p[i].abs() + update.abs() + step.lr * d_terms;
                        }
                        let u = roundoff(dtype);
                        let tol = |scale: &[f64]| scale.iter().map(|s| 64.0 * u * s).collect::<Vec<_>>();
                        assert_close(&format!("{context} step {t} param"), &param.read(&context)?, &p, &tol(&p_scale));
                        if step.momentum > 0.0 {
                            let got = momentum.read(&context)?;
                            assert_close(&format!("{context} step {t} buf"), &got, &buf, &tol(&buf_scale));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// Plain f64 Adam for one element at step `t`, from the textbook definition with AdamW's
/// decoupled decay. Returns the update subtracted from p (for the tolerance).
fn adam_reference(p: &mut f64, g: f64, m: &mut f64, v: &mut f64, s: &AdamStep, t: u64) -> f64 {
    *m = s.beta1 * *m + (1.0 - s.beta1) * g;
    *v = s.beta2 * *v + (1.0 - s.beta2) * g * g;
    let m_hat = *m / (1.0 - s.beta1.powi(t as i32));
    let v_hat = *v / (1.0 - s.beta2.powi(t as i32));
    let update = s.lr * s.weight_decay * *p + s.lr * m_hat / (v_hat.sqrt() + s.eps);
    *p -= update;
    update
}

/// Adam's parameter and moments as padded views, with their f64 reference values and the
/// magnitudes each step added up (the tolerance grows with them: 64 roundoffs).
struct AdamRun {
    reference: [Vec<f64>; 3],
    scale: [Vec<f64>; 3],
    tensors: [State; 3],
    dtype: DType,
}

impl AdamRun {
    /// The parameter `p` and zero moments, at offsets that differ from each other's.
    fn new(p: Vec<f64>, offset: usize, dtype: DType, device: Device) -> Result<AdamRun> {
        let zeros = vec![0.0; p.len()];
        let tensors = [
            State::new(&p, offset, dtype, device)?,
            State::new(&zeros, offset + 1, dtype, device)?,
            State::new(&zeros, 3 - offset, dtype, device)?,
        ];
        let n = p.len();
        Ok(AdamRun {
            reference: [p, zeros.clone(), zeros],
            scale: [vec![0.0; n], vec![0.0; n], vec![0.0; n]],
            tensors,
            dtype,
        })
    }

    /// `op(param, grad, m, v)` on the views.
    fn apply(&self, grad: &State, op: impl FnOnce(&Tensor, &Tensor, &Tensor, &Tensor) -> Result<()>) -> Result<()> {
        let [param, m, v] = &self.tensors;
        op(&param.view, &grad.view, &m.view, &v.view)
    }

    /// One step through `op`, then its checks: the state's versions moved and the gradient's
    /// did not, the gradient is unchanged, and parameter and moments match the f64 reference
    /// (advanced here with `step`).
    fn step(
        &mut self,
        context: &str,
        step: &AdamStep,
        g: &[f64],
        grad: &State,
        op: impl FnOnce(&Tensor, &Tensor, &Tensor, &Tensor) -> Result<()>,
    ) -> Result<()> {
        let versions =
            |run: &AdamRun| [&run.tensors[0], &run.tensors[1], &run.tensors[2], grad].map(|s| s.view.version());
        let before = versions(self);
        self.apply(grad, op)?;
        let after = versions(self);
        assert!(after[..3].iter().zip(&before).all(|(a, b)| a > b), "{context}: state versions");
        assert_eq!(after[3], before[3], "{context}: grad version");
        assert_eq!(grad.read(context)?, g, "{context}: grad changed");
        let ([p, m, v], [sp, sm, sv]) = (&mut self.reference, &mut self.scale);
        for i in 0..g.len() {
            let update = adam_reference(&mut p[i], g[i], &mut m[i], &mut v[i], step, step.step);
            sp[i] += p[i].abs() + update.abs();
            sm[i] += m[i].abs() + g[i].abs();
            sv[i] += v[i].abs() + g[i] * g[i];
        }
        let u = roundoff(self.dtype);
        for (k, name) in ["param", "m", "v"].into_iter().enumerate() {
            let tol: Vec<f64> = self.scale[k].iter().map(|s| 64.0 * u * s).collect();
            let got = self.tensors[k].read(context)?;
            assert_close(&format!("{context} {name}"), &got, &self.reference[k], &tol);
        }
        Ok(())
    }
}

/// [`STEPS`] Adam steps per case, dtype, size and offset against plain f64 Adam, with the
/// parameter and both moments compared after every step.
pub fn adam_against_f64(device: Device) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(72);
    for (k, case) in ADAM_CASES.iter().enumerate() {
        for dtype in [DType::F32, DType::F64] {
            for n in OPTIM_SIZES {
                for offset in [0, 1] {
                    let context = format!("adam case {k} {dtype} on {device}, n={n} offset={offset}");
                    let mut run = AdamRun::new(random_values(&mut rng, n, dtype), offset, dtype, device)?;
                    for t in case.step..case.step + STEPS {
                        let step = AdamStep { step: t, ..*case };
                        let g = random_values(&mut rng, n, dtype);
                        let grad = State::new(&g, (offset + 2) % 4, dtype, device)?;
                        if !optimizer_supported(dtype, device) {
                            let err = run.apply(&grad, |p, g, m, v| ops::adam_step(p, g, m, v, &step)).unwrap_err();
                            assert!(matches!(err, Error::UnsupportedDType { op: "adam_step", .. }), "{err}");
                            break;
                        }
                        run.step(&format!("{context} step {t}"), &step, &g, &grad, |p, g, m, v| {
                            ops::adam_step(p, g, m, v, &step)
                        })?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// The hyperparameters of `step` that stay fixed, for [`AdamState::advance`].
pub fn hyper(step: &AdamStep) -> AdamHyper {
    AdamHyper { beta1: step.beta1, beta2: step.beta2, eps: step.eps, weight_decay: step.weight_decay }
}

/// The device-state runs quarter the learning rate from this step of a case on (counted from
/// the case's first step).
pub const LR_CHANGE_AFTER: u64 = 2;

/// `got` within `rel` of `want`, relative to `want`.
fn assert_rel(context: &str, got: f64, want: f64, rel: f64) {
    assert!((got - want).abs() <= rel * want.abs(), "{context}: got {got:e}, f64 reference {want:e}, rel {rel:e}");
}

/// An [`AdamState`] advanced 1003 times (the learning rate quartered after step 500): its step
/// count, learning rate and running powers, and its f32 coefficients against the closed form
/// in f64 (`powi`) rounded to f32: exactly where the formula's operations are exact in f64 (the
/// betas, `1 − β`, ε, `lr·wd`), within an f32 rounding and the running products' drift for the
/// bias corrections.
pub fn adam_state_against_f64(device: Device) -> Result<()> {
    for (k, case) in ADAM_CASES.iter().enumerate() {
        let hyper = hyper(case);
        let state = AdamState::new(case.lr, device)?;
        assert_eq!(state.device(), device);
        assert_eq!((state.step()?, state.lr()?), (0, case.lr), "case {k}");
        assert_eq!(state.coefficients()?, None, "case {k}: no coefficients before the first step");
        let mut lr = case.lr;
        for t in 1..=1003u64 {
            if t == 501 {
                lr = case.lr / 4.0;
                state.set_lr(lr)?;
                assert_eq!((state.step()?, state.lr()?), (500, lr), "case {k}: set_lr changes only lr");
            }
            state.advance(&hyper)?;
            if ![1, 2, 3, 500, 501, 502, 1000, 1003].contains(&t) {
                continue;
            }
            let context = format!("adam state case {k} on {device}, step {t}");
            let progress = state.progress()?;
            assert_eq!((state.step()?, progress.step, progress.lr), (t, t as f64, lr), "{context}");
            let (b1t, b2t) = (case.beta1.powi(t as i32), case.beta2.powi(t as i32));
            assert_rel(&format!("{context} beta1^t"), progress.beta1_power, b1t, 1e-12);
            assert_rel(&format!("{context} beta2^t"), progress.beta2_power, b2t, 1e-12);
            let c = state.coefficients()?.expect("advanced");
            let exact = [case.beta1, 1.0 - case.beta1, case.beta2, 1.0 - case.beta2, case.eps, lr * case.weight_decay];
            let got = [c.beta1, c.one_minus_beta1, c.beta2, c.one_minus_beta2, c.eps, c.lr_weight_decay];
            assert_eq!(got, exact.map(|x| x as f32), "{context}: the fixed coefficients");
            // An f32 rounding (2^-24), and the closed form's own against the products' (1e-12).
            let rel = f64::from(f32::EPSILON) / 2.0 + 1e-12;
            assert_rel(&format!("{context} step_size"), f64::from(c.step_size), lr / (1.0 - b1t), rel);
            assert_rel(
                &format!("{context} inv_sqrt_bias2"),
                f64::from(c.inv_sqrt_bias2),
                1.0 / (1.0 - b2t).sqrt(),
                rel,
            );
        }
    }
    Ok(())
}

/// [`ops::adam_step_device`] for [`STEPS`] steps per case, dtype, size and offset against plain
/// f64 Adam, as [`adam_against_f64`], with the learning rate quartered after
/// [`LR_CHANGE_AFTER`] steps. The state is advanced to the case's first step beforehand, so
/// step 1000 really is the state's thousandth.
pub fn adam_device_against_f64(device: Device) -> Result<()> {
    let op = "adam_step_device";
    let mut rng = StdRng::seed_from_u64(73);
    for (k, case) in ADAM_CASES.iter().enumerate() {
        for dtype in [DType::F32, DType::F64] {
            for n in OPTIM_SIZES {
                for offset in [0, 1] {
                    let context = format!("adam_step_device case {k} {dtype} on {device}, n={n} offset={offset}");
                    let mut run = AdamRun::new(random_values(&mut rng, n, dtype), offset, dtype, device)?;
                    let state = AdamState::new(case.lr, device)?;
                    for _ in 1..case.step {
                        state.advance(&hyper(case))?;
                    }
                    let mut lr = case.lr;
                    for t in case.step..case.step + STEPS {
                        if t == case.step + LR_CHANGE_AFTER {
                            lr = case.lr / 4.0;
                            state.set_lr(lr)?;
                        }
                        state.advance(&hyper(case))?;
                        let g = random_values(&mut rng, n, dtype);
                        let grad = State::new(&g, (offset + 2) % 4, dtype, device)?;
                        if !optimizer_supported(dtype, device) {
                            let err =
                                run.apply(&grad, |p, g, m, v| ops::adam_step_device(p, g, m, v, &state)).unwrap_err();
                            assert!(matches!(err, Error::UnsupportedDType { op: "adam_step_device", .. }), "{err}");
                            break;
                        }
                        let step = AdamStep { lr, step: t, ..*case };
                        run.step(&format!("{context} step {t} ({op})"), &step, &g, &grad, |p, g, m, v| {
                            ops::adam_step_device(p, g, m, v, &state)
                        })?;
                    }
                    if optimizer_supported(dtype, device) {
                        assert_eq!(state.step()?, case.step + STEPS - 1, "{context}: steps counted");
                    }
                }
            }
        }
    }
    Ok(())
}

/// The device state's errors: bad learning rates and hyperparameters, a step before the
/// first `advance`, bad operands; each a typed error naming the call, and nothing changed.
pub fn adam_state_errors(device: Device) -> Result<()> {
    for lr in [f64::NAN, f64::INFINITY, -1e-3] {
        let err = AdamState::new(lr, device).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { op: "AdamState::new", .. }), "lr {lr}: {err}");
    }
    let state = AdamState::new(1e-3, device)?;
    let t = |v: &[f64], dtype: DType| tensor(v, dtype, device);
    let (p, g) = (t(&[1.0, -2.0, 3.0], DType::F32)?, t(&[0.5, 0.5, 0.5], DType::F32)?);
    let (m, v) = (t(&[0.0; 3], DType::F32)?, t(&[0.0; 3], DType::F32)?);
    let err = ops::adam_step_device(&p, &g, &m, &v, &state).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { op: "adam_step_device", .. }), "before advance: {err}");
    let good = AdamHyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };
    for bad in [
        AdamHyper { beta1: 1.0, ..good },
        AdamHyper { beta2: -0.1, ..good },
        AdamHyper { beta2: f64::NAN, ..good },
        AdamHyper { eps: -1e-8, ..good },
        AdamHyper { weight_decay: f64::INFINITY, ..good },
    ] {
        let err = state.advance(&bad).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { op: "AdamState::advance", .. }), "{bad:?}: {err}");
    }
    for lr in [f64::NAN, -1.0] {
        let err = state.set_lr(lr).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { op: "AdamState::set_lr", .. }), "lr {lr}: {err}");
    }
    assert_eq!((state.step()?, state.lr()?, state.coefficients()?), (0, 1e-3, None), "nothing changed");
    state.advance(&good)?;
    let g4 = t(&[0.5; 4], DType::F32)?;
    match ops::adam_step_device(&p, &g4, &m, &v, &state) {
        Err(Error::ShapeMismatch { op: "adam_step_device", lhs, rhs }) => assert_eq!((lhs, rhs), (vec![3], vec![4])),
        other => panic!("expected a shape mismatch, got {other:?}"),
    }
    let h = |v: &[f64]| t(v, DType::F16);
    let (ph, gh, mh, vh) = (h(&[1.0; 3])?, h(&[1.0; 3])?, h(&[0.0; 3])?, h(&[0.0; 3])?);
    assert!(matches!(
        ops::adam_step_device(&ph, &gh, &mh, &vh, &state),
        Err(Error::UnsupportedDType { op: "adam_step_device", dtype: DType::F16, .. })
    ));
    assert!(matches!(
        ops::adam_step_device(&p, &g, &m, &m, &state),
        Err(Error::Overlap { op: "adam_step_device", output: 2 })
    ));
    assert_eq!(values(&p)?, [1.0, -2.0, 3.0]);
    assert_eq!((values(&m)?, values(&v)?), (vec![0.0; 3], vec![0.0; 3]));
    assert_eq!(state.step()?, 1);
    Ok(())
}

/// The offsets of the grouped step's `[param, grad, m, v]` views in their sentinel-padded
/// buffers, per parameter of [`adam_group_matches_single`]: all 16-byte aligned, all odd, or one
/// or two of the four off.
const GROUP_OFFSETS: [[usize; 4]; 9] =
    [[0; 4], [1; 4], [0; 4], [0; 4], [3, 0, 0, 0], [0, 2, 0, 0], [0, 0, 1, 3], [0; 4], [2; 4]];

/// One parameter's `[p, m, v]` in [`adam_group_matches_single`]: views for the grouped step,
/// views for the whole step, tensors for the single step.
type ParameterCopies = ([State; 3], [State; 3], [Tensor; 3]);

/// [`ops::adam_step_device_group`] over 1, 4, 5 and 9 parameters of different sizes (one or
/// more groups of four, some slots unused, an empty parameter among them, sizes not a multiple
/// of 4), each as views at the offsets of [`GROUP_OFFSETS`], gives, step after step, the same
/// bits as [`ops::adam_step_device`] on each parameter (fresh, aligned tensors), which
/// [`adam_device_against_f64`] checks against f64, and writes nothing outside the views; so
/// does [`ops::adam_advance_step_group`] (the advance and the step in one call: on CUDA one
/// launch up to four parameters of 1024 packs, at the edge with 4096 elements, and the two
/// launches past it), whose state ends where the others' do. Then the errors: parameters that
/// share memory, a parameter on another state's device; nothing is written and no state moves.
pub fn adam_group_matches_single(device: Device) -> Result<()> {
    use ops::AdamTensors;
    let op = "adam_step_device_group";
    let mut rng = StdRng::seed_from_u64(74);
    let dtypes: &[DType] = if device.is_cuda() { &[DType::F32] } else { &[DType::F32, DType::F64] };
    let sizes = [1029usize, 7, 0, 64, 1, 300, 5, 33, 2];
    let groups: [&[usize]; 6] = [&sizes[..1], &sizes[..4], &sizes[..5], &sizes, &[4096], &[4093, 6]];
    let case = ADAM_CASES[1];
    for &dtype in dtypes {
        for sizes in groups {
            let count = sizes.len();
            let context = format!("{op} of {count} parameters {sizes:?}, {dtype} on {device}");
            // Each parameter's [p, m, v] three times: views for the grouped step and for the
            // whole step, tensors for the single.
            let make = |values: &[f64]| tensor(values, dtype, device);
            let mut sets: Vec<ParameterCopies> = Vec::new();
            for (&n, [at_p, _, at_m, at_v]) in sizes.iter().zip(GROUP_OFFSETS) {
                let p = random_values(&mut rng, n, dtype);
                let zeros = vec![0.0; n];
                let views = || -> Result<[State; 3]> {
                    Ok([
                        State::new(&p, at_p, dtype, device)?,
                        State::new(&zeros, at_m, dtype, device)?,
                        State::new(&zeros, at_v, dtype, device)?,
                    ])
                };
                sets.push((views()?, views()?, [make(&p)?, make(&zeros)?, make(&zeros)?]));
            }
            let (grouped, whole, single) =
                (AdamState::new(case.lr, device)?, AdamState::new(case.lr, device)?, AdamState::new(case.lr, device)?);
            for t in 1..=STEPS {
                grouped.advance(&hyper(&case))?;
                single.advance(&hyper(&case))?;
                let g: Vec<Vec<f64>> = sizes.iter().map(|&n| random_values(&mut rng, n, dtype)).collect();
                let grads: Vec<State> = g
                    .iter()
                    .zip(GROUP_OFFSETS)
                    .map(|(g, [_, at_g, _, _])| State::new(g, at_g, dtype, device))
                    .collect::<Result<_>>()?;
                let slots = |pick: fn(&ParameterCopies) -> &[State; 3]| -> Vec<AdamTensors<'_>> {
                    sets.iter()
                        .zip(&grads)
                        .map(|(set, grad)| {
                            let [p, m, v] = pick(set);
                            AdamTensors { param: &p.view, grad: &grad.view, m: &m.view, v: &v.view }
                        })
                        .collect()
                };
                ops::adam_step_device_group(&slots(|set| &set.0), &grouped)?;
                ops::adam_advance_step_group(&slots(|set| &set.1), &whole, &hyper(&case))?;
                for ((_, _, [p, m, v]), g) in sets.iter().zip(&g) {
                    ops::adam_step_device(p, &make(g)?, m, v, &single)?;
                }
                for (k, ((a, w, b), (grad, g))) in sets.iter().zip(grads.iter().zip(&g)).enumerate() {
                    let context = format!("{context}: step {t}, parameter {k}");
                    let bits = |v: Vec<f64>| -> Vec<u64> { v.iter().map(|x| x.to_bits()).collect() };
                    for (i, name) in ["param", "m", "v"].into_iter().enumerate() {
                        let want = bits(values(&b[i])?);
                        assert_eq!(bits(a[i].read(&context)?), want, "{context}'s {name}, grouped");
                        assert_eq!(bits(w[i].read(&context)?), want, "{context}'s {name}, whole step");
                    }
                    assert_eq!(&grad.read(&context)?, g, "{context}'s grad changed");
                }
            }
            assert_eq!((grouped.step()?, whole.step()?), (STEPS, STEPS), "{context}");
            let coefficient_bits = |s: &AdamState| -> Result<Option<[u32; 8]>> {
                Ok(s.coefficients()?.map(|c| c.to_array().map(f32::to_bits)))
            };
            assert_eq!(coefficient_bits(&whole)?, coefficient_bits(&grouped)?, "{context}: coefficients");
        }
    }

    // Errors: nothing written.
    let t = |v: &[f64]| tensor(v, DType::F32, device);
    let state = AdamState::new(0.1, device)?;
    let (p, q) = (t(&[1.0, 2.0])?, t(&[3.0, 4.0])?);
    let (g, m, v, m2, v2) = (t(&[0.5; 2])?, t(&[0.0; 2])?, t(&[0.0; 2])?, t(&[0.0; 2])?, t(&[0.0; 2])?);
    let before = AdamTensors { param: &p, grad: &g, m: &m, v: &v };
    match ops::adam_step_device_group(&[before], &state) {
        Err(Error::InvalidArgument { op: "adam_step_device_group", .. }) => {}
        other => panic!("before advance: expected InvalidArgument, got {other:?}"),
    }
    state.advance(&AdamHyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 })?;
    // The second parameter's first moment is the first one's second moment.
    let shared = [before, AdamTensors { param: &q, grad: &g, m: &v, v: &v2 }];
    match ops::adam_step_device_group(&shared, &state) {
        Err(Error::Overlap { op: "adam_step_device_group", output: 1 }) => {}
        other => panic!("shared moments: expected Overlap, got {other:?}"),
    }
    // A parameter that is another's gradient.
    let crossed = [before, AdamTensors { param: &g, grad: &q, m: &m2, v: &v2 }];
    assert!(matches!(ops::adam_step_device_group(&crossed, &state), Err(Error::Overlap { output: 1, .. })));
    // The whole step checks everything before it advances the state.
    let fresh = AdamState::new(0.1, device)?;
    let good = AdamHyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };
    match ops::adam_advance_step_group(&shared, &fresh, &good) {
        Err(Error::Overlap { op: "adam_advance_step_group", output: 1 }) => {}
        other => panic!("whole step, shared moments: expected Overlap, got {other:?}"),
    }
    match ops::adam_advance_step_group(&[before], &fresh, &AdamHyper { beta1: 1.0, ..good }) {
        Err(Error::InvalidArgument { op: "adam_advance_step_group", .. }) => {}
        other => panic!("whole step, beta1 = 1: expected InvalidArgument, got {other:?}"),
    }
    assert_eq!((fresh.step()?, fresh.coefficients()?), (0, None), "a refused whole step moved the state");
    let other = if device.is_cuda() { Device::Cpu } else { Device::cuda_if_available() };
    if other != device {
        let elsewhere = Tensor::from_vec(vec![1.0f32, 2.0], [2], other)?;
        let err = ops::adam_step_device_group(&[AdamTensors { param: &elsewhere, ..before }], &state).unwrap_err();
        assert!(matches!(err, Error::DeviceMismatch { op: "adam_step_device_group", .. }), "{err}");
    }
    assert_eq!((values(&p)?, values(&q)?), (vec![1.0, 2.0], vec![3.0, 4.0]), "nothing written");
    assert_eq!((values(&m)?, values(&v)?, values(&m2)?), (vec![0.0; 2], vec![0.0; 2], vec![0.0; 2]));
    // An empty group is a step of nothing.
    ops::adam_step_device_group(&[], &state)?;
    Ok(())
}

/// Bad hyperparameters and operands: typed errors naming the op, and no tensor changed.
pub fn optimizer_errors(device: Device) -> Result<()> {
    let t = |v: &[f64], dtype: DType| tensor(v, dtype, device);
    let (p, g) = (t(&[1.0, -2.0, 3.0], DType::F32)?, t(&[0.5, 0.5, 0.5], DType::F32)?);
    let (m, v) = (t(&[0.0; 3], DType::F32)?, t(&[0.0; 3], DType::F32)?);
    let unchanged = || -> Result<()> {
        assert_eq!(values(&p)?, [1.0, -2.0, 3.0]);
        assert_eq!(values(&g)?, [0.5; 3]);
        assert_eq!((values(&m)?, values(&v)?), (vec![0.0; 3], vec![0.0; 3]));
        Ok(())
    };
    let adam = AdamStep { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0, step: 1 };
    let bad_adam = [
        AdamStep { step: 0, ..adam },
        AdamStep { lr: f64::NAN, ..adam },
        AdamStep { lr: f64::INFINITY, ..adam },
        AdamStep { lr: -1e-3, ..adam },
        AdamStep { eps: -1e-8, ..adam },
        AdamStep { weight_decay: f64::NAN, ..adam },
        AdamStep { beta1: 1.0, ..adam },
        AdamStep { beta2: -0.1, ..adam },
        AdamStep { beta2: f64::NAN, ..adam },
    ];
    for step in bad_adam {
        let err = ops::adam_step(&p, &g, &m, &v, &step).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { op: "adam_step", .. }), "{step:?}: {err}");
    }
    let sgd = SgdStep { lr: 0.1, momentum: 0.9, weight_decay: 0.0 };
    for step in [
        SgdStep { lr: f64::NAN, ..sgd },
        SgdStep { lr: -0.1, ..sgd },
        SgdStep { momentum: -0.5, ..sgd },
        SgdStep { weight_decay: f64::INFINITY, ..sgd },
    ] {
        let err = ops::sgd_step(&p, &g, Some(&m), &step).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { op: "sgd_step", .. }), "{step:?}: {err}");
    }
    // The momentum buffer is there exactly when momentum is on.
    let err = ops::sgd_step(&p, &g, None, &sgd).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { op: "sgd_step", .. }), "{err}");
    let err = ops::sgd_step(&p, &g, Some(&m), &SgdStep { momentum: 0.0, ..sgd }).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { op: "sgd_step", .. }), "{err}");
    // Shapes, dtypes, overlaps.
    let g4 = t(&[0.5; 4], DType::F32)?;
    match ops::adam_step(&p, &g4, &m, &v, &adam) {
        Err(Error::ShapeMismatch { op: "adam_step", lhs, rhs }) => assert_eq!((lhs, rhs), (vec![3], vec![4])),
        other => panic!("expected a shape mismatch, got {other:?}"),
    }
    assert!(matches!(ops::sgd_step(&p, &g4, Some(&m), &sgd), Err(Error::ShapeMismatch { op: "sgd_step", .. })));
    let m64 = t(&[0.0; 3], DType::F64)?;
    assert!(matches!(
        ops::adam_step(&p, &g, &m64, &v, &adam),
        Err(Error::DTypeMismatch { op: "adam_step", lhs: DType::F32, rhs: DType::F64 })
    ));
    let h = |v: &[f64]| t(v, DType::F16);
    let (ph, gh, mh, vh) = (h(&[1.0; 3])?, h(&[1.0; 3])?, h(&[0.0; 3])?, h(&[0.0; 3])?);
    assert!(matches!(
        ops::adam_step(&ph, &gh, &mh, &vh, &adam),
        Err(Error::UnsupportedDType { op: "adam_step", dtype: DType::F16, .. })
    ));
    assert!(matches!(
        ops::sgd_step(&ph, &gh, None, &SgdStep { momentum: 0.0, ..sgd }),
        Err(Error::UnsupportedDType { op: "sgd_step", dtype: DType::F16, .. })
    ));
    assert_eq!(values(&ph)?, [1.0; 3]);
    let state = t(&[0.0; 4], DType::F32)?;
    let (lo, hi) = (state.flat_slice(0, 3)?, state.flat_slice(1, 3)?);
    assert!(matches!(ops::adam_step(&p, &g, &lo, &hi, &adam), Err(Error::Overlap { op: "adam_step", output: 1 })));
    assert!(matches!(ops::adam_step(&p, &g, &m, &m, &adam), Err(Error::Overlap { op: "adam_step", output: 2 })));
    assert!(matches!(ops::sgd_step(&p, &g, Some(&p), &sgd), Err(Error::Overlap { op: "sgd_step", output: 1 })));
    assert_eq!(values(&state)?, [0.0; 4]);
    unchanged()
}

/// Lists the optimizer cases, for the suites to run.
#[macro_export]
macro_rules! optim_cases {
    ($device:expr) => {
        #[test]
        fn sgd_against_f64() -> opsmith_host::Result<()> {
            common::optim::sgd_against_f64($device)
        }
        #[test]
        fn adam_against_f64() -> opsmith_host::Result<()> {
            common::optim::adam_against_f64($device)
        }
        #[test]
        fn optimizer_errors() -> opsmith_host::Result<()> {
            common::optim::optimizer_errors($device)
        }
        #[test]
        fn adam_state_against_f64() -> opsmith_host::Result<()> {
            common::optim::adam_state_against_f64($device)
        }
        #[test]
        fn adam_device_against_f64() -> opsmith_host::Result<()> {
            common::optim::adam_device_against_f64($device)
        }
        #[test]
        fn adam_state_errors() -> opsmith_host::Result<()> {
            common::optim::adam_state_errors($device)
        }
        #[test]
        fn adam_group_matches_single() -> opsmith_host::Result<()> {
            common::optim::adam_group_matches_single($device)
        }
    };
}
