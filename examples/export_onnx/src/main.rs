//! `export_onnx`: writes ONNX models of train_mlp's MLP (f32 and f16), of opsmith's fused ops,
//! and of the custom-op example's `Filter3x3`, each with sample inputs and the outputs opsmith
//! computes for them on the CPU. `scripts/onnx_check.py` runs them in onnxruntime and compares.
//!
//! ```text
//! cargo run --release -p opsmith-example-export-onnx [-- OUT_DIR]   # default target/onnx
//! python3 scripts/onnx_check.py target/onnx
//! ```
//!
//! The MLP's weights come from `target/mlp.safetensors` when train_mlp has written it, else
//! they are freshly initialized with train_mlp's sizes.
use opsmith::autograd::nn::{Activation, Linear, Mlp};
use opsmith::autograd::onnx::{Model, Tracer};
use opsmith::autograd::{CustomOp, Result, Var, custom, no_grad, ops};
use opsmith::{DType, Device, Labels, Tensor};
use opsmith_example_custom_op::{Filter3x3, LAPLACIAN_LIKE};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Deterministic values in [-1, 1): the same sample inputs on every run.
struct Sampler(u64);

impl Sampler {
    fn next(&mut self) -> f64 {
        // SplitMix64.
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }

    fn tensor(&mut self, dims: &[usize], scale: f64, dtype: DType) -> Result<Tensor> {
        let values: Vec<f64> = (0..dims.iter().product()).map(|_| scale * self.next()).collect();
        Ok(Tensor::from_vec(values, dims, Device::Cpu)?.to_dtype(dtype)?)
    }
}

fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::F64 => "float64",
        DType::U32 => "uint32",
        DType::I64 => "int64",
    }
}

fn tensor_json(t: &Tensor) -> Result<Value> {
    Ok(json!({ "dtype": dtype_name(t.dtype()), "dims": t.dims(), "values": t.to_vec_f64()? }))
}

/// Writes `<dir>/<name>.onnx` and `<dir>/<name>.json` (the inputs and opsmith's outputs).
fn write(dir: &Path, name: &str, model: &Model, inputs: Vec<(&str, Value)>, outputs: Vec<(&str, &Var)>) -> Result<()> {
    let onnx = dir.join(format!("{name}.onnx"));
    model.save(&onnx)?;
    let mut sample = json!({ "inputs": {}, "outputs": {} });
    for (input, value) in inputs {
        sample["inputs"][input] = value;
    }
    for (output, var) in outputs {
        sample["outputs"][output] = tensor_json(var.value())?;
    }
    let json_path = dir.join(format!("{name}.json"));
    std::fs::write(&json_path, sample.to_string()).map_err(|e| opsmith::autograd::Error::ModelFile {
        path: json_path.display().to_string(),
        reason: e.to_string(),
    })?;
    let functions: Vec<String> = model.proto().functions.iter().map(|f| format!("{}::{}", f.domain, f.name)).collect();
    println!(
        "{:<44} {:>2} nodes: {}{}",
        onnx.display(),
        model.op_types().len(),
        model.op_types().join(" "),
        if functions.is_empty() { String::new() } else { format!("  (functions: {})", functions.join(", ")) }
    );
    Ok(())
}

/// train_mlp's model (trained weights if the file is there), in `dtype`.
fn mlp(dtype: DType) -> Result<Mlp> {
    let trained = Path::new("target/mlp.safetensors");
    let mlp = if trained.exists() {
        Mlp::load_safetensors(trained, Device::Cpu, None)?
    } else {
        Mlp::new(&opsmith::autograd::Tape::new(), &[2, 128, 2], Activation::Relu, DType::F32, Device::Cpu, 42)?
    };
    let layers = mlp
        .layers()
        .iter()
        .map(|l| Linear::from_tensors(l.weight().value().to_dtype(dtype)?, l.bias().value().to_dtype(dtype)?, None))
        .collect::<Result<Vec<_>>>()?;
    Mlp::from_layers(layers, mlp.activation())
}

fn export_mlp(dir: &Path, dtype: DType, sampler: &mut Sampler) -> Result<()> {
    let mlp = mlp(dtype)?;
    let x = Var::constant(sampler.tensor(&[16, mlp.sizes()[0]], 2.0, dtype)?);
    let mut tracer = Tracer::new("mlp")?.dynamic_batch("batch");
    tracer.input("x", &x)?;
    for (name, parameter) in mlp.named_parameters() {
        tracer.name(&parameter, &name)?;
    }
    let y = mlp.forward(&x)?;
    tracer.output("y", &y)?;
    let model = tracer.finish()?;
    write(dir, &format!("mlp_{}", dtype_name(dtype)), &model, vec![("x", tensor_json(x.value())?)], vec![("y", &y)])
}

/// opsmith's fused ops (custom-domain nodes with functions) and losses, in one model.
fn export_fused(dir: &Path, dtype: DType, sampler: &mut Sampler) -> Result<()> {
    let (rows, cols) = (6, 8);
    let [a, b, c] = [0, 1, 2].map(|_| sampler.tensor(&[rows, cols], 1.5, dtype).map(Var::constant));
    let (a, b, c) = (a?, b?, c?);
    let mask_values: Vec<f64> = (0..cols).map(|j| if j % 3 == 2 { f64::NEG_INFINITY } else { 0.0 }).collect();
    let mask = Var::constant(Tensor::from_vec(mask_values, [cols], Device::Cpu)?.to_dtype(dtype)?);
    let label_values: Vec<u32> = (0..rows as u32).map(|r| (r * 5) % cols as u32).collect();
    let labels = Labels::new(&label_values, Device::Cpu)?;

    let mut tracer = Tracer::new("fused")?;
    for (name, v) in [("a", &a), ("b", &b), ("c", &c)] {
        tracer.input(name, v)?;
    }
    tracer.name(&mask, "mask")?;
    let d = ops::fused_mul_add(&a, &b, &c)?;
    let z = ops::add_mul(&d, &c, &b)?; // (d + c) * b
    let probs = ops::softmax(&z, 0.5, Some(&mask))?;
    let hidden =
        ops::add_row(&ops::gelu(&ops::scale(&z, 0.25)?)?, &Var::constant(sampler.tensor(&[cols], 1.0, dtype)?))?;
    let loss = ops::add(
        &ops::cross_entropy(&ops::silu(&hidden)?, &labels)?,
        &ops::mse_loss(&ops::neg(&ops::relu(&d)?)?, &ops::add_scalar(&a, 0.5)?)?,
    )?;
    tracer.output("probs", &probs)?;
    tracer.output("loss", &loss)?;
    let model = tracer.finish()?;
    let mut inputs =
        vec![("a", tensor_json(a.value())?), ("b", tensor_json(b.value())?), ("c", tensor_json(c.value())?)];
    let label_json: Vec<i64> = label_values.iter().map(|&l| i64::from(l)).collect();
    inputs.push(("labels", json!({ "dtype": "int64", "dims": [rows], "values": label_json })));
    write(dir, &format!("fused_{}", dtype_name(dtype)), &model, inputs, vec![("probs", &probs), ("loss", &loss)])
}

/// The tensor API's broadcasting, reductions along a dim, indexing and shape ops, row by row
/// (so the model also runs on a batch of another size).
fn export_tensor_api(dir: &Path, dtype: DType, sampler: &mut Sampler) -> Result<()> {
    let x = Var::constant(sampler.tensor(&[8, 6], 2.0, dtype)?);
    let w = Var::constant(sampler.tensor(&[6], 1.0, dtype)?);
    let columns = Tensor::from_vec(vec![4i64, 0, 5], [3], Device::Cpu)?;
    let mut tracer = Tracer::new("tensor_api")?.dynamic_batch("batch");
    tracer.input("x", &x)?;
    tracer.name(&w, "w")?;
    let scaled = (&x * &w)?; // [batch, 6] * [6]
    let centered = (&scaled - &(&scaled.sum_keepdim(1)? / 6.0)?)?; // minus each row's mean
    let top = centered.max(1)?;
    let picked = centered.index_select(1, &columns)?; // [batch, 3]
    let joined = Var::cat(&[&picked, &picked.narrow(1, 0, 1)?], 1)?.unsqueeze(1)?.transpose(1, 2)?.squeeze(2)?;
    tracer.output("top", &top)?;
    tracer.output("joined", &joined)?;
    let model = tracer.finish()?;
    let name = format!("tensor_api_{}", dtype_name(dtype));
    write(dir, &name, &model, vec![("x", tensor_json(x.value())?)], vec![("top", &top), ("joined", &joined)])
}

/// The custom-op example's filter, inside a small graph.
fn export_filter(dir: &Path, sampler: &mut Sampler) -> Result<()> {
    let filter: Arc<dyn CustomOp> = Arc::new(Filter3x3::new(LAPLACIAN_LIKE, Device::Cpu)?);
    let image = Var::constant(sampler.tensor(&[12, 10], 1.0, DType::F32)?);
    let mut tracer = Tracer::new("filter3x3")?;
    tracer.input("image", &image)?;
    let edges = ops::relu(&custom(&filter, &[&image])?)?;
    tracer.output("edges", &edges)?;
    let model = tracer.finish()?;
    write(dir, "filter3x3_float32", &model, vec![("image", tensor_json(image.value())?)], vec![("edges", &edges)])
}

/// Writes ONNX models of train_mlp's MLP, the fused ops and the custom op, each with sample
/// inputs and opsmith's outputs, for `scripts/onnx_check.py`.
#[derive(clap::Parser)]
#[command(name = "export_onnx")]
struct Args {
    /// Where the .onnx and .json files go.
    #[arg(value_name = "OUT_DIR", default_value = "target/onnx")]
    dir: PathBuf,
}

fn main() -> Result<()> {
    let dir = <Args as clap::Parser>::parse().dir;
    let _inference = no_grad();
    let mut sampler = Sampler(2026);
    for dtype in [DType::F32, DType::F16] {
        export_mlp(&dir, dtype, &mut sampler)?;
        export_fused(&dir, dtype, &mut sampler)?;
        export_tensor_api(&dir, dtype, &mut sampler)?;
    }
    export_filter(&dir, &mut sampler)?;
    println!("check them in onnxruntime: python3 scripts/onnx_check.py {}", dir.display());
    Ok(())
}
