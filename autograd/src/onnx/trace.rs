//! What the ops tell a [`Tracer`](super::Tracer): a thread-local list of the ops run while one
//! is alive, with the ids of their input and output variables.
use crate::CustomOp;
use crate::tape::{Var, VarId};
use opsmith_host::{DType, Labels, Tensor};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Arc;

/// An op as recorded for export: which op, and the arguments that are not variables.
pub(crate) enum Traced {
    Add,
    Sub,
    Mul,
    Div,
    Scale(f64),
    AddScalar(f64),
    Sum,
    Mean,
    FusedMulAdd,
    AddMul,
    AddRow,
    Matmul,
    /// `x · w + b`, then a ReLU when `relu`.
    Linear {
        relu: bool,
    },
    /// `relu(x · w1 + b1) · w2 + b2`, inputs `x, w1, b1, w2, b2`.
    LinearReluLinear,
    Relu,
    Gelu,
    Silu,
    Softmax {
        scale: f64,
        masked: bool,
    },
    /// Inputs `q`, `k`, `v`, and the caller's mask when `masked`; `causal` holds
    /// `(seq_q, seq_k)`, the size of the causal mask to add.
    Attention {
        scale: f64,
        causal: Option<(usize, usize)>,
        masked: bool,
    },
    CrossEntropy(Labels),
    MseLoss,
    /// Elements `start..start + len` along `dim`.
    Narrow {
        dim: usize,
        start: usize,
        len: usize,
    },
    /// `transpose` too: dim `k` of the output is dim `order[k]` of the input.
    Permute(Vec<usize>),
    /// Along this dim.
    Cat(usize),
    /// Along this new dim.
    Stack(usize),
    Squeeze(usize),
    Unsqueeze(usize),
    /// The input's dims and the output's: a dynamic batch needs both to write the shape.
    Reshape {
        from: Vec<usize>,
        to: Vec<usize>,
    },
    ToDtype(DType),
    /// The input's dims and the output's (`Expand` keeps a dim the input already has).
    BroadcastAs {
        from: Vec<usize>,
        to: Vec<usize>,
    },
    SumDim {
        dim: usize,
        keepdim: bool,
    },
    MaxDim {
        dim: usize,
        keepdim: bool,
    },
    /// Along this dim, with the i64 index as the second input.
    IndexSelect(usize),
    /// Along this dim, with the i64 index as the second input.
    Gather(usize),
    Custom(Arc<dyn CustomOp>),
}

/// One recorded op.
pub(crate) struct TracedNode {
    pub(crate) op: Traced,
    pub(crate) inputs: Vec<VarId>,
    pub(crate) output: VarId,
}

/// The shape and dtype of a value (graph outputs are declared with them).
#[derive(Clone, Debug)]
pub(crate) struct Meta {
    pub(crate) dims: Vec<usize>,
    pub(crate) dtype: DType,
}

/// Everything recorded since the tracer started.
#[derive(Default)]
pub(crate) struct Recording {
    pub(crate) nodes: Vec<TracedNode>,
    /// The value of every variable an op read that no recorded op produced: the graph's inputs
    /// and initializers (parameters, constants) come from here.
    pub(crate) leaves: HashMap<VarId, Tensor>,
    /// The shape and dtype of every op's output.
    pub(crate) produced: HashMap<VarId, Meta>,
}

thread_local! {
    // A flag apart from the recording, so an op pays one thread-local read when nothing traces.
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
    static RECORDING: RefCell<Recording> = RefCell::default();
}

/// Starts recording on this thread; `false` if a recording is already running.
pub(crate) fn start() -> bool {
    if ACTIVE.with(Cell::get) {
        return false;
    }
    RECORDING.with_borrow_mut(|r| *r = Recording::default());
    ACTIVE.with(|a| a.set(true));
    true
}

/// Stops recording and returns what was recorded.
pub(crate) fn stop() -> Recording {
    ACTIVE.with(|a| a.set(false));
    RECORDING.with_borrow_mut(std::mem::take)
}

/// Whether a tracer records on this thread.
pub(crate) fn active() -> bool {
    ACTIVE.with(Cell::get)
}

/// Whether a recorded op computed the variable `id`.
pub(crate) fn produced(id: VarId) -> bool {
    RECORDING.with_borrow(|r| r.produced.contains_key(&id))
}

/// Records that `op` read `inputs` and produced `output`, when a tracer is recording.
pub(crate) fn note(op: impl FnOnce() -> Traced, inputs: &[&Var], output: &Var) {
    if !active() {
        return;
    }
    RECORDING.with_borrow_mut(|r| {
        for v in inputs {
            if !r.produced.contains_key(&v.id()) {
                r.leaves.entry(v.id()).or_insert_with(|| v.value().clone());
            }
        }
        let value = output.value();
        r.produced.insert(output.id(), Meta { dims: value.dims().to_vec(), dtype: value.dtype() });
        r.nodes.push(TracedNode { op: op(), inputs: inputs.iter().map(|v| v.id()).collect(), output: output.id() });
    });
}
