//! CUDA graphs: record a sequence of opsmith ops once, replay it with one launch.
//!
//! [`Graph::capture`] runs a closure (a forward, backward and optimizer step, or any other
//! sequence of ops) once under stream capture: the driver records its kernels, copies and fills
//! instead of running them. [`Graph::replay`] then runs the whole recording with a single driver
//! call, on the same memory, so a step of fifty small kernels costs one launch of host time
//! instead of fifty.
//!
//! # Memory and lifetimes
//!
//! * **Tensors made during the capture** (activations, gradients, the loss) get memory from a
//!   pool private to the graph. They keep their addresses for as long as the graph or they
//!   live: each replay writes the same tensors again, so reading a result after
//!   [`replay`](Graph::replay) shows that replay's values. Memory a tensor frees during the
//!   capture goes back to the pool for the capture's later allocations of the same size (in
//!   stream order, as the driver's pool would); none of it goes to the device's block cache,
//!   and nothing is allocated while replaying. The pool is freed once the graph and the last of
//!   its tensors are gone.
//! * **Tensors made before the capture** that the captured work reads or writes (parameters,
//!   optimizer state, the input and label buffers) are kept alive by the graph, so dropping
//!   them early cannot leave a replay reading freed memory.
//! * **Inputs:** to feed a replay new data, copy it into the tensors the capture read, with
//!   [`Tensor::copy_from_`](crate::Tensor::copy_from_), before calling
//!   [`replay`](Graph::replay); read outputs after it. A replay is ordered after earlier work
//!   on those tensors on any stream, and later work on any stream waits for it.
//! * **Dropping a graph** waits for its stream, and dropping the last of a graph's memory waits
//!   for the device: drop old graphs before capturing a new one on the same device (inside a
//!   capture, the driver refuses the wait, and the capture fails with [`Error::Capture`]).
//! * **Scalars are frozen:** a kernel parameter (a scale, SGD's learning rate) is recorded with
//!   the value it had during the capture. State that changes per step must live in device
//!   memory: `opsmith_autograd`'s Adam keeps its step count and learning rate there.
//!
//! # Parallel branches
//!
//! A stream runs its work one item after another, but much of a training step is independent:
//! the gradients of a layer's weight and bias, the optimizer's step count and the forward pass.
//! A capture records each of opsmith's kernels (and each [`Kernel::launch`](super::Kernel::launch))
//! after only the nodes it must follow: for memory it reads, the last node that wrote it; for
//! memory it writes, the nodes that read it since that write (each of which follows the
//! writer), or the writer if none did. Both launch paths know every buffer a kernel reads
//! and writes, so a replay may run independent kernels at the same time on different SMs, and
//! [`Graph::depth`] (the longest chain) is what bounds a replay's time rather than
//! [`Graph::node_count`]. The results are the same bits: only the order of independent work
//! changes.
//!
//! Other work (copies, fills, cuBLAS products, collectives) is recorded after everything before
//! it, and everything after waits for it. Memory is tracked by allocation: a block of the
//! graph's pool that a dropped temporary gives back orders the new tensor's writer after the old
//! one's readers. Set `OPSMITH_GRAPH_BRANCHES=0` ([`GRAPH_BRANCHES_ENV`]) to record every node
//! after the one before it, as the stream ran them.
//!
//! # Dependent launch
//!
//! On sm_90 and newer, opsmith's kernels come from builds in which each kernel lets the next
//! kernel be scheduled as soon as it starts, and waits for the kernels before it to finish
//! before it touches memory (programmatic dependent launch; see
//! [`Kernel::dependent_launch`](super::Kernel::dependent_launch)). A capture records such a
//! kernel's edges from the kernel nodes it follows as programmatic edges, so that in a replay
//! its launch overlaps their run; its edges from other nodes (copies, memsets) stay full
//! dependencies. The results are the same bits. `OPSMITH_DEPENDENT_LAUNCH=0` turns it off, in
//! captures and on streams alike.
//!
//! # What cannot be captured
//!
//! A graph records device work on one stream. While a capture runs on a thread, these fail with
//! [`Error::Capture`], which names the op, and the capture fails with it (nothing half-recorded
//! is kept): reading device memory on the host (`to_vec`), copying host memory to the device,
//! synchronizing a stream, event or device, ops on CPU tensors (they would run once, at
//! capture, and never again), using a tensor last written or read on another stream, waiting on
//! another stream's event, peer copies between GPUs, and starting a second capture on the same
//! device.
//!
//! The capture runs on the device's current stream (opsmith's default stream is an ordinary
//! stream, so unlike PyTorch no side stream is needed), in the driver's relaxed capture mode,
//! which lets the graph's pool allocate during the capture. Run the step once eagerly before
//! capturing it, as PyTorch recommends too, so that one-time setup (loading kernel modules,
//! creating cuBLAS handles) stays out of the capture; the tests and examples always do. Other
//! threads must not queue work on the capturing stream meanwhile: it would be recorded too.
use super::{CudaDevice, Stream};
use crate::tensor::storage::{Storage, StorageData};
use crate::{Error, Result};
use cudarc::driver::{CudaSlice, sys};
use parking_lot::Mutex;
use smallvec::SmallVec;
use std::any::Any;
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

thread_local! {
    /// Whether this thread is running a [`Graph::capture`] closure.
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is running a [`Graph::capture`] closure.
pub(crate) fn capturing_thread() -> bool {
    CAPTURING.with(Cell::get)
}

/// In a capture, before the launch of a kernel that waits for its predecessors (programmatic
/// dependent launch): makes the edges from the kernel nodes it will depend on programmatic, so
/// that a replay may start it before they finish; edges from other nodes (copies, memsets)
/// stay full dependencies, which is all they may be. A stream not capturing, or a driver
/// that refuses, keeps full edges everywhere: slower, never wrong.
pub(crate) fn make_kernel_edges_programmatic(stream: &Stream) {
    let Ok(deps) = capture_dependencies(stream) else { return };
    let programmatic = sys::CUgraphEdgeData {
        from_port: sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8,
        to_port: 0,
        type_: sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8,
        reserved: [0; 5],
    };
    let full = sys::CUgraphEdgeData { from_port: 0, to_port: 0, type_: 0, reserved: [0; 5] };
    let edges: SmallVec<[sys::CUgraphEdgeData; 8]> = deps
        .iter()
        .map(|&node| {
            let mut kind = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
            // SAFETY: `node` belongs to the graph being captured (it came from the driver's
            // dependency set) and the out-pointer is valid.
            let status = unsafe { sys::cuGraphNodeGetType(node as sys::CUgraphNode, &mut kind) };
            let kernel =
                status == sys::CUresult::CUDA_SUCCESS && kind == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL;
            if kernel { programmatic } else { full }
        })
        .collect();
    if !edges.contains(&programmatic) {
        return;
    }
    let mut raw: SmallVec<[sys::CUgraphNode; 8]> = deps.iter().map(|&n| n as sys::CUgraphNode).collect();
    let flags = sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES as u32;
    // SAFETY: the stream is capturing (its dependencies were just read), every node belongs to
    // its graph, and `edges` holds one entry per node. A failure leaves the dependencies as
    // they were, with full edges.
    let _ = unsafe {
        sys::cuStreamUpdateCaptureDependencies_v2(
            stream.raw().cu_stream(),
            raw.as_mut_ptr(),
            edges.as_ptr(),
            raw.len(),
            flags,
        )
    };
}

/// `Err(Error::Capture)` naming `op` when this thread is capturing a graph: for what cannot be
/// recorded whatever the device (host reads and writes, synchronizations, CPU work).
pub(crate) fn refuse_while_capturing(op: &'static str, why: &str) -> Result<()> {
    if capturing_thread() {
        return Err(Error::Capture { op, reason: why.to_string() });
    }
    Ok(())
}

/// Why a CPU op is refused during a capture.
pub(crate) const CPU_WORK: &str =
    "its tensors are on the CPU: CPU work runs once, while capturing, and a replay would not repeat it";

/// Why a host read is refused during a capture.
pub(crate) const HOST_READ: &str =
    "it reads device memory on the host, which waits for the device; read results after Graph::replay";

/// Why a host-to-device copy is refused during a capture.
pub(crate) const HOST_WRITE: &str = "it copies host memory to the device; create inputs before the capture and \
                                     copy new values into them with Tensor::copy_from_ before each replay";

/// Why a synchronization is refused during a capture.
pub(crate) const SYNC: &str = "a graph cannot wait for the device in the middle of its work";

/// Memory private to one graph: every allocation its capture makes, at addresses that stay fixed
/// for the graph's replays. See the module docs.
pub(crate) struct GraphPool {
    device: CudaDevice,
    state: Mutex<PoolState>,
}

#[derive(Default)]
struct PoolState {
    /// Blocks given back during the capture, by size, for its later allocations.
    free: HashMap<usize, Vec<u64>>,
    /// Every block, to free with the pool.
    owned: Vec<u64>,
    bytes: usize,
}

impl GraphPool {
    /// A block of `bytes` bytes on the capture's stream: one given back earlier in the capture,
    /// or a fresh one. Fresh blocks come from `cuMemAlloc`, not the stream-ordered allocator:
    /// the latter would record allocation nodes into the graph, whose memory a replay could not
    /// hand to tensors that outlive it.
    fn alloc(&self, op: &'static str, stream: &Stream, bytes: usize) -> Result<CudaSlice<u8>> {
        let reused = self.state.lock().free.get_mut(&bytes).and_then(Vec::pop);
        let address = match reused {
            Some(address) => address,
            None if bytes == 0 => 0,
            None => {
                // SAFETY: a plain allocation in the context current on this thread (bound by the
                // caller); the memory is uninitialised, and every tensor constructor writes its
                // memory before reading it.
                let address = unsafe { cudarc::driver::result::malloc_sync(bytes) }
                    .map_err(|e| Error::from_alloc(op, self.device.device(), bytes, e))?;
                let mut state = self.state.lock();
                state.owned.push(address);
                state.bytes += bytes;
                address
            }
        };
        // SAFETY: `address` holds `bytes` bytes owned by this pool; the slice never frees it
        // (`give_back` takes it apart with `leak`).
        Ok(unsafe { stream.raw().upgrade_device_ptr::<u8>(address, bytes) })
    }

    /// Takes a block of this pool back from a storage that is being dropped.
    pub(crate) fn give_back(&self, block: CudaSlice<u8>) {
        let bytes = block.len();
        let address = block.leak();
        if bytes > 0 {
            self.state.lock().free.entry(bytes).or_default().push(address);
        }
    }

    fn bytes(&self) -> usize {
        self.state.lock().bytes
    }
}

impl Drop for GraphPool {
    fn drop(&mut self) {
        // The last replay, or work on the pool's tensors on any stream, may still be running.
        let ctx = self.device.context();
        ctx.record_err(ctx.bind_to_thread());
        ctx.record_err(ctx.synchronize());
        for address in std::mem::take(&mut self.state.get_mut().owned) {
            // SAFETY: the address came from `malloc_sync` in this pool, the device has finished
            // every use of it (synchronized above), and nothing refers to it any more: every
            // storage of the pool holds the pool alive.
            ctx.record_err(unsafe { cudarc::driver::result::free_sync(address) });
        }
    }
}

/// A block freed during a capture, released once it ends (see [`ActiveCapture::defer_free`]).
pub(crate) struct DeferredFree {
    pub(crate) block: CudaSlice<u8>,
    pub(crate) uses: super::stream_order::StreamUses,
}

/// A storage that the captured work used.
struct Touched {
    storage: Held,
    wrote: bool,
}

enum Held {
    /// Made before the capture: the graph keeps it alive.
    Kept(Arc<Storage>),
    /// From the graph's pool: its tensors decide how long it lives.
    Pooled(Weak<Storage>),
}

/// The state of a capture in progress on one device: see [`CudaDevice::active_capture`].
pub(crate) struct ActiveCapture {
    stream: Stream,
    pool: Arc<GraphPool>,
    state: Mutex<CaptureState>,
    branches: Mutex<Branches>,
}

/// Whether captures record independent kernels as parallel branches (`OPSMITH_GRAPH_BRANCHES=0`
/// records every node after the one before, as the stream ran them).
fn branches_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var(GRAPH_BRANCHES_ENV).map_or(true, |v| v != "0"))
}

/// The variable that turns parallel branches off when set to `0`: see the [module docs](self).
pub const GRAPH_BRANCHES_ENV: &str = "OPSMITH_GRAPH_BRANCHES";

/// A graph node as an address (`CUgraphNode` is a raw pointer, which is not `Send`).
type Node = usize;

/// What the capture knows of its nodes' dependencies, for recording kernels whose whole
/// footprint is known (`with_cuda_ptrs_exact`) as branches. See the [module docs](self).
#[derive(Default)]
struct Branches {
    /// Off for the rest of the capture after a failure in the middle of an exact launch.
    off: bool,
    /// The capture's dependency set as the last exact launch left it; anything else at the next
    /// one means other work (a copy, a fill, cuBLAS) was recorded in between.
    expected: SmallVec<[Node; 8]>,
    /// Nodes no other node depends on yet: what other work is recorded after, so that it
    /// waits for everything before it.
    sinks: Vec<Node>,
    /// The last other work (a fence): exact launches with no data dependency wait for it.
    fence: SmallVec<[Node; 4]>,
    /// Since the fence, by storage base address: the last node that wrote it and the nodes that
    /// read it since.
    memory: HashMap<u64, Access>,
    /// The dependencies the exact launch in progress was given.
    pending: SmallVec<[Node; 8]>,
}

#[derive(Default)]
struct Access {
    writer: Option<Node>,
    readers: SmallVec<[Node; 4]>,
}

fn same_set(a: &[Node], b: &[Node]) -> bool {
    a.len() == b.len() && a.iter().all(|n| b.contains(n))
}

/// The nodes that the next work recorded on `stream` will depend on.
fn capture_dependencies(stream: &Stream) -> Result<SmallVec<[Node; 8]>> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut nodes: *const sys::CUgraphNode = std::ptr::null();
    let mut count = 0usize;
    // SAFETY: the stream is live; the id and graph outputs are optional (null); the driver
    // writes a pointer to its own array of `count` nodes, valid until the next call on the
    // stream, which is copied out before anything else is called.
    unsafe {
        sys::cuStreamGetCaptureInfo_v2(
            stream.raw().cu_stream(),
            &mut status,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut nodes,
            &mut count,
        )
    }
    .result()
    .map_err(|source| stream.device().driver_error("cuStreamGetCaptureInfo", source))?;
    if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
        return Err(Error::Capture {
            op: "Graph::capture",
            reason: "the driver ended the capture early: something in the closure broke it".into(),
        });
    }
    if count == 0 || nodes.is_null() {
        return Ok(SmallVec::new());
    }
    // SAFETY: the driver's array holds `count` nodes (see above).
    let nodes = unsafe { std::slice::from_raw_parts(nodes, count) };
    Ok(nodes.iter().map(|&n| n as Node).collect())
}

/// Makes `nodes` the dependencies of the next work recorded on `stream`.
fn set_capture_dependencies(stream: &Stream, nodes: &[Node]) -> Result<()> {
    let mut raw: SmallVec<[sys::CUgraphNode; 8]> = nodes.iter().map(|&n| n as sys::CUgraphNode).collect();
    let flags = sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES as u32;
    // SAFETY: the stream is capturing (checked by `capture_dependencies` before each exact
    // launch) and every node belongs to its graph: each came from the driver's dependency set.
    unsafe { sys::cuStreamUpdateCaptureDependencies(stream.raw().cu_stream(), raw.as_mut_ptr(), raw.len(), flags) }
        .result()
        .map_err(|source| stream.device().driver_error("cuStreamUpdateCaptureDependencies", source))
}

#[derive(Default)]
struct CaptureState {
    touched: Vec<Touched>,
    /// Where each storage is in `touched`.
    index: HashMap<usize, usize>,
    /// Other device memory the work reads (labels), kept alive with the graph.
    kept: Vec<Arc<dyn Any + Send + Sync>>,
    deferred: Vec<DeferredFree>,
}

impl ActiveCapture {
    /// Whether `stream` is the one being captured.
    pub(crate) fn is_on(&self, stream: &Stream) -> bool {
        self.stream.same_as(stream)
    }

    /// A block for a tensor made during the capture, from the graph's pool.
    pub(crate) fn alloc(&self, op: &'static str, bytes: usize) -> Result<(CudaSlice<u8>, Arc<GraphPool>)> {
        Ok((self.pool.alloc(op, &self.stream, bytes)?, self.pool.clone()))
    }

    /// Notes that the captured work uses `storage` (and writes it if `write`).
    pub(crate) fn touch(&self, storage: &Arc<Storage>, write: bool) {
        let mut state = self.state.lock();
        let key = Arc::as_ptr(storage) as usize;
        if let Some(&at) = state.index.get(&key) {
            state.touched[at].wrote |= write;
            return;
        }
        let pooled = matches!(&storage.data, StorageData::Cuda { pool: Some(_), .. });
        let held = if pooled { Held::Pooled(Arc::downgrade(storage)) } else { Held::Kept(storage.clone()) };
        let at = state.touched.len();
        state.touched.push(Touched { storage: held, wrote: write });
        state.index.insert(key, at);
    }

    /// Before an exact launch (one kernel that touches exactly `footprint`: each storage's base
    /// address and whether it is written): makes the capture record it after only the nodes it
    /// must follow: for a storage it reads, the last writer; for one it writes, the readers since
    /// that write, or the writer if none. Returns whether it did; if so, call [`end_exact`](Self::end_exact) once the
    /// kernel is queued.
    pub(crate) fn begin_exact(&self, footprint: &[(u64, bool)]) -> Result<bool> {
        let mut b = self.branches.lock();
        if b.off || !branches_enabled() {
            return Ok(false);
        }
        let current = capture_dependencies(&self.stream)?;
        if !same_set(&current, &b.expected) {
            // Other work was recorded since the last exact launch: it depends on everything
            // before it, so everything after depends on it.
            b.fence = current.iter().copied().collect();
            b.sinks = current.to_vec();
            b.memory.clear();
        }
        let mut deps: SmallVec<[Node; 8]> = SmallVec::new();
        let mut add = |n: Node| {
            if !deps.contains(&n) {
                deps.push(n)
            }
        };
        for (base, write) in footprint {
            if let Some(access) = b.memory.get(base) {
                // A write waits for the readers since the last write, which each waited for that
                // write, so an edge from the writer too would be redundant (with programmatic
                // edges too: each kernel's prologue waits for the nodes it follows). With no
                // readers, it waits for the writer itself.
                if *write && !access.readers.is_empty() {
                    access.readers.iter().copied().for_each(&mut add);
                } else {
                    access.writer.into_iter().for_each(&mut add);
                }
            }
        }
        // Every node since the fence depends on it, directly or through its data dependencies.
        if deps.is_empty() {
            deps = b.fence.iter().copied().collect();
        }
        if !same_set(&deps, &current) {
            set_capture_dependencies(&self.stream, &deps)?;
        }
        b.pending = deps;
        Ok(true)
    }

    /// After an exact launch that [`begin_exact`](Self::begin_exact) prepared: notes the new node
    /// as the last writer or a reader of each storage of `footprint`, and leaves the capture's
    /// dependencies on every node without dependents, so that other work waits for all of them.
    /// After a failed launch (`launched` false) it records no more branches in this capture.
    pub(crate) fn end_exact(&self, footprint: &[(u64, bool)], launched: bool) -> Result<()> {
        let mut b = self.branches.lock();
        let current = capture_dependencies(&self.stream)?;
        let pending = std::mem::take(&mut b.pending);
        let mut sinks = std::mem::take(&mut b.sinks);
        if !launched || current.len() != 1 || pending.contains(&current[0]) {
            // Nothing, or not one node, was recorded: from here on everything depends on
            // everything before it.
            b.off = true;
            for n in current {
                if !sinks.contains(&n) {
                    sinks.push(n);
                }
            }
            return set_capture_dependencies(&self.stream, &sinks);
        }
        let node = current[0];
        for (base, write) in footprint {
            let access = b.memory.entry(*base).or_default();
            if *write {
                access.writer = Some(node);
                access.readers.clear();
            } else if !access.readers.contains(&node) {
                access.readers.push(node);
            }
        }
        sinks.retain(|n| !pending.contains(n));
        sinks.push(node);
        set_capture_dependencies(&self.stream, &sinks)?;
        b.expected = sinks.iter().copied().collect();
        b.sinks = sinks;
        Ok(())
    }

    /// Keeps `memory` alive for as long as the graph.
    pub(crate) fn keep(&self, memory: Arc<dyn Any + Send + Sync>) {
        self.state.lock().kept.push(memory);
    }

    /// Holds a block of memory made before the capture and dropped during it until the capture
    /// ends: freeing it now would record the free into the graph (each replay would free it
    /// again), and ordering its free after its users could wait on the capturing stream.
    pub(crate) fn defer_free(&self, free: DeferredFree) {
        self.state.lock().deferred.push(free);
    }
}

/// A recorded sequence of device work, replayed with one launch. See the [module docs](self).
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
/// use opsmith_host::{Tensor, cuda::{CudaDevice, Graph}, ops};
/// let dev = CudaDevice::get(0)?;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3], dev.device())?;
/// let w = Tensor::from_vec(vec![2.0f32; 3], [3], dev.device())?;
/// // Recorded, not run: `y` is a tensor of the graph's pool.
/// let (graph, y) = Graph::capture(&dev, || ops::add_mul(&x, &x, &w))?;
/// graph.replay()?;
/// assert_eq!(y.to_vec::<f32>()?, [4.0, 8.0, 12.0]);
/// x.copy_from_(&Tensor::from_vec(vec![-1.0f32, 0.5, 10.0], [3], dev.device())?)?; // a new input
/// graph.replay()?;
/// assert_eq!(y.to_vec::<f32>()?, [-4.0, 2.0, 40.0]);
/// # Ok(()) }
/// ```
pub struct Graph {
    exec: cudarc::driver::CudaGraph,
    stream: Stream,
    pool: Arc<GraphPool>,
    touched: Vec<Touched>,
    /// Held for the graph's lifetime (see [`CaptureState::kept`]).
    _kept: Vec<Arc<dyn Any + Send + Sync>>,
    nodes: usize,
    depth: usize,
    edges: usize,
    programmatic_edges: usize,
}

// SAFETY: a graph may be launched from any thread; `replay` takes `&self` but `Graph` is not
// `Sync`, so two threads never launch or destroy one graph at once, as the driver requires.
unsafe impl Send for Graph {}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("stream", &self.stream)
            .field("nodes", &self.nodes)
            .field("depth", &self.depth)
            .field("edges", &self.edges)
            .field("programmatic_edges", &self.programmatic_edges)
            .field("pool_bytes", &self.pool.bytes())
            .finish()
    }
}

/// Clears this thread's capture flag and the device's capture when dropped, and ends the
/// stream's capture if the closure panicked before it could end, so the stream runs work again.
struct CaptureScope<'a> {
    device: &'a CudaDevice,
    stream: &'a Stream,
    capturing: bool,
}

impl CaptureScope<'_> {
    fn end(&mut self) -> std::result::Result<Option<cudarc::driver::CudaGraph>, cudarc::driver::DriverError> {
        self.capturing = false;
        self.stream.raw().end_capture(sys::CUgraphInstantiate_flags(0))
    }
}

impl Drop for CaptureScope<'_> {
    fn drop(&mut self) {
        if self.capturing {
            drop(self.end()); // after a panic: the half-recorded graph is discarded
        }
        CAPTURING.with(|c| c.set(false));
        self.device.clear_active_capture();
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // A replay may still be running: the graph, and then the memory it uses, go once the
        // stream has finished it.
        let ctx = self.stream.device().context();
        ctx.record_err(self.stream.raw().synchronize());
    }
}

impl Graph {
    /// Runs `record` once under stream capture on `device`'s current stream and returns the
    /// graph, ready to replay, with what `record` returned (typically the tensors to read after
    /// each replay). The work is recorded, not run: results are there after the first
    /// [`replay`](Self::replay).
    ///
    /// Fails with [`Error::Capture`] when `record` asks for something a graph cannot hold (see
    /// the [module docs](self)), or returns `record`'s own error; either way nothing is kept and
    /// the stream is usable again.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::{Error, Tensor, cuda::{CudaDevice, Graph}, ops};
    /// let dev = CudaDevice::get(0)?;
    /// let x = Tensor::from_vec(vec![1.0f32; 4], [4], dev.device())?;
    /// let err = Graph::capture(&dev, || ops::add(&x, &x)?.to_vec::<f32>()).unwrap_err();
    /// assert!(matches!(err, Error::Capture { op: "Tensor::to_vec", .. }), "{err}");
    /// # Ok(()) }
    /// ```
    pub fn capture<R, E: From<Error>>(
        device: &CudaDevice,
        record: impl FnOnce() -> std::result::Result<R, E>,
    ) -> std::result::Result<(Graph, R), E> {
        let op = "Graph::capture";
        if capturing_thread() {
            return Err(Error::Capture { op, reason: "this thread is already capturing a graph".into() }.into());
        }
        let stream = device.current_stream();
        device.bind()?;
        let pool = Arc::new(GraphPool { device: device.clone(), state: Mutex::new(PoolState::default()) });
        let capture = Arc::new(ActiveCapture {
            stream: stream.clone(),
            pool,
            state: Mutex::default(),
            branches: Mutex::default(),
        });
        if !device.try_set_active_capture(capture.clone()) {
            return Err(
                Error::Capture { op, reason: format!("{} is already capturing a graph", device.device()) }.into()
            );
        }
        let mut scope = CaptureScope { device, stream: &stream, capturing: false };
        stream
            .raw()
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(|source| device.driver_error("cuStreamBeginCapture", source))?;
        scope.capturing = true;
        CAPTURING.with(|c| c.set(true));
        let recorded = record();
        // The capture ends whatever happened, so the stream can run work again.
        let ended = scope.end();
        drop(scope);

        let state = std::mem::take(&mut *capture.state.lock());
        // Blocks freed during the capture are released now, in stream order as usual.
        for DeferredFree { block, uses } in state.deferred {
            super::block_cache::release(device, block, &uses);
        }
        let value = recorded?;
        let exec = match ended {
            Ok(Some(exec)) => exec,
            Ok(None) => return Err(Error::Capture { op, reason: "the driver returned no graph".into() }.into()),
            Err(source) => return Err(capture_failure(device, source).into()),
        };
        let nodes = node_count(&exec);
        let GraphShape { depth, edges, programmatic_edges } = graph_shape(&exec);
        exec.upload().map_err(|source| device.driver_error("cuGraphUpload", source))?;
        let graph = Graph {
            exec,
            stream,
            pool: capture.pool.clone(),
            touched: state.touched,
            _kept: state.kept,
            nodes,
            depth,
            edges,
            programmatic_edges,
        };
        Ok((graph, value))
    }

    /// Runs the recorded work again, on the stream it was captured on, after the work queued
    /// so far on any stream that uses the graph's tensors; later work on any stream that uses
    /// them waits for it. Returns once the replay is queued.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::{Tensor, cuda::{CudaDevice, Graph}, ops};
    /// let dev = CudaDevice::get(0)?;
    /// let total = Tensor::zeros([1], opsmith_host::DType::F32, dev.device())?;
    /// let one = Tensor::from_vec(vec![1.0f32], [1], dev.device())?;
    /// let (count, ()) = Graph::capture(&dev, || ops::add_into(&total, &one, &total))?;
    /// for _ in 0..10 {
    ///     count.replay()?;
    /// }
    /// assert_eq!(total.to_vec::<f32>()?, [10.0]);
    /// # Ok(()) }
    /// ```
    pub fn replay(&self) -> Result<()> {
        let device = self.stream.device();
        refuse_while_capturing("Graph::replay", "a graph cannot launch another graph")?;
        device.bind()?;
        for touched in &self.touched {
            let storage = match &touched.storage {
                Held::Kept(storage) => storage.clone(),
                Held::Pooled(weak) => match weak.upgrade() {
                    Some(storage) => storage,
                    None => continue, // no tensor left to order
                },
            };
            if let StorageData::Cuda { uses, .. } = &storage.data {
                if touched.wrote {
                    uses.write_on(&self.stream)?;
                    storage.bump_version();
                } else {
                    uses.read_on(&self.stream)?;
                    uses.read_done(&self.stream)?;
                }
            }
        }
        self.exec.launch().map_err(|source| device.driver_error("cuGraphLaunch", source))?;
        if super::launch_blocking() {
            self.stream.synchronize()?;
        }
        Ok(())
    }

    /// The stream the graph was captured on, which replays run on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The number of nodes (kernels, copies, fills) the driver recorded.
    pub fn node_count(&self) -> usize {
        self.nodes
    }

    /// The longest chain of nodes that each wait for the one before: the nodes a replay runs
    /// one after another. Below [`node_count`](Self::node_count) when independent work was
    /// recorded as parallel branches (see the [module docs](self)).
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::{Tensor, cuda::{CudaDevice, Graph}, ops};
    /// let dev = CudaDevice::get(0)?;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], [2], dev.device())?;
    /// let y = Tensor::from_vec(vec![3.0f32, 4.0], [2], dev.device())?;
    /// // Two sums that share no memory, then their product: 3 nodes, 2 in a row.
    /// let (graph, z) = Graph::capture(&dev, || ops::mul(&ops::add(&x, &x)?, &ops::add(&y, &y)?))?;
    /// graph.replay()?;
    /// assert_eq!(z.to_vec::<f32>()?, [12.0, 32.0]);
    /// if std::env::var("OPSMITH_GRAPH_BRANCHES").as_deref() != Ok("0") {
    ///     assert_eq!((graph.node_count(), graph.depth()), (3, 2));
    /// }
    /// # Ok(()) }
    /// ```
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// How many dependencies the graph holds: each an edge from a node to one that waits for
    /// it. A capture records only the edges the data needs (see the [module docs](self)), so a
    /// chain of `n` kernels has `n - 1`.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::{Tensor, cuda::{CudaDevice, Graph}, ops};
    /// let dev = CudaDevice::get(0)?;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], [2], dev.device())?;
    /// // Each add reads the one before: 4 nodes in a row, 3 edges.
    /// let (graph, y) = Graph::capture(&dev, || {
    ///     let mut y = x.clone();
    ///     for _ in 0..4 {
    ///         y = ops::add(&y, &x)?;
    ///     }
    ///     Ok::<_, opsmith_host::Error>(y)
    /// })?;
    /// graph.replay()?;
    /// assert_eq!(y.to_vec::<f32>()?, [5.0, 10.0]);
    /// assert_eq!((graph.node_count(), graph.edge_count()), (4, 3));
    /// # Ok(()) }
    /// ```
    pub fn edge_count(&self) -> usize {
        self.edges
    }

    /// How many of the graph's edges are programmatic: the dependent node may be launched
    /// before the node it follows has finished, and waits for it before touching memory (see
    /// [Dependent launch](self#dependent-launch)). 0 before sm_90, with
    /// `OPSMITH_DEPENDENT_LAUNCH=0`, and in a graph of kernels other than opsmith's.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
    /// use opsmith_host::{Tensor, cuda::{CudaDevice, Graph}, ops};
    /// let dev = CudaDevice::get(0)?;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], [2], dev.device())?;
    /// let (graph, y) = Graph::capture(&dev, || ops::mul(&ops::add(&x, &x)?, &x))?;
    /// graph.replay()?;
    /// assert_eq!(y.to_vec::<f32>()?, [2.0, 8.0]);
    /// let early = dev.kernel("mul_f32")?.dependent_launch();
    /// assert_eq!(graph.programmatic_edges(), if early { 1 } else { 0 });
    /// # Ok(()) }
    /// ```
    pub fn programmatic_edges(&self) -> usize {
        self.programmatic_edges
    }

    /// Writes the graph's nodes and edges to `path` in Graphviz's DOT format (the driver's
    /// `cuGraphDebugDotPrint`, kernel names and launch shapes included): to see what a capture
    /// recorded and which nodes run one after another.
    pub fn write_dot(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let op = "Graph::write_dot";
        let path = path.as_ref();
        let text = path.to_str().ok_or_else(|| Error::InvalidArgument {
            op,
            reason: format!("the path {} is not UTF-8", path.display()),
        })?;
        let c_path = std::ffi::CString::new(text)
            .map_err(|_| Error::InvalidArgument { op, reason: "the path holds a NUL byte".into() })?;
        // Verbose: every node's parameters, kernel names included.
        let flags = sys::CUgraphDebugDot_flags::CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE as u32;
        // SAFETY: the graph is live and the path a NUL-terminated string that outlives the call.
        unsafe { sys::cuGraphDebugDotPrint(self.exec.cu_graph(), c_path.as_ptr(), flags) }
            .result()
            .map_err(|source| self.stream.device().driver_error("cuGraphDebugDotPrint", source))
    }

    /// Bytes of device memory in the graph's private pool: every allocation its capture made.
    pub fn pool_bytes(&self) -> usize {
        self.pool.bytes()
    }
}

/// What [`graph_shape`] reads of a captured graph (all 0 if the driver does not say).
#[derive(Debug, Default, PartialEq)]
struct GraphShape {
    /// The longest chain of dependent nodes.
    depth: usize,
    edges: usize,
    /// Of `edges`, those that are programmatic.
    programmatic_edges: usize,
}

/// The shape of a captured graph: its longest chain, its edges and how many of them are
/// programmatic. The edge query is the one that returns each edge's data: the plain one refuses
/// a graph with programmatic edges as lossy.
fn graph_shape(exec: &cudarc::driver::CudaGraph) -> GraphShape {
    let graph = exec.cu_graph();
    let mut count = 0usize;
    // SAFETY: the graph is live; a null node array asks only for the count.
    if unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut count) }.result().is_err() {
        return GraphShape::default();
    }
    let mut nodes = vec![std::ptr::null_mut(); count];
    // SAFETY: `nodes` has room for `count` nodes.
    if unsafe { sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut count) }.result().is_err() {
        return GraphShape::default();
    }
    // Edge data came with CUDA 12.3; before it no graph of ours has programmatic edges.
    let with_data = super::driver_at_least(12, 3);
    let get_edges =
        |from: *mut sys::CUgraphNode, to: *mut sys::CUgraphNode, data: *mut sys::CUgraphEdgeData, edges: &mut usize| {
            // SAFETY: the graph is live; each array is null (asking for the count) or has room for
            // `edges` entries.
            let status = unsafe {
                if with_data {
                    sys::cuGraphGetEdges_v2(graph, from, to, data, edges)
                } else {
                    sys::cuGraphGetEdges(graph, from, to, edges)
                }
            };
            status.result().is_ok()
        };
    let mut edges = 0usize;
    if !get_edges(std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), &mut edges) {
        return GraphShape::default();
    }
    // No edges: every node is a chain of one. (Asking for zero edges into empty arrays is an
    // invalid value to the driver.)
    if edges == 0 {
        return GraphShape { depth: depth_of(count, &[]), ..GraphShape::default() };
    }
    let (mut from, mut to) = (vec![std::ptr::null_mut(); edges], vec![std::ptr::null_mut(); edges]);
    let mut data = vec![sys::CUgraphEdgeData { from_port: 0, to_port: 0, type_: 0, reserved: [0; 5] }; edges];
    if !get_edges(from.as_mut_ptr(), to.as_mut_ptr(), data.as_mut_ptr(), &mut edges) {
        return GraphShape::default();
    }
    let index: HashMap<sys::CUgraphNode, usize> = nodes.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let pairs: Vec<(usize, usize)> =
        from.iter().zip(&to).filter_map(|(f, t)| Some((*index.get(f)?, *index.get(t)?))).collect();
    let programmatic = sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8;
    GraphShape {
        depth: depth_of(count, &pairs),
        edges,
        programmatic_edges: data[..edges].iter().filter(|e| e.type_ == programmatic).count(),
    }
}

/// The number of nodes on the longest path of a DAG of `nodes` nodes with edges `pairs`
/// (Kahn's order; nodes on a cycle, which a graph cannot have, are left out).
fn depth_of(nodes: usize, pairs: &[(usize, usize)]) -> usize {
    let mut incoming = vec![0usize; nodes];
    let mut out: Vec<Vec<usize>> = vec![Vec::new(); nodes];
    for &(f, t) in pairs {
        incoming[t] += 1;
        out[f].push(t);
    }
    let mut depth = vec![1usize; nodes];
    let mut ready: Vec<usize> = (0..nodes).filter(|&n| incoming[n] == 0).collect();
    let mut longest = 0;
    while let Some(n) = ready.pop() {
        longest = longest.max(depth[n]);
        for &t in &out[n] {
            depth[t] = depth[t].max(depth[n] + 1);
            incoming[t] -= 1;
            if incoming[t] == 0 {
                ready.push(t);
            }
        }
    }
    longest
}

/// The nodes of a captured graph (0 if the driver does not say).
fn node_count(exec: &cudarc::driver::CudaGraph) -> usize {
    let mut count = 0usize;
    // SAFETY: the graph is live; a null node array asks only for the count.
    let status = unsafe { sys::cuGraphGetNodes(exec.cu_graph(), std::ptr::null_mut(), &mut count) };
    if status.result().is_err() { 0 } else { count }
}

/// The error for a capture the driver ended with an error: a typed capture error when the
/// driver refused something in it, a driver error otherwise.
fn capture_failure(device: &CudaDevice, source: cudarc::driver::DriverError) -> Error {
    use sys::CUresult::*;
    match source.0 {
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        | CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        | CUDA_ERROR_STREAM_CAPTURE_ISOLATION
        | CUDA_ERROR_STREAM_CAPTURE_UNJOINED
        | CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => Error::Capture {
            op: "Graph::capture",
            reason: format!(
                "the driver refused part of the captured work ({source}); something in the closure used the \
                 device outside opsmith's checks (another stream, or a raw driver call)"
            ),
        },
        _ => device.driver_error("cuStreamEndCapture", source),
    }
}

#[cfg(test)]
mod tests {
    use super::depth_of;

    #[test]
    fn depth_counts_the_nodes_of_the_longest_chain() {
        assert_eq!(depth_of(0, &[]), 0);
        assert_eq!(depth_of(3, &[]), 1, "nodes without edges are chains of one");
        // 0 -> 1 -> 3 and 0 -> 2 -> 3 -> 4, and a lone node 5.
        assert_eq!(depth_of(6, &[(0, 1), (1, 3), (0, 2), (2, 3), (3, 4)]), 4);
    }
}
