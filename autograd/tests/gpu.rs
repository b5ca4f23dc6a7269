//! The GPU autograd suite (`--features gpu-tests`; needs a CUDA device).
mod common;

use common::{Cube, cases, inputs};
use opsmith_autograd::{CustomOp, Error, GradcheckOptions, Result, Tape, Var, compare_devices, custom, ops};
use opsmith_host::{DType, Device, Tensor};
use std::sync::Arc;

const GPU: Device = Device::Cuda(0);

shared_cases!(GPU);

/// Every case's CUDA gradients against its CPU gradients, same inputs and dtype.
#[test]
fn cuda_gradients_match_cpu() -> Result<()> {
    for (seed, (name, shapes, f)) in cases().into_iter().enumerate() {
        for dtype in [DType::F32, DType::BF16] {
            let ins = inputs(&shapes, dtype, Device::Cpu, 7 + seed as u64)?;
            let options = GradcheckOptions {
                atol: dtype.unit_roundoff() * 8.0,
                rtol: dtype.unit_roundoff() * 8.0,
                ..GradcheckOptions::for_dtype(dtype)
            };
            compare_devices(f, &ins, GPU, &options).unwrap_or_else(|e| panic!("{name} {dtype}: {e}"));
        }
    }
    Ok(())
}

/// Gradients of CUDA inputs are CUDA tensors: backward never moved them to the host.
#[test]
fn backward_stays_on_the_device() -> Result<()> {
    let tape = Tape::new();
    let ins = inputs(&[&[64, 32], &[32], &[64, 32]], DType::F32, GPU, 3)?;
    let (x, b, w) = (tape.var(ins[0].clone()), tape.var(ins[1].clone()), tape.var(ins[2].clone()));
    let loss = ops::mean(&ops::add_mul(&ops::add_row(&x, &b)?, &w, &w)?)?;
    let grads = tape.backward(&loss)?;
    for v in [&x, &b, &w] {
        assert_eq!(grads.get(v).unwrap().device(), GPU);
    }
    Ok(())
}

/// The shape ops' backwards run on the device too: each CUDA input's gradient is a CUDA tensor
/// (the values are compared with the CPU's in `cuda_gradients_match_cpu`).
#[test]
fn shape_op_gradients_stay_on_the_device() -> Result<()> {
    let tape = Tape::new();
    let ins = inputs(&[&[4, 6], &[4, 6], &[6]], DType::F32, GPU, 4)?;
    let (x, w, b) = (tape.var(ins[0].clone()), tape.var(ins[1].clone()), tape.var(ins[2].clone()));
    let heads = x.reshape([4, 2, 3])?.transpose(0, 1)?; // [2, 4, 3]
    let joined = Var::cat(&[&heads.narrow(0, 0, 1)?, &heads.narrow(0, 1, 1)?], 2)?.squeeze(0)?; // [4, 6]
    let low = joined.to_dtype(DType::BF16)?.to_dtype(DType::F32)?;
    let pair = Var::stack(&[&low, &w], 0)?.permute(&[1, 0, 2])?; // [4, 2, 6]
    let y = ops::add_row(&pair.reshape([8, 6])?, &b.unsqueeze(0)?.squeeze(0)?)?;
    let grads = tape.backward(&ops::sum(&ops::mul(&y, &y)?)?)?;
    for v in [&x, &w, &b] {
        assert_eq!(grads.get(v).unwrap().device(), GPU);
    }
    Ok(())
}

/// A custom op without CUDA halves says so, at forward or at backward.
#[test]
fn missing_cuda_halves_are_errors() -> Result<()> {
    struct ForwardOnly;
    impl CustomOp for ForwardOnly {
        fn name(&self) -> &'static str {
            "forward_only"
        }
        fn num_inputs(&self) -> usize {
            1
        }
        fn cpu_forward(&self, i: &[&Tensor]) -> Result<Tensor> {
            Ok(i[0].copy()?)
        }
        fn cpu_backward(&self, _: &[&Tensor], _: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
            Ok(vec![Some(g.clone())])
        }
        fn cuda_forward(&self, i: &[&Tensor]) -> Result<Tensor> {
            Ok(i[0].copy()?)
        }
    }
    let x = Tensor::full(2.0, [8], DType::F32, GPU)?;
    let tape = Tape::new();
    let cube: Arc<dyn CustomOp> = Arc::new(Cube);
    match custom(&cube, &[&tape.var(x.clone())]) {
        Err(Error::MissingCudaImpl { op, stage: "forward" }) => assert_eq!(op, "cube"),
        other => panic!("expected MissingCudaImpl forward, got {other:?}"),
    }
    let fwd: Arc<dyn CustomOp> = Arc::new(ForwardOnly);
    let y = custom(&fwd, &[&tape.var(x)])?;
    match tape.backward(&ops::sum(&y)?) {
        Err(Error::MissingCudaImpl { op, stage: "backward" }) => assert_eq!(op, "forward_only"),
        other => panic!("expected MissingCudaImpl backward, got {:?}", other.map(|g| g.len())),
    }
    Ok(())
}

/// A model traced on the GPU exports the same ONNX model as on the CPU: the initializers are
/// read back from the device, and the graph does not depend on where the ops ran.
#[test]
fn onnx_export_from_cuda_equals_export_from_cpu() -> Result<()> {
    use opsmith_autograd::nn::{Activation, Mlp};
    use opsmith_autograd::no_grad;
    use opsmith_autograd::onnx::{Model, Tracer};
    let export = |device: Device| -> Result<(Model, Vec<f32>)> {
        let _off = no_grad();
        let mlp = Mlp::new(&Tape::new(), &[3, 16, 4], Activation::Gelu, DType::F32, device, 5)?;
        let x = Var::constant(inputs(&[&[8, 3]], DType::F32, device, 9)?.remove(0));
        let mut tracer = Tracer::new("mlp")?.dynamic_batch("batch");
        tracer.input("x", &x)?;
        for (name, p) in mlp.named_parameters() {
            tracer.name(&p, &name)?;
        }
        let y = ops::softmax(&mlp.forward(&x)?, 0.5, None)?;
        tracer.output("y", &y)?;
        Ok((tracer.finish()?, y.value().to_vec::<f32>()?))
    };
    let (on_gpu, y_gpu) = export(GPU)?;
    let (on_cpu, y_cpu) = export(Device::Cpu)?;
    assert_eq!(on_gpu.to_bytes(), on_cpu.to_bytes());
    assert_eq!(on_gpu.op_types(), ["MatMul", "Add", "Gelu", "MatMul", "Add", "ScaledSoftmax"]);
    // The ops ran on the GPU while being traced.
    for (g, c) in y_gpu.iter().zip(&y_cpu) {
        assert!((g - c).abs() <= 1e-5, "{g} vs {c}");
    }
    Ok(())
}

/// The fused `linear_relu` and `linear` on CUDA against the ops they replace (`matmul`,
/// `add_row`, `relu`), on the same device in f32, for each small-product mapping (k = 2, 100 and
/// 1029) and for a product cuBLAS takes: the outputs and the input's gradient are the same bits;
/// the weights' and biases' gradients, which the fused layers take from `linear_grads` (one
/// launch for both, in another order of additions), agree within f32 rounding.
#[test]
fn fused_linear_layers_equal_the_composed_ops_bit_for_bit() -> Result<()> {
    for (m, k, n) in [(64, 2, 48), (32, 100, 8), (3, 1029, 5), (160, 80, 100)] {
        let ins = inputs(&[&[m, k], &[k, n], &[n], &[n, 3]], DType::F32, GPU, (m * k) as u64)?;
        let run = |fused: bool| -> Result<Vec<Vec<u32>>> {
            let tape = Tape::new();
            let v: Vec<Var> = ins.iter().map(|t| tape.var(t.clone())).collect();
            let (hidden, out) = if fused {
                let hidden = ops::linear_relu(&v[0], &v[1], &v[2])?;
                let out = ops::linear(&hidden, &v[3], &v[2].narrow(0, 0, 3)?)?;
                (hidden, out)
            } else {
                let hidden = ops::relu(&ops::add_row(&ops::matmul(&v[0], &v[1])?, &v[2])?)?;
                let out = ops::add_row(&ops::matmul(&hidden, &v[3])?, &v[2].narrow(0, 0, 3)?)?;
                (hidden, out)
            };
            let grads = tape.backward(&ops::sum(&ops::mul(&out, &out)?)?)?;
            let mut bits = vec![hidden.value().to_vec::<f32>()?, out.value().to_vec::<f32>()?];
            for x in &v {
                bits.push(grads.get(x).expect("every input has a gradient").to_vec::<f32>()?);
            }
            Ok(bits.into_iter().map(|v| v.into_iter().map(f32::to_bits).collect()).collect())
        };
        let (fused, composed) = (run(true)?, run(false)?);
        assert!(
            fused[0].contains(&0) && fused[0].iter().any(|&b| f32::from_bits(b) > 0.0),
            "[{m}, {k}, {n}]: the ReLU clips some"
        );
        // hidden, output and x's gradient: the same ops on the same values.
        for (i, (f, c)) in fused.iter().zip(&composed).enumerate().take(3) {
            assert_eq!(f, c, "[{m}, {k}, {n}]: value {i} (hidden, output, then x's gradient) differs");
        }
        // w1's, the shared bias's and w2's gradients: sums of up to 1029 f32 terms in another
        // order, so within a few units of f32 rounding of the largest.
        for (i, (f, c)) in fused.iter().zip(&composed).enumerate().skip(3) {
            let (f, c): (Vec<f32>, Vec<f32>) =
                (f.iter().map(|&b| f32::from_bits(b)).collect(), c.iter().map(|&b| f32::from_bits(b)).collect());
            let largest = c.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            for (j, (x, y)) in f.iter().zip(&c).enumerate() {
                assert!((x - y).abs() <= 1e-4 * largest, "[{m}, {k}, {n}]: gradient {i}, element {j}: {x} vs {y}");
            }
        }
    }
    Ok(())
}

/// `linear_relu_linear` on CUDA against `linear_relu` then `linear`, with and without the
/// input's gradient: train_mlp's block, odd sizes, and the widest input and output the fused
/// kernels take. The fused kernels add in the separate layers' order (up to 1024 rows and 256
/// hidden units), so the output and every gradient are the same bits.
#[test]
fn two_layer_block_equals_the_separate_layers_bit_for_bit() -> Result<()> {
    for (m, d_in, hidden, d_out) in [(1024, 2, 128, 2), (37, 3, 70, 5), (200, 4, 256, 8)] {
        for dtype in [DType::F32, DType::BF16] {
            for x_needs in [false, true] {
                let shapes: [&[usize]; 5] = [&[m, d_in], &[d_in, hidden], &[hidden], &[hidden, d_out], &[d_out]];
                let ins = inputs(&shapes, dtype, GPU, (m * hidden) as u64)?;
                let run = |fused: bool| -> Result<Vec<Vec<f64>>> {
                    let tape = Tape::new();
                    let x = if x_needs { tape.var(ins[0].clone()) } else { Var::constant(ins[0].clone()) };
                    let p: Vec<Var> = ins[1..].iter().map(|t| tape.var(t.clone())).collect();
                    let out = if fused {
                        ops::linear_relu_linear(&x, &p[0], &p[1], &p[2], &p[3])?
                    } else {
                        ops::linear(&ops::linear_relu(&x, &p[0], &p[1])?, &p[2], &p[3])?
                    };
                    let grads = tape.backward(&ops::sum(&ops::mul(&out, &out)?)?)?;
                    let mut got = vec![out.value().to_vec_f64()?];
                    for v in p.iter().chain(x_needs.then_some(&x)) {
                        got.push(grads.get(v).expect("a gradient for every variable").to_vec_f64()?);
                    }
                    Ok(got)
                };
                let (fused, apart) = (run(true)?, run(false)?);
                let context = format!("{dtype} [{m}, {d_in}] -> {hidden} -> {d_out}, x's gradient {x_needs}");
                assert!(fused[1].iter().any(|&v| v != 0.0), "{context}: w1's gradient is not all zeros");
                for (i, (f, a)) in fused.iter().zip(&apart).enumerate() {
                    let (f, a): (Vec<u64>, Vec<u64>) =
                        (f.iter().map(|v| v.to_bits()).collect(), a.iter().map(|v| v.to_bits()).collect());
                    assert_eq!(f, a, "{context}: value {i} (output, w1, b1, w2, b2, x gradients) differs");
                }
            }
        }
    }
    Ok(())
}
