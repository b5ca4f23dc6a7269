//! ONNX export: record a forward pass with a [`Tracer`], get a [`Model`] that onnxruntime (or
//! any ONNX runtime) runs.
//!
//! * Built-in ops map to standard ONNX ops (opset [`OPSET`]): `matmul` → `MatMul`, `add_row` →
//!   `Add` (broadcast), `gelu` → `Gelu` with `approximate="tanh"`, `silu` → `Sigmoid`, `Mul`,
//!   `cross_entropy` → `SoftmaxCrossEntropyLoss`, `sum`/`mean` → `ReduceSum`/`ReduceMean`, …
//! * `attention` → `Transpose` of `k`, `MatMul`, the softmax as for `softmax` (its mask the
//!   caller's mask, a `Constant` causal mask, or both added), `MatMul`: the composed graph.
//! * Shape ops: `narrow` → `Slice`, `transpose`/`permute` → `Transpose`, `cat` → `Concat`,
//!   `stack` → an `Unsqueeze` per input and a `Concat`, `squeeze`/`unsqueeze` →
//!   `Squeeze`/`Unsqueeze`, `reshape` → `Reshape`, `to_dtype` → `Cast`. Their indices, axes and
//!   shapes are int64 `Constant` nodes holding the traced values (see [`Tracer::dynamic_batch`]
//!   for `Reshape`'s leading dim).
//! * Fused ops (`fused_mul_add`, `add_mul`, `softmax` with a scale or a mask) become nodes of the
//!   [`OPSMITH_DOMAIN`] domain, and a [`CustomOp`](crate::CustomOp) a node of the domain its
//!   [`CustomOp::onnx_function`](crate::CustomOp::onnx_function) names. Each such op type comes
//!   with a model-local ONNX function that spells it out in standard ops: runtimes that know
//!   the op can keep the node, others (onnxruntime) inline the function.
//! * Parameters and other constants become initializers, in their dtype (f32, f16, bf16, f64).
//!
//! The protobuf messages are prost structs with ONNX's field numbers, in [`proto`].
//!
//! ```
//! # fn main() -> opsmith_autograd::Result<()> {
//! use opsmith_autograd::nn::{Activation, Mlp};
//! use opsmith_autograd::{Var, onnx::Tracer};
//! use opsmith_host::{DType, Device, Tensor};
//! let mlp = Mlp::new(&opsmith_autograd::Tape::new(), &[4, 8, 3], Activation::Gelu, DType::F32, Device::Cpu, 7)?;
//!
//! let mut tracer = Tracer::new("mlp")?.dynamic_batch("batch");
//! let x = Var::constant(Tensor::zeros([2, 4], DType::F32, Device::Cpu)?);
//! tracer.input("x", &x)?;
//! for (name, parameter) in mlp.named_parameters() {
//!     tracer.name(&parameter, &name)?;
//! }
//! tracer.output("y", &mlp.forward(&x)?)?;
//! let model = tracer.finish()?;
//! assert_eq!(model.op_types(), ["MatMul", "Add", "Gelu", "MatMul", "Add"]);
//! let bytes = model.to_bytes(); // or model.save("mlp.onnx")
//! # assert!(!bytes.is_empty());
//! # Ok(()) }
//! ```
pub mod proto;
pub(crate) mod trace;

use crate::tape::{Var, VarId};
use crate::{Error, Result};
use opsmith_host::{DType, Tensor};
use prost::Message;
use proto::{
    AttributeProto, AttributeType, DataType, FunctionProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
    TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use trace::{Meta, Traced};

/// The ONNX IR version written (ONNX 1.16 and newer read it; onnxruntime from 1.18).
pub const IR_VERSION: i64 = 10;
/// The standard opset the nodes use (21: `Gelu` needs 20 or newer).
pub const OPSET: i64 = 21;
/// The domain of opsmith's fused ops in an exported model.
pub const OPSMITH_DOMAIN: &str = "opsmith";

fn export_error(what: impl Into<String>, reason: impl Into<String>) -> Error {
    Error::Export { what: what.into(), reason: reason.into() }
}

/// An attribute of an ONNX node, for [`Function`] bodies.
///
/// ```
/// use opsmith_autograd::onnx::Attribute;
/// let axis = Attribute::int("axis", -1);
/// assert_eq!(axis.name(), "axis");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Attribute(AttributeProto);

impl Attribute {
    /// An integer attribute.
    pub fn int(name: &str, value: i64) -> Attribute {
        Attribute(AttributeProto {
            name: name.into(),
            r#type: AttributeType::Int as i32,
            i: value,
            ..Default::default()
        })
    }

    /// A float attribute.
    pub fn float(name: &str, value: f32) -> Attribute {
        Attribute(AttributeProto {
            name: name.into(),
            r#type: AttributeType::Float as i32,
            f: value,
            ..Default::default()
        })
    }

    /// A string attribute.
    pub fn string(name: &str, value: &str) -> Attribute {
        Attribute(AttributeProto {
            name: name.into(),
            r#type: AttributeType::String as i32,
            s: value.as_bytes().to_vec(),
            ..Default::default()
        })
    }

    /// A list of integers.
    pub fn ints(name: &str, values: &[i64]) -> Attribute {
        Attribute(AttributeProto {
            name: name.into(),
            r#type: AttributeType::Ints as i32,
            ints: values.to_vec(),
            ..Default::default()
        })
    }

    /// A scalar tensor, for a `Constant` node's `value`.
    fn tensor(name: &str, value: TensorProto) -> Attribute {
        Attribute(AttributeProto {
            name: name.into(),
            r#type: AttributeType::Tensor as i32,
            t: Some(value),
            ..Default::default()
        })
    }

    /// A float attribute whose value is the calling node's attribute `of` (inside a function).
    fn float_ref(name: &str, of: &str) -> Attribute {
        Attribute(AttributeProto {
            name: name.into(),
            ref_attr_name: of.into(),
            r#type: AttributeType::Float as i32,
            ..Default::default()
        })
    }

    /// The attribute's name.
    pub fn name(&self) -> &str {
        &self.0.name
    }
}

fn node(op_type: &str, inputs: &[&str], output: &str, attributes: Vec<Attribute>) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        op_type: op_type.into(),
        attribute: attributes.into_iter().map(|a| a.0).collect(),
        ..Default::default()
    }
}

/// What an op of a custom domain computes, spelled out in standard ONNX ops: a model-local ONNX
/// function, written next to the nodes that call it.
///
/// The function has the op's inputs, in order, and one output. Its body is nodes of the
/// standard domain (opset [`OPSET`]) in an order where each reads only the function's inputs
/// and earlier nodes' outputs. It has no types: onnxruntime instantiates it for the dtypes of
/// each call, so write constants with [`Function::constant_like`].
///
/// ```
/// use opsmith_autograd::onnx::Function;
/// // y = 3·x², for an op `Cube` of the domain `com.example`.
/// let f = Function::new("com.example", "ThreeXSquared", &["x"], "y")
///     .node("Mul", &["x", "x"], "x2")
///     .constant_like("three", 3.0, "x")
///     .node("Mul", &["three", "x2"], "y");
/// assert_eq!(f.op_type(), "ThreeXSquared");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    proto: FunctionProto,
}

impl Function {
    /// A function for nodes of `op_type` in `domain`, with these input names and output name.
    pub fn new(domain: &str, op_type: &str, inputs: &[&str], output: &str) -> Function {
        Function {
            proto: FunctionProto {
                name: op_type.into(),
                domain: domain.into(),
                input: inputs.iter().map(|s| s.to_string()).collect(),
                output: vec![output.into()],
                opset_import: vec![OperatorSetIdProto { domain: String::new(), version: OPSET }],
                ..Default::default()
            },
        }
    }

    /// Appends a standard ONNX node `op_type(inputs) -> output`.
    pub fn node(self, op_type: &str, inputs: &[&str], output: &str) -> Function {
        self.node_with(op_type, inputs, output, Vec::new())
    }

    /// Appends a standard ONNX node with attributes.
    pub fn node_with(mut self, op_type: &str, inputs: &[&str], output: &str, attributes: Vec<Attribute>) -> Function {
        self.proto.node.push(node(op_type, inputs, output, attributes));
        self
    }

    /// Appends `output = value`, a scalar of the dtype of the value named `like` (a `Constant`
    /// then a `CastLike`), so that the function works for every float dtype.
    pub fn constant_like(self, output: &str, value: f64, like: &str) -> Function {
        let raw = format!("{output}/f32");
        self.node_with("Constant", &[], &raw, vec![Attribute::float("value_float", value as f32)]).node(
            "CastLike",
            &[&raw, like],
            output,
        )
    }

    /// Appends `output`, a float tensor of shape `dims` holding `values` (row-major), in the
    /// dtype of the value named `like`. [`Error::Export`] at export if the counts differ.
    pub fn constant_tensor_like(self, output: &str, values: &[f64], dims: &[usize], like: &str) -> Function {
        let raw = format!("{output}/f32");
        let tensor = TensorProto {
            dims: dims.iter().map(|&d| d as i64).collect(),
            data_type: DataType::Float as i32,
            raw_data: values.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect(),
            ..Default::default()
        };
        self.node_with("Constant", &[], &raw, vec![Attribute::tensor("value", tensor)]).node(
            "CastLike",
            &[&raw, like],
            output,
        )
    }

    /// Appends `output`, a 1-D int64 tensor: axes, shapes, indices.
    pub fn constant_ints(self, output: &str, values: &[i64]) -> Function {
        self.node_with("Constant", &[], output, vec![Attribute::ints("value_ints", values)])
    }

    /// Declares an attribute that the calling nodes set; body nodes refer to it by name.
    fn attribute(mut self, name: &str) -> Function {
        self.proto.attribute.push(name.into());
        self
    }

    /// The domain of the nodes that call it.
    pub fn domain(&self) -> &str {
        &self.proto.domain
    }

    /// The op type of the nodes that call it.
    pub fn op_type(&self) -> &str {
        &self.proto.name
    }

    /// Checks the function for an op `op` with `inputs` inputs.
    fn validate(&self, op: &str, inputs: usize) -> Result<()> {
        let what = format!("custom op `{op}` ({}::{})", self.domain(), self.op_type());
        let bad = |reason: String| Err(export_error(what.clone(), reason));
        if self.domain().is_empty() || self.domain() == "ai.onnx" {
            return bad("its function needs a domain of its own, not the standard one".into());
        }
        if self.op_type().is_empty() {
            return bad("its function has no op type".into());
        }
        if self.proto.input.len() != inputs {
            return bad(format!("the op has {inputs} inputs, its function {}", self.proto.input.len()));
        }
        let mut defined: HashSet<&str> = HashSet::new();
        for name in &self.proto.input {
            if name.is_empty() || !defined.insert(name) {
                return bad(format!("function input names must be distinct and non-empty: {:?}", self.proto.input));
            }
        }
        for n in &self.proto.node {
            for t in n.attribute.iter().filter_map(|a| a.t.as_ref()) {
                let count: i64 = t.dims.iter().product();
                if count.max(0) as usize * 4 != t.raw_data.len() {
                    return bad(format!("a constant of shape {:?} has {} values", t.dims, t.raw_data.len() / 4));
                }
            }
            if let Some(missing) = n.input.iter().find(|i| !i.is_empty() && !defined.contains(i.as_str())) {
                return bad(format!("node {} reads `{missing}` before anything defines it", n.op_type));
            }
            for out in &n.output {
                if !defined.insert(out) {
                    return bad(format!("`{out}` is defined twice"));
                }
            }
        }
        if !defined.contains(self.proto.output[0].as_str()) {
            return bad(format!("no node computes the output `{}`", self.proto.output[0]));
        }
        Ok(())
    }
}

/// opsmith's fused ops, as functions of the [`OPSMITH_DOMAIN`] domain.
fn builtin_function(op_type: &str) -> Function {
    let f = |inputs: &[&str]| Function::new(OPSMITH_DOMAIN, op_type, inputs, "y");
    match op_type {
        "FusedMulAdd" => f(&["a", "b", "c"]).node("Mul", &["a", "b"], "ab").node("Add", &["ab", "c"], "y"),
        "AddMul" => f(&["x", "y_in", "w"]).node("Add", &["x", "y_in"], "sum").node("Mul", &["sum", "w"], "y"),
        "ScaledSoftmax" | "ScaledMaskedSoftmax" => {
            let masked = op_type == "ScaledMaskedSoftmax";
            let mut g = f(if masked { &["x", "mask"] } else { &["x"] })
                .attribute("scale")
                .node_with("Constant", &[], "scale_f32", vec![Attribute::float_ref("value_float", "scale")])
                .node("CastLike", &["scale_f32", "x"], "scale")
                .node("Mul", &["x", "scale"], "scaled");
            let logits = if masked {
                g = g.node("Add", &["scaled", "mask"], "masked");
                "masked"
            } else {
                "scaled"
            };
            g.node_with("Softmax", &[logits], "y", vec![Attribute::int("axis", -1)])
        }
        _ => unreachable!("not a fused op: {op_type}"),
    }
}

fn data_type(dtype: DType) -> DataType {
    match dtype {
        DType::F32 => DataType::Float,
        DType::F16 => DataType::Float16,
        DType::BF16 => DataType::Bfloat16,
        DType::F64 => DataType::Double,
        DType::U32 => DataType::Uint32,
        DType::I64 => DataType::Int64,
    }
}

/// The tensor's values as a `TensorProto` (read back to the host if on a GPU).
fn tensor_proto(name: &str, t: &Tensor) -> Result<TensorProto> {
    let raw_data = match t.dtype() {
        DType::F64 => t.to_vec::<f64>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::F32 => t.to_vec::<f32>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::F16 => t.to_vec::<half::f16>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::BF16 => t.to_vec::<half::bf16>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::U32 => t.to_vec::<u32>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::I64 => t.to_vec::<i64>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
    };
    Ok(TensorProto {
        dims: t.dims().iter().map(|&d| d as i64).collect(),
        data_type: data_type(t.dtype()) as i32,
        name: name.into(),
        raw_data,
        ..Default::default()
    })
}

/// A scalar of `dtype` (shape `[]`) holding `value`, rounded to the dtype.
fn scalar_proto(value: f64, dtype: DType) -> TensorProto {
    let raw_data = match dtype {
        DType::F64 => value.to_le_bytes().to_vec(),
        DType::F32 => (value as f32).to_le_bytes().to_vec(),
        DType::F16 => half::f16::from_f64(value).to_le_bytes().to_vec(),
        DType::BF16 => half::bf16::from_f64(value).to_le_bytes().to_vec(),
        DType::U32 => (value.round() as u32).to_le_bytes().to_vec(),
        DType::I64 => (value.round() as i64).to_le_bytes().to_vec(),
    };
    TensorProto { data_type: data_type(dtype) as i32, raw_data, ..Default::default() }
}

/// A `Constant` node holding a 1-D int64 tensor: indices, axes, a shape.
fn ints_constant(name: &str, values: &[i64]) -> NodeProto {
    node("Constant", &[], name, vec![Attribute::ints("value_ints", values)])
}

/// The `shape` input of a `Reshape` from dims `from` to dims `to`, and whether the node needs
/// `allowzero` (set when `to` has a zero dim, which a plain 0 would copy from the input
/// instead). With a dynamic batch the leading dim is 0 (copied) or -1 (inferred): see
/// [`Tracer::dynamic_batch`].
fn reshape_target(from: &[usize], to: &[usize], dynamic_batch: bool) -> (Vec<i64>, bool) {
    let mut shape: Vec<i64> = to.iter().map(|&d| d as i64).collect();
    if to.contains(&0) {
        return (shape, true);
    }
    if dynamic_batch && !from.is_empty() && !to.is_empty() {
        shape[0] = if from[0] == to[0] { 0 } else { -1 };
    }
    (shape, false)
}

/// A dimension of a declared shape: fixed, symbolic, or unknown.
enum Dim {
    Fixed(usize),
    Named(String),
    Unknown,
}

fn value_info(name: &str, elem_type: DataType, dims: impl IntoIterator<Item = Dim>) -> ValueInfoProto {
    use proto::tensor_shape_proto::{Dimension, dimension::Value};
    let dim = dims
        .into_iter()
        .map(|d| Dimension {
            value: match d {
                Dim::Fixed(n) => Some(Value::DimValue(n as i64)),
                Dim::Named(s) => Some(Value::DimParam(s)),
                Dim::Unknown => None,
            },
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(proto::type_proto::Value::TensorType(proto::type_proto::Tensor {
                elem_type: elem_type as i32,
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Records the ops run on this thread while it lives, and writes them as an ONNX [`Model`].
///
/// Declare the graph's inputs with [`Tracer::input`] (variables you then pass to the ops), run
/// the forward pass, declare its outputs with [`Tracer::output`], and call [`Tracer::finish`].
/// Every other variable the recorded ops read becomes an initializer: parameters, constants.
/// Only the ops the outputs depend on are exported. Tracing works with or without a tape and
/// under [`crate::no_grad`]; the ops run as usual, on any device.
///
/// Labels passed to `cross_entropy` become int64 graph inputs named `labels`, `labels_1`, …
///
/// One tracer records per thread at a time; ops run on other threads are not recorded.
#[derive(Debug)]
pub struct Tracer {
    graph_name: String,
    batch: Option<String>,
    inputs: Vec<(String, VarId, Meta)>,
    outputs: Vec<(String, VarId)>,
    names: HashMap<VarId, String>,
    finished: bool,
    // Recording is per thread: the tracer must stay on the thread it started on.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Tracer {
    /// Starts recording the ops run on this thread; the model will be named `graph_name`.
    /// [`Error::Export`] if another tracer records on this thread.
    pub fn new(graph_name: &str) -> Result<Tracer> {
        if !trace::start() {
            return Err(export_error("Tracer::new", "another tracer is already recording on this thread"));
        }
        Ok(Tracer {
            graph_name: graph_name.into(),
            batch: None,
            inputs: Vec::new(),
            outputs: Vec::new(),
            names: HashMap::new(),
            finished: false,
            _not_send: std::marker::PhantomData,
        })
    }

    /// Declares the first dimension of every graph input as a symbolic size named `name`, so
    /// the model takes any batch size. The outputs' dimensions are then left unknown (shape
    /// inference in the runtime fills them in).
    ///
    /// A `reshape` then writes its leading dim so that the batch carries through: `0` (the
    /// input's leading dim) when the reshape keeps the leading dim's size, else `-1` (inferred
    /// from the element count), as in a flatten `[B, T, C]` → `[B·T, C]`. Both give the traced
    /// shape for the traced sizes; for other batch sizes they are right when the batch is the
    /// leading dim of both shapes and scales only the output's leading dim (a reshape that
    /// moves the batch elsewhere, such as `[B, 6]` → `[2, 3·B]`, exports for the traced batch
    /// only). A reshape to a shape with a zero dim is written as traced. The other shape ops
    /// write the traced values: a `narrow` along dim 0 keeps the traced rows.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Var, onnx::Tracer};
    /// use opsmith_host::{DType, Device, Tensor};
    /// let x = Var::constant(Tensor::zeros([2, 3, 4], DType::F32, Device::Cpu)?);
    /// let mut tracer = Tracer::new("flatten")?.dynamic_batch("batch");
    /// tracer.input("x", &x)?;
    /// tracer.output("rows", &x.reshape([6, 4])?)?; // written as [-1, 4]
    /// tracer.output("flat", &x.reshape([2, 12])?)?; // written as [0, 12]
    /// assert_eq!(tracer.finish()?.op_types(), ["Constant", "Reshape", "Constant", "Reshape"]);
    /// # Ok(()) }
    /// ```
    pub fn dynamic_batch(mut self, name: &str) -> Tracer {
        self.batch = Some(name.into());
        self
    }

    /// Declares `var` a graph input named `name`.
    pub fn input(&mut self, name: &str, var: &Var) -> Result<()> {
        self.check_new_name(name, "input")?;
        if trace::produced(var.id()) {
            return Err(export_error(
                format!("input `{name}`"),
                "it was computed by a recorded op; declare inputs before using them",
            ));
        }
        let meta = Meta { dims: var.value().dims().to_vec(), dtype: var.value().dtype() };
        self.inputs.push((name.into(), var.id(), meta));
        Ok(())
    }

    /// Names the initializer (a parameter, a constant) that `var` becomes; unnamed ones are
    /// called `initializer_0`, `initializer_1`, …
    pub fn name(&mut self, var: &Var, name: &str) -> Result<()> {
        self.check_new_name(name, "initializer")?;
        self.names.insert(var.id(), name.into());
        Ok(())
    }

    /// Declares `var`, computed while tracing, a graph output named `name`.
    pub fn output(&mut self, name: &str, var: &Var) -> Result<()> {
        self.check_new_name(name, "output")?;
        self.outputs.push((name.into(), var.id()));
        Ok(())
    }

    fn check_new_name(&self, name: &str, what: &str) -> Result<()> {
        let taken =
            self.inputs.iter().map(|(n, ..)| n).chain(self.outputs.iter().map(|(n, _)| n)).chain(self.names.values());
        if name.is_empty() {
            return Err(export_error(format!("{what} name"), "names must not be empty"));
        }
        if taken.into_iter().any(|n| n == name) {
            return Err(export_error(format!("{what} `{name}`"), "the name is already used"));
        }
        Ok(())
    }

    /// Stops recording and builds the model.
    pub fn finish(mut self) -> Result<Model> {
        self.finished = true;
        let recording = trace::stop();
        Lowering::new(&self, recording)?.run(&self)
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        if !self.finished {
            trace::stop();
        }
    }
}

/// Turns a recording into a graph.
struct Lowering {
    recording: trace::Recording,
    /// The name of each value of the graph so far.
    names: HashMap<VarId, String>,
    nodes: Vec<NodeProto>,
    initializers: Vec<TensorProto>,
    extra_inputs: Vec<ValueInfoProto>,
    functions: Vec<FunctionProto>,
    domains: Vec<String>,
    unnamed: usize,
    batch: Option<String>,
    /// The names the caller gave: generated names avoid them.
    reserved: HashSet<String>,
}

impl Lowering {
    fn new(tracer: &Tracer, recording: trace::Recording) -> Result<Lowering> {
        let mut names = HashMap::new();
        for (name, id, _) in &tracer.inputs {
            names.insert(*id, name.clone());
        }
        // An output takes its name where it is computed; a second name for one value is an
        // Identity node, added at the end.
        for (name, id) in &tracer.outputs {
            if !recording.produced.contains_key(id) && !names.contains_key(id) {
                return Err(export_error(
                    format!("output `{name}`"),
                    "it was not computed by an op recorded by this tracer (nor is it an input)",
                ));
            }
            names.entry(*id).or_insert_with(|| name.clone());
        }
        Ok(Lowering {
            recording,
            names,
            nodes: Vec::new(),
            initializers: Vec::new(),
            extra_inputs: Vec::new(),
            functions: Vec::new(),
            domains: Vec::new(),
            unnamed: 0,
            batch: tracer.batch.clone(),
            reserved: tracer
                .inputs
                .iter()
                .map(|(n, ..)| n.clone())
                .chain(tracer.outputs.iter().map(|(n, _)| n.clone()))
                .chain(tracer.names.values().cloned())
                .collect(),
        })
    }

    fn run(mut self, tracer: &Tracer) -> Result<Model> {
        // The nodes the outputs depend on, walking back from the end.
        let nodes = std::mem::take(&mut self.recording.nodes);
        let mut wanted: HashSet<VarId> = tracer.outputs.iter().map(|(_, id)| *id).collect();
        let mut keep = vec![false; nodes.len()];
        for (k, n) in nodes.iter().enumerate().rev() {
            if wanted.contains(&n.output) {
                keep[k] = true;
                wanted.extend(n.inputs.iter().copied());
            }
        }
        for (k, n) in nodes.iter().enumerate() {
            if !keep[k] {
                continue;
            }
            let inputs: Vec<String> = n.inputs.iter().map(|id| self.operand(*id, tracer)).collect::<Result<_>>()?;
            let output = match self.names.get(&n.output) {
                Some(name) => name.clone(),
                None => {
                    let name = self.fresh(format!("{}_{k}", lowered_name(&n.op)));
                    self.names.insert(n.output, name.clone());
                    name
                }
            };
            let dtype = self.recording.produced[&n.output].dtype;
            self.lower(&n.op, &inputs, &output, dtype)?;
        }
        let mut outputs = Vec::new();
        for (name, id) in &tracer.outputs {
            let value = &self.names[id];
            if value != name {
                self.nodes.push(node("Identity", &[value], name, Vec::new()));
            }
            let meta = match self.recording.produced.get(id) {
                Some(m) => m.clone(),
                None => {
                    tracer.inputs.iter().find(|(_, i, _)| i == id).map(|(.., m)| m.clone()).expect("checked in new")
                }
            };
            let dims = meta.dims.iter().map(|&d| if tracer.batch.is_some() { Dim::Unknown } else { Dim::Fixed(d) });
            outputs.push(value_info(name, data_type(meta.dtype), dims));
        }
        let mut inputs: Vec<ValueInfoProto> = tracer
            .inputs
            .iter()
            .map(|(name, _, meta)| {
                let dims = meta.dims.iter().enumerate().map(|(axis, &d)| match (&tracer.batch, axis) {
                    (Some(b), 0) => Dim::Named(b.clone()),
                    _ => Dim::Fixed(d),
                });
                value_info(name, data_type(meta.dtype), dims)
            })
            .collect();
        inputs.append(&mut self.extra_inputs);
        for (k, n) in self.nodes.iter_mut().enumerate() {
            n.name = format!("{}_{k}", n.op_type);
        }
        let mut opset_import = vec![OperatorSetIdProto { domain: String::new(), version: OPSET }];
        opset_import.extend(self.domains.iter().map(|d| OperatorSetIdProto { domain: d.clone(), version: 1 }));
        let graph = GraphProto {
            node: self.nodes,
            name: tracer.graph_name.clone(),
            initializer: self.initializers,
            input: inputs,
            output: outputs,
            ..Default::default()
        };
        Ok(Model {
            proto: ModelProto {
                ir_version: IR_VERSION,
                opset_import,
                producer_name: "opsmith".into(),
                producer_version: env!("CARGO_PKG_VERSION").into(),
                graph: Some(graph),
                functions: self.functions,
                ..Default::default()
            },
        })
    }

    /// `base`, or `base_1`, `base_2`, … if the caller named a value `base`: a generated name.
    /// (The values derived from it, `base/constant` and the like, inherit its uniqueness as
    /// long as the caller's names have no `/`.)
    fn fresh(&self, base: String) -> String {
        if !self.reserved.contains(&base) {
            return base;
        }
        (1..).map(|i| format!("{base}_{i}")).find(|n| !self.reserved.contains(n)).expect("an unbounded range")
    }

    /// The name of a value a node reads: an input, an earlier node's output, or an initializer
    /// (added on first use).
    fn operand(&mut self, id: VarId, tracer: &Tracer) -> Result<String> {
        if let Some(name) = self.names.get(&id) {
            return Ok(name.clone());
        }
        let Some(value) = self.recording.leaves.get(&id) else {
            return Err(export_error("trace", "an op read a value computed outside the tracer's recording"));
        };
        let name = match tracer.names.get(&id) {
            Some(n) => n.clone(),
            None => {
                self.unnamed += 1;
                self.fresh(format!("initializer_{}", self.unnamed - 1))
            }
        };
        self.initializers.push(tensor_proto(&name, value)?);
        self.names.insert(id, name.clone());
        Ok(name)
    }

    fn uses_domain(&mut self, domain: &str) {
        if !self.domains.iter().any(|d| d == domain) {
            self.domains.push(domain.into());
        }
    }

    /// Adds `function` to the model (once per op type) and a node calling it.
    fn call(&mut self, function: Function, inputs: &[String], output: &str, attributes: Vec<Attribute>) -> Result<()> {
        match self.functions.iter().find(|f| f.domain == function.proto.domain && f.name == function.proto.name) {
            Some(existing) if *existing != function.proto => {
                return Err(export_error(
                    format!("{}::{}", function.domain(), function.op_type()),
                    "two ops export functions of this name with different bodies",
                ));
            }
            Some(_) => {}
            None => self.functions.push(function.proto.clone()),
        }
        self.uses_domain(&function.proto.domain);
        let ins: Vec<&str> = inputs.iter().map(String::as_str).collect();
        let mut n = node(function.op_type(), &ins, output, attributes);
        n.domain = function.proto.domain;
        self.nodes.push(n);
        Ok(())
    }

    fn lower(&mut self, op: &Traced, inputs: &[String], output: &str, dtype: DType) -> Result<()> {
        let ins: Vec<&str> = inputs.iter().map(String::as_str).collect();
        let standard = |op_type: &str, attributes: Vec<Attribute>| node(op_type, &ins, output, attributes);
        let constant = |value: f64| {
            let name = format!("{output}/constant");
            (node("Constant", &[], &name, vec![Attribute::tensor("value", scalar_proto(value, dtype))]), name)
        };
        let reduce = |op_type: &str| standard(op_type, vec![Attribute::int("keepdims", 0)]);
        let new_nodes = match op {
            Traced::Add | Traced::AddRow => vec![standard("Add", vec![])],
            Traced::Sub => vec![standard("Sub", vec![])],
            Traced::Mul => vec![standard("Mul", vec![])],
            Traced::Div => vec![standard("Div", vec![])],
            Traced::Matmul => vec![standard("MatMul", vec![])],
            Traced::Linear { relu } => {
                let product = format!("{output}/matmul");
                let biased = if *relu { format!("{output}/biased") } else { output.to_string() };
                let mut nodes = vec![
                    node("MatMul", &ins[..2], &product, vec![]),
                    node("Add", &[product.as_str(), ins[2]], &biased, vec![]),
                ];
                if *relu {
                    nodes.push(node("Relu", &[&biased], output, vec![]));
                }
                nodes
            }
            Traced::LinearReluLinear => {
                let names = ["matmul", "biased", "hidden", "output_matmul"].map(|part| format!("{output}/{part}"));
                vec![
                    node("MatMul", &ins[..2], &names[0], vec![]),
                    node("Add", &[names[0].as_str(), ins[2]], &names[1], vec![]),
                    node("Relu", &[&names[1]], &names[2], vec![]),
                    node("MatMul", &[names[2].as_str(), ins[3]], &names[3], vec![]),
                    node("Add", &[names[3].as_str(), ins[4]], output, vec![]),
                ]
            }
            Traced::Relu => vec![standard("Relu", vec![])],
            Traced::Gelu => vec![standard("Gelu", vec![Attribute::string("approximate", "tanh")])],
            Traced::Sum => vec![reduce("ReduceSum")],
            Traced::Mean => vec![reduce("ReduceMean")],
            Traced::Scale(alpha) if *alpha == -1.0 => vec![standard("Neg", vec![])],
            Traced::Scale(alpha) => {
                let (c, name) = constant(*alpha);
                vec![c, node("Mul", &[ins[0], &name], output, vec![])]
            }
            Traced::AddScalar(beta) => {
                let (c, name) = constant(*beta);
                vec![c, node("Add", &[ins[0], &name], output, vec![])]
            }
            Traced::Silu => {
                let sigmoid = format!("{output}/sigmoid");
                vec![node("Sigmoid", &ins, &sigmoid, vec![]), node("Mul", &[ins[0], &sigmoid], output, vec![])]
            }
            Traced::MseLoss => {
                let (diff, square) = (format!("{output}/diff"), format!("{output}/square"));
                vec![
                    node("Sub", &ins, &diff, vec![]),
                    node("Mul", &[&diff, &diff], &square, vec![]),
                    node("ReduceMean", &[&square], output, vec![Attribute::int("keepdims", 0)]),
                ]
            }
            Traced::Softmax { scale, masked } => {
                if *scale == 1.0 && !masked {
                    vec![standard("Softmax", vec![Attribute::int("axis", -1)])]
                } else {
                    let op_type = if *masked { "ScaledMaskedSoftmax" } else { "ScaledSoftmax" };
                    return self.call(
                        builtin_function(op_type),
                        inputs,
                        output,
                        vec![Attribute::float("scale", *scale as f32)],
                    );
                }
            }
            Traced::Narrow { dim, start, len } => {
                let [starts, ends, axes] = ["starts", "ends", "axes"].map(|s| format!("{output}/{s}"));
                vec![
                    ints_constant(&starts, &[*start as i64]),
                    ints_constant(&ends, &[(start + len) as i64]),
                    ints_constant(&axes, &[*dim as i64]),
                    node("Slice", &[ins[0], &starts, &ends, &axes], output, vec![]),
                ]
            }
            Traced::Permute(order) => {
                let perm: Vec<i64> = order.iter().map(|&d| d as i64).collect();
                vec![standard("Transpose", vec![Attribute::ints("perm", &perm)])]
            }
            Traced::Cat(dim) => vec![standard("Concat", vec![Attribute::int("axis", *dim as i64)])],
            Traced::Stack(dim) => {
                let axes = format!("{output}/axes");
                let mut nodes = vec![ints_constant(&axes, &[*dim as i64])];
                let expanded: Vec<String> = (0..ins.len()).map(|k| format!("{output}/unsqueezed_{k}")).collect();
                for (x, e) in ins.iter().zip(&expanded) {
                    nodes.push(node("Unsqueeze", &[x, &axes], e, vec![]));
                }
                let parts: Vec<&str> = expanded.iter().map(String::as_str).collect();
                nodes.push(node("Concat", &parts, output, vec![Attribute::int("axis", *dim as i64)]));
                nodes
            }
            Traced::Squeeze(dim) | Traced::Unsqueeze(dim) => {
                let op_type = if matches!(op, Traced::Squeeze(_)) { "Squeeze" } else { "Unsqueeze" };
                let axes = format!("{output}/axes");
                vec![ints_constant(&axes, &[*dim as i64]), node(op_type, &[ins[0], &axes], output, vec![])]
            }
            Traced::Reshape { from, to } => {
                let name = format!("{output}/shape");
                let (shape, allowzero) = reshape_target(from, to, self.batch.is_some());
                let attributes = if allowzero { vec![Attribute::int("allowzero", 1)] } else { vec![] };
                vec![ints_constant(&name, &shape), node("Reshape", &[ins[0], &name], output, attributes)]
            }
            Traced::ToDtype(to) => vec![standard("Cast", vec![Attribute::int("to", data_type(*to) as i64)])],
            Traced::BroadcastAs { from, to } => {
                // 1 wherever the input already has the size: Expand keeps that dim as it is, so
                // a dynamic batch passes through.
                let offset = to.len() - from.len();
                let shape: Vec<i64> = to
                    .iter()
                    .enumerate()
                    .map(|(k, &t)| if k >= offset && from[k - offset] == t { 1 } else { t as i64 })
                    .collect();
                let name = format!("{output}/shape");
                vec![ints_constant(&name, &shape), node("Expand", &[ins[0], &name], output, vec![])]
            }
            Traced::SumDim { dim, keepdim } | Traced::MaxDim { dim, keepdim } => {
                let op_type = if matches!(op, Traced::SumDim { .. }) { "ReduceSum" } else { "ReduceMax" };
                let axes = format!("{output}/axes");
                vec![
                    ints_constant(&axes, &[*dim as i64]),
                    node(op_type, &[ins[0], &axes], output, vec![Attribute::int("keepdims", *keepdim as i64)]),
                ]
            }
            Traced::IndexSelect(dim) => vec![standard("Gather", vec![Attribute::int("axis", *dim as i64)])],
            Traced::Gather(dim) => vec![standard("GatherElements", vec![Attribute::int("axis", *dim as i64)])],
            Traced::FusedMulAdd => return self.call(builtin_function("FusedMulAdd"), inputs, output, vec![]),
            Traced::AddMul => return self.call(builtin_function("AddMul"), inputs, output, vec![]),
            Traced::Attention { scale, causal, masked } => {
                // Transpose and MatMul for the scores, the softmax as for `softmax`, a MatMul.
                let [k_t, scores, weights, causal_mask, mask] =
                    ["k_t", "scores", "weights", "causal_mask", "mask"].map(|s| format!("{output}/{s}"));
                self.nodes.push(node("Transpose", &[ins[1]], &k_t, vec![Attribute::ints("perm", &[0, 1, 3, 2])]));
                self.nodes.push(node("MatMul", &[ins[0], &k_t], &scores, vec![]));
                let mask = match causal {
                    None => masked.then(|| inputs[3].clone()),
                    Some((seq_q, seq_k)) => {
                        // 0 where key j <= query i, -inf after: a constant of the scores' dtype.
                        let values: Vec<f64> = (0..*seq_q)
                            .flat_map(|i| (0..*seq_k).map(move |j| if j > i { f64::NEG_INFINITY } else { 0.0 }))
                            .collect();
                        let t = Tensor::from_f64(&values, [*seq_q, *seq_k], dtype, opsmith_host::Device::Cpu)?;
                        let value = Attribute::tensor("value", tensor_proto(&causal_mask, &t)?);
                        self.nodes.push(node("Constant", &[], &causal_mask, vec![value]));
                        if *masked {
                            self.nodes.push(node("Add", &[ins[3], &causal_mask], &mask, vec![]));
                            Some(mask)
                        } else {
                            Some(causal_mask)
                        }
                    }
                };
                let softmax_inputs: Vec<String> = std::iter::once(scores).chain(mask.clone()).collect();
                self.lower(
                    &Traced::Softmax { scale: *scale, masked: mask.is_some() },
                    &softmax_inputs,
                    &weights,
                    dtype,
                )?;
                vec![node("MatMul", &[&weights, ins[2]], output, vec![])]
            }
            Traced::CrossEntropy(labels) => {
                let name = self.labels_name();
                let rows = match &self.batch {
                    Some(b) => Dim::Named(b.clone()),
                    None => Dim::Fixed(labels.len()),
                };
                self.extra_inputs.push(value_info(&name, DataType::Int64, [rows]));
                vec![node(
                    "SoftmaxCrossEntropyLoss",
                    &[ins[0], &name],
                    output,
                    vec![Attribute::string("reduction", "mean")],
                )]
            }
            Traced::Custom(custom) => {
                let Some(function) = custom.onnx_function() else {
                    return Err(export_error(
                        format!("custom op `{}`", custom.name()),
                        "it has no ONNX decomposition; implement CustomOp::onnx_function",
                    ));
                };
                function.validate(custom.name(), inputs.len())?;
                return self.call(function, inputs, output, vec![]);
            }
        };
        self.nodes.extend(new_nodes);
        Ok(())
    }

    /// A name for the next labels input: `labels`, `labels_1`, …
    fn labels_name(&self) -> String {
        let taken = |n: &str| {
            self.reserved.contains(n)
                || self.names.values().any(|v| v == n)
                || self.extra_inputs.iter().any(|v| v.name == n)
        };
        if !taken("labels") {
            return "labels".into();
        }
        (1..).map(|i| format!("labels_{i}")).find(|n| !taken(n)).expect("an unbounded range")
    }
}

/// The prefix of an op's intermediate value names.
fn lowered_name(op: &Traced) -> &'static str {
    match op {
        Traced::Add => "add",
        Traced::Sub => "sub",
        Traced::Mul => "mul",
        Traced::Div => "div",
        Traced::Scale(_) => "scale",
        Traced::AddScalar(_) => "add_scalar",
        Traced::Sum => "sum",
        Traced::Mean => "mean",
        Traced::FusedMulAdd => "fused_mul_add",
        Traced::AddMul => "add_mul",
        Traced::AddRow => "add_row",
        Traced::Matmul => "matmul",
        Traced::Linear { relu: false } => "linear",
        Traced::Linear { relu: true } => "linear_relu",
        Traced::LinearReluLinear => "linear_relu_linear",
        Traced::Relu => "relu",
        Traced::Gelu => "gelu",
        Traced::Silu => "silu",
        Traced::Softmax { .. } => "softmax",
        Traced::Attention { .. } => "attention",
        Traced::CrossEntropy(_) => "cross_entropy",
        Traced::MseLoss => "mse_loss",
        Traced::Narrow { .. } => "narrow",
        Traced::Permute(_) => "permute",
        Traced::Cat(_) => "cat",
        Traced::Stack(_) => "stack",
        Traced::Squeeze(_) => "squeeze",
        Traced::Unsqueeze(_) => "unsqueeze",
        Traced::Reshape { .. } => "reshape",
        Traced::ToDtype(_) => "to_dtype",
        Traced::BroadcastAs { .. } => "broadcast_as",
        Traced::SumDim { .. } => "sum_dim",
        Traced::MaxDim { .. } => "max_dim",
        Traced::IndexSelect(_) => "index_select",
        Traced::Gather(_) => "gather",
        Traced::Custom(op) => op.name(),
    }
}

/// An exported ONNX model.
#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    proto: ModelProto,
}

impl Model {
    /// The protobuf message, to inspect or change before writing.
    pub fn proto(&self) -> &ModelProto {
        &self.proto
    }

    /// The protobuf message, mutable.
    pub fn proto_mut(&mut self) -> &mut ModelProto {
        &mut self.proto
    }

    /// The graph's nodes' op types, in order.
    pub fn op_types(&self) -> Vec<&str> {
        self.graph().node.iter().map(|n| n.op_type.as_str()).collect()
    }

    fn graph(&self) -> &GraphProto {
        self.proto.graph.as_ref().expect("an exported model has a graph")
    }

    /// The model as protobuf bytes, the content of a `.onnx` file.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.proto.encode_to_vec()
    }

    /// Reads a model from protobuf bytes (fields opsmith does not write are skipped).
    pub fn from_bytes(bytes: &[u8]) -> Result<Model> {
        let proto = ModelProto::decode(bytes).map_err(|e| export_error("Model::from_bytes", e.to_string()))?;
        if proto.graph.is_none() {
            return Err(export_error("Model::from_bytes", "the model has no graph"));
        }
        Ok(Model { proto })
    }

    /// Writes the model to `path` (a `.onnx` file), creating parent directories.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let io = |e: std::io::Error| Error::ModelFile { path: path.display().to_string(), reason: e.to_string() };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        std::fs::write(path, self.to_bytes()).map_err(io)
    }
}
