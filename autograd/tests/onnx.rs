//! ONNX export: the exported graphs, run by a small f64 interpreter written here from the ONNX
//! operator specs, against opsmith's own forward; and the export errors.
//!
//! onnxruntime runs the example's models in CI (`scripts/onnx_check.py`); these tests need no
//! Python.
mod common;

use common::{ravel, tensor, unravel, values};
use opsmith_autograd::nn::{Activation, Mlp};
use opsmith_autograd::onnx::proto::{self, AttributeProto, FunctionProto, ModelProto, NodeProto, TensorProto};
use opsmith_autograd::onnx::{Function, Model, OPSET, OPSMITH_DOMAIN, Tracer};
use opsmith_autograd::{CustomOp, Error, Result, Tape, Var, custom, ops};
use opsmith_host::{DType, Device, Labels, Tensor, ops as host};
use std::collections::HashMap;
use std::sync::Arc;

/// A dense f64 tensor of the interpreter.
#[derive(Clone, Debug)]
struct Value {
    dims: Vec<usize>,
    data: Vec<f64>,
}

impl Value {
    fn scalar(v: f64) -> Value {
        Value { dims: vec![], data: vec![v] }
    }

    fn map(&self, f: impl Fn(f64) -> f64) -> Value {
        Value { dims: self.dims.clone(), data: self.data.iter().map(|&v| f(v)).collect() }
    }
}

fn decode(t: &TensorProto) -> Value {
    let dims: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
    let raw = &t.raw_data;
    let data: Vec<f64> = match proto::DataType::try_from(t.data_type).unwrap() {
        proto::DataType::Float => raw.chunks(4).map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap()))).collect(),
        proto::DataType::Double => raw.chunks(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect(),
        proto::DataType::Float16 => raw.chunks(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
        proto::DataType::Bfloat16 => raw.chunks(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
        proto::DataType::Int64 => raw.chunks(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
        other => panic!("no decoder for {other:?}"),
    };
    assert_eq!(data.len(), dims.iter().product::<usize>(), "tensor {} holds {} values", t.name, data.len());
    Value { dims, data }
}

/// NumPy broadcasting of an elementwise binary op.
fn broadcast(a: &Value, b: &Value, f: impl Fn(f64, f64) -> f64) -> Value {
    let rank = a.dims.len().max(b.dims.len());
    let pad = |d: &[usize]| [vec![1; rank - d.len()], d.to_vec()].concat();
    let (da, db) = (pad(&a.dims), pad(&b.dims));
    let dims: Vec<usize> = da
        .iter()
        .zip(&db)
        .map(|(&x, &y)| {
            assert!(x == y || x == 1 || y == 1, "cannot broadcast {:?} with {:?}", a.dims, b.dims);
            x.max(y)
        })
        .collect();
    let n: usize = dims.iter().product();
    let index = |d: &[usize], mut flat: usize| {
        let mut offset = 0;
        let mut stride = 1;
        for axis in (0..rank).rev() {
            let i = flat % dims[axis];
            flat /= dims[axis];
            if d[axis] != 1 {
                offset += i * stride;
            }
            stride *= d[axis];
        }
        offset
    };
    Value { dims: dims.clone(), data: (0..n).map(|k| f(a.data[index(&da, k)], b.data[index(&db, k)])).collect() }
}

fn matmul(a: &Value, b: &Value) -> Value {
    let (ra, rb) = (a.dims.len(), b.dims.len());
    assert_eq!(ra, rb, "MatMul of ranks {ra} and {rb}");
    let (m, k, n) = (a.dims[ra - 2], a.dims[ra - 1], b.dims[rb - 1]);
    assert_eq!(b.dims[rb - 2], k);
    let batch: usize = a.dims[..ra - 2].iter().product();
    let mut data = vec![0.0; batch * m * n];
    for p in 0..batch {
        for i in 0..m {
            for j in 0..n {
                data[(p * m + i) * n + j] =
                    (0..k).map(|q| a.data[(p * m + i) * k + q] * b.data[(p * k + q) * n + j]).sum();
            }
        }
    }
    let mut dims = a.dims[..ra - 2].to_vec();
    dims.extend([m, n]);
    Value { dims, data }
}

fn softmax_last(x: &Value) -> Value {
    let cols = *x.dims.last().unwrap();
    let mut data = Vec::with_capacity(x.data.len());
    for row in x.data.chunks(cols) {
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = row.iter().map(|v| (v - max).exp()).collect();
        let s: f64 = e.iter().sum();
        data.extend(e.iter().map(|v| v / s));
    }
    Value { dims: x.dims.clone(), data }
}

/// An int64 tensor's values (the interpreter holds every value as f64).
fn ints(v: &Value) -> Vec<i64> {
    v.data.iter().map(|&x| x as i64).collect()
}

/// An axis of a tensor of `rank` dims; negative ones count from the end.
fn axis(a: i64, rank: usize) -> usize {
    let r = rank as i64;
    assert!((-r..r).contains(&a), "axis {a} of rank {rank}");
    a.rem_euclid(r) as usize
}

/// The tensor of `dims` whose element at each multi-index is `x`'s at `source(index)`.
fn gather(x: &Value, dims: Vec<usize>, source: impl Fn(&mut Vec<usize>)) -> Value {
    let n: usize = dims.iter().product();
    let data = (0..n)
        .map(|f| {
            let mut index = unravel(f, &dims);
            source(&mut index);
            x.data[ravel(&index, &x.dims)]
        })
        .collect();
    Value { dims, data }
}

/// A sum or max along axis `a`, kept with size 1 when `keep`.
fn reduce_axis(v: &Value, a: usize, keep: bool, sum: bool) -> Value {
    let mut dims = v.dims.clone();
    dims[a] = 1;
    let n: usize = dims.iter().product();
    let data = (0..n)
        .map(|f| {
            let mut index = unravel(f, &dims);
            let along = (0..v.dims[a]).map(|j| {
                index[a] = j;
                v.data[ravel(&index, &v.dims)]
            });
            if sum { along.sum() } else { along.fold(f64::NEG_INFINITY, f64::max) }
        })
        .collect();
    if !keep {
        dims.remove(a);
    }
    Value { dims, data }
}

/// `Slice` with unit steps: starts and ends clamped to each axis, negative ones from the end.
fn slice(x: &Value, starts: &[i64], ends: &[i64], axes: &[i64]) -> Value {
    let (mut dims, mut offsets) = (x.dims.clone(), vec![0; x.dims.len()]);
    for ((&s, &e), &a) in starts.iter().zip(ends).zip(axes) {
        let a = axis(a, x.dims.len());
        let size = x.dims[a] as i64;
        let clamp = |i: i64| (if i < 0 { i + size } else { i }).clamp(0, size) as usize;
        let (s, e) = (clamp(s), clamp(e));
        offsets[a] = s;
        dims[a] = e.saturating_sub(s);
    }
    gather(x, dims, |index| index.iter_mut().zip(&offsets).for_each(|(i, o)| *i += o))
}

/// `Transpose`: output dim `k` is input dim `perm[k]`.
fn transpose(x: &Value, perm: &[i64]) -> Value {
    let perm: Vec<usize> = perm.iter().map(|&p| p as usize).collect();
    let dims = perm.iter().map(|&p| x.dims[p]).collect();
    gather(x, dims, |index| {
        let mut source = vec![0; index.len()];
        for (k, &p) in perm.iter().enumerate() {
            source[p] = index[k];
        }
        *index = source;
    })
}

/// `Concat` along `axis`.
fn concat(parts: &[Value], a: i64) -> Value {
    let a = axis(a, parts[0].dims.len());
    let mut dims = parts[0].dims.clone();
    dims[a] = parts.iter().map(|p| p.dims[a]).sum();
    let n: usize = dims.iter().product();
    let data = (0..n)
        .map(|f| {
            let mut index = unravel(f, &dims);
            let mut k = 0;
            while index[a] >= parts[k].dims[a] {
                index[a] -= parts[k].dims[a];
                k += 1;
            }
            parts[k].data[ravel(&index, &parts[k].dims)]
        })
        .collect();
    Value { dims, data }
}

/// `Reshape`: 0 copies the input's dim (unless `allowzero`), -1 is inferred.
fn reshape(x: &Value, shape: &[i64], allowzero: bool) -> Value {
    let mut dims: Vec<i64> =
        shape.iter().enumerate().map(|(k, &d)| if d == 0 && !allowzero { x.dims[k] as i64 } else { d }).collect();
    if let Some(k) = dims.iter().position(|&d| d == -1) {
        let known: i64 = dims.iter().filter(|&&d| d != -1).product();
        dims[k] = x.data.len() as i64 / known;
    }
    let dims: Vec<usize> = dims.iter().map(|&d| usize::try_from(d).expect("a resolved dim")).collect();
    assert_eq!(dims.iter().product::<usize>(), x.data.len(), "Reshape of {:?} to {shape:?}", x.dims);
    Value { dims, data: x.data.clone() }
}

/// `Cast` to ONNX element type `to`: rounded as that type rounds.
fn cast(x: &Value, to: i64) -> Value {
    match proto::DataType::try_from(to as i32).unwrap() {
        proto::DataType::Double => x.clone(),
        proto::DataType::Float => x.map(|v| f64::from(v as f32)),
        proto::DataType::Float16 => x.map(|v| half::f16::from_f64(v).to_f64()),
        proto::DataType::Bfloat16 => x.map(|v| half::bf16::from_f64(v).to_f64()),
        other => panic!("no Cast to {other:?}"),
    }
}

fn attr<'a>(n: &'a NodeProto, name: &str) -> Option<&'a AttributeProto> {
    n.attribute.iter().find(|a| a.name == name)
}

/// Runs `nodes` over the values in `env`; `attrs` are the calling node's, inside a function.
fn run(model: &ModelProto, nodes: &[NodeProto], env: &mut HashMap<String, Value>, attrs: &[AttributeProto]) {
    for n in nodes {
        let x = |i: usize| env[&n.input[i]].clone();
        // An attribute of this node, with function attribute references resolved.
        let resolved = |name: &str| {
            attr(n, name).map(|a| match a.ref_attr_name.as_str() {
                "" => a.clone(),
                r => attrs.iter().find(|c| c.name == r).unwrap_or_else(|| panic!("no attribute {r}")).clone(),
            })
        };
        let out = if n.domain.is_empty() {
            match n.op_type.as_str() {
                "Add" => broadcast(&x(0), &x(1), |a, b| a + b),
                "Sub" => broadcast(&x(0), &x(1), |a, b| a - b),
                "Mul" => broadcast(&x(0), &x(1), |a, b| a * b),
                "Div" => broadcast(&x(0), &x(1), |a, b| a / b),
                "Neg" => x(0).map(|v| -v),
                "Relu" => x(0).map(|v| v.max(0.0)),
                "Sigmoid" => x(0).map(|v| 1.0 / (1.0 + (-v).exp())),
                "Gelu" => {
                    let approximate = resolved("approximate").map(|a| a.s).unwrap_or_default();
                    assert_eq!(approximate, b"tanh");
                    let c = (2.0 / std::f64::consts::PI).sqrt();
                    x(0).map(|v| 0.5 * v * (1.0 + (c * (v + 0.044715 * v * v * v)).tanh()))
                }
                "Softmax" => {
                    assert_eq!(resolved("axis").map(|a| a.i), Some(-1));
                    softmax_last(&x(0))
                }
                "MatMul" => matmul(&x(0), &x(1)),
                "ReduceSum" | "ReduceMax" if n.input.len() == 2 => {
                    let (v, axes) = (x(0), ints(&x(1)));
                    assert_eq!(axes.len(), 1, "one axis");
                    let a = axis(axes[0], v.dims.len());
                    let keep = resolved("keepdims").map_or(1, |k| k.i) == 1;
                    reduce_axis(&v, a, keep, n.op_type == "ReduceSum")
                }
                "Expand" => {
                    let shape: Vec<usize> = ints(&x(1)).iter().map(|&d| d as usize).collect();
                    let n_shape = shape.iter().product();
                    broadcast(&x(0), &Value { dims: shape, data: vec![0.0; n_shape] }, |a, _| a)
                }
                "Gather" => {
                    let (v, index) = (x(0), x(1));
                    let a = axis(resolved("axis").map_or(0, |k| k.i), v.dims.len());
                    let mut dims = v.dims[..a].to_vec();
                    dims.extend(&index.dims);
                    dims.extend(&v.dims[a + 1..]);
                    let r = index.dims.len();
                    gather(&v, dims, |ix| {
                        let picked = index.data[ravel(&ix[a..a + r], &index.dims)] as usize;
                        let mut source = ix[..a].to_vec();
                        source.push(picked);
                        source.extend(&ix[a + r..]);
                        *ix = source;
                    })
                }
                "GatherElements" => {
                    let (v, index) = (x(0), x(1));
                    let a = axis(resolved("axis").map_or(0, |k| k.i), v.dims.len());
                    gather(&v, index.dims.clone(), |ix| ix[a] = index.data[ravel(ix, &index.dims)] as usize)
                }
                "ReduceSum" | "ReduceMean" => {
                    assert_eq!(n.input.len(), 1, "reduce over all axes");
                    assert_eq!(resolved("keepdims").map(|a| a.i), Some(0));
                    let v = x(0);
                    let s: f64 = v.data.iter().sum();
                    Value::scalar(if n.op_type == "ReduceSum" { s } else { s / v.data.len() as f64 })
                }
                "Constant" => {
                    if let Some(a) = resolved("value_ints") {
                        Value { dims: vec![a.ints.len()], data: a.ints.iter().map(|&i| i as f64).collect() }
                    } else if let Some(a) = resolved("value") {
                        decode(a.t.as_ref().unwrap())
                    } else {
                        Value::scalar(f64::from(resolved("value_float").expect("a Constant value").f))
                    }
                }
                "CastLike" | "Identity" => x(0),
                "Slice" => {
                    assert!(n.input.len() == 4, "Slice with starts, ends and axes, unit steps");
                    slice(&x(0), &ints(&x(1)), &ints(&x(2)), &ints(&x(3)))
                }
                "Transpose" => transpose(&x(0), &resolved("perm").expect("a perm").ints),
                "Concat" => {
                    let parts: Vec<Value> = (0..n.input.len()).map(x).collect();
                    concat(&parts, resolved("axis").expect("an axis").i)
                }
                "Unsqueeze" => {
                    let (v, axes) = (x(0), ints(&x(1)));
                    // Axes index the output, of one more dim per axis.
                    let rank = v.dims.len() + axes.len();
                    let mut axes: Vec<usize> = axes.iter().map(|&a| axis(a, rank)).collect();
                    axes.sort();
                    let mut dims = v.dims.clone();
                    for a in axes {
                        dims.insert(a, 1);
                    }
                    Value { dims, data: v.data }
                }
                "Squeeze" => {
                    let v = x(0);
                    let mut axes: Vec<usize> = ints(&x(1)).iter().map(|&a| axis(a, v.dims.len())).collect();
                    axes.sort();
                    let mut dims = v.dims.clone();
                    for &a in axes.iter().rev() {
                        assert_eq!(dims.remove(a), 1, "Squeeze of axis {a} of {:?}", v.dims);
                    }
                    Value { dims, data: v.data }
                }
                "Reshape" => {
                    let allowzero = resolved("allowzero").is_some_and(|a| a.i == 1);
                    reshape(&x(0), &ints(&x(1)), allowzero)
                }
                "Cast" => cast(&x(0), resolved("to").expect("a target type").i),
                "SoftmaxCrossEntropyLoss" => {
                    assert_eq!(resolved("reduction").map(|a| a.s), Some(b"mean".to_vec()));
                    let (logits, labels) = (x(0), x(1));
                    let p = softmax_last(&logits);
                    let cols = logits.dims[1];
                    let rows = logits.dims[0];
                    Value::scalar(
                        (0..rows).map(|r| -p.data[r * cols + labels.data[r] as usize].ln()).sum::<f64>() / rows as f64,
                    )
                }
                other => panic!("the interpreter has no {other}"),
            }
        } else {
            let f: &FunctionProto = model
                .functions
                .iter()
                .find(|f| f.domain == n.domain && f.name == n.op_type)
                .unwrap_or_else(|| panic!("no function {}::{}", n.domain, n.op_type));
            let mut inner: HashMap<String, Value> =
                f.input.iter().zip(&n.input).map(|(p, a)| (p.clone(), env[a].clone())).collect();
            run(model, &f.node, &mut inner, &n.attribute);
            inner.remove(&f.output[0]).expect("the function's output")
        };
        env.insert(n.output[0].clone(), out);
    }
}

/// Runs the model's graph on `inputs`, returning every graph output by name.
fn interpret(model: &Model, inputs: &[(&str, Value)]) -> HashMap<String, Value> {
    let m = model.proto();
    let graph = m.graph.as_ref().unwrap();
    let mut env: HashMap<String, Value> = graph.initializer.iter().map(|t| (t.name.clone(), decode(t))).collect();
    for (name, v) in inputs {
        assert!(graph.input.iter().any(|i| i.name == *name), "no graph input {name}");
        env.insert(name.to_string(), v.clone());
    }
    run(m, &graph.node, &mut env, &[]);
    graph.output.iter().map(|o| (o.name.clone(), env[&o.name].clone())).collect()
}

fn value_of(t: &Tensor) -> Value {
    Value { dims: t.dims().to_vec(), data: t.to_vec_f64().unwrap() }
}

fn assert_close(got: &Value, want: &Tensor, rel: f64, what: &str) {
    let want = value_of(want);
    assert_eq!(got.dims, want.dims, "{what}: dims");
    let scale = want.data.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    assert!(scale > 0.0, "{what}: an all-zero reference proves nothing");
    for (k, (g, w)) in got.data.iter().zip(&want.data).enumerate() {
        assert!((g - w).abs() <= rel * scale, "{what}: element {k}: exported graph {g}, opsmith {w} (scale {scale})");
    }
}

fn constant(v: &[f64], dims: &[usize], dtype: DType) -> Var {
    Var::constant(tensor(v, dims, dtype, Device::Cpu).unwrap())
}

#[test]
fn an_mlp_exports_to_its_own_forward_for_every_activation_and_dtype() -> Result<()> {
    for activation in [Activation::Relu, Activation::Gelu, Activation::Silu] {
        for (dtype, rel) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            let mlp = Mlp::new(&Tape::new(), &[3, 6, 5, 2], activation, dtype, Device::Cpu, 11)?;
            let x = constant(&values(4 * 3, 5), &[4, 3], dtype);
            let mut tracer = Tracer::new("mlp")?;
            tracer.input("x", &x)?;
            for (name, p) in mlp.named_parameters() {
                tracer.name(&p, &name)?;
            }
            let y = mlp.forward(&x)?;
            tracer.output("y", &y)?;
            let model = tracer.finish()?;
            let graph = model.proto().graph.as_ref().unwrap();
            let names: Vec<&str> = graph.initializer.iter().map(|t| t.name.as_str()).collect();
            assert_eq!(
                names,
                [
                    "layers.0.weight",
                    "layers.0.bias",
                    "layers.1.weight",
                    "layers.1.bias",
                    "layers.2.weight",
                    "layers.2.bias"
                ]
            );
            assert!(graph.initializer.iter().all(|t| t.data_type == if dtype == DType::F64 { 11 } else { 1 }));
            let out = interpret(&model, &[("x", value_of(x.value()))]);
            assert_close(&out["y"], y.value(), rel, &format!("{activation:?} {dtype:?}"));
        }
    }
    Ok(())
}

/// `y = x³`, with the ONNX function given (or none).
struct Cube {
    function: Option<Function>,
}

impl Cube {
    fn with_function() -> Cube {
        let f = Function::new("com.example", "Cube", &["x"], "y").node("Mul", &["x", "x"], "x2").node(
            "Mul",
            &["x2", "x"],
            "y",
        );
        Cube { function: Some(f) }
    }
}

impl CustomOp for Cube {
    fn name(&self) -> &'static str {
        "cube"
    }
    fn num_inputs(&self) -> usize {
        1
    }
    fn cpu_forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        Ok(host::mul(&host::mul(inputs[0], inputs[0])?, inputs[0])?)
    }
    fn cpu_backward(&self, inputs: &[&Tensor], _: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(host::mul(grad, &host::scale(&host::mul(inputs[0], inputs[0])?, 3.0)?)?)])
    }
    fn onnx_function(&self) -> Option<Function> {
        self.function.clone()
    }
}

#[test]
fn fused_ops_custom_ops_and_losses_export_with_their_functions() -> Result<()> {
    let dtype = DType::F64;
    let (rows, cols) = (3, 4);
    let a = constant(&values(rows * cols, 1), &[rows, cols], dtype);
    let b = constant(&values(rows * cols, 2), &[rows, cols], dtype);
    let c = constant(&values(rows * cols, 3), &[rows, cols], dtype);
    let mask = constant(&[0.0, f64::NEG_INFINITY, 0.0, 0.0], &[cols], dtype);
    let labels = Labels::new(&[3, 0, 1], Device::Cpu)?;
    let cube: Arc<dyn CustomOp> = Arc::new(Cube::with_function());

    // Traced under a tape: recording gradients does not change what is exported.
    let tape = Tape::new();
    let w = tape.var(tensor(&values(cols, 4), &[cols], dtype, Device::Cpu)?);
    let mut tracer = Tracer::new("everything")?;
    for (name, v) in [("a", &a), ("b", &b), ("c", &c)] {
        tracer.input(name, v)?;
    }
    tracer.name(&w, "w")?;
    let d = ops::fused_mul_add(&a, &b, &c)?;
    let z = ops::add_mul(&d, &c, &b)?;
    let masked = ops::softmax(&z, 0.5, Some(&mask))?;
    let scaled = ops::softmax(&z, 2.0, None)?;
    let plain = ops::softmax(&ops::neg(&z)?, 1.0, None)?;
    let cubed = custom(&cube, &[&ops::add_row(&ops::scale(&d, 0.25)?, &w)?])?;
    let ce = ops::cross_entropy(&ops::sub(&cubed, &ops::add_scalar(&plain, -0.5)?)?, &labels)?;
    let loss = ops::add(
        &ops::add(&ce, &ops::mse_loss(&masked, &scaled)?)?,
        &ops::mean(&ops::div(&z, &ops::add_scalar(&ops::mul(&z, &z)?, 1.0)?)?)?,
    )?;
    let total = ops::sum(&cubed)?;
    let _unused = ops::relu(&a)?; // recorded, but no output needs it
    for (name, v) in [("masked", &masked), ("loss", &loss), ("total", &total)] {
        tracer.output(name, v)?;
    }
    let model = tracer.finish()?;

    let proto = model.proto();
    let functions: Vec<(&str, &str)> = proto.functions.iter().map(|f| (f.domain.as_str(), f.name.as_str())).collect();
    assert_eq!(
        functions,
        [
            (OPSMITH_DOMAIN, "FusedMulAdd"),
            (OPSMITH_DOMAIN, "AddMul"),
            (OPSMITH_DOMAIN, "ScaledMaskedSoftmax"),
            (OPSMITH_DOMAIN, "ScaledSoftmax"),
            ("com.example", "Cube")
        ]
    );
    let opsets: Vec<(&str, i64)> = proto.opset_import.iter().map(|o| (o.domain.as_str(), o.version)).collect();
    assert_eq!(opsets, [("", OPSET), (OPSMITH_DOMAIN, 1), ("com.example", 1)]);
    assert!(!model.op_types().contains(&"Relu"), "the unused relu was exported: {:?}", model.op_types());
    let graph = proto.graph.as_ref().unwrap();
    let inputs: Vec<&str> = graph.input.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(inputs, ["a", "b", "c", "labels"]);
    let initializers: Vec<&str> = graph.initializer.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(initializers, ["initializer_0", "w"]); // the mask, then w

    let mut feeds: Vec<(&str, Value)> =
        [("a", &a), ("b", &b), ("c", &c)].map(|(n, v)| (n, value_of(v.value()))).to_vec();
    feeds.push(("labels", Value { dims: vec![rows], data: vec![3.0, 0.0, 1.0] }));
    let out = interpret(&model, &feeds);
    assert_close(&out["masked"], masked.value(), 1e-12, "masked softmax");
    assert_close(&out["loss"], loss.value(), 1e-12, "loss");
    assert_close(&out["total"], total.value(), 1e-12, "total");
    // The exported graph is what ran: backward still works on the tape.
    assert!(tape.backward(&loss)?.get(&w).is_some());
    Ok(())
}

/// `attention` exports as its composed graph (`Transpose`, `MatMul`, the softmax, `MatMul`), with
/// the causal mask as a `Constant` and the caller's as an initializer, and computes what opsmith
/// computes, for every combination of the two masks.
#[test]
fn attention_exports_to_its_composed_graph() -> Result<()> {
    let dtype = DType::F64;
    let (b, h, sq, sk, d) = (2, 2, 3, 5, 4);
    let mask = common::attention_mask(&tensor(&[0.0], &[1], dtype, Device::Cpu)?)?;
    for (causal, masked) in [(false, false), (true, false), (false, true), (true, true)] {
        let q = constant(&values(b * h * sq * d, 1), &[b, h, sq, d], dtype);
        let k = constant(&values(b * h * sk * d, 2), &[b, h, sk, d], dtype);
        let v = constant(&values(b * h * sk * d, 3), &[b, h, sk, d], dtype);
        let mut tracer = Tracer::new("attention")?;
        for (name, x) in [("q", &q), ("k", &k), ("v", &v)] {
            tracer.input(name, x)?;
        }
        let y = ops::attention(&q, &k, &v, 0.5, causal, masked.then_some(&mask))?;
        tracer.output("y", &y)?;
        let model = tracer.finish()?;
        let what = format!("causal {causal} masked {masked}");
        let mut expected = vec!["Transpose", "MatMul"];
        if causal {
            expected.push("Constant");
            if masked {
                expected.push("Add");
            }
        }
        expected.extend([if causal || masked { "ScaledMaskedSoftmax" } else { "ScaledSoftmax" }, "MatMul"]);
        assert_eq!(model.op_types(), expected, "{what}");
        let initializers = model.proto().graph.as_ref().unwrap().initializer.len();
        assert_eq!(initializers, usize::from(masked), "{what}: the mask is the one initializer");
        let feeds = [("q", value_of(q.value())), ("k", value_of(k.value())), ("v", value_of(v.value()))];
        let out = interpret(&model, &feeds);
        assert_close(&out["y"], y.value(), 1e-12, &what);
    }
    Ok(())
}

#[test]
fn models_round_trip_through_bytes_and_files() -> Result<()> {
    let x = constant(&values(6, 9), &[2, 3], DType::F32);
    let k = constant(&values(3, 10), &[3], DType::F16);
    let mut tracer = Tracer::new("round_trip")?.dynamic_batch("n");
    tracer.input("x", &x)?;
    let y = ops::gelu(&ops::add_row(&x, &Var::constant(k.value().to_dtype(DType::F32)?))?)?;
    tracer.output("y", &y)?;
    let model = tracer.finish()?;
    let bytes = model.to_bytes();
    assert_eq!(Model::from_bytes(&bytes)?, model);
    let path = std::env::temp_dir().join(format!("opsmith-onnx-{}/model.onnx", std::process::id()));
    model.save(&path)?;
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();

    // The batch is symbolic on the input; the output's dims are left to the runtime.
    use proto::tensor_shape_proto::dimension::Value as Dim;
    let graph = model.proto().graph.as_ref().unwrap();
    let dims = |v: &proto::ValueInfoProto| match &v.r#type.as_ref().unwrap().value {
        Some(proto::type_proto::Value::TensorType(t)) => {
            t.shape.as_ref().unwrap().dim.iter().map(|d| d.value.clone()).collect::<Vec<_>>()
        }
        None => panic!("no tensor type"),
    };
    assert_eq!(dims(&graph.input[0]), [Some(Dim::DimParam("n".into())), Some(Dim::DimValue(3))]);
    assert_eq!(dims(&graph.output[0]), [None, None]);
    assert!(matches!(Model::from_bytes(&[0xff, 0xff]), Err(Error::Export { .. })));
    Ok(())
}

fn export_message(result: Result<Model>) -> String {
    match result {
        Err(e @ Error::Export { .. }) => e.to_string(),
        Err(e) => panic!("expected an export error, got {e}"),
        Ok(_) => panic!("expected an export error, got a model"),
    }
}

#[test]
fn export_errors_name_the_op_or_the_name() -> Result<()> {
    let x = constant(&values(4, 1), &[4], DType::F32);

    // A custom op without a decomposition.
    let opaque: Arc<dyn CustomOp> = Arc::new(Cube { function: None });
    let mut tracer = Tracer::new("g")?;
    tracer.input("x", &x)?;
    tracer.output("y", &custom(&opaque, &[&x])?)?;
    let message = export_message(tracer.finish());
    assert!(message.contains("`cube`") && message.contains("onnx_function"), "{message}");

    // One tracer per thread; dropping it stops its recording.
    let first = Tracer::new("first")?;
    assert!(matches!(Tracer::new("second"), Err(Error::Export { .. })));
    drop(first);
    let mut tracer = Tracer::new("third")?;

    // Names: empty, or used twice.
    assert!(matches!(tracer.input("", &x), Err(Error::Export { .. })));
    tracer.input("x", &x)?;
    let message = tracer.output("x", &x).unwrap_err().to_string();
    assert!(message.contains("`x`") && message.contains("already used"), "{message}");

    // An output no recorded op computed, and an input computed by one.
    let outside = constant(&values(4, 2), &[4], DType::F32);
    tracer.output("y", &outside)?;
    let message = export_message(tracer.finish());
    assert!(message.contains("output `y`"), "{message}");
    let mut tracer = Tracer::new("g")?;
    let y = ops::relu(&x)?;
    assert!(matches!(tracer.input("y", &y), Err(Error::Export { .. })));
    drop(tracer);

    // A function that reads a value nothing defines, or takes the wrong number of inputs.
    let cases = [
        (Function::new("d", "F", &["x"], "y").node("Mul", &["x", "nothing"], "y"), "`nothing`"),
        (Function::new("d", "F", &["x", "z"], "y").node("Relu", &["x"], "y"), "1 inputs"),
        (Function::new("", "F", &["x"], "y").node("Relu", &["x"], "y"), "domain"),
        (Function::new("d", "F", &["x"], "y").node("Relu", &["x"], "r"), "output `y`"),
    ];
    for (function, expected) in cases {
        let op: Arc<dyn CustomOp> = Arc::new(Cube { function: Some(function) });
        let mut tracer = Tracer::new("g")?;
        tracer.input("x", &x)?;
        tracer.output("y", &custom(&op, &[&x])?)?;
        let message = export_message(tracer.finish());
        assert!(message.contains("`cube`") && message.contains(expected), "{message} lacks {expected}");
    }
    Ok(())
}

#[test]
fn nothing_is_recorded_without_a_tracer_or_on_other_threads() -> Result<()> {
    let x = constant(&values(4, 1), &[4], DType::F32);
    let before = ops::relu(&x)?; // before the tracer: not recorded
    let mut tracer = Tracer::new("g")?;
    tracer.input("x", &x)?;
    let elsewhere = std::thread::spawn({
        let x = x.value().clone();
        move || ops::neg(&Var::constant(x)).map(|v| v.value().clone())
    })
    .join()
    .unwrap()?;
    let y = ops::add(&before, &Var::constant(elsewhere))?;
    tracer.output("y", &y)?;
    let model = tracer.finish()?;
    assert_eq!(model.op_types(), ["Add"]); // `before` and the other thread's result are initializers
    assert_eq!(model.proto().graph.as_ref().unwrap().initializer.len(), 2);

    // Generated names step aside for the caller's.
    let mut tracer = Tracer::new("names")?;
    tracer.input("add_1", &x)?;
    tracer.name(&before, "initializer_0")?;
    let y = ops::add(&ops::add(&x, &before)?, &Var::constant(x.value().clone()))?;
    tracer.output("add_0", &y)?;
    let model = tracer.finish()?;
    let graph = model.proto().graph.as_ref().unwrap();
    let mut names: Vec<&str> = graph.node.iter().flat_map(|n| n.output.iter().map(String::as_str)).collect();
    names.extend(graph.initializer.iter().map(|t| t.name.as_str()));
    names.extend(graph.input.iter().map(|t| t.name.as_str()));
    assert_eq!(names, ["add_0_1", "add_0", "initializer_0", "initializer_0_1", "add_1"]);
    Ok(())
}

/// The value of the int64 `Constant` node named `name`.
fn constant_ints(model: &Model, name: &str) -> Vec<i64> {
    let graph = model.proto().graph.as_ref().unwrap();
    let node = graph.node.iter().find(|n| n.output[0] == name).unwrap_or_else(|| panic!("no node makes {name}"));
    assert_eq!(node.op_type, "Constant");
    attr(node, "value_ints").expect("value_ints").ints.clone()
}

/// The shape ops export as `Slice`, `Transpose`, `Concat`, `Unsqueeze`, `Squeeze`, `Reshape` and
/// `Cast`, and the exported graph computes exactly what opsmith computed: these ops only move
/// elements, or round them the same way.
#[test]
fn shape_ops_export_to_their_onnx_nodes() -> Result<()> {
    let x = constant(&values(24, 31), &[2, 3, 4], DType::F64);
    let w = constant(&values(6, 32), &[2, 3], DType::F64);
    // A parameter on a tape: recording gradients does not change what is exported.
    let tape = Tape::new();
    let b = tape.var(tensor(&values(6, 33), &[3, 2], DType::F32, Device::Cpu)?);
    let mut tracer = Tracer::new("shapes")?;
    tracer.input("x", &x)?;
    tracer.name(&w, "w")?;
    tracer.name(&b, "b")?;
    let n = x.narrow(2, 1, 2)?; // [2, 3, 2]
    let t = n.transpose(0, 2)?; // [2, 3, 2]
    let stacked = Var::stack(&[&n, &t], 1)?; // [2, 2, 3, 2]
    let u = w.unsqueeze(2)?; // [2, 3, 1]
    let joined = Var::cat(&[&n, &u, &t], 2)?; // [2, 3, 5]
    let flat = joined.permute(&[2, 0, 1])?.reshape([5, 6])?;
    let picked = flat.narrow(0, 1, 3)?.reshape([3, 3, 2])?.narrow(1, 2, 1)?.squeeze(1)?; // [3, 2]
    let scaled = ops::mul(&picked.to_dtype(DType::F32)?, &b)?; // in f32
    let back = ops::add(&scaled.to_dtype(DType::F64)?.reshape([6])?, &u.squeeze(2)?.reshape([6])?)?;
    for (name, v) in [("stacked", &stacked), ("flat", &flat), ("scaled", &scaled), ("back", &back)] {
        tracer.output(name, v)?;
    }
    let model = tracer.finish()?;

    let mut op_types = model.op_types();
    op_types.sort();
    op_types.dedup();
    let expected =
        ["Add", "Cast", "Concat", "Constant", "Mul", "Reshape", "Slice", "Squeeze", "Transpose", "Unsqueeze"];
    assert_eq!(op_types, expected);
    let graph = model.proto().graph.as_ref().unwrap();
    let by_type = |t: &'static str| graph.node.iter().filter(move |n| n.op_type == t);
    // The first narrow: columns 1..3 of dim 2.
    let first_slice = by_type("Slice").next().unwrap();
    let [starts, ends, axes] = [1, 2, 3].map(|k| constant_ints(&model, &first_slice.input[k]));
    assert_eq!((starts, ends, axes), (vec![1], vec![3], vec![2]));
    let perms: Vec<Vec<i64>> = by_type("Transpose").map(|n| attr(n, "perm").unwrap().ints.clone()).collect();
    assert_eq!(perms, [vec![2, 1, 0], vec![2, 0, 1]]);
    let casts: Vec<i64> = by_type("Cast").map(|n| attr(n, "to").unwrap().i).collect();
    assert_eq!(casts, [proto::DataType::Float as i64, proto::DataType::Double as i64]);
    // stack: one Unsqueeze per input onto the new axis, then a Concat along it.
    let stack_concat = by_type("Concat").find(|n| n.output[0] == "stacked").unwrap();
    assert_eq!(attr(stack_concat, "axis").unwrap().i, 1);
    assert_eq!(stack_concat.input.len(), 2);
    for part in &stack_concat.input {
        let unsqueeze = graph.node.iter().find(|n| &n.output[0] == part).unwrap();
        assert_eq!(unsqueeze.op_type, "Unsqueeze");
        assert_eq!(constant_ints(&model, &unsqueeze.input[1]), [1]);
    }
    let shapes: Vec<Vec<i64>> = by_type("Reshape").map(|n| constant_ints(&model, &n.input[1])).collect();
    assert_eq!(shapes, [vec![5, 6], vec![3, 3, 2], vec![6], vec![6]], "no dynamic batch: the traced shapes");

    let out = interpret(&model, &[("x", value_of(x.value()))]);
    for (name, v) in [("stacked", &stacked), ("flat", &flat), ("scaled", &scaled), ("back", &back)] {
        assert_close(&out[name], v.value(), 0.0, name);
    }
    assert!(tape.backward(&ops::sum(&back)?)?.get(&b).is_some());
    Ok(())
}

/// With a dynamic batch a reshape keeps the batch: its leading dim is written as 0 where the
/// reshape keeps that dim and as -1 where the batch folds into it. The model traced on a batch
/// of 2 then computes opsmith's forward on a batch of 5; the other shape ops need nothing.
#[test]
fn shape_ops_export_for_any_batch_size() -> Result<()> {
    fn forward(x: &Var) -> Result<[Var; 2]> {
        let batch = x.value().dims()[0];
        let rows = x.reshape([batch * 3, 4])?; // [B·3, 4]: -1
        let items = x.reshape([batch, 12])?; // [B, 12]: 0
        let halves = Var::stack(&[&items.narrow(1, 0, 6)?, &items.narrow(1, 6, 6)?], 1)?; // [B, 2, 6]
        let y = halves.transpose(1, 2)?.unsqueeze(0)?.squeeze(0)?.reshape([batch, 12])?;
        Ok([rows, y])
    }
    let trace = |dynamic: bool| -> Result<Model> {
        let x = constant(&values(24, 41), &[2, 3, 4], DType::F32);
        let tracer = Tracer::new("batch")?;
        let mut tracer = if dynamic { tracer.dynamic_batch("batch") } else { tracer };
        tracer.input("x", &x)?;
        let [rows, y] = forward(&x)?;
        tracer.output("rows", &rows)?;
        tracer.output("y", &y)?;
        tracer.finish()
    };
    let shapes = |model: &Model| -> Vec<Vec<i64>> {
        let graph = model.proto().graph.as_ref().unwrap();
        graph.node.iter().filter(|n| n.op_type == "Reshape").map(|n| constant_ints(model, &n.input[1])).collect()
    };
    assert_eq!(shapes(&trace(false)?), [vec![6, 4], vec![2, 12], vec![2, 12]]);
    let model = trace(true)?;
    assert_eq!(shapes(&model), [vec![-1, 4], vec![0, 12], vec![0, 12]]);

    let x5 = constant(&values(60, 42), &[5, 3, 4], DType::F32);
    let [rows, y] = forward(&x5)?;
    let out = interpret(&model, &[("x", value_of(x5.value()))]);
    assert_close(&out["rows"], rows.value(), 0.0, "rows, batch of 5");
    assert_close(&out["y"], y.value(), 0.0, "y, batch of 5");

    // A shape with a zero dim is written as traced, with allowzero (a plain 0 would copy).
    let empty = constant(&[], &[0, 3], DType::F32);
    let mut tracer = Tracer::new("empty")?.dynamic_batch("batch");
    tracer.input("x", &empty)?;
    tracer.output("y", &empty.reshape([3, 0])?)?;
    let model = tracer.finish()?;
    let reshape = &model.proto().graph.as_ref().unwrap().node[1];
    assert_eq!(attr(reshape, "allowzero").map(|a| a.i), Some(1));
    assert_eq!(constant_ints(&model, &reshape.input[1]), [3, 0]);
    assert_eq!(interpret(&model, &[("x", value_of(empty.value()))])["y"].dims, [3, 0]);
    Ok(())
}

/// Broadcasting binary ops, `broadcast_as`, sums and maxima along a dim, `index_select` and
/// `gather` export to Expand, ReduceSum/ReduceMax, Gather and GatherElements, and the graph
/// computes what opsmith did, at the traced batch and at another.
#[test]
fn index_ops_export_to_their_onnx_nodes() -> Result<()> {
    let x = constant(&values(12, 41), &[3, 4], DType::F64);
    let b = constant(&values(4, 42), &[4], DType::F64);
    let tokens = Tensor::from_vec(vec![2i64, 0, 2], [3], Device::Cpu)?;
    let picks = Tensor::from_vec(vec![1u32, 3, 0], [3, 1], Device::Cpu)?;
    let mut tracer = Tracer::new("indexing")?.dynamic_batch("batch");
    tracer.input("x", &x)?;
    tracer.name(&b, "b")?;
    let shifted = ops::add(&x, &b)?; // [3, 4] + [4], broadcast by ONNX's Add itself
    let wide = b.unsqueeze(0)?.broadcast_as([2, 4])?; // an explicit broadcast: Expand
    let column = shifted.sum_keepdim(1)?; // [3, 1]
    let scaled = ops::mul(&shifted, &column)?; // [3, 4] * [3, 1]
    let best = scaled.max(1)?; // [3]
    let table = ops::index_select(&scaled, 1, &tokens)?; // columns 2, 0, 2
    let picked = scaled.gather(1, &picks)?; // [3, 1]
    let totals = ops::sum_dim(&table, 0, false)?; // [3]
    for (name, v) in [("best", &best), ("table", &table), ("picked", &picked), ("totals", &totals), ("wide", &wide)] {
        tracer.output(name, v)?;
    }
    let model = tracer.finish()?;
    let mut op_types = model.op_types();
    op_types.sort();
    op_types.dedup();
    assert_eq!(
        op_types,
        ["Add", "Constant", "Expand", "Gather", "GatherElements", "Mul", "ReduceMax", "ReduceSum", "Unsqueeze"]
    );
    let graph = model.proto().graph.as_ref().unwrap();
    // One Expand, for the explicit broadcast: [1, 4] to [2, 4], the kept dim written as 1.
    let expands: Vec<Vec<i64>> =
        graph.node.iter().filter(|n| n.op_type == "Expand").map(|n| constant_ints(&model, &n.input[1])).collect();
    assert_eq!(expands, [vec![2, 1]]);
    let out = interpret(&model, &[("x", value_of(x.value()))]);
    for (name, v) in [("best", &best), ("table", &table), ("picked", &picked), ("totals", &totals), ("wide", &wide)] {
        assert_close(&out[name], v.value(), 1e-14, name);
    }
    Ok(())
}
