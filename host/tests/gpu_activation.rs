//! Activations and optimizer steps on CUDA (`--features gpu-tests`; needs a CUDA device): the
//! shared cases on `Device::Cuda(0)` (f32, f16, bf16 against f64, poisoned outputs, odd sizes
//! and unaligned views), CUDA against the CPU, and what needs two devices.
mod common;

use common::activation::{Act, inputs, tolerance};
use common::optim::{ADAM_CASES, LR_CHANGE_AFTER, SGD_CASES, STEPS, hyper};
use common::{random_values, tensor, values};
use opsmith_host::ops::AdamState;
use opsmith_host::{DType, Device, Error, Result, Tensor, ops};
use rand::{SeedableRng, rngs::StdRng};

const GPU: Device = Device::Cuda(0);

activation_cases!(GPU);
optim_cases!(GPU);

/// CUDA's gelu and silu differ from the CPU's only by the exponential: within twice the shared
/// tolerance of each other, and relu bit for bit. Prints the largest difference seen, in units
/// of the dtype's roundoff of the CPU value, for the record.
#[test]
fn activations_cuda_close_to_cpu() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(404);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let n = 100_003;
        let x = inputs(&mut rng, n, dtype);
        let g = random_values(&mut rng, n, dtype);
        for act in Act::ALL {
            let run = |device: Device| -> Result<(Vec<f64>, Vec<f64>)> {
                let (xt, gt) = (tensor(&x, dtype, device)?, tensor(&g, dtype, device)?);
                Ok((values(&act.forward(&xt)?)?, values(&act.backward(&gt, &xt)?)?))
            };
            let ((cpu_y, cpu_dy), (gpu_y, gpu_dy)) = (run(Device::Cpu)?, run(GPU)?);
            let mut worst = [0.0f64; 2];
            for i in 0..n {
                for (k, (c, d, gi)) in [(cpu_y[i], gpu_y[i], 1.0), (cpu_dy[i], gpu_dy[i], g[i])].into_iter().enumerate()
                {
                    if act == Act::Relu {
                        assert_eq!(c.to_bits(), d.to_bits(), "{act:?} {dtype} output {k}[{i}], x = {}", x[i]);
                        continue;
                    }
                    // Both are within the tolerance of f64, and f16/bf16 may round to neighbours.
                    let tol = 2.0 * tolerance(dtype, c, gi, act.error_scale(x[i], k == 1), x[i]);
                    assert!(
                        (c - d).abs() <= tol,
                        "{act:?} {dtype} output {k}[{i}]: cpu {c:e} cuda {d:e}, x = {}",
                        x[i]
                    );
                    let u = dtype.unit_roundoff().max(2f64.powi(-24));
                    if c.abs() > 1e-30 {
                        worst[k] = worst[k].max((c - d).abs() / (u * c.abs()));
                    }
                }
            }
            eprintln!(
                "{act:?} {dtype}: largest |cuda - cpu| / (u |cpu|): forward {:.1}, backward {:.1}",
                worst[0], worst[1]
            );
        }
    }
    Ok(())
}

/// SGD and Adam run the same correctly rounded operations on both devices: the same bits after
/// every step. Adam with its state on the device too: the state advanced on each device (to the
/// case's first step, then once a step, the learning rate quartered midway) holds the same
/// progress and coefficients on both, and the steps give the same bits.
#[test]
fn optimizers_cuda_match_cpu_bitwise() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(405);
    let n = 4099;
    let dtype = DType::F32;
    let init = |rng: &mut StdRng| random_values(rng, n, dtype);
    let same = |what: &str, a: &Tensor, b: &Tensor| -> Result<()> {
        let (a, b) = (values(a)?, values(b)?);
        if let Some(i) =
            (0..a.len().max(b.len())).find(|&i| a.get(i).map(|v| v.to_bits()) != b.get(i).map(|v| v.to_bits()))
        {
            panic!("{what}[{i}]: cpu {:e} vs cuda {:e}", a[i], b[i]);
        }
        Ok(())
    };
    for step in SGD_CASES {
        let (p0, buf0) = (init(&mut rng), init(&mut rng));
        let state = |device: Device| -> Result<(Tensor, Tensor)> {
            // An odd offset: unaligned for the vector loads.
            Ok((tensor(&p0, dtype, device)?.flat_slice(1, n - 1)?, tensor(&buf0, dtype, device)?.flat_slice(1, n - 1)?))
        };
        let ((p_cpu, b_cpu), (p_gpu, b_gpu)) = (state(Device::Cpu)?, state(GPU)?);
        for t in 0..STEPS {
            let g = init(&mut rng);
            let buf = |b| (step.momentum > 0.0).then_some(b);
            ops::sgd_step(&p_cpu, &tensor(&g, dtype, Device::Cpu)?.flat_slice(0, n - 1)?, buf(&b_cpu), &step)?;
            ops::sgd_step(&p_gpu, &tensor(&g, dtype, GPU)?.flat_slice(0, n - 1)?, buf(&b_gpu), &step)?;
            same(&format!("sgd {step:?} step {t} param"), &p_cpu, &p_gpu)?;
            same(&format!("sgd {step:?} step {t} buf"), &b_cpu, &b_gpu)?;
        }
    }
    for case in ADAM_CASES {
        let p0 = init(&mut rng);
        let state = |device: Device| -> Result<[Tensor; 3]> {
            Ok([tensor(&p0, dtype, device)?, Tensor::zeros([n], dtype, device)?, Tensor::zeros([n], dtype, device)?])
        };
        let ([p_c, m_c, v_c], [p_g, m_g, v_g]) = (state(Device::Cpu)?, state(GPU)?);
        for t in case.step..case.step + STEPS {
            let step = ops::AdamStep { step: t, ..case };
            let g = init(&mut rng);
            ops::adam_step(&p_c, &tensor(&g, dtype, Device::Cpu)?, &m_c, &v_c, &step)?;
            ops::adam_step(&p_g, &tensor(&g, dtype, GPU)?, &m_g, &v_g, &step)?;
            for (name, c, g) in [("param", &p_c, &p_g), ("m", &m_c, &m_g), ("v", &v_c, &v_g)] {
                same(&format!("adam {case:?} step {t} {name}"), c, g)?;
            }
        }
    }
    for case in ADAM_CASES {
        let (p0, h) = (init(&mut rng), hyper(&case));
        let state = |device: Device| -> Result<([Tensor; 3], AdamState)> {
            let tensors =
                [tensor(&p0, dtype, device)?, Tensor::zeros([n], dtype, device)?, Tensor::zeros([n], dtype, device)?];
            Ok((tensors, AdamState::new(case.lr, device)?))
        };
        let (([p_c, m_c, v_c], s_c), ([p_g, m_g, v_g], s_g)) = (state(Device::Cpu)?, state(GPU)?);
        for _ in 1..case.step {
            s_c.advance(&h)?;
            s_g.advance(&h)?;
        }
        for t in case.step..case.step + STEPS {
            if t == case.step + LR_CHANGE_AFTER {
                s_c.set_lr(case.lr / 4.0)?;
                s_g.set_lr(case.lr / 4.0)?;
            }
            s_c.advance(&h)?;
            s_g.advance(&h)?;
            let context = format!("adam_step_device {case:?} step {t}");
            let (progress_c, progress_g) = (s_c.progress()?.to_array(), s_g.progress()?.to_array());
            assert_eq!(progress_c.map(f64::to_bits), progress_g.map(f64::to_bits), "{context}: progress");
            assert_eq!(progress_c[0], t as f64, "{context}: step count");
            let bits = |s: &AdamState| -> Result<Option<[u32; 8]>> {
                Ok(s.coefficients()?.map(|c| c.to_array().map(f32::to_bits)))
            };
            assert_eq!(bits(&s_c)?, bits(&s_g)?, "{context}: coefficients");
            let g = init(&mut rng);
            ops::adam_step_device(&p_c, &tensor(&g, dtype, Device::Cpu)?, &m_c, &v_c, &s_c)?;
            ops::adam_step_device(&p_g, &tensor(&g, dtype, GPU)?, &m_g, &v_g, &s_g)?;
            for (name, c, g) in [("param", &p_c, &p_g), ("m", &m_c, &m_g), ("v", &v_c, &v_g)] {
                same(&format!("{context} {name}"), c, g)?;
            }
        }
    }
    Ok(())
}

/// The grouped Adam kernels launched directly, on grids smaller and larger than their packs
/// (one warp for hundreds of packs, three blocks of two warps, 1024 threads for a few packs, one
/// thread per pack): every element updated exactly once, bit for bit as
/// `opsmith_kernels::optim::adam` in f32 on the CPU, over slots of sizes not a multiple of 4,
/// empty slots first, between and last, and views at odd offsets; the gradients unchanged and
/// nothing outside the views written. The one-block kernel that also advances the state
/// (`adam_device_group_advance`) on the same grids: its block 0 alone does the work, striding
/// by its size, and it leaves the next state and that step's coefficients.
#[test]
fn adam_group_kernel_any_grid() -> Result<()> {
    use opsmith_host::cuda::{self, Grid, LaunchConfig};
    use opsmith_kernels::optim::{AdamHyper, AdamProgress, adam};
    let hyper = AdamHyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 };
    let mut progress = AdamProgress::start(1e-2);
    progress.advance(&hyper);
    let before = progress;
    let c = progress.advance(&hyper).map(|x| x as f32);
    let coefficients = Tensor::from_vec(c.to_array().to_vec(), [8], GPU)?;
    // Each slot's size and the offsets of its [param, grad, m, v] views in their buffers.
    let layouts: [[(usize, [usize; 4]); 4]; 2] = [
        [(1029, [0; 4]), (0, [0; 4]), (7, [1; 4]), (66, [0, 0, 0, 2])],
        [(0, [0; 4]), (5, [0; 4]), (64, [3; 4]), (0, [1; 4])],
    ];
    let config = |grid, block| Grid::Config(LaunchConfig { grid, block, shared_mem_bytes: 0 });
    let sentinel = common::SENTINEL as f32;
    /// One operand: its values, the sentinel-padded buffer holding them at `at`, and the view.
    struct Padded {
        values: Vec<f32>,
        whole: Tensor,
        view: Tensor,
        at: usize,
    }
    let mut rng = StdRng::seed_from_u64(406);
    for (l, layout) in layouts.iter().enumerate() {
        let packs: u64 = layout.iter().map(|&(n, _)| n.div_ceil(4) as u64).sum();
        for (grid, advancing) in [config(1, 32), config(3, 64), config(1, 1024), Grid::covering(packs)]
            .into_iter()
            .flat_map(|grid| [(grid, false), (grid, true)])
        {
            let context = format!("layout {l}, {grid:?}, advancing {advancing}");
            // Per slot: p, g, m, v (v ≥ 0).
            let mut slots: Vec<[Padded; 4]> = Vec::new();
            for &(n, offsets) in layout {
                let mut padded = |k: usize| -> Result<Padded> {
                    let scale = [1.0, 1.0, 1.0 / 16.0, 1.0 / 256.0][k];
                    let values: Vec<f32> = random_values(&mut rng, n, DType::F32)
                        .iter()
                        .map(|&x| (if k == 3 { x.abs() } else { x } * scale) as f32)
                        .collect();
                    let at = offsets[k];
                    let mut data = vec![sentinel; at + n + 2];
                    data[at..at + n].copy_from_slice(&values);
                    let whole = Tensor::from_vec(data, [at + n + 2], GPU)?;
                    let view = whole.flat_slice(at, n)?;
                    Ok(Padded { values, whole, view, at })
                };
                slots.push([padded(0)?, padded(1)?, padded(2)?, padded(3)?]);
            }
            let view = |s: usize, k: usize| &slots[s][k].view;
            let n = |s: usize| layout[s].0 as u64;
            let state = Tensor::from_vec(before.to_array().to_vec(), [4], GPU)?;
            let written = Tensor::from_vec(vec![f32::NAN; 8], [8], GPU)?;
            if advancing {
                let AdamHyper { beta1, beta2, eps, weight_decay } = hyper;
                cuda::launch(
                    opsmith_kernels::names::optim::F32.adam_device_group_advance,
                    grid,
                    (
                        view(0, 0),
                        view(0, 1),
                        view(0, 2),
                        view(0, 3),
                        n(0),
                        view(1, 0),
                        view(1, 1),
                        view(1, 2),
                        view(1, 3),
                        n(1),
                        view(2, 0),
                        view(2, 1),
                        view(2, 2),
                        view(2, 3),
                        n(2),
                        view(3, 0),
                        view(3, 1),
                        view(3, 2),
                        view(3, 3),
                        n(3),
                        &state,
                        &written,
                        beta1,
                        beta2,
                        eps,
                        weight_decay,
                    ),
                )?;
                assert_eq!(state.to_vec::<f64>()?, progress.to_array(), "{context}: the next state");
                let want: Vec<u32> = c.to_array().iter().map(|x| x.to_bits()).collect();
                let got: Vec<u32> = written.to_vec::<f32>()?.iter().map(|x| x.to_bits()).collect();
                assert_eq!(got, want, "{context}: the step's coefficients");
            } else {
                cuda::launch(
                    opsmith_kernels::names::optim::F32.adam_device_group,
                    grid,
                    (
                        view(0, 0),
                        view(0, 1),
                        view(0, 2),
                        view(0, 3),
                        n(0),
                        view(1, 0),
                        view(1, 1),
                        view(1, 2),
                        view(1, 3),
                        n(1),
                        view(2, 0),
                        view(2, 1),
                        view(2, 2),
                        view(2, 3),
                        n(2),
                        view(3, 0),
                        view(3, 1),
                        view(3, 2),
                        view(3, 3),
                        n(3),
                        &coefficients,
                    ),
                )?;
            }
            for (s, [p, g, m, v]) in slots.iter().enumerate() {
                let updated: Vec<(f32, f32, f32)> =
                    (0..p.values.len()).map(|i| adam(p.values[i], g.values[i], m.values[i], v.values[i], &c)).collect();
                let want: [Vec<f32>; 4] = [
                    updated.iter().map(|u| u.0).collect(),
                    g.values.clone(),
                    updated.iter().map(|u| u.1).collect(),
                    updated.iter().map(|u| u.2).collect(),
                ];
                for ((name, operand), want) in ["param", "grad", "m", "v"].into_iter().zip([p, g, m, v]).zip(&want) {
                    let inside = operand.at..operand.at + want.len();
                    for (i, x) in operand.whole.to_vec::<f32>()?.into_iter().enumerate() {
                        let expected = if inside.contains(&i) { want[i - operand.at] } else { sentinel };
                        assert_eq!(x.to_bits(), expected.to_bits(), "{context}: slot {s}'s {name}, buffer element {i}");
                    }
                }
            }
        }
    }
    Ok(())
}

#[test]
fn device_mismatch_is_an_error() -> Result<()> {
    let on = |device: Device| tensor(&[1.0, -2.0, 3.0], DType::F32, device);
    let (x_gpu, g_cpu) = (on(GPU)?, on(Device::Cpu)?);
    let err = ops::gelu_backward(&g_cpu, &x_gpu).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "gelu_backward", lhs: Device::Cpu, rhs: GPU }), "{err}");
    let out = Tensor::zeros([3], DType::F32, Device::Cpu)?;
    assert!(matches!(ops::silu_into(&x_gpu, &out), Err(Error::DeviceMismatch { op: "silu", .. })));
    let (m, v) = (Tensor::zeros([3], DType::F32, GPU)?, Tensor::zeros([3], DType::F32, Device::Cpu)?);
    let step = ops::AdamStep { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0, step: 1 };
    let err = ops::adam_step(&x_gpu, &on(GPU)?, &m, &v, &step).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "adam_step", lhs: GPU, rhs: Device::Cpu }), "{err}");
    let sgd = ops::SgdStep { lr: 0.1, momentum: 0.0, weight_decay: 0.0 };
    assert!(matches!(ops::sgd_step(&x_gpu, &g_cpu, None, &sgd), Err(Error::DeviceMismatch { op: "sgd_step", .. })));
    // The device-resident Adam state must be on the tensors' device.
    let state = AdamState::new(1e-3, Device::Cpu)?;
    state.advance(&hyper(&step))?;
    let m = Tensor::zeros([3], DType::F32, GPU)?;
    let err = ops::adam_step_device(&x_gpu, &on(GPU)?, &m, &m.copy()?, &state).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "adam_step_device", lhs: GPU, rhs: Device::Cpu }), "{err}");
    assert_eq!(values(&x_gpu)?, [1.0, -2.0, 3.0]);
    Ok(())
}

/// f64 has no CUDA kernels; the optimizers take f32 only on CUDA.
#[test]
fn unsupported_dtypes_on_cuda() -> Result<()> {
    let x = tensor(&[1.0, 2.0], DType::F64, GPU)?;
    assert!(matches!(ops::relu(&x), Err(Error::UnsupportedDType { op: "relu", dtype: DType::F64, device: GPU })));
    let h = || tensor(&[1.0, 2.0], DType::BF16, GPU);
    let sgd = ops::SgdStep { lr: 0.1, momentum: 0.0, weight_decay: 0.0 };
    let err = ops::sgd_step(&h()?, &h()?, None, &sgd).unwrap_err();
    assert!(matches!(err, Error::UnsupportedDType { op: "sgd_step", dtype: DType::BF16, device: GPU }), "{err}");
    Ok(())
}
