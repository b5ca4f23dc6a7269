//! The tape: variables, recorded nodes, backward, and the no-grad switch.
use crate::{Error, Result};
use opsmith_host::{DType, Device, Shape, Tensor, ops};
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A variable's identity, the key of [`Gradients`].
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::Tape;
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![1.0f32], [1], Device::Cpu)?);
/// assert_eq!(x.clone().id(), x.id()); // clones are the same variable
/// assert_ne!(tape.var(x.value().clone()).id(), x.id()); // a new var of the same tensor is not
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VarId(u64);

impl VarId {
    fn fresh() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        VarId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// A tensor in a computation: either tracked by a [`Tape`] (it requires gradients) or a constant.
///
/// Cloning a `Var` is cheap and keeps its identity: both clones have the same gradient.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, Var, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let w = tape.var(Tensor::from_vec(vec![2.0f32], [1], Device::Cpu)?);
/// let k = Var::constant(Tensor::from_vec(vec![3.0f32], [1], Device::Cpu)?);
/// let loss = ops::mul(&w, &k)?;
/// let grads = tape.backward(&loss)?;
/// assert_eq!(grads.get(&w).unwrap().to_vec::<f32>()?, [3.0]);
/// assert!(grads.get(&k).is_none()); // constants get no gradient
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Var {
    value: Tensor,
    id: VarId,
    tape: Option<Tape>,
    leaf: bool,
}

impl std::fmt::Debug for Var {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Var({:?}, {:?}, requires_grad: {})", self.id, self.value, self.requires_grad())
    }
}

impl Var {
    /// A constant: ops on it record nothing for it, and it gets no gradient.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::Var;
    /// use opsmith_host::{Device, Tensor};
    /// let c = Var::constant(Tensor::from_vec(vec![1.0f32], [1], Device::Cpu)?);
    /// assert!(!c.requires_grad() && c.tape().is_none());
    /// # Ok(()) }
    /// ```
    pub fn constant(value: Tensor) -> Var {
        Var { value, id: VarId::fresh(), tape: None, leaf: true }
    }

    /// The value.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, ops};
    /// use opsmith_host::{Device, Tensor};
    /// let tape = Tape::new();
    /// let x = tape.var(Tensor::from_vec(vec![1.5f32], [1], Device::Cpu)?);
    /// assert_eq!(ops::scale(&x, 2.0)?.value().to_vec::<f32>()?, [3.0]);
    /// # Ok(()) }
    /// ```
    pub fn value(&self) -> &Tensor {
        &self.value
    }

    /// The identity, as used by [`Gradients`].
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::Tape;
    /// use opsmith_host::{Device, Tensor};
    /// let tape = Tape::new();
    /// let t = Tensor::from_vec(vec![1.0f32], [1], Device::Cpu)?;
    /// let (a, b) = (tape.var(t.clone()), tape.var(t));
    /// assert_ne!(a.id(), b.id()); // two variables, one tensor
    /// # Ok(()) }
    /// ```
    pub fn id(&self) -> VarId {
        self.id
    }

    /// Whether gradients flow to this variable.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, Var, no_grad, ops};
    /// use opsmith_host::{Device, Tensor};
    /// let tape = Tape::new();
    /// let x = tape.var(Tensor::from_vec(vec![1.0f32], [1], Device::Cpu)?);
    /// assert!(x.requires_grad());
    /// assert!(ops::neg(&x)?.requires_grad());
    /// let _off = no_grad();
    /// assert!(!ops::neg(&x)?.requires_grad());
    /// assert!(!Var::constant(x.value().clone()).requires_grad());
    /// # Ok(()) }
    /// ```
    pub fn requires_grad(&self) -> bool {
        self.tape.is_some()
    }

    /// Whether the variable was created by [`Tape::var`] rather than computed by an op.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, ops};
    /// use opsmith_host::{Device, Tensor};
    /// let tape = Tape::new();
    /// let x = tape.var(Tensor::from_vec(vec![1.0f32], [1], Device::Cpu)?);
    /// assert!(x.is_leaf());
    /// assert!(!ops::add(&x, &x)?.is_leaf());
    /// # Ok(()) }
    /// ```
    pub fn is_leaf(&self) -> bool {
        self.leaf
    }

    /// The tape that tracks this variable, if any.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, ops};
    /// use opsmith_host::{Device, Tensor};
    /// let tape = Tape::new();
    /// let x = tape.var(Tensor::from_vec(vec![1.0f32], [1], Device::Cpu)?);
    /// let y = ops::mul(&x, &x)?;
    /// assert_eq!(y.tape().map(|t| t.len()), Some(1)); // the same tape, holding the mul
    /// # Ok(()) }
    /// ```
    pub fn tape(&self) -> Option<&Tape> {
        self.tape.as_ref()
    }
}

/// What backward needs of one recorded op. `Fn`, not `FnOnce`: a backward that fails leaves its
/// nodes on the tape, and they must be able to run again.
type BackwardFn = Box<dyn Fn(&Tensor) -> Result<Vec<Option<Tensor>>> + Send>;

/// A cheaper backward for when the output's gradient is one value everywhere: it gets that
/// value and may hand on uniform gradients, which cost no device work.
type UniformBackwardFn = Box<dyn Fn(f64) -> Result<Vec<Option<Grad>>> + Send>;

/// A gradient while backward runs: a tensor, or one value everywhere, known on the host.
///
/// `backward` seeds the loss with a uniform 1, and the ops that pass a uniform gradient on as
/// uniform gradients (`sum`, `mean`, `scale`, `add`, …) do so without touching the device. A
/// node that needs the gradient as a tensor gets one filled in (one memset on CUDA); at the
/// end, so does every leaf. In a step like `sum((x + y) * w).backward()` this saves the seed's
/// fill, `sum`'s broadcast kernel, and the read of a gradient tensor in `add_mul`'s backward.
/// A uniform value is kept in f64 until it is filled in or passed to a kernel (as f32), so in
/// f16 or bf16 a scaled uniform gradient (`mean`'s `1/n`) can be one rounding more accurate
/// than the same gradient carried as a tensor (and a chain of scales that overflows the storage
/// dtype on the way can end finite).
pub(crate) enum Grad {
    Tensor(Tensor),
    Uniform(Uniform),
}

/// `value` in every element of a tensor shaped like `like`.
#[derive(Clone, Debug)]
pub(crate) struct Uniform {
    value: f64,
    like: Like,
}

/// The shape, dtype and device of a tensor, without holding its memory.
#[derive(Clone, Debug)]
pub(crate) struct Like {
    shape: Shape,
    dtype: DType,
    device: Device,
}

impl Like {
    pub(crate) fn of(t: &Tensor) -> Like {
        Like { shape: t.shape().clone(), dtype: t.dtype(), device: t.device() }
    }

    /// A tensor of this shape, dtype and device holding `value` everywhere.
    pub(crate) fn fill(&self, value: f64) -> Result<Tensor> {
        Ok(Tensor::full(value, self.shape.clone(), self.dtype, self.device)?)
    }
}

impl Grad {
    pub(crate) fn uniform(value: f64, like: &Like) -> Grad {
        Grad::Uniform(Uniform { value, like: like.clone() })
    }

    /// The same gradient again; a tensor is shared, not copied.
    pub(crate) fn share(&self) -> Grad {
        match self {
            Grad::Tensor(t) => Grad::Tensor(t.clone()),
            Grad::Uniform(u) => Grad::Uniform(u.clone()),
        }
    }

    /// Whether this is a tensor sharing `t`'s memory.
    fn is_tensor_of(&self, t: &Tensor) -> bool {
        matches!(self, Grad::Tensor(own) if own.shares_storage(t))
    }

    fn into_tensor(self) -> Result<Tensor> {
        match self {
            Grad::Tensor(t) => Ok(t),
            Grad::Uniform(u) => u.like.fill(u.value),
        }
    }

    /// The sum of two gradients of one variable: uniform if both are, else one kernel.
    fn accumulate(self, other: Grad) -> Result<Grad> {
        Ok(Grad::Tensor(match (self, other) {
            (Grad::Uniform(a), Grad::Uniform(b)) => {
                return Ok(Grad::Uniform(Uniform { value: a.value + b.value, ..a }));
            }
            (Grad::Tensor(t), Grad::Uniform(u)) | (Grad::Uniform(u), Grad::Tensor(t)) => ops::add_scalar(&t, u.value)?,
            (Grad::Tensor(a), Grad::Tensor(b)) => ops::add(&a, &b)?,
        }))
    }
}

/// Who else may hold the memory of a gradient tensor while backward runs. Backward hands each
/// variable its own tensor by copying only the final gradients that need it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Sharers {
    /// No one: a fresh kernel output, or the only heir of a gradient that has been used up.
    None,
    /// Perhaps other gradients of this backward: an op handed one tensor to several inputs (as
    /// `add` does), or passed on one that was.
    Gradients,
    /// Perhaps memory that is not a gradient: the caller's seed of `backward_with`, or a tensor a
    /// node saved. A final gradient in this class is always copied.
    Outside,
}

/// A gradient while backward runs, with who else may hold its tensor.
struct Pending {
    grad: Grad,
    sharers: Sharers,
}

/// An input of a node that requires gradients.
#[derive(Clone, Copy)]
struct Input {
    id: VarId,
    /// A leaf has no node; any other input's node must still be on the tape for backward.
    leaf: bool,
}

struct Node {
    /// The recording order, kept when a failed backward puts its nodes back.
    seq: u64,
    /// Recording allocates no name.
    op: &'static str,
    /// One entry per input: `None` for an input that does not require gradients.
    inputs: Vec<Option<Input>>,
    output: VarId,
    /// Tensors the backward closure holds, with their storage version when saved.
    saved: Vec<(Tensor, u64)>,
    backward: BackwardFn,
    /// Used instead of `backward` when the output's gradient is uniform.
    uniform_backward: Option<UniformBackwardFn>,
}

/// Records ops on variables and runs them backwards.
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?);
/// let y = tape.var(Tensor::from_vec(vec![3.0f32, 4.0], [2], Device::Cpu)?);
/// let w = tape.var(Tensor::from_vec(vec![0.5f32, -1.0], [2], Device::Cpu)?);
/// let z = ops::add_mul(&x, &y, &w)?;        // (x + y) * w, one fused kernel
/// let loss = ops::sum(&z)?;
/// let grads = tape.backward(&loss)?;
/// assert_eq!(grads.get(&x).unwrap().to_vec::<f32>()?, [0.5, -1.0]); // dz/dx = w
/// assert_eq!(grads.get(&w).unwrap().to_vec::<f32>()?, [4.0, 6.0]);  // dz/dw = x + y
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct Tape {
    recorded: Arc<Mutex<Recorded>>,
}

/// The nodes not yet consumed, in recording order (every node after the nodes of its inputs).
#[derive(Default)]
struct Recorded {
    nodes: Vec<Node>,
    next_seq: u64,
}

impl Tape {
    /// An empty tape.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// let tape = opsmith_autograd::Tape::new();
    /// assert!(tape.is_empty());
    /// # Ok(()) }
    /// ```
    pub fn new() -> Tape {
        Tape::default()
    }

    /// A leaf variable that requires gradients.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::Tape;
    /// use opsmith_host::{Device, Tensor};
    /// let tape = Tape::new();
    /// let w = tape.var(Tensor::from_vec(vec![0.5f32; 4], [2, 2], Device::Cpu)?);
    /// assert!(w.requires_grad() && w.is_leaf());
    /// assert!(tape.is_empty()); // a variable is not a recorded op
    /// # Ok(()) }
    /// ```
    pub fn var(&self, value: Tensor) -> Var {
        Var { value, id: VarId::fresh(), tape: Some(self.clone()), leaf: true }
    }

    /// The number of recorded nodes not yet consumed by a backward.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, ops};
    /// use opsmith_host::{Device, Tensor};
    /// let tape = Tape::new();
    /// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?);
    /// let loss = ops::sum(&ops::mul(&x, &x)?)?;
    /// assert_eq!(tape.len(), 2); // mul, sum
    /// tape.backward(&loss)?;
    /// assert_eq!(tape.len(), 0); // consumed
    /// # Ok(()) }
    /// ```
    pub fn len(&self) -> usize {
        self.recorded.lock().nodes.len()
    }

    /// Whether no nodes are recorded.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, ops};
    /// use opsmith_host::{Device, Tensor};
    /// let tape = Tape::new();
    /// let x = tape.var(Tensor::from_vec(vec![1.0f32], [1], Device::Cpu)?);
    /// ops::neg(&x)?;
    /// assert!(!tape.is_empty());
    /// # Ok(()) }
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every recorded node, consumed by no backward: the graphs of outputs whose backward
    /// will not run (say, after a failed backward that is not to be retried, or ops recorded
    /// outside `no_grad` for a metric). Their saved tensors are released, and a backward through
    /// them returns [`Error::GraphConsumed`]. Variables, leaves included, stay valid.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Error, Tape, ops};
    /// use opsmith_host::{Device, Tensor};
    /// let tape = Tape::new();
    /// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?);
    /// let metric = ops::sum(&ops::mul(&x, &x)?)?; // never differentiated
    /// let loss = ops::sum(&ops::scale(&x, 2.0)?)?;
    /// tape.backward(&loss)?;
    /// assert_eq!(tape.len(), 2); // the metric's graph stays
    /// tape.clear();
    /// assert!(tape.is_empty());
    /// assert!(matches!(tape.backward(&metric), Err(Error::GraphConsumed)));
    /// # Ok(()) }
    /// ```
    pub fn clear(&self) {
        // Taken under the lock, dropped (releasing saved tensors) outside it.
        let nodes = std::mem::take(&mut self.recorded.lock().nodes);
        drop(nodes);
    }

    fn same(&self, other: &Tape) -> bool {
        Arc::ptr_eq(&self.recorded, &other.recorded)
    }

    /// Backward from a one-element `loss`, seeded with 1: the gradients of the leaf variables the
    /// loss depends on. See [`Tape::backward_with`] for what it consumes and returns.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, ops};
    /// use opsmith_host::{Device, Tensor};
    /// let tape = Tape::new();
    /// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3], Device::Cpu)?);
    /// let loss = ops::mean(&ops::mul(&x, &x)?)?; // mean(x²)
    /// let grads = tape.backward(&loss)?;
    /// let gx = grads.get(&x).unwrap().to_vec::<f32>()?; // 2x / 3
    /// assert!((gx[2] - 2.0).abs() < 1e-6);
    /// # Ok(()) }
    /// ```
    pub fn backward(&self, loss: &Var) -> Result<Gradients> {
        if loss.value.elem_count() != 1 {
            return Err(Error::NonScalarLoss { shape: loss.value.dims().to_vec() });
        }
        self.backward_from(loss, Pending { grad: Grad::uniform(1.0, &Like::of(&loss.value)), sharers: Sharers::None })
    }

    /// Backward from `output` with its gradient `grad` (same shape, dtype and device): runs the
    /// nodes `output` depends on in reverse and returns the gradients of the leaf variables.
    ///
    /// **What is consumed.** Only `output`'s graph, the nodes found by walking back from it, as
    /// in PyTorch without `retain_graph`: their saved tensors are released, and a later backward
    /// through any of them returns [`Error::GraphConsumed`] (so does another output's backward
    /// that needs one of them: run its forward again). The nodes of other outputs recorded on
    /// the same tape stay, and their backward works afterwards, whether they share leaves with
    /// `output` or not. Nodes that no backward consumes stay until the tape is dropped or
    /// [cleared](Tape::clear): on a tape that lives across training steps, record what is not
    /// differentiated under [`no_grad`].
    ///
    /// **On failure nothing is consumed.** If backward fails (an op's backward returns an error,
    /// a saved tensor was written in place, a device error), every node is on the tape again as
    /// before: other outputs' backward works, and this one's can be run again; it reports the
    /// same error unless the cause is gone (say, a custom op's backward that failed for a reason
    /// since fixed). While a backward runs its nodes are off the tape, so a backward through
    /// them on another thread meanwhile returns [`Error::GraphConsumed`].
    ///
    /// **The gradients.** A variable used several times gets the sum of its gradients. Each
    /// variable's gradient is a tensor of its own, sharing memory with no other variable's and
    /// not with `grad`, so it can be written in place (by an optimizer or an all-reduce) without
    /// changing another. Ops that hand one tensor to several inputs (`add`, `add_mul`'s `x` and
    /// `y`) or pass their gradient on as is (`sub`, `add_row`, `fused_mul_add`'s `c`) do so
    /// without copying; at the end, a tensor that is still two variables' gradients (or is
    /// `grad`) is copied once for all but one of them, and nothing else is.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Error, Tape, ops};
    /// use opsmith_host::{Device, Tensor};
    /// let tape = Tape::new();
    /// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?);
    /// let y = ops::add(&ops::mul(&x, &x)?, &x)?; // x² + x: x is used three times
    /// let other = ops::sum(&ops::scale(&x, 3.0)?)?; // another output, on the same tape
    /// let upstream = Tensor::from_vec(vec![1.0f32, 10.0], [2], Device::Cpu)?;
    /// let grads = tape.backward_with(&y, upstream.clone())?;
    /// assert_eq!(grads.get(&x).unwrap().to_vec::<f32>()?, [3.0, 50.0]); // g * (2x + 1)
    /// assert!(matches!(tape.backward_with(&y, upstream), Err(Error::GraphConsumed)));
    /// assert_eq!(tape.backward(&other)?.get(&x).unwrap().to_vec::<f32>()?, [3.0, 3.0]); // untouched
    /// # Ok(()) }
    /// ```
    pub fn backward_with(&self, output: &Var, grad: Tensor) -> Result<Gradients> {
        if grad.dims() != output.value.dims() {
            return Err(opsmith_host::Error::ShapeMismatch {
                op: "backward",
                lhs: output.value.dims().to_vec(),
                rhs: grad.dims().to_vec(),
            }
            .into());
        }
        // The gradients keep the values' dtypes and devices: a seed of another dtype would
        // hand it on to every leaf, and the optimizer would refuse them a step later.
        if grad.dtype() != output.value.dtype() {
            return Err(opsmith_host::Error::DTypeMismatch {
                op: "backward",
                lhs: output.value.dtype(),
                rhs: grad.dtype(),
            }
            .into());
        }
        if grad.device() != output.value.device() {
            return Err(opsmith_host::Error::DeviceMismatch {
                op: "backward",
                lhs: output.value.device(),
                rhs: grad.device(),
            }
            .into());
        }
        // The caller keeps `grad`: no variable may be handed it as its gradient.
        self.backward_from(output, Pending { grad: Grad::Tensor(grad), sharers: Sharers::Outside })
    }

    fn backward_from(&self, output: &Var, seed: Pending) -> Result<Gradients> {
        match &output.tape {
            None => return Err(Error::RequiresGrad { what: "backward" }),
            Some(t) if !t.same(self) => return Err(Error::TapeMismatch { op: "backward" }),
            Some(_) => {}
        }
        let graph = self.take_graph(output)?;
        match run_backward(&graph, output.id, seed) {
            // Dropping the nodes consumes them and releases what they saved.
            Ok(grads) => Ok(grads),
            Err(e) => {
                self.put_back(graph);
                Err(e)
            }
        }
    }

    /// Takes the nodes `output` depends on off the tape, in recording order; the others stay.
    /// [`Error::GraphConsumed`] (taking nothing) if one of them was consumed already.
    fn take_graph(&self, output: &Var) -> Result<Vec<Node>> {
        let mut recorded = self.recorded.lock();
        let nodes = &mut recorded.nodes;
        // Non-leaf variables of the graph whose node the walk back has not reached yet: as every
        // node comes after its inputs' nodes, one walk from the end finds them all.
        let mut wanted = HashSet::new();
        if !output.leaf {
            wanted.insert(output.id);
        }
        let mut in_graph = vec![false; nodes.len()];
        for (k, node) in nodes.iter().enumerate().rev() {
            if wanted.is_empty() {
                break;
            }
            if wanted.remove(&node.output) {
                in_graph[k] = true;
                wanted.extend(node.inputs.iter().flatten().filter(|i| !i.leaf).map(|i| i.id));
            }
        }
        if !wanted.is_empty() {
            return Err(Error::GraphConsumed);
        }
        // The usual case, one output per tape: the whole tape, without moving a node.
        if in_graph.iter().all(|&t| t) {
            return Ok(std::mem::take(nodes));
        }
        let mut k = 0;
        Ok(nodes
            .extract_if(.., |_| {
                k += 1;
                in_graph[k - 1]
            })
            .collect())
    }

    /// Puts the nodes of a failed backward back on the tape, in recording order among the
    /// nodes that stayed and any recorded meanwhile.
    fn put_back(&self, graph: Vec<Node>) {
        let mut recorded = self.recorded.lock();
        recorded.nodes.extend(graph);
        // Two sorted runs: the stable sort merges them in one pass.
        recorded.nodes.sort_by_key(|n| n.seq);
    }
}

/// Runs `graph` (in recording order) backwards from `output`'s gradient `seed`, without
/// consuming it.
fn run_backward(graph: &[Node], output: VarId, seed: Pending) -> Result<Gradients> {
    let mut grads: HashMap<VarId, Pending> = HashMap::from([(output, seed)]);
    for node in graph.iter().rev() {
        // Intermediate gradients are dropped once used; only leaves keep theirs.
        let Some(Pending { grad, sharers }) = grads.remove(&node.output) else { continue };
        for (tensor, version) in &node.saved {
            if tensor.version() != *version {
                return Err(Error::SavedTensorModified { op: node.op, saved: *version, now: tensor.version() });
            }
        }
        let (mut input_grads, upstream) = match (grad, &node.uniform_backward) {
            (Grad::Uniform(u), Some(uniform_backward)) => (uniform_backward(u.value)?, None),
            (g, _) => {
                // A uniform gradient filled in here is a fresh tensor.
                let sharers = if matches!(g, Grad::Tensor(_)) { sharers } else { Sharers::None };
                let g = g.into_tensor()?;
                let input_grads = (node.backward)(&g)?.into_iter().map(|g| g.map(Grad::Tensor)).collect();
                (input_grads, Some((g, sharers)))
            }
        };
        if input_grads.len() != node.inputs.len() {
            return Err(Error::Arity {
                op: node.op,
                what: "gradients",
                expected: node.inputs.len(),
                actual: input_grads.len(),
            });
        }
        // The incoming gradient is kept only while a gradient handed on is that tensor (whose
        // memory then lives on anyway); otherwise it is freed before any sum is allocated.
        let upstream = upstream.filter(|(g, _)| input_grads.iter().flatten().any(|gi| gi.is_tensor_of(g)));
        for k in 0..input_grads.len() {
            let sharers = sharers_of(node, &input_grads, k, upstream.as_ref());
            // A gradient no other input got is moved out; one that others got stays for their
            // checks (a handle is cloned: its memory lives on in them anyway).
            let gi = match sharers {
                Sharers::None => input_grads[k].take(),
                _ => input_grads[k].as_ref().map(Grad::share),
            };
            if let (Some(input), Some(gi)) = (node.inputs[k], gi) {
                match grads.entry(input.id) {
                    Entry::Vacant(e) => {
                        e.insert(Pending { grad: gi, sharers });
                    }
                    Entry::Occupied(e) => {
                        let (id, earlier) = e.remove_entry();
                        // A sum is a fresh tensor (or a uniform value).
                        grads.insert(id, Pending { grad: earlier.grad.accumulate(gi)?, sharers: Sharers::None });
                    }
                }
            }
        }
    }
    // Each variable gets a tensor of its own: copy a final gradient only if it may still be held
    // by another final gradient (one copy per extra holder) or by someone else.
    let mut map = HashMap::with_capacity(grads.len());
    let mut kept_shared: Vec<Tensor> = Vec::new();
    for (id, Pending { grad, sharers }) in grads {
        let t = grad.into_tensor()?;
        let t = match sharers {
            Sharers::None => t,
            Sharers::Gradients if !kept_shared.iter().any(|k| k.shares_storage(&t)) => {
                kept_shared.push(t.clone());
                t
            }
            Sharers::Gradients | Sharers::Outside => t.copy()?,
        };
        map.insert(id, t);
    }
    Ok(Gradients { map })
}

/// Who may hold the tensor of `input_grads[k]` besides that input: a gradient that is the
/// node's incoming gradient inherits its sharers, one handed to another input too is shared
/// between gradients, and one that is a saved tensor belongs to the node. Entries already moved
/// out are ones that share with no other, so the check against the rest is exact.
fn sharers_of(node: &Node, input_grads: &[Option<Grad>], k: usize, upstream: Option<&(Tensor, Sharers)>) -> Sharers {
    let Some(Grad::Tensor(t)) = &input_grads[k] else { return Sharers::None };
    let mut sharers = Sharers::None;
    if let Some((g, g_sharers)) = upstream
        && g.shares_storage(t)
    {
        sharers = *g_sharers;
    }
    let other_input = input_grads
        .iter()
        .zip(&node.inputs)
        .enumerate()
        .any(|(j, (gj, input))| j != k && input.is_some() && gj.as_ref().is_some_and(|gj| gj.is_tensor_of(t)));
    if other_input {
        sharers = sharers.max(Sharers::Gradients);
    }
    if node.saved.iter().any(|(s, _)| s.shares_storage(t)) {
        sharers = Sharers::Outside;
    }
    sharers
}

/// Gradients by variable, as returned by [`Tape::backward`].
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let a = tape.var(Tensor::from_vec(vec![2.0f32], [1], Device::Cpu)?);
/// let b = tape.var(Tensor::from_vec(vec![5.0f32], [1], Device::Cpu)?);
/// let grads = tape.backward(&ops::mul(&a, &b)?)?;
/// assert_eq!(grads.len(), 2);
/// assert_eq!(grads.get(&a).unwrap().to_vec::<f32>()?, [5.0]);
/// # Ok(()) }
/// ```
#[derive(Default, Debug)]
pub struct Gradients {
    map: HashMap<VarId, Tensor>,
}

impl Gradients {
    /// The gradient of `var`, or `None` if the output does not depend on it.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, ops};
    /// use opsmith_host::{Device, Tensor};
    /// let tape = Tape::new();
    /// let x = tape.var(Tensor::from_vec(vec![2.0f32], [1], Device::Cpu)?);
    /// let unused = tape.var(Tensor::from_vec(vec![7.0f32], [1], Device::Cpu)?);
    /// let grads = tape.backward(&ops::scale(&x, 4.0)?)?;
    /// assert_eq!(grads.get(&x).unwrap().to_vec::<f32>()?, [4.0]);
    /// assert!(grads.get(&unused).is_none());
    /// # Ok(()) }
    /// ```
    pub fn get(&self, var: &Var) -> Option<&Tensor> {
        self.map.get(&var.id)
    }

    /// Takes the gradient of `var` out of the store.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, ops};
    /// use opsmith_host::{Device, Tensor};
    /// let tape = Tape::new();
    /// let x = tape.var(Tensor::from_vec(vec![2.0f32], [1], Device::Cpu)?);
    /// let mut grads = tape.backward(&ops::neg(&x)?)?;
    /// let gx = grads.remove(&x).unwrap(); // owned, no clone
    /// assert_eq!(gx.to_vec::<f32>()?, [-1.0]);
    /// assert!(grads.is_empty());
    /// # Ok(()) }
    /// ```
    pub fn remove(&mut self, var: &Var) -> Option<Tensor> {
        self.map.remove(&var.id)
    }

    /// The number of gradients held.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// use opsmith_autograd::{Tape, ops};
    /// use opsmith_host::{Device, Tensor};
    /// let tape = Tape::new();
    /// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?);
    /// let grads = tape.backward(&ops::sum(&x)?)?;
    /// assert_eq!(grads.len(), 1); // the leaf x; intermediate gradients are dropped
    /// # Ok(()) }
    /// ```
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no gradient is held.
    ///
    /// ```
    /// # fn main() -> opsmith_autograd::Result<()> {
    /// assert!(opsmith_autograd::Gradients::default().is_empty());
    /// # Ok(()) }
    /// ```
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

thread_local! {
    static NO_GRAD_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// While alive, ops on this thread record nothing, so inference pays nothing for the tape.
/// Returned by [`no_grad`].
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{is_grad_enabled, no_grad};
/// let guard = no_grad();
/// assert!(!is_grad_enabled());
/// drop(guard);
/// assert!(is_grad_enabled());
/// # Ok(()) }
/// ```
#[must_use = "recording resumes when the guard is dropped"]
pub struct NoGradGuard {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        NO_GRAD_DEPTH.with(|d| d.set(d.get() - 1));
    }
}

/// Turns recording off on this thread until the guard drops (like `torch.no_grad()`).
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, no_grad, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let x = tape.var(Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?);
/// {
///     let _inference = no_grad();
///     let y = ops::mul(&x, &x)?;
///     assert!(!y.requires_grad());
/// }
/// assert!(tape.is_empty());
/// # Ok(()) }
/// ```
pub fn no_grad() -> NoGradGuard {
    NO_GRAD_DEPTH.with(|d| d.set(d.get() + 1));
    NoGradGuard { _not_send: std::marker::PhantomData }
}

/// Whether ops on this thread record (false inside [`no_grad`]).
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{is_grad_enabled, no_grad};
/// assert!(is_grad_enabled());
/// {
///     let _outer = no_grad();
///     let _inner = no_grad(); // guards nest
///     assert!(!is_grad_enabled());
/// }
/// assert!(is_grad_enabled());
/// # Ok(()) }
/// ```
pub fn is_grad_enabled() -> bool {
    NO_GRAD_DEPTH.with(|d| d.get() == 0)
}

/// The tape an op on `inputs` records on, if any: `None` under `no_grad` or when no input
/// requires gradients; an error if inputs come from different tapes.
pub(crate) fn tracking(op: &'static str, inputs: &[&Var]) -> Result<Option<Tape>> {
    if !is_grad_enabled() {
        return Ok(None);
    }
    let mut found: Option<&Tape> = None;
    for tape in inputs.iter().filter_map(|v| v.tape.as_ref()) {
        match found {
            Some(t) if !t.same(tape) => return Err(Error::TapeMismatch { op }),
            _ => found = Some(tape),
        }
    }
    Ok(found.cloned())
}

impl Tape {
    /// Records one op: `output` was computed from `inputs`; `saved` are the tensors `backward`
    /// holds (checked for in-place writes before it runs); `backward` maps the output's gradient
    /// to one optional gradient per input.
    pub(crate) fn record(
        &self,
        op: &'static str,
        inputs: &[&Var],
        output: Tensor,
        saved: &[&Tensor],
        backward: impl Fn(&Tensor) -> Result<Vec<Option<Tensor>>> + Send + 'static,
    ) -> Var {
        self.push_node(op, inputs, output, saved, Box::new(backward), None)
    }

    /// As [`record`](Self::record), with a second backward for a uniform output gradient (see
    /// [`Grad`]); it must compute the same gradients as `backward` does from that gradient
    /// filled into a tensor, up to the roundings [`Grad`] describes.
    pub(crate) fn record_with_uniform(
        &self,
        op: &'static str,
        inputs: &[&Var],
        output: Tensor,
        saved: &[&Tensor],
        backward: impl Fn(&Tensor) -> Result<Vec<Option<Tensor>>> + Send + 'static,
        uniform_backward: impl Fn(f64) -> Result<Vec<Option<Grad>>> + Send + 'static,
    ) -> Var {
        self.push_node(op, inputs, output, saved, Box::new(backward), Some(Box::new(uniform_backward)))
    }

    fn push_node(
        &self,
        op: &'static str,
        inputs: &[&Var],
        output: Tensor,
        saved: &[&Tensor],
        backward: BackwardFn,
        uniform_backward: Option<UniformBackwardFn>,
    ) -> Var {
        let out = Var { value: output, id: VarId::fresh(), tape: Some(self.clone()), leaf: false };
        let mut node = Node {
            seq: 0,
            op,
            inputs: inputs.iter().map(|v| v.requires_grad().then_some(Input { id: v.id, leaf: v.leaf })).collect(),
            output: out.id,
            saved: saved.iter().map(|t| ((*t).clone(), t.version())).collect(),
            backward,
            uniform_backward,
        };
        let mut recorded = self.recorded.lock();
        node.seq = recorded.next_seq;
        recorded.next_seq += 1;
        recorded.nodes.push(node);
        out
    }
}
