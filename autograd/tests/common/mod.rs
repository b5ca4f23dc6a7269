//! Test bodies shared by the CPU suite (`cpu.rs`) and the GPU suite (`gpu.rs`).
#![allow(dead_code)]

use opsmith_autograd::{CustomOp, Error, GradcheckOptions, Result, Tape, Var, custom, gradcheck, ops};
use opsmith_host::{DType, Device, Labels, Tensor};
use std::sync::Arc;

/// Deterministic values in ±[0.25, 2), away from zero so that no op sits on a kink.
pub fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let unit = (state >> 11) as f64 / (1u64 << 53) as f64;
            let v = ((0.25 + 1.75 * unit) * 256.0).round() / 256.0; // exact in every dtype
            if state & 1 == 0 { v } else { -v }
        })
        .collect()
}

/// The multi-index of flat index `flat` in a row-major tensor of `dims`.
pub fn unravel(mut flat: usize, dims: &[usize]) -> Vec<usize> {
    let mut index = vec![0; dims.len()];
    for k in (0..dims.len()).rev() {
        index[k] = flat % dims[k];
        flat /= dims[k];
    }
    index
}

/// The flat index of multi-index `index` in a row-major tensor of `dims`.
pub fn ravel(index: &[usize], dims: &[usize]) -> usize {
    index.iter().zip(dims).fold(0, |flat, (&i, &d)| flat * d + i)
}

pub fn tensor(v: &[f64], shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
    Ok(Tensor::from_f64(v, shape.to_vec(), dtype, device)?)
}

pub fn inputs(shapes: &[&[usize]], dtype: DType, device: Device, seed: u64) -> Result<Vec<Tensor>> {
    shapes
        .iter()
        .enumerate()
        .map(|(k, s)| tensor(&values(s.iter().product(), seed + k as u64), s, dtype, device))
        .collect()
}

type Case = (&'static str, Vec<&'static [usize]>, fn(&[Var]) -> Result<Var>);

/// One case per differentiable op (and a few compositions), with its input shapes.
pub fn cases() -> Vec<Case> {
    vec![
        ("add", vec![&[2, 3], &[2, 3]], |v| ops::add(&v[0], &v[1])),
        ("sub", vec![&[2, 3], &[2, 3]], |v| ops::sub(&v[0], &v[1])),
        ("mul", vec![&[2, 3], &[2, 3]], |v| ops::mul(&v[0], &v[1])),
        ("div", vec![&[2, 3], &[2, 3]], |v| ops::div(&v[0], &v[1])),
        // The operators are the ops: `(a - b / 2) * (-a) + 1`.
        ("operators", vec![&[4], &[4]], |v| (&(&v[0] - &(&v[1] / 2.0)?)? * &(-&v[0])?)? + 1.0),
        ("neg", vec![&[5]], |v| ops::neg(&v[0])),
        ("scale", vec![&[5]], |v| ops::scale(&v[0], -2.5)),
        ("add_scalar", vec![&[5]], |v| ops::add_scalar(&v[0], 0.75)),
        ("sum", vec![&[3, 4]], |v| ops::sum(&v[0])),
        ("mean", vec![&[3, 4]], |v| ops::mean(&v[0])),
        ("fused_mul_add", vec![&[7], &[7], &[7]], |v| ops::fused_mul_add(&v[0], &v[1], &v[2])),
        ("add_mul", vec![&[9], &[9], &[9]], |v| ops::add_mul(&v[0], &v[1], &v[2])),
        ("add_row", vec![&[3, 4], &[4]], |v| ops::add_row(&v[0], &v[1])),
        // A variable used several times: its gradients accumulate.
        ("x*x + x", vec![&[6]], |v| ops::add(&ops::mul(&v[0], &v[0])?, &v[0])),
        ("mean((x+y)*w * x)", vec![&[8], &[8], &[8]], |v| {
            ops::mean(&ops::mul(&ops::add_mul(&v[0], &v[1], &v[2])?, &v[0])?)
        }),
        ("affine layer", vec![&[4, 3], &[3], &[4, 3]], |v| ops::sum(&ops::mul(&ops::add_row(&v[0], &v[1])?, &v[2])?)),
        ("matmul", vec![&[3, 4], &[4, 2]], |v| ops::matmul(&v[0], &v[1])),
        ("batched matmul", vec![&[2, 3, 4], &[2, 4, 5]], |v| ops::matmul(&v[0], &v[1])),
        ("relu", vec![&[7]], |v| ops::relu(&v[0])),
        ("gelu", vec![&[7]], |v| ops::gelu(&v[0])),
        ("silu", vec![&[7]], |v| ops::silu(&v[0])),
        ("softmax", vec![&[3, 5]], |v| ops::softmax(&v[0], 1.5, None)),
        // A [cols] mask broadcast over rows: its gradient sums over them.
        ("softmax with mask", vec![&[2, 3, 4], &[4]], |v| ops::softmax(&v[0], 0.75, Some(&v[1]))),
        ("softmax with full mask", vec![&[3, 6], &[3, 6]], |v| ops::softmax(&v[0], -2.0, Some(&v[1]))),
        ("cross_entropy", vec![&[4, 3]], |v| {
            ops::cross_entropy(&v[0], &Labels::new(&[2, 0, 1, 2], v[0].value().device())?)
        }),
        ("mse_loss", vec![&[3, 4], &[3, 4]], |v| ops::mse_loss(&v[0], &v[1])),
        ("linear relu linear", vec![&[4, 3], &[3, 5], &[5], &[5, 2]], |v| {
            ops::matmul(&ops::relu(&ops::add_row(&ops::matmul(&v[0], &v[1])?, &v[2])?)?, &v[3])
        }),
        ("linear", vec![&[4, 3], &[3, 5], &[5]], |v| ops::linear(&v[0], &v[1], &v[2])),
        // The fused layer: the ReLU's gradient from the output, then the product's and the bias's.
        ("linear_relu then linear", vec![&[4, 3], &[3, 5], &[5], &[5, 2], &[2]], |v| {
            ops::linear(&ops::linear_relu(&v[0], &v[1], &v[2])?, &v[3], &v[4])
        }),
        // The two-layer block: every input's gradient (the composed backward of the first
        // layer), then with a constant input (on CUDA, the first layer's gradients in one launch).
        ("linear_relu_linear", vec![&[4, 3], &[3, 5], &[5], &[5, 2], &[2]], |v| {
            ops::linear_relu_linear(&v[0], &v[1], &v[2], &v[3], &v[4])
        }),
        ("linear_relu_linear of a constant", vec![&[6, 2], &[2, 5], &[5], &[5, 3], &[3]], |v| {
            // A fixed input (finite differences must not move it); v[0] only shifts the rows.
            let fixed: Vec<f64> = (0..12).map(|i| f64::from((i * 7) % 5) * 0.5 - 1.0).collect();
            let (device, dtype) = (v[0].value().device(), v[0].value().dtype());
            let x = Var::constant(opsmith_host::Tensor::from_vec(fixed, [6, 2], device)?.to_dtype(dtype)?);
            ops::add(&ops::linear_relu_linear(&x, &v[1], &v[2], &v[3], &v[4])?, &ops::sum_dim(&v[0], 1, true)?)
        }),
        // Shape ops: each moves elements, and its gradient moves them back.
        ("narrow", vec![&[3, 5]], |v| ops::narrow(&v[0], 1, 1, 3)),
        // Along the leading dim the narrowed rows are one contiguous block of the input.
        ("narrow rows", vec![&[5, 3]], |v| v[0].narrow(0, 2, 2)),
        ("permute", vec![&[2, 3, 4]], |v| ops::permute(&v[0], &[2, 0, 1])),
        ("transpose", vec![&[3, 4]], |v| v[0].transpose(1, 0)),
        ("cat", vec![&[2, 3], &[2, 1], &[2, 2]], |v| ops::cat(&[&v[0], &v[1], &v[2]], 1)),
        // A variable joined twice: the gradients of its two places add up.
        ("cat of a variable twice", vec![&[2, 3], &[1, 3]], |v| Var::cat(&[&v[0], &v[1], &v[0]], 0)),
        ("stack", vec![&[2, 3], &[2, 3]], |v| ops::stack(&[&v[0], &v[1]], 1)),
        ("squeeze", vec![&[3, 1, 2]], |v| ops::squeeze(&v[0], 1)),
        ("unsqueeze", vec![&[3, 2]], |v| v[0].unsqueeze(2)),
        ("reshape", vec![&[2, 6]], |v| ops::reshape(&v[0], [3, 4])),
        // f32 from f16 and bf16: the gradient comes back in the narrow dtype. In the reference
        // (all f64) and for f64 inputs the cast keeps f64, so no rounding enters the check.
        ("to_dtype", vec![&[6]], |v| {
            let wide = if v[0].value().dtype() == DType::F64 { DType::F64 } else { DType::F32 };
            ops::mul(&ops::to_dtype(&v[0], wide)?, &ops::to_dtype(&v[0], wide)?)
        }),
        // Attention's head split: [rows, heads·d] → [heads, rows, d], then a batched matmul.
        ("split heads", vec![&[4, 6], &[2, 3, 4]], |v| ops::matmul(&v[0].reshape([4, 2, 3])?.transpose(0, 1)?, &v[1])),
        ("narrow, stack, squeeze", vec![&[4, 3]], |v| {
            let (top, bottom) = (v[0].narrow(0, 0, 2)?, v[0].narrow(0, 2, 2)?);
            ops::mul(&Var::stack(&[&top, &bottom], 0)?.narrow(0, 1, 1)?.squeeze(0)?, &top)
        }),
        // Broadcasting binary ops: the smaller operand's gradient sums over its copies.
        ("broadcast add", vec![&[2, 3], &[3]], |v| ops::add(&v[0], &v[1])),
        ("broadcast sub", vec![&[4, 1], &[2, 1, 3]], |v| ops::sub(&v[0], &v[1])),
        ("broadcast mul", vec![&[2, 1, 3], &[4, 1]], |v| &v[0] * &v[1]),
        ("broadcast div", vec![&[3, 1], &[1, 4]], |v| ops::div(&v[0], &v[1])),
        ("broadcast_as", vec![&[3, 1]], |v| v[0].broadcast_as([2, 3, 4])),
        // Along a dim, and indexing.
        ("sum_dim", vec![&[3, 4]], |v| v[0].sum(0)),
        ("sum_dim keepdim", vec![&[2, 3, 4]], |v| ops::sum_dim(&v[0], 1, true)),
        ("max_dim", vec![&[3, 5]], |v| v[0].max(1)),
        ("index_select", vec![&[4, 3]], |v| {
            v[0].index_select(0, &Tensor::from_vec(vec![3i64, 0, 3], [3], v[0].value().device())?)
        }),
        ("gather", vec![&[3, 4]], |v| {
            ops::gather(&v[0], 1, &Tensor::from_vec(vec![1u32, 3, 3, 0, 2, 2], [3, 2], v[0].value().device())?)
        }),
        // Attention: q [batch, heads, seq_q, head_dim], k and v [batch, heads, seq_k, head_dim].
        ("attention", vec![&[1, 2, 3, 4], &[1, 2, 5, 4], &[1, 2, 5, 4]], |v| {
            ops::attention(&v[0], &v[1], &v[2], 0.5, false, None)
        }),
        ("attention causal", vec![&[1, 2, 3, 4], &[1, 2, 5, 4], &[1, 2, 5, 4]], |v| {
            ops::attention(&v[0], &v[1], &v[2], 0.5, true, None)
        }),
        // A constant [seq_q, seq_k] mask on top of the causal one.
        ("attention with mask", vec![&[1, 2, 3, 4], &[1, 2, 5, 4], &[1, 2, 5, 4]], |v| {
            let mask = attention_mask(v[0].value())?;
            ops::attention(&v[0], &v[1], &v[2], 0.5, true, Some(&mask))
        }),
        // More queries than keys, v with its own head size, a negative scale.
        ("attention seq_q > seq_k", vec![&[2, 1, 4, 3], &[2, 1, 2, 3], &[2, 1, 2, 5]], |v| {
            ops::attention(&v[0], &v[1], &v[2], -0.75, true, None)
        }),
    ]
}

/// A `[3, 5]` additive mask in `like`'s dtype and device: values exact in every dtype, a `-inf`
/// in two rows, and none where the causal mask leaves a row its last key.
pub fn attention_mask(like: &Tensor) -> Result<Tensor> {
    let inf = f64::NEG_INFINITY;
    let m = [0.5, -0.25, 0.0, 1.0, inf, 0.0, inf, 0.25, -1.0, 0.0, inf, 0.75, -0.5, 0.0, 0.0];
    tensor(&m, &[3, 5], like.dtype(), like.device())
}

/// gradcheck every case with inputs of `dtype` on `device`.
pub fn gradcheck_every_op(device: Device, dtype: DType) -> Result<()> {
    for (seed, (name, shapes, f)) in cases().into_iter().enumerate() {
        let ins = inputs(&shapes, dtype, device, 100 * seed as u64)?;
        let report = gradcheck(f, &ins, &GradcheckOptions::for_dtype(dtype))
            .unwrap_or_else(|e| panic!("{name} {dtype} on {device}: {e}"));
        let expected: usize = shapes.iter().map(|s| s.iter().product::<usize>()).sum();
        assert_eq!(report.checked, expected, "{name}: every element checked");
    }
    Ok(())
}

/// add_mul with only some inputs requiring gradients: the others get none, the rest are right.
pub fn add_mul_partial_grads(device: Device) -> Result<()> {
    let [x, y, w] = [1, 2, 3].map(|s| tensor(&values(5, s), &[5], DType::F32, device));
    let (x, y, w) = (x?, y?, w?);
    let xs = x.to_vec::<f32>()?;
    let ys = y.to_vec::<f32>()?;
    let ws = w.to_vec::<f32>()?;
    for (need_x, need_w) in [(true, false), (false, true), (true, true)] {
        let tape = Tape::new();
        let v = |t: &Tensor, need: bool| if need { tape.var(t.clone()) } else { Var::constant(t.clone()) };
        let (xv, yv, wv) = (v(&x, need_x), Var::constant(y.clone()), v(&w, need_w));
        let grads = tape.backward(&ops::sum(&ops::add_mul(&xv, &yv, &wv)?)?)?;
        assert!(grads.get(&yv).is_none());
        assert_eq!(grads.get(&xv).is_some(), need_x);
        assert_eq!(grads.get(&wv).is_some(), need_w);
        if need_x {
            assert_eq!(grads.get(&xv).unwrap().to_vec::<f32>()?, ws);
        }
        if need_w {
            let expected: Vec<f32> = xs.iter().zip(&ys).map(|(a, b)| a + b).collect();
            assert_eq!(grads.get(&wv).unwrap().to_vec::<f32>()?, expected);
        }
    }
    Ok(())
}

/// Modifying a saved input in place before backward is an error naming the op.
pub fn saved_tensor_modified(device: Device) -> Result<()> {
    let tape = Tape::new();
    let ins = inputs(&[&[4], &[4], &[4]], DType::F32, device, 9)?;
    let (x, y, w) = (tape.var(ins[0].clone()), tape.var(ins[1].clone()), tape.var(ins[2].clone()));
    let loss = ops::sum(&ops::add_mul(&x, &y, &w)?)?;
    w.value().fill_(2.0)?; // in place, after the forward saved w
    match tape.backward(&loss) {
        Err(Error::SavedTensorModified { op, saved, now }) => {
            assert_eq!(op, "add_mul");
            assert!(now > saved);
        }
        other => panic!("expected SavedTensorModified, got {:?}", other.map(|g| g.len())),
    }
    Ok(())
}

/// The tape's own errors.
pub fn tape_errors(device: Device) -> Result<()> {
    let tape = Tape::new();
    let x = tape.var(tensor(&values(4, 3), &[4], DType::F32, device)?);
    let y = ops::mul(&x, &x)?;
    assert!(matches!(tape.backward(&y), Err(Error::NonScalarLoss { .. })));
    let loss = ops::sum(&y)?;
    tape.backward(&loss)?;
    assert!(matches!(tape.backward(&loss), Err(Error::GraphConsumed)), "backward twice");
    let c = Var::constant(tensor(&[1.0], &[1], DType::F32, device)?);
    assert!(matches!(tape.backward(&c), Err(Error::RequiresGrad { .. })));
    let other = Tape::new();
    let z = other.var(tensor(&values(4, 5), &[4], DType::F32, device)?);
    assert!(matches!(ops::add(&x, &z), Err(Error::TapeMismatch { .. })));
    // Host errors come through unchanged.
    let bad = tape.var(tensor(&values(3, 1), &[3], DType::F32, device)?);
    assert!(matches!(ops::add(&x, &bad), Err(Error::Host(opsmith_host::Error::ShapeMismatch { op: "add", .. }))));
    Ok(())
}

/// Gradients of a variable used twice accumulate, and `backward_with` takes a given gradient.
pub fn accumulation_and_backward_with(device: Device) -> Result<()> {
    let tape = Tape::new();
    let xs = values(6, 11);
    let x = tape.var(tensor(&xs, &[6], DType::F32, device)?);
    let y = ops::add(&ops::mul(&x, &x)?, &ops::scale(&x, 3.0)?)?; // x² + 3x
    let g = tensor(&[1.0, 2.0, 0.5, -1.0, 0.25, 4.0], &[6], DType::F32, device)?;
    let grads = tape.backward_with(&y, g)?;
    let got = grads.get(&x).unwrap().to_vec::<f32>()?;
    let gs = [1.0, 2.0, 0.5, -1.0, 0.25, 4.0];
    for i in 0..6 {
        let expected = gs[i] * (2.0 * xs[i] + 3.0);
        assert!((got[i] as f64 - expected).abs() <= 1e-5 * expected.abs().max(1.0), "{i}: {} vs {expected}", got[i]);
    }
    Ok(())
}

/// `backward()` passes the loss's seed of 1 on as a uniform gradient (no tensor) through the ops
/// that allow it; every case must get the same gradients as from an explicit tensor of ones,
/// which takes the tensor path through every node. Bit for bit in f32 and f64 (the uniform
/// values here are exact or rounded the same way); in f16 and bf16, a uniform value scaled by
/// `mean`'s `1/n` keeps f32 precision, so within two roundings.
pub fn uniform_gradients_match_tensor_gradients(device: Device) -> Result<()> {
    for (seed, (name, shapes, f)) in cases().into_iter().enumerate() {
        for dtype in [DType::F64, DType::F32, DType::F16, DType::BF16] {
            if device.is_cuda() && dtype == DType::F64 {
                continue;
            }
            let ins = inputs(&shapes, dtype, device, 300 + seed as u64)?;
            let grads = |uniform: bool| -> Result<Vec<Vec<f64>>> {
                let tape = Tape::new();
                let vars: Vec<Var> = ins.iter().map(|t| tape.var(t.clone())).collect();
                let out = f(&vars)?;
                let loss = if out.value().elem_count() == 1 { out } else { ops::sum(&out)? };
                let grads = if uniform {
                    tape.backward(&loss)?
                } else {
                    // In the loss's dtype, which `to_dtype` makes differ from the inputs'.
                    let ones = Tensor::full(1.0, loss.value().shape().clone(), loss.value().dtype(), device)?;
                    tape.backward_with(&loss, ones)?
                };
                vars.iter().map(|v| Ok(grads.get(v).expect("every input gets a gradient").to_vec_f64()?)).collect()
            };
            let (uniform, tensor) = (grads(true)?, grads(false)?);
            for (k, (u, t)) in uniform.iter().zip(&tensor).enumerate() {
                for (i, (a, b)) in u.iter().zip(t).enumerate() {
                    let low_precision = matches!(dtype, DType::F16 | DType::BF16);
                    let allowed = if low_precision { 2.0 * dtype.unit_roundoff() * b.abs() } else { 0.0 };
                    assert!(
                        (a - b).abs() <= allowed,
                        "{name} {dtype} on {device}: input {k}[{i}]: uniform {a} vs tensor {b}"
                    );
                }
            }
        }
    }
    Ok(())
}

/// Uniform gradients meeting at one variable add up on the host; a uniform and a tensor
/// gradient add in one kernel. Checked against the derivatives worked out by hand.
pub fn uniform_gradients_accumulate(device: Device) -> Result<()> {
    let xs = values(6, 21);
    let tape = Tape::new();
    let x = tape.var(tensor(&xs, &[6], DType::F32, device)?);
    // d/dx [sum(x) + sum(2.5 x) - mean(x)] = 1 + 2.5 - 1/6, all uniform.
    let loss = ops::sub(&ops::add(&ops::sum(&x)?, &ops::sum(&ops::scale(&x, 2.5)?)?)?, &ops::mean(&x)?)?;
    let gx = tape.backward(&loss)?.get(&x).unwrap().to_vec_f64()?;
    let expected = (1.0f64 + 2.5 - 1.0 / 6.0) as f32 as f64;
    assert!(gx.iter().all(|&g| g == expected), "{gx:?} vs {expected}");
    // d/dx [sum(x) + sum(x * x)] = 1 + 2x: a uniform gradient meets a tensor one.
    let tape = Tape::new();
    let x = tape.var(tensor(&xs, &[6], DType::F32, device)?);
    let loss = ops::add(&ops::sum(&x)?, &ops::sum(&ops::mul(&x, &x)?)?)?;
    let gx = tape.backward(&loss)?.get(&x).unwrap().to_vec_f64()?;
    for (g, x) in gx.iter().zip(&xs) {
        assert_eq!(*g, 1.0 + 2.0 * x, "x = {x}"); // exact: x has 9 significant bits
    }
    Ok(())
}

/// `x³` with a CPU forward and backward only.
pub struct Cube;

impl CustomOp for Cube {
    fn name(&self) -> &'static str {
        "cube"
    }
    fn num_inputs(&self) -> usize {
        1
    }
    fn cpu_forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        let x = inputs[0];
        Ok(opsmith_host::ops::mul(&opsmith_host::ops::mul(x, x)?, x)?)
    }
    fn cpu_backward(&self, inputs: &[&Tensor], _output: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let x = inputs[0];
        let three_x2 = opsmith_host::ops::scale(&opsmith_host::ops::mul(x, x)?, 3.0)?;
        Ok(vec![Some(opsmith_host::ops::mul(grad, &three_x2)?)])
    }
}

/// A custom op whose backward returns the wrong number or shape of gradients.
pub struct Broken {
    pub wrong_count: bool,
}

impl CustomOp for Broken {
    fn name(&self) -> &'static str {
        "broken"
    }
    fn num_inputs(&self) -> usize {
        1
    }
    fn cpu_forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        Ok(inputs[0].copy()?)
    }
    fn cpu_backward(&self, _inputs: &[&Tensor], _output: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        if self.wrong_count {
            Ok(vec![Some(grad.clone()), None])
        } else {
            Ok(vec![Some(grad.reshape([grad.elem_count(), 1])?)])
        }
    }
}

/// Custom ops on the CPU: gradcheck, arity and malformed backward results.
pub fn custom_ops_on_cpu() -> Result<()> {
    let cube: Arc<dyn CustomOp> = Arc::new(Cube);
    let ins = inputs(&[&[7]], DType::F64, Device::Cpu, 4)?;
    gradcheck(|v| custom(&cube, &[&v[0]]), &ins, &GradcheckOptions::for_dtype(DType::F64))?;
    let tape = Tape::new();
    let x = tape.var(ins[0].clone());
    assert!(matches!(custom(&cube, &[&x, &x]), Err(Error::Arity { expected: 1, actual: 2, what: "inputs", .. })));
    for wrong_count in [true, false] {
        let broken: Arc<dyn CustomOp> = Arc::new(Broken { wrong_count });
        let tape = Tape::new();
        let x = tape.var(ins[0].clone());
        let err = tape.backward(&ops::sum(&custom(&broken, &[&x])?)?).unwrap_err();
        if wrong_count {
            assert!(matches!(err, Error::Arity { what: "gradients", expected: 1, actual: 2, .. }), "{err}");
        } else {
            assert!(matches!(err, Error::GradientShape { input: 0, .. }), "{err}");
        }
    }
    Ok(())
}

#[macro_export]
macro_rules! shared_cases {
    ($device:expr) => {
        #[test]
        fn add_mul_partial_grads() -> opsmith_autograd::Result<()> {
            common::add_mul_partial_grads($device)
        }
        #[test]
        fn uniform_gradients_match_tensor_gradients() -> opsmith_autograd::Result<()> {
            common::uniform_gradients_match_tensor_gradients($device)
        }
        #[test]
        fn uniform_gradients_accumulate() -> opsmith_autograd::Result<()> {
            common::uniform_gradients_accumulate($device)
        }
        #[test]
        fn saved_tensor_modified() -> opsmith_autograd::Result<()> {
            common::saved_tensor_modified($device)
        }
        #[test]
        fn tape_errors() -> opsmith_autograd::Result<()> {
            common::tape_errors($device)
        }
        #[test]
        fn accumulation_and_backward_with() -> opsmith_autograd::Result<()> {
            common::accumulation_and_backward_with($device)
        }
        #[test]
        fn gradcheck_every_op_f32() -> opsmith_autograd::Result<()> {
            common::gradcheck_every_op($device, opsmith_host::DType::F32)
        }
        #[test]
        fn gradcheck_every_op_bf16() -> opsmith_autograd::Result<()> {
            common::gradcheck_every_op($device, opsmith_host::DType::BF16)
        }
        #[test]
        fn gradcheck_every_op_f16() -> opsmith_autograd::Result<()> {
            common::gradcheck_every_op($device, opsmith_host::DType::F16)
        }
    };
}
