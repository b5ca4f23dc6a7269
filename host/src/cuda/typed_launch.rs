//! Typed launches: a kernel's [`KernelDecl`] (from `opsmith_kernels::kernel!`) fixes, in its
//! type, what a launch passes; the launcher checks the rest at run time.
//!
//! * At compile time: the number, order and kind of the arguments. A buffer parameter takes a
//!   `&Tensor`, a scalar parameter a value of exactly its type (`u64`, `f32`, ...), as a tuple in
//!   the kernel's parameter order.
//! * At run time, before anything reaches the driver: every tensor is on one CUDA device, has
//!   the dtype the kernel declares for its parameter and exactly the declared length (from the
//!   scalar arguments), and every output overlaps no other buffer (except an `#[in_place]`
//!   output that is exactly one of the inputs). Each failure is a typed [`Error`] naming the
//!   kernel and the parameter.
//!
//! The launch then runs on the device's current stream, ordered after earlier work on the
//! tensors on other streams, as opsmith's own ops are.
use super::launch::{DEFAULT_BLOCK, LaunchConfig};
use super::{CudaDevice, Kernel, KernelModule};
use crate::tensor::storage::with_cuda_ptrs_exact;
use crate::{DType, Device, Error, Result, Tensor};
use opsmith_kernels::decl::{ElemKind, In, KernelDecl, KernelScalar, Out, ParamDecl, ParamKind};
use smallvec::SmallVec;
use std::ffi::c_void;
use std::sync::Arc;

/// How many threads a launch starts.
///
/// ```
/// use opsmith_host::cuda::{Grid, LaunchConfig};
/// let g = Grid::covering(1000).with_block(128);
/// assert_eq!(g, Grid::Covering { items: 1000, block: 128 });
/// let exact = Grid::Config(LaunchConfig { grid: 1, block: 32, shared_mem_bytes: 0 });
/// # let _ = exact;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grid {
    /// For grid-stride kernels: one item per thread, but never more blocks than the device
    /// keeps resident at once ([`LaunchConfig::grid_stride`]).
    Stride {
        /// Work items (elements, or vector packs).
        items: u64,
        /// Threads per block.
        block: u32,
    },
    /// One item per thread, up to the largest grid CUDA allows ([`LaunchConfig::covering`]).
    Covering {
        /// Work items.
        items: u64,
        /// Threads per block.
        block: u32,
    },
    /// Exactly this configuration.
    Config(LaunchConfig),
}

impl Grid {
    /// [`Grid::Stride`] over `items`, in blocks of [`DEFAULT_BLOCK`] threads.
    pub const fn stride(items: u64) -> Self {
        Grid::Stride { items, block: DEFAULT_BLOCK }
    }

    /// [`Grid::Covering`] over `items`, in blocks of [`DEFAULT_BLOCK`] threads.
    pub const fn covering(items: u64) -> Self {
        Grid::Covering { items, block: DEFAULT_BLOCK }
    }

    /// The same grid with `block` threads per block (no change to [`Grid::Config`]).
    pub const fn with_block(self, block: u32) -> Self {
        match self {
            Grid::Stride { items, .. } => Grid::Stride { items, block },
            Grid::Covering { items, .. } => Grid::Covering { items, block },
            config @ Grid::Config(_) => config,
        }
    }

    fn config(self, kernel: &Kernel) -> Result<LaunchConfig> {
        match self {
            Grid::Stride { items, block } => LaunchConfig::grid_stride(kernel, items, block),
            Grid::Covering { items, block } => LaunchConfig::covering(kernel.name(), items, block),
            Grid::Config(cfg) => Ok(cfg),
        }
    }
}

/// One argument once its type has matched its parameter.
#[derive(Clone, Copy)]
#[doc(hidden)]
pub enum ArgValue<'a> {
    /// A buffer.
    Tensor(&'a Tensor),
    /// A scalar: its bits, its width in bytes (4 or 8), and its value as a length.
    Scalar { bits: u64, wide: bool, len: Option<u64> },
}

mod sealed {
    pub trait Sealed {}
}

/// A parameter type of a [`KernelDecl`]: the marker [`In`] or [`Out`] of a buffer, or a scalar
/// type. Implemented by opsmith only.
pub trait KernelParam: sealed::Sealed {
    /// What a launch passes for it: `&Tensor` for a buffer, the scalar itself otherwise.
    type Arg<'a>;
    #[doc(hidden)]
    fn value<'a>(arg: Self::Arg<'a>) -> ArgValue<'a>;
}

impl sealed::Sealed for In {}
impl KernelParam for In {
    type Arg<'a> = &'a Tensor;
    fn value<'a>(arg: Self::Arg<'a>) -> ArgValue<'a> {
        ArgValue::Tensor(arg)
    }
}

impl sealed::Sealed for Out {}
impl KernelParam for Out {
    type Arg<'a> = &'a Tensor;
    fn value<'a>(arg: Self::Arg<'a>) -> ArgValue<'a> {
        ArgValue::Tensor(arg)
    }
}

macro_rules! scalar_param {
    ($($t:ty => |$v:ident| $bits:expr, $wide:expr;)*) => {$(
        impl sealed::Sealed for $t {}
        impl KernelParam for $t {
            type Arg<'a> = $t;
            fn value<'a>($v: Self::Arg<'a>) -> ArgValue<'a> {
                ArgValue::Scalar { bits: $bits, wide: $wide, len: KernelScalar::as_len($v) }
            }
        }
    )*};
}

scalar_param! {
    u32 => |v| v as u64, false;
    i32 => |v| v as u32 as u64, false;
    f32 => |v| v.to_bits() as u64, false;
    u64 => |v| v, true;
    i64 => |v| v as u64, true;
    f64 => |v| v.to_bits(), true;
}

/// A kernel's whole parameter list: a tuple of [`KernelParam`]s, whose launch arguments are the
/// tuple of their [`Arg`](KernelParam::Arg)s.
pub trait KernelParams: sealed::Sealed {
    /// The tuple a launch passes.
    type Args<'a>;
    #[doc(hidden)]
    fn values<'a>(args: Self::Args<'a>, out: &mut SmallVec<[ArgValue<'a>; 16]>);
}

macro_rules! tuple_params {
    ($($p:ident $a:ident),*) => {
        impl<$($p: KernelParam),*> sealed::Sealed for ($($p,)*) {}
        impl<$($p: KernelParam),*> KernelParams for ($($p,)*) {
            type Args<'a> = ($($p::Arg<'a>,)*);
            #[allow(unused_variables, clippy::unused_unit)]
            fn values<'a>(args: Self::Args<'a>, out: &mut SmallVec<[ArgValue<'a>; 16]>) {
                let ($($a,)*) = args;
                $(out.push($p::value($a));)*
            }
        }
    };
}

tuple_params!();
tuple_params!(A a);
tuple_params!(A a, B b);
tuple_params!(A a, B b, C c);
tuple_params!(A a, B b, C c, D d);
tuple_params!(A a, B b, C c, D d, E e);
tuple_params!(A a, B b, C c, D d, E e, F f);
tuple_params!(A a, B b, C c, D d, E e, F f, G g);
tuple_params!(A a, B b, C c, D d, E e, F f, G g, H h);
tuple_params!(A a, B b, C c, D d, E e, F f, G g, H h, I i);
tuple_params!(A a, B b, C c, D d, E e, F f, G g, H h, I i, J j);
tuple_params!(A a, B b, C c, D d, E e, F f, G g, H h, I i, J j, K k);
tuple_params!(A a, B b, C c, D d, E e, F f, G g, H h, I i, J j, K k, L l);
tuple_params!(A a, B b, C c, D d, E e, F f, G g, H h, I i, J j, K k, L l, M m);
tuple_params!(A a, B b, C c, D d, E e, F f, G g, H h, I i, J j, K k, L l, M m, N n);
tuple_params!(A a, B b, C c, D d, E e, F f, G g, H h, I i, J j, K k, L l, M m, N n, O o);
tuple_params!(A a, B b, C c, D d, E e, F f, G g, H h, I i, J j, K k, L l, M m, N n, O o, P p);
tuple_params!(A a, B b, C c, D d, E e, F f, G g, H h, I i, J j, K k, L l, M m, N n, O o, P p, Q q);
tuple_params!(A a, B b, C c, D d, E e, F f, G g, H h, I i, J j, K k, L l, M m, N n, O o, P p, Q q, R r);
tuple_params!(A a, B b, C c, D d, E e, F f, G g, H h, I i, J j, K k, L l, M m, N n, O o, P p, Q q, R r, S s);
tuple_params!(A a, B b, C c, D d, E e, F f, G g, H h, I i, J j, K k, L l, M m, N n, O o, P p, Q q, R r, S s, T t);
tuple_params!(A a, B b, C c, D d, E e, F f, G g, H h, I i, J j, K k, L l, M m, N n, O o, P p, Q q, R r, S s, T t, U u);
tuple_params!(A a, B b, C c, D d, E e, F f, G g, H h, I i, J j, K k, L l, M m, N n, O o, P p, Q q, R r, S s, T t, U u, V v);
tuple_params!(A a, B b, C c, D d, E e, F f, G g, H h, I i, J j, K k, L l, M m, N n, O o, P p, Q q, R r, S s, T t, U u, V v, W w);
tuple_params!(A a, B b, C c, D d, E e, F f, G g, H h, I i, J j, K k, L l, M m, N n, O o, P p, Q q, R r, S s, T t, U u, V v, W w, X x);
tuple_params!(A a, B b, C c, D d, E e, F f, G g, H h, I i, J j, K k, L l, M m, N n, O o, P p, Q q, R r, S s, T t, U u, V v, W w, X x, Y y);
tuple_params!(A a, B b, C c, D d, E e, F f, G g, H h, I i, J j, K k, L l, M m, N n, O o, P p, Q q, R r, S s, T t, U u, V v, W w, X x, Y y, Z z);

/// The PTX of a kernel crate, loaded into each device's context on first use and kept there.
///
/// Declare one per kernel crate, as a `static`, and launch its kernels through it:
///
/// ```no_run
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::cuda::{Grid, KernelCrate};
/// use opsmith_host::{Device, Tensor};
/// # const PTX: &str = "";
/// # opsmith_kernels::kernel! {
/// #     /// `y = a * x`.
/// #     pub unsafe fn scale_f32(x: *const [f32; n], #[in_place] y: *mut [f32; n], a: f32, n: u64) {}
/// # }
/// static MY_KERNELS: KernelCrate = KernelCrate::new("my-kernels", PTX);
///
/// let x = Tensor::from_vec(vec![1.0f32; 1024], [1024], Device::Cuda(0))?;
/// let y = Tensor::empty([1024], x.dtype(), x.device())?;
/// MY_KERNELS.launch(scale_f32, Grid::stride(1024), (&x, &y, 2.0, 1024))?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct KernelCrate {
    name: &'static str,
    ptx: &'static str,
}

impl KernelCrate {
    /// The kernels of `ptx`, which errors and [`KernelModule::name`] call `name`.
    pub const fn new(name: &'static str, ptx: &'static str) -> Self {
        Self { name, ptx }
    }

    /// The crate's name.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// The module on `device`, loaded (and the PTX compiled by the driver) on the first call
    /// for that device; later calls return the same module.
    pub fn module(&self, device: &CudaDevice) -> Result<Arc<KernelModule>> {
        device.user_module(self.name, self.ptx)
    }

    /// Launches `kernel` from this crate on its tensors' device, after the checks that
    /// [`cuda::launch`](crate::cuda::launch) makes.
    ///
    /// A wrong argument type or order does not compile:
    ///
    /// ```compile_fail
    /// # use opsmith_host::{Tensor, cuda::{Grid, KernelCrate}};
    /// # opsmith_kernels::kernel! {
    /// #     pub unsafe fn scale_f32(x: *const [f32; n], #[in_place] y: *mut [f32; n], a: f32, n: u64) {}
    /// # }
    /// # static K: KernelCrate = KernelCrate::new("k", "");
    /// # fn f(x: &Tensor, y: &Tensor) -> opsmith_host::Result<()> {
    /// K.launch(scale_f32, Grid::stride(8), (x, 2.0f32, y, 8u64)) // a scalar where a buffer goes
    /// # }
    /// ```
    pub fn launch<P: KernelParams>(&self, kernel: KernelDecl<P>, grid: Grid, args: P::Args<'_>) -> Result<()> {
        let mut values = SmallVec::new();
        P::values(args, &mut values);
        let declared = Declared { params: kernel.params(), required_len: &|v, i| kernel.required_len(v, i) };
        launch_checked(kernel.name(), &declared, &values, grid, |device| self.module(device)?.kernel(kernel.name()))
    }
}

/// Launches one of opsmith's own kernels (from `opsmith_kernels::names`) on its tensors'
/// device.
///
/// Checked at compile time: the number, order and kind of the arguments (a buffer parameter
/// takes a `&Tensor`, a scalar parameter a value of exactly its type, as a tuple in the
/// kernel's parameter order). Checked at run time, before anything reaches the driver: every
/// tensor has the dtype the kernel declares for its parameter ([`Error::ArgumentDType`]) and
/// exactly the declared length ([`Error::ArgumentLength`]), no output overlaps another buffer
/// unless it is an `#[in_place]` output that is exactly one of the inputs ([`Error::Overlap`]),
/// and all of them are on one CUDA device. The launch then runs on that device's current
/// stream, ordered after earlier work on the tensors on other streams.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// # if !opsmith_host::Device::cuda_if_available().is_cuda() { return Ok(()); }
/// use opsmith_host::cuda::{self, Grid};
/// use opsmith_host::{DType, Device, Error, Tensor};
/// let add = opsmith_kernels::names::F32.add;
/// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3], Device::Cuda(0))?;
/// let out = Tensor::empty([3], DType::F32, Device::Cuda(0))?;
/// cuda::launch(add, Grid::stride(3), (&a, &a, &out, 3))?;
/// assert_eq!(out.to_vec::<f32>()?, [2.0, 4.0, 6.0]);
/// // A length the tensors do not have is an error, not an out-of-bounds write.
/// let err = cuda::launch(add, Grid::stride(4), (&a, &a, &out, 4)).unwrap_err();
/// assert!(matches!(err, Error::ArgumentLength { param: "a", expected: Some(4), actual: 3, .. }));
/// # Ok(()) }
/// ```
pub fn launch<P: KernelParams>(kernel: KernelDecl<P>, grid: Grid, args: P::Args<'_>) -> Result<()> {
    let mut values = SmallVec::new();
    P::values(args, &mut values);
    let declared = Declared { params: kernel.params(), required_len: &|v, i| kernel.required_len(v, i) };
    launch_checked(kernel.name(), &declared, &values, grid, |device| device.kernel(kernel.name()))
}

/// [`KernelDecl::required_len`] without the declaration's type parameter.
type RequiredLen<'d> = dyn Fn(&[Option<u64>], usize) -> Option<u64> + 'd;

/// What [`launch_checked`] needs of a declaration, without its type parameter.
struct Declared<'d> {
    params: &'static [ParamDecl],
    required_len: &'d RequiredLen<'d>,
}

/// The element type a dtype stores as, in a kernel's terms; f64 has none.
fn elem_kind(dtype: DType) -> Option<ElemKind> {
    match dtype {
        DType::F32 => Some(ElemKind::F32),
        DType::F16 => Some(ElemKind::F16),
        DType::BF16 => Some(ElemKind::BF16),
        DType::F64 => Some(ElemKind::F64),
        DType::U32 => Some(ElemKind::U32),
        DType::I64 => Some(ElemKind::I64),
    }
}

/// The checks, then the launch. Not generic, so each kernel's launcher is a few instructions.
fn launch_checked(
    kernel_name: &'static str,
    decl: &Declared<'_>,
    args: &[ArgValue<'_>],
    grid: Grid,
    load: impl FnOnce(&CudaDevice) -> Result<Kernel>,
) -> Result<()> {
    let params = decl.params;
    if params.len() != args.len() {
        // The types make this impossible; a hand-made declaration could still get here.
        return Err(Error::InvalidArgument {
            op: kernel_name,
            reason: format!("declares {} parameters, was given {} arguments", params.len(), args.len()),
        });
    }
    let lens: SmallVec<[Option<u64>; 16]> =
        args.iter().map(|a| if let ArgValue::Scalar { len, .. } = a { *len } else { None }).collect();
    let buffers = || {
        params.iter().zip(args).enumerate().filter_map(|(i, (p, a))| match a {
            ArgValue::Tensor(t) => Some((i, p, *t)),
            ArgValue::Scalar { .. } => None,
        })
    };

    // Each buffer's dtype and length, as declared.
    for (i, p, t) in buffers() {
        let expected = p.kind.elem().unwrap_or(ElemKind::U32);
        if elem_kind(t.dtype()) != Some(expected) {
            return Err(Error::ArgumentDType { kernel: kernel_name, param: p.name, expected, actual: t.dtype() });
        }
        let expected = (decl.required_len)(&lens, i);
        let actual = t.elem_count() as u64;
        if expected != Some(actual) {
            return Err(Error::ArgumentLength { kernel: kernel_name, param: p.name, expected, actual });
        }
    }

    // Outputs overlap nothing, but an in-place output may be exactly an input.
    for (k, (i, p, out)) in buffers().filter(|(_, p, _)| p.kind.is_output()).enumerate() {
        let clash = buffers().any(|(j, q, other)| {
            let in_place = matches!(p.kind, ParamKind::InPlaceOut(_))
                && matches!(q.kind, ParamKind::In(_))
                && crate::ops::check::identical(out, other);
            j != i && crate::ops::check::overlaps(out, other) && !in_place
        });
        if clash {
            return Err(Error::Overlap { op: kernel_name, output: k });
        }
    }

    // One CUDA device for every buffer.
    let Some((_, _, first)) = buffers().next() else {
        return Err(Error::InvalidArgument {
            op: kernel_name,
            reason: "has no buffer parameter to say which device runs it".into(),
        });
    };
    let device = first.device();
    let Device::Cuda(ordinal) = device else {
        return Err(Error::InvalidArgument {
            op: kernel_name,
            reason: format!("is a CUDA kernel; its buffers are on {device}"),
        });
    };
    if let Some((_, _, t)) = buffers().find(|(_, _, t)| t.device() != device) {
        return Err(Error::DeviceMismatch { op: kernel_name, lhs: device, rhs: t.device() });
    }

    let (reads, writes): (SmallVec<[&Tensor; 8]>, SmallVec<[&Tensor; 8]>) = {
        let (mut r, mut w) = (SmallVec::new(), SmallVec::new());
        for (_, p, t) in buffers() {
            if p.kind.is_output() { w.push(t) } else { r.push(t) }
        }
        (r, w)
    };
    if buffers().all(|(_, _, t)| t.elem_count() == 0) {
        // No element to touch, so no launch; the outputs count as written all the same.
        writes.iter().for_each(|t| t.storage.bump_version());
        return Ok(());
    }

    let device = CudaDevice::get(ordinal)?;
    let kernel = load(&device)?;
    let cfg = grid.config(&kernel)?;
    let stream = device.current_stream();
    with_cuda_ptrs_exact(kernel_name, &stream, &reads, &writes, |read_ptrs, write_ptrs| {
        let (mut r, mut w) = (read_ptrs.iter(), write_ptrs.iter());
        // Every parameter as a 64-bit slot; the driver reads 4 bytes of a 32-bit one (the low
        // half, on the little-endian hosts CUDA runs on).
        let mut slots: SmallVec<[u64; 16]> = SmallVec::new();
        for (p, a) in params.iter().zip(args) {
            slots.push(match a {
                ArgValue::Tensor(_) => {
                    // `with_cuda_ptrs` gives one pointer per tensor, in the order given.
                    let next = if p.kind.is_output() { w.next() } else { r.next() };
                    *next.ok_or(Error::InvalidArgument { op: kernel_name, reason: "lost a buffer pointer".into() })?
                }
                ArgValue::Scalar { bits, wide, .. } => {
                    if *wide {
                        *bits
                    } else {
                        *bits & 0xffff_ffff
                    }
                }
            });
        }
        let mut pointers: SmallVec<[*mut c_void; 16]> =
            slots.iter_mut().map(|slot| slot as *mut u64 as *mut c_void).collect();
        // SAFETY: the declaration that typed `args` was generated from the kernel's own parameter
        // list, so there is one slot per parameter, of its width; each buffer has the declared
        // dtype, length and device, and the outputs overlap only what the kernel allows.
        unsafe { kernel.launch_raw(&stream, cfg, &mut pointers) }
    })
}
