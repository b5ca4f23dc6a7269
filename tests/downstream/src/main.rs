//! A first program against opsmith: one fused op and one tape backward, on CUDA when the build
//! has the `cuda` feature and the machine a GPU, else on the CPU, and its ONNX export. Every
//! value is checked.
use opsmith::autograd::{Tape, ops as ag};
use opsmith::{Device, Tensor, ops};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = Device::cuda_if_available();
    println!("opsmith downstream: running on {device} (cuda feature: {})", cfg!(feature = "cuda"));

    // d = a * b + c, one kernel on CUDA.
    let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, -4.0], [4], device)?;
    let b = Tensor::from_vec(vec![0.5f32, -1.5, 2.0, 0.25], [4], device)?;
    let c = Tensor::from_vec(vec![3.0f32, 1.0, -2.0, 0.5], [4], device)?;
    let d = ops::fused_mul_add(&a, &b, &c)?.to_vec::<f32>()?;
    assert_eq!(d, [3.5, -2.0, 4.0, -0.5], "fused_mul_add");

    // loss = sum((x + y) * w); d/dx = d/dy = w, d/dw = x + y.
    let tape = Tape::new();
    let (x, y, w) = (tape.var(a), tape.var(b), tape.var(c));
    let loss = ag::sum(&ag::add_mul(&x, &y, &w)?)?;
    let grads = tape.backward(&loss)?;
    let gx = grads.get(&x).ok_or("no gradient for x")?.to_vec::<f32>()?;
    let gw = grads.get(&w).ok_or("no gradient for w")?.to_vec::<f32>()?;
    assert_eq!(gx, [3.0, 1.0, -2.0, 0.5], "d loss / dx");
    assert_eq!(gw, [1.5, 0.5, 5.0, -3.75], "d loss / dw");
    assert_eq!(loss.value().to_vec::<f32>()?, [4.5 + 0.5 - 10.0 - 1.875], "loss");

    // The same forward as an ONNX model: opsmith's fused node (with its function), then ReduceSum.
    let mut tracer = opsmith::autograd::onnx::Tracer::new("add_mul_sum")?;
    for (name, v) in [("x", &x), ("y", &y), ("w", &w)] {
        tracer.input(name, v)?;
    }
    tracer.output("loss", &ag::sum(&ag::add_mul(&x, &y, &w)?)?)?;
    let model = tracer.finish()?;
    assert_eq!(model.op_types(), ["AddMul", "ReduceSum"], "exported nodes");
    assert!(model.to_bytes().len() > 100, "an ONNX model's bytes");

    // Without the feature, asking for a GPU is an error that says which feature to turn on.
    if !cfg!(feature = "cuda") {
        let err = Tensor::zeros([1], opsmith::DType::F32, Device::Cuda(0)).unwrap_err();
        assert!(err.to_string().contains("`cuda` cargo feature"), "{err}");
    }
    println!("fused_mul_add {d:?}; backward of sum((x+y)*w): dx {gx:?}, dw {gw:?}: all as expected");
    Ok(())
}
