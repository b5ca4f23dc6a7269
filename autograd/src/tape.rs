//! The tape: variables, recorded nodes, backward, and the no-grad switch.
use crate::{Error, Result};
use opsmith_host::{Tensor, ops};
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A variable's identity, the key of [`Gradients`].
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
    pub fn constant(value: Tensor) -> Var {
        Var { value, id: VarId::fresh(), tape: None, leaf: true }
    }

    /// The value.
    pub fn value(&self) -> &Tensor {
        &self.value
    }

    /// The identity, as used by [`Gradients`].
    pub fn id(&self) -> VarId {
        self.id
    }

    /// Whether gradients flow to this variable.
    pub fn requires_grad(&self) -> bool {
        self.tape.is_some()
    }

    /// Whether the variable was created by [`Tape::var`] rather than computed by an op.
    pub fn is_leaf(&self) -> bool {
        self.leaf
    }

    /// The tape that tracks this variable, if any.
    pub fn tape(&self) -> Option<&Tape> {
        self.tape.as_ref()
    }
}

/// What backward needs of one recorded op.
type BackwardFn = Box<dyn FnOnce(&Tensor) -> Result<Vec<Option<Tensor>>> + Send>;

struct Node {
    op: String,
    /// One entry per input: the input's id if it requires gradients.
    inputs: Vec<Option<VarId>>,
    output: VarId,
    /// Tensors the backward closure holds, with their storage version when saved.
    saved: Vec<(Tensor, u64)>,
    backward: BackwardFn,
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
    nodes: Arc<Mutex<Vec<Node>>>,
}

impl Tape {
    /// An empty tape.
    pub fn new() -> Tape {
        Tape::default()
    }

    /// A leaf variable that requires gradients.
    pub fn var(&self, value: Tensor) -> Var {
        Var { value, id: VarId::fresh(), tape: Some(self.clone()), leaf: true }
    }

    /// The number of recorded nodes not yet consumed by a backward.
    pub fn len(&self) -> usize {
        self.nodes.lock().len()
    }

    /// Whether no nodes are recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn same(&self, other: &Tape) -> bool {
        Arc::ptr_eq(&self.nodes, &other.nodes)
    }

    /// Backward from a one-element `loss` (seeded with 1). See [`Tape::backward_with`].
    pub fn backward(&self, loss: &Var) -> Result<Gradients> {
        if loss.value.elem_count() != 1 {
            return Err(Error::NonScalarLoss { shape: loss.value.dims().to_vec() });
        }
        let seed = Tensor::full(1.0, loss.value.shape().clone(), loss.value.dtype(), loss.value.device())?;
        self.backward_with(loss, seed)
    }

    /// Backward from `output` with its gradient `grad` (same shape, dtype and device): runs the
    /// recorded nodes in reverse and returns the gradients of the leaf variables.
    ///
    /// The recorded graph is consumed, as in PyTorch without `retain_graph`: saved tensors are
    /// released, and a second backward through the same nodes returns [`Error::GraphConsumed`].
    /// A variable used several times gets the sum of its gradients.
    pub fn backward_with(&self, output: &Var, grad: Tensor) -> Result<Gradients> {
        match &output.tape {
            None => return Err(Error::RequiresGrad { what: "backward" }),
            Some(t) if !t.same(self) => return Err(Error::TapeMismatch { op: "backward".into() }),
            Some(_) => {}
        }
        if grad.dims() != output.value.dims() {
            return Err(opsmith_host::Error::ShapeMismatch {
                op: "backward",
                lhs: output.value.dims().to_vec(),
                rhs: grad.dims().to_vec(),
            }
            .into());
        }
        let nodes = std::mem::take(&mut *self.nodes.lock());
        if !output.leaf && !nodes.iter().any(|n| n.output == output.id) {
            return Err(Error::GraphConsumed);
        }
        let mut grads: HashMap<VarId, Tensor> = HashMap::from([(output.id, grad)]);
        for node in nodes.into_iter().rev() {
            // Intermediate gradients are dropped once used; only leaves keep theirs.
            let Some(g) = grads.remove(&node.output) else { continue };
            for (tensor, version) in &node.saved {
                if tensor.version() != *version {
                    return Err(Error::SavedTensorModified { op: node.op, saved: *version, now: tensor.version() });
                }
            }
            let input_grads = (node.backward)(&g)?;
            if input_grads.len() != node.inputs.len() {
                return Err(Error::Arity {
                    op: node.op,
                    what: "gradients",
                    expected: node.inputs.len(),
                    actual: input_grads.len(),
                });
            }
            for (id, gi) in node.inputs.iter().zip(input_grads) {
                if let (Some(id), Some(gi)) = (id, gi) {
                    match grads.entry(*id) {
                        Entry::Vacant(e) => {
                            e.insert(gi);
                        }
                        Entry::Occupied(mut e) => {
                            let sum = ops::add(e.get(), &gi)?;
                            e.insert(sum);
                        }
                    }
                }
            }
        }
        Ok(Gradients { map: grads })
    }
}

/// Gradients by variable, as returned by [`Tape::backward`].
#[derive(Default, Debug)]
pub struct Gradients {
    map: HashMap<VarId, Tensor>,
}

impl Gradients {
    /// The gradient of `var`, or `None` if the output does not depend on it.
    pub fn get(&self, var: &Var) -> Option<&Tensor> {
        self.map.get(&var.id)
    }

    /// Takes the gradient of `var` out of the store.
    pub fn remove(&mut self, var: &Var) -> Option<Tensor> {
        self.map.remove(&var.id)
    }

    /// The number of gradients held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no gradient is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

thread_local! {
    static NO_GRAD_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// While alive, ops on this thread record nothing, so inference pays nothing for the tape.
/// Returned by [`no_grad`].
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
pub fn is_grad_enabled() -> bool {
    NO_GRAD_DEPTH.with(|d| d.get() == 0)
}

/// The tape an op on `inputs` records on, if any: `None` under `no_grad` or when no input
/// requires gradients; an error if inputs come from different tapes.
pub(crate) fn tracking(op: &str, inputs: &[&Var]) -> Result<Option<Tape>> {
    if !is_grad_enabled() {
        return Ok(None);
    }
    let mut found: Option<&Tape> = None;
    for tape in inputs.iter().filter_map(|v| v.tape.as_ref()) {
        match found {
            Some(t) if !t.same(tape) => return Err(Error::TapeMismatch { op: op.into() }),
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
        op: impl Into<String>,
        inputs: &[&Var],
        output: Tensor,
        saved: &[&Tensor],
        backward: impl FnOnce(&Tensor) -> Result<Vec<Option<Tensor>>> + Send + 'static,
    ) -> Var {
        let out = Var { value: output, id: VarId::fresh(), tape: Some(self.clone()), leaf: false };
        let node = Node {
            op: op.into(),
            inputs: inputs.iter().map(|v| v.requires_grad().then_some(v.id)).collect(),
            output: out.id,
            saved: saved.iter().map(|t| ((*t).clone(), t.version())).collect(),
            backward: Box::new(backward),
        };
        self.nodes.lock().push(node);
        out
    }
}
