//! Optimizer steps that update parameters in place: SGD (plain, or with momentum) and Adam
//! (AdamW when weight decay is on), each one fused kernel, and their update formulas, which the
//! CPU backend runs too (generic over [`Real`]). The kernels use only FMA, multiply, divide and
//! square root, all correctly rounded in PTX as on the CPU, so both give the same bits.
//!
//! Adam comes in two forms. `adam` takes its per-step scalars ([`AdamCoefficients`]) as kernel
//! parameters, computed on the host. The capturable form keeps them in device memory:
//! `adam_advance` moves an [`AdamProgress`] (step count, running powers of the betas, learning
//! rate) one step on the device and writes the coefficients that `adam_device` then reads, so a
//! recorded CUDA graph replays correct steps. [`AdamProgress::advance`] is the one definition of
//! that step, run by the kernel and by the CPU backend alike: f64 multiply, subtract, divide and
//! square root, correctly rounded on both, then one rounding to f32.
//!
//! ```
//! use opsmith_kernels::optim::{AdamHyper, AdamProgress};
//! let hyper = AdamHyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };
//! let mut progress = AdamProgress::start(1e-3);
//! let first = progress.advance(&hyper);
//! assert_eq!(progress.step, 1.0);
//! // The first step's bias corrections: lr / (1 - β1) and 1 / √(1 - β2).
//! assert!((first.step_size - 1e-3 / 0.1).abs() < 1e-15);
//! assert!((first.inv_sqrt_bias2 - 1.0 / 0.001f64.sqrt()).abs() < 1e-12);
//! ```
use crate::names::OptimizerKernels;
use crate::real::Real;

/// Plain SGD for one element: `p − lr (g + wd p)`.
#[inline(always)]
pub fn sgd<T: Real>(p: T, g: T, lr: T, weight_decay: T) -> T {
    let d = weight_decay.mul_add(p, g);
    (-lr).mul_add(d, p)
}

/// SGD with momentum for one element: `buf' = μ buf + (g + wd p)`, `p' = p − lr buf'`.
/// Returns `(p', buf')`.
#[inline(always)]
pub fn sgd_momentum<T: Real>(p: T, g: T, buf: T, lr: T, momentum: T, weight_decay: T) -> (T, T) {
    let d = weight_decay.mul_add(p, g);
    let buf = momentum.mul_add(buf, d);
    ((-lr).mul_add(buf, p), buf)
}

/// The per-step scalars of an Adam update, derived in f64 from the hyperparameters, the
/// learning rate and the step number, then rounded to the arithmetic type: on the host for the
/// `adam` kernels, which take them as scalar parameters in field order
/// ([`AdamCoefficients::to_array`]); by [`AdamProgress::advance`] for the capturable form, whose
/// `adam_device` kernels read them from device memory in the same order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamCoefficients<T> {
    /// β1, the first moment's decay.
    pub beta1: T,
    /// 1 − β1, formed in f64 (in f32, `1 − 0.999f32` keeps only 4 digits).
    pub one_minus_beta1: T,
    /// β2, the second moment's decay.
    pub beta2: T,
    /// 1 − β2, formed in f64.
    pub one_minus_beta2: T,
    /// ε, added to the bias-corrected `√v`.
    pub eps: T,
    /// `lr · weight_decay`: AdamW's decoupled decay per step.
    pub lr_weight_decay: T,
    /// `lr / (1 − β1^step)`: the learning rate with the first moment's bias correction.
    pub step_size: T,
    /// `1 / √(1 − β2^step)`: the second moment's bias correction, applied to `√v`.
    pub inv_sqrt_bias2: T,
}

impl<T: Copy> AdamCoefficients<T> {
    /// The coefficients converted one by one (f64 to the arithmetic type, on the host).
    pub fn map<U>(self, f: impl Fn(T) -> U) -> AdamCoefficients<U> {
        AdamCoefficients {
            beta1: f(self.beta1),
            one_minus_beta1: f(self.one_minus_beta1),
            beta2: f(self.beta2),
            one_minus_beta2: f(self.one_minus_beta2),
            eps: f(self.eps),
            lr_weight_decay: f(self.lr_weight_decay),
            step_size: f(self.step_size),
            inv_sqrt_bias2: f(self.inv_sqrt_bias2),
        }
    }

    /// The coefficients from an array in field order ([`to_array`](Self::to_array)'s inverse).
    pub fn from_array(
        [beta1, one_minus_beta1, beta2, one_minus_beta2, eps, lr_weight_decay, step_size, inv_sqrt_bias2]: [T; 8],
    ) -> Self {
        AdamCoefficients {
            beta1,
            one_minus_beta1,
            beta2,
            one_minus_beta2,
            eps,
            lr_weight_decay,
            step_size,
            inv_sqrt_bias2,
        }
    }

    /// The coefficients in field order: the order of the `adam` kernels' scalar parameters, and
    /// of the `adam_device` kernels' coefficient buffer.
    pub fn to_array(self) -> [T; 8] {
        [
            self.beta1,
            self.one_minus_beta1,
            self.beta2,
            self.one_minus_beta2,
            self.eps,
            self.lr_weight_decay,
            self.step_size,
            self.inv_sqrt_bias2,
        ]
    }
}

impl AdamCoefficients<f64> {
    /// A step's coefficients from the hyperparameters, the learning rate and the betas raised to
    /// the step number (`β1^t`, `β2^t`), in correctly rounded f64 operations.
    #[inline(always)]
    pub fn from_powers(hyper: &AdamHyper, lr: f64, beta1_power: f64, beta2_power: f64) -> Self {
        AdamCoefficients {
            beta1: hyper.beta1,
            one_minus_beta1: 1.0 - hyper.beta1,
            beta2: hyper.beta2,
            one_minus_beta2: 1.0 - hyper.beta2,
            eps: hyper.eps,
            lr_weight_decay: lr * hyper.weight_decay,
            step_size: lr / (1.0 - beta1_power),
            inv_sqrt_bias2: 1.0 / sqrt_f64(1.0 - beta2_power),
        }
    }
}

/// Adam's hyperparameters that stay fixed from step to step. The learning rate, which a schedule
/// may change, is part of [`AdamProgress`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamHyper {
    /// β1, the first moment's decay, in [0, 1).
    pub beta1: f64,
    /// β2, the second moment's decay, in [0, 1).
    pub beta2: f64,
    /// ε, added to the bias-corrected `√v`.
    pub eps: f64,
    /// Decoupled weight decay (AdamW); 0 for plain Adam.
    pub weight_decay: f64,
}

/// How far an Adam optimizer has got: everything its per-step scalars depend on besides the
/// [`AdamHyper`]. The capturable Adam keeps it in device memory as `[f64; 4]` in field order
/// ([`to_array`](Self::to_array)), and the `adam_advance` kernel moves it on there.
///
/// The step count is an f64, exact up to 2^53 steps. The powers of the betas are running
/// products, one multiplication a step, since the device has no `powf`; after `t` steps they
/// are within `t` f64 roundings of `β^t`, far below what rounding the coefficients to f32 loses.
///
/// ```
/// use opsmith_kernels::optim::{AdamHyper, AdamProgress};
/// let hyper = AdamHyper { beta1: 0.5, beta2: 0.75, eps: 0.0, weight_decay: 0.0 };
/// let mut progress = AdamProgress::start(0.125);
/// let c = (0..3).map(|_| progress.advance(&hyper)).last().unwrap();
/// assert_eq!(progress.to_array(), [3.0, 0.125, 0.421875, 0.125]);
/// assert_eq!(c.step_size, 0.125 / (1.0 - 0.125)); // lr / (1 - β1³)
/// assert_eq!(AdamProgress::from_array(progress.to_array()), progress);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamProgress {
    /// Steps taken.
    pub step: f64,
    /// β1^step.
    pub beta1_power: f64,
    /// β2^step.
    pub beta2_power: f64,
    /// The learning rate of the next step.
    pub lr: f64,
}

impl AdamProgress {
    /// Before the first step, with learning rate `lr`.
    pub const fn start(lr: f64) -> Self {
        AdamProgress { step: 0.0, beta1_power: 1.0, beta2_power: 1.0, lr }
    }

    /// The progress from an array in field order.
    pub const fn from_array([step, beta1_power, beta2_power, lr]: [f64; 4]) -> Self {
        AdamProgress { step, beta1_power, beta2_power, lr }
    }

    /// The fields in order: `[step, β1^step, β2^step, lr]`, the layout in device memory.
    pub const fn to_array(self) -> [f64; 4] {
        [self.step, self.beta1_power, self.beta2_power, self.lr]
    }

    /// Takes one step: counts it, multiplies the betas into their powers, and returns that
    /// step's coefficients in f64 (see [`adam`] for how they enter the update). The kernel and
    /// the CPU both run this, with correctly rounded f64 operations only, so both get the same
    /// bits.
    #[inline(always)]
    pub fn advance(&mut self, hyper: &AdamHyper) -> AdamCoefficients<f64> {
        self.step += 1.0;
        self.beta1_power *= hyper.beta1;
        self.beta2_power *= hyper.beta2;
        AdamCoefficients::from_powers(hyper, self.lr, self.beta1_power, self.beta2_power)
    }
}

/// The correctly rounded f64 square root: `sqrt.rn.f64` on the device, `std`'s on the host.
#[inline(always)]
fn sqrt_f64(x: f64) -> f64 {
    #[cfg(target_arch = "nvptx64")]
    let root = crate::device::math::sqrt_f64(x);
    #[cfg(not(target_arch = "nvptx64"))]
    let root = x.sqrt();
    root
}

/// Adam (AdamW) for one element. Returns `(p', m', v')`:
///
/// * `m' = β1 m + (1 − β1) g`, `v' = β2 v + (1 − β2) g²`;
/// * `p' = p − lr wd p − step_size m' / (√v' / √(1 − β2^step) + ε)`, the decay taken from the
///   old p (as PyTorch's AdamW).
#[inline(always)]
pub fn adam<T: Real>(p: T, g: T, m: T, v: T, c: &AdamCoefficients<T>) -> (T, T, T) {
    let m = c.beta1.mul_add(m, c.one_minus_beta1 * g);
    let v = c.beta2.mul_add(v, c.one_minus_beta2 * g * g);
    let denom = v.sqrt().mul_add(c.inv_sqrt_bias2, c.eps);
    let decayed = (-c.lr_weight_decay).mul_add(p, p);
    ((-c.step_size).mul_add(m / denom, decayed), m, v)
}

/// The Adam kernels' pass: [`adam`] over `n` elements with the step's coefficients `c`, the
/// calling thread taking rank `rank` of `threads` (`map_elementwise_as`).
///
/// # Safety
/// As for `map_elementwise_as`: every pointer is valid for `n` elements and aligned to `T`; each
/// output is exactly one input or overlaps none, and the outputs do not overlap each other; the
/// grid's threads take the ranks `0..threads` once each.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn adam_elements<T: crate::device::element::Element>(
    rank: u64,
    threads: u64,
    inputs: [*const T; 4],
    outputs: [*mut T; 3],
    n: u64,
    c: &AdamCoefficients<f32>,
) {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        crate::device::elementwise::map_elementwise_as::<T, 4, 3>(rank, threads, inputs, outputs, n, |[p, g, m, v]| {
            let (p, m, v) = adam(p, g, m, v, c);
            [p, m, v]
        })
    }
}

/// One parameter of a grouped Adam step as its kernel sees it: the four buffers, their length,
/// and where its packs begin in the group's flat pack index (the packs of slot 0, then of slot
/// 1, …; a slot's last pack may be partial).
#[cfg(target_arch = "nvptx64")]
#[derive(Clone, Copy)]
struct AdamSlot<T> {
    param: *mut T,
    grad: *const T,
    m: *mut T,
    v: *mut T,
    n: u64,
    first_pack: u64,
}

#[cfg(target_arch = "nvptx64")]
impl<T> AdamSlot<T> {
    /// `later` if flat pack `flat` is at or past `later`'s first pack, else `self`: a comparison
    /// and selects, not a branch. Chained over the slots in order, it picks the last slot whose
    /// packs begin at or before `flat`: the one holding it, an empty slot never (its successor
    /// begins where it does).
    #[inline(always)]
    fn or_from(self, later: Self, flat: u64) -> Self {
        // `select_unpredictable`: with plain `if`s, LLVM turns some of these selects into
        // branches around moves.
        fn pick<U>(later_one: bool, l: U, s: U) -> U {
            core::hint::select_unpredictable(later_one, l, s)
        }
        let later_one = flat >= later.first_pack;
        AdamSlot {
            param: pick(later_one, later.param, self.param),
            grad: pick(later_one, later.grad, self.grad),
            m: pick(later_one, later.m, self.m),
            v: pick(later_one, later.v, self.v),
            n: pick(later_one, later.n, self.n),
            first_pack: pick(later_one, later.first_pack, self.first_pack),
        }
    }

    /// A grouped step's four slots from each one's `(param, grad, m, v, n)`, their packs of
    /// `lanes` elements numbered one slot after another; and the total number of packs.
    #[inline(always)]
    fn group(slots: [(*mut T, *const T, *mut T, *mut T, u64); 4], lanes: u64) -> ([Self; 4], u64) {
        let mut packs = 0;
        let slots = slots.map(|(param, grad, m, v, n)| {
            let slot = AdamSlot { param, grad, m, v, n, first_pack: packs };
            packs += n.div_ceil(lanes);
            slot
        });
        (slots, packs)
    }
}

/// [`adam`] over flat pack `flat` of a grouped step's `slots` ([`AdamSlot::group`]), which
/// picks its slot by comparisons and selects. (The slots are indexed by constants only: an
/// array indexed by a run-time value would live on the stack.)
///
/// # Safety
/// `flat` is below the group's pack count; each slot's pointers are valid for its `n` elements
/// and aligned to `T`; no other thread accesses this pack's elements, and no slot's buffers
/// overlap another's or its own gradient.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn adam_group_pack<T: crate::device::element::Element>(
    slots: &[AdamSlot<T>; 4],
    flat: u64,
    c: &AdamCoefficients<f32>,
) {
    let slot = slots[0].or_from(slots[1], flat).or_from(slots[2], flat).or_from(slots[3], flat);
    // SAFETY: `slot` is the slot holding flat pack `flat`, so the pack is one of its
    // `n.div_ceil(LANES)`; the rest is the caller's contract.
    unsafe { adam_pack(slot, flat - slot.first_pack, c) }
}

/// [`adam`] over pack `pack` of `slot` (its elements `LANES * pack ..`, up to `LANES` of them).
/// A full pack of a slot whose four buffers are 16-byte aligned takes one vector load of each
/// buffer and one vector store of each output; any other pack (a slot's partial last pack, or a
/// view at an odd offset) takes scalar loads and stores of its elements, each under a lane test
/// (predicated, not branched around), all loads issued before the arithmetic. Both go through
/// the one copy of the lane arithmetic.
///
/// # Safety
/// `pack < slot.n.div_ceil(LANES)`; each of the slot's pointers is valid for `slot.n` elements
/// and aligned to `T`; no other thread accesses this pack's elements of `param`, `m` or `v`,
/// and `grad` overlaps none of them.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn adam_pack<T: crate::device::element::Element>(slot: AdamSlot<T>, pack: u64, c: &AdamCoefficients<f32>) {
    use crate::device::memory::{Pack, is_pack_aligned, load_pack, store_pack};
    let AdamSlot { param, grad, m, v, n, .. } = slot;
    let lanes = T::LANES as u64;
    let first = pack * lanes;
    // At least 1, as `first < n`: lane 0 is always in.
    let count = (n - first).min(lanes);
    let has = |lane: usize| lane == 0 || (lane as u64) < count;
    let ins = [param.cast_const(), grad, m.cast_const(), v.cast_const()];
    let outs = [param, m, v];
    // `&`, not `&&`: no branch.
    let vector = (count == lanes) & ins.iter().fold(true, |all, &p| all & is_pack_aligned(p));
    // The two paths join as raw packs. Joined as f32 lanes, LLVM splits the vector loads into
    // scalar ones and shares the last lane's with the scalar path: four extra loads per pack.
    let raw: [Pack; 4] = if vector {
        // SAFETY: a full pack inside the slot's `n` elements, every pointer 16-byte aligned
        // (checked above); the caller guarantees validity.
        ins.map(|p| unsafe { load_pack(p, pack) })
    } else {
        // Lanes past the pack's end stay 0, computed but never stored; `pack` after `to_f32`
        // gives back the element's bits.
        ins.map(|p| {
            let mut wide = T::unpack([0; 4]);
            for lane in 0..T::LANES {
                if has(lane) {
                    // SAFETY: element `first + lane < n`, and the caller guarantees validity.
                    wide[lane] = unsafe { p.add((first + lane as u64) as usize).read() }.to_f32();
                }
            }
            T::pack(wide)
        })
    };
    let x = raw.map(T::unpack);
    let mut r = [x[0]; 3];
    for lane in 0..T::LANES {
        let (p, m, v) = adam(x[0][lane], x[1][lane], x[2][lane], x[3][lane], c);
        (r[0][lane], r[1][lane], r[2][lane]) = (p, m, v);
    }
    if vector {
        for k in 0..3 {
            // SAFETY: as for the loads; the caller guarantees the pack is this thread's alone.
            unsafe { store_pack(outs[k], pack, T::pack(r[k])) };
        }
    } else {
        for lane in 0..T::LANES {
            if has(lane) {
                for k in 0..3 {
                    // SAFETY: as for the loads; the caller guarantees the element is this
                    // thread's alone.
                    unsafe { outs[k].add((first + lane as u64) as usize).write(T::from_f32(r[k][lane])) };
                }
            }
        }
    }
}

macro_rules! optimizer_family {
    (
        $(#[$table_doc:meta])*
        $table:ident, $elem:ty, {
            sgd: $sgd:ident,
            sgd_momentum: $sgd_momentum:ident,
            adam: $adam:ident,
            adam_device: $adam_device:ident,
            adam_device_group: $adam_device_group:ident,
            adam_device_group_advance: $adam_device_group_advance:ident,
            adam_advance: $adam_advance:ident $(,)?
        }
    ) => {
        $(#[$table_doc])*
        #[cfg(not(target_arch = "nvptx64"))]
        pub const $table: OptimizerKernels = OptimizerKernels {
            sgd: $sgd,
            sgd_momentum: $sgd_momentum,
            adam: $adam,
            adam_device: $adam_device,
            adam_device_group: $adam_device_group,
            adam_device_group_advance: $adam_device_group_advance,
            adam_advance: $adam_advance,
        };

        crate::kernel! {
            /// Plain SGD: `param_out[i] = param[i] − lr (grad[i] + weight_decay param[i])` for
            /// `i < n`, in f32 with FMAs.
            ///
            /// Threads map to 16-byte packs in grid-stride order, scalar for the tail or when a
            /// pointer is not 16-byte aligned; any grid size is correct.
            ///
            /// # Safety
            /// Every pointer is valid for `n` elements and aligned to the element type;
            /// `param_out` is exactly `param` (the in-place update) or `grad`, or overlaps neither.
            pub unsafe fn $sgd(
                param: *const [$elem; n],
                grad: *const [$elem; n],
                #[in_place] param_out: *mut [$elem; n],
                lr: f32,
                weight_decay: f32,
                n: u64,
            ) {
                // SAFETY: forwarded from this kernel's contract.
                unsafe {
                    crate::device::elementwise::map_elementwise::<$elem, 2, 1>([param, grad], [param_out], n, |[p, g]| {
                        [sgd(p, g, lr, weight_decay)]
                    })
                }
            }
        }

        crate::kernel! {
            /// SGD with momentum: `buf_out = momentum buf + (grad + weight_decay param)` and
            /// `param_out = param − lr buf_out`, elementwise for `i < n`, in f32 with FMAs.
            ///
            /// Thread mapping as for the plain SGD kernel of this family.
            ///
            /// # Safety
            /// Every pointer is valid for `n` elements and aligned to the element type; each output
            /// is exactly one input (in place: `param_out` is `param`, `buf_out` is `buf`) or
            /// overlaps none, and the outputs do not overlap each other.
            pub unsafe fn $sgd_momentum(
                param: *const [$elem; n],
                grad: *const [$elem; n],
                buf: *const [$elem; n],
                #[in_place] param_out: *mut [$elem; n],
                #[in_place] buf_out: *mut [$elem; n],
                lr: f32,
                momentum: f32,
                weight_decay: f32,
                n: u64,
            ) {
                // SAFETY: forwarded from this kernel's contract.
                unsafe {
                    crate::device::elementwise::map_elementwise::<$elem, 3, 2>(
                        [param, grad, buf],
                        [param_out, buf_out],
                        n,
                        |[p, g, b]| {
                            let (p, b) = sgd_momentum(p, g, b, lr, momentum, weight_decay);
                            [p, b]
                        },
                    )
                }
            }
        }

        crate::kernel! {
            /// Adam (AdamW) in one pass: reads `param`, `grad`, `m`, `v` and writes the updated
            /// parameter and moments (see [`adam`]), elementwise for `i < n`, in f32. The scalars are
            /// [`AdamCoefficients`] in field order.
            ///
            /// Thread mapping as for the plain SGD kernel of this family.
            ///
            /// # Safety
            /// Every pointer is valid for `n` elements and aligned to the element type; each output
            /// is exactly one input (in place: `param_out` is `param`, `m_out` is `m`, `v_out` is
            /// `v`) or overlaps none, and the outputs do not overlap each other.
            pub unsafe fn $adam(
                param: *const [$elem; n],
                grad: *const [$elem; n],
                m: *const [$elem; n],
                v: *const [$elem; n],
                #[in_place] param_out: *mut [$elem; n],
                #[in_place] m_out: *mut [$elem; n],
                #[in_place] v_out: *mut [$elem; n],
                beta1: f32,
                one_minus_beta1: f32,
                beta2: f32,
                one_minus_beta2: f32,
                eps: f32,
                lr_weight_decay: f32,
                step_size: f32,
                inv_sqrt_bias2: f32,
                n: u64,
            ) {
                let c = AdamCoefficients {
                    beta1,
                    one_minus_beta1,
                    beta2,
                    one_minus_beta2,
                    eps,
                    lr_weight_decay,
                    step_size,
                    inv_sqrt_bias2,
                };
                // SAFETY: forwarded from this kernel's contract.
                unsafe {
                    let (rank, threads) = (crate::device::index::global_thread_index(), crate::device::index::grid_thread_count());
                    adam_elements(rank, threads, [param, grad, m, v], [param_out, m_out, v_out], n, &c)
                }
            }
        }

        crate::kernel! {
            /// Adam (AdamW) in one pass with its per-step scalars in device memory: as the `adam`
            /// kernel of this family, but the eight [`AdamCoefficients`] are read, in field
            /// order, from `coefficients` (which `adam_advance` writes), so that a recorded CUDA
            /// graph does not freeze them.
            ///
            /// Thread mapping as for the plain SGD kernel of this family. Every thread reads the
            /// 32 bytes of coefficients: one line, served from cache after the first reads.
            ///
            /// # Safety
            /// `coefficients` is valid for 8 f32 and no thread writes it during the launch; every
            /// other pointer is valid for `n` elements and aligned to the element type; each
            /// output is exactly one input (in place: `param_out` is `param`, `m_out` is `m`,
            /// `v_out` is `v`) or overlaps none, and the outputs do not overlap each other.
            pub unsafe fn $adam_device(
                param: *const [$elem; n],
                grad: *const [$elem; n],
                m: *const [$elem; n],
                v: *const [$elem; n],
                #[in_place] param_out: *mut [$elem; n],
                #[in_place] m_out: *mut [$elem; n],
                #[in_place] v_out: *mut [$elem; n],
                coefficients: *const [f32; 8],
                n: u64,
            ) {
                // SAFETY: `coefficients` holds 8 f32 that nothing writes meanwhile (this kernel's
                // contract); an array of f32 needs only f32's alignment.
                let c = AdamCoefficients::from_array(unsafe { coefficients.cast::<[f32; 8]>().read() });
                // SAFETY: forwarded from this kernel's contract.
                unsafe {
                    let (rank, threads) = (crate::device::index::global_thread_index(), crate::device::index::grid_thread_count());
                    adam_elements(rank, threads, [param, grad, m, v], [param_out, m_out, v_out], n, &c)
                }
            }
        }

        crate::kernel! {
            /// The capturable Adam step of up to four parameters in one launch: for each slot
            /// `k` in 0..4, the `adam_device` update of this family over `param_k`, `grad_k`,
            /// `m_k` and `v_k` (`n_k` elements, in place), with the coefficients read from
            /// `coefficients`. A slot with `n_k = 0` is skipped. A model's small tensors (biases,
            /// a small layer's weights) each cost a launch of their own otherwise, which in a
            /// replayed CUDA graph is most of their update's time.
            ///
            /// Thread mapping: the slots' 16-byte packs form one flat index, the packs of slot 0,
            /// then of slot 1, …, each slot's last pack possibly partial, and the threads
            /// grid-stride over it (one thread per pack for a grid covering them all; any grid
            /// size is correct). A thread picks its pack's slot by comparisons and selects, and
            /// takes a full pack of a slot whose buffers are all 16-byte aligned with vector
            /// loads and stores, any other pack element by element. Each thread with a pack
            /// reads the 32 bytes of coefficients once.
            ///
            /// # Safety
            /// `coefficients` is valid for 8 f32 and no thread writes it during the launch. For
            /// each slot, every pointer is valid for `n_k` elements and aligned to the element
            /// type; the sixteen buffers overlap none of each other (empty ones excepted). An
            /// empty slot's pointers are never used and may be anything.
            pub unsafe fn $adam_device_group(
                param_0: *mut [$elem; n_0],
                grad_0: *const [$elem; n_0],
                m_0: *mut [$elem; n_0],
                v_0: *mut [$elem; n_0],
                n_0: u64,
                param_1: *mut [$elem; n_1],
                grad_1: *const [$elem; n_1],
                m_1: *mut [$elem; n_1],
                v_1: *mut [$elem; n_1],
                n_1: u64,
                param_2: *mut [$elem; n_2],
                grad_2: *const [$elem; n_2],
                m_2: *mut [$elem; n_2],
                v_2: *mut [$elem; n_2],
                n_2: u64,
                param_3: *mut [$elem; n_3],
                grad_3: *const [$elem; n_3],
                m_3: *mut [$elem; n_3],
                v_3: *mut [$elem; n_3],
                n_3: u64,
                coefficients: *const [f32; 8],
            ) {
                // SAFETY: `coefficients` holds 8 f32 that nothing writes meanwhile (this kernel's
                // contract); an array of f32 needs only f32's alignment. Read once, before the
                // loop: these loads are still in flight when the first pack's are issued.
                let c = AdamCoefficients::from_array(unsafe { coefficients.cast::<[f32; 8]>().read() });
                let lanes = <$elem as crate::device::element::Element>::LANES as u64;
                let (slots, packs) = AdamSlot::group(
                    [
                        (param_0, grad_0, m_0, v_0, n_0),
                        (param_1, grad_1, m_1, v_1, n_1),
                        (param_2, grad_2, m_2, v_2, n_2),
                        (param_3, grad_3, m_3, v_3, n_3),
                    ],
                    lanes,
                );
                for flat in crate::device::index::GridStride::over(0, packs) {
                    // SAFETY: flat < packs; the slots' pointers are valid and aligned, and their
                    // buffers overlap nothing else (this kernel's contract); the grid stride
                    // gives each flat pack to one thread.
                    unsafe { adam_group_pack(&slots, flat, &c) };
                }
            }
        }

        crate::kernel! {
            /// One whole capturable Adam step of up to four parameters in one launch of one
            /// block: the `adam_advance` of this family (the state's next step and that step's
            /// coefficients, in f64 by [`AdamProgress::advance`], written back to `state` and,
            /// rounded to f32, to `coefficients`), then the `adam_device_group` update of the
            /// four slots with those coefficients. The same bits as the two launches; one graph
            /// node instead of two for a model whose parameters fit one group.
            ///
            /// Thread mapping: every thread of the block reads `state` and works out the step's
            /// coefficients itself; after a barrier (every thread has read the state) thread 0
            /// writes the new state and the coefficients. The threads then stride over the
            /// group's flat pack index as the `adam_device_group` kernel's do, by the block's
            /// size. Blocks other than block 0 do nothing: launch one block (of a multiple of
            /// 32 threads, up to 1024; one pack a thread is the quickest).
            ///
            /// # Safety
            /// `state` is valid for 4 f64 and `coefficients` for 8 f32, each aligned to its
            /// element type; they overlap each other and no slot's buffers, and nothing else
            /// reads or writes them during the launch. For each slot, as for the
            /// `adam_device_group` kernel of this family.
            pub unsafe fn $adam_device_group_advance(
                param_0: *mut [$elem; n_0],
                grad_0: *const [$elem; n_0],
                m_0: *mut [$elem; n_0],
                v_0: *mut [$elem; n_0],
                n_0: u64,
                param_1: *mut [$elem; n_1],
                grad_1: *const [$elem; n_1],
                m_1: *mut [$elem; n_1],
                v_1: *mut [$elem; n_1],
                n_1: u64,
                param_2: *mut [$elem; n_2],
                grad_2: *const [$elem; n_2],
                m_2: *mut [$elem; n_2],
                v_2: *mut [$elem; n_2],
                n_2: u64,
                param_3: *mut [$elem; n_3],
                grad_3: *const [$elem; n_3],
                m_3: *mut [$elem; n_3],
                v_3: *mut [$elem; n_3],
                n_3: u64,
                state: *mut [f64; 4],
                coefficients: *mut [f32; 8],
                beta1: f64,
                beta2: f64,
                eps: f64,
                weight_decay: f64,
            ) {
                use core::arch::nvptx;
                // SAFETY: reading the special registers has no preconditions.
                let (block, thread, threads) =
                    unsafe { (nvptx::_block_idx_x(), nvptx::_thread_idx_x() as u64, nvptx::_block_dim_x() as u64) };
                // A second block could read the state after the first wrote the next one.
                if block != 0 {
                    return;
                }
                let hyper = AdamHyper { beta1, beta2, eps, weight_decay };
                // SAFETY: `state` holds 4 f64 that no other launch touches meanwhile (this
                // kernel's contract); arrays need only their element's alignment.
                let mut progress = AdamProgress::from_array(unsafe { state.cast::<[f64; 4]>().read() });
                let next = progress.advance(&hyper);
                // `as` rounds to nearest (`cvt.rn.f32.f64`), as the host and `adam_advance` do.
                let c = next.map(|x| x as f32);
                // SAFETY: the whole block reaches the barrier (only other blocks returned).
                unsafe { nvptx::_syncthreads() };
                if thread == 0 {
                    // SAFETY: every thread has read the state (the barrier); thread 0 alone
                    // writes both buffers, which are valid, aligned and disjoint.
                    unsafe {
                        state.cast::<[f64; 4]>().write(progress.to_array());
                        coefficients.cast::<[f32; 8]>().write(c.to_array());
                    }
                }
                let lanes = <$elem as crate::device::element::Element>::LANES as u64;
                let (slots, packs) = AdamSlot::group(
                    [
                        (param_0, grad_0, m_0, v_0, n_0),
                        (param_1, grad_1, m_1, v_1, n_1),
                        (param_2, grad_2, m_2, v_2, n_2),
                        (param_3, grad_3, m_3, v_3, n_3),
                    ],
                    lanes,
                );
                let mut flat = thread;
                while flat < packs {
                    // SAFETY: flat < packs; the slots' pointers are valid and aligned, and their
                    // buffers overlap nothing else (this kernel's contract); the block's stride
                    // gives each flat pack to one thread, and only this block runs.
                    unsafe { adam_group_pack(&slots, flat, &c) };
                    flat += threads;
                }
            }
        }

        crate::kernel! {
            /// One step of the capturable Adam's device-resident state: reads `state`
            /// ([`AdamProgress`] in field order: step, β1^step, β2^step, lr), advances it with
            /// [`AdamProgress::advance`] in f64, writes it back, and writes that step's
            /// [`AdamCoefficients`], each rounded to f32, in field order into `coefficients` for
            /// the `adam_device` kernel of this family.
            ///
            /// Thread 0 of the grid does it all and the other threads nothing: launch one block
            /// of one warp.
            ///
            /// # Safety
            /// `state` is valid for 4 f64 and `coefficients` for 8 f32, each aligned to its
            /// element type; they do not overlap, and no other thread reads or writes them during
            /// the launch.
            pub unsafe fn $adam_advance(
                state: *mut [f64; 4],
                coefficients: *mut [f32; 8],
                beta1: f64,
                beta2: f64,
                eps: f64,
                weight_decay: f64,
            ) {
                if crate::device::index::global_thread_index() != 0 {
                    return;
                }
                let hyper = AdamHyper { beta1, beta2, eps, weight_decay };
                // SAFETY: thread 0 alone touches both buffers, which are valid, aligned and
                // disjoint (this kernel's contract); arrays need only their element's alignment.
                unsafe {
                    let state = state.cast::<[f64; 4]>();
                    let mut progress = AdamProgress::from_array(state.read());
                    let c = progress.advance(&hyper);
                    state.write(progress.to_array());
                    // `as` rounds to nearest (`cvt.rn.f32.f64`), as on the host.
                    coefficients.cast::<[f32; 8]>().write(c.map(|x| x as f32).to_array());
                }
            }
        }
    };
}

optimizer_family! {
    /// The optimizer kernels for f32 parameters, gradients and state.
    F32, f32, {
        sgd: sgd_f32,
        sgd_momentum: sgd_momentum_f32,
        adam: adam_f32,
        adam_device: adam_device_f32,
        adam_device_group: adam_device_group_f32,
        adam_device_group_advance: adam_device_group_advance_f32,
        adam_advance: adam_advance_f32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The running products stay within a few f64 roundings per step of `powf`: over 10^4 steps
    /// every coefficient is within 1e-11 relative of the one from the closed form, far inside
    /// what rounding it to f32 (6e-8) loses.
    #[test]
    fn advance_tracks_the_closed_form() {
        let hypers = [
            AdamHyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 },
            AdamHyper { beta1: 0.8, beta2: 0.99, eps: 1e-6, weight_decay: 0.1 },
            AdamHyper { beta1: 0.0, beta2: 0.5, eps: 1e-3, weight_decay: 0.05 },
            AdamHyper { beta1: 0.99, beta2: 0.9999, eps: 1e-8, weight_decay: 0.01 },
        ];
        for hyper in hypers {
            let lr = 3e-4;
            let mut progress = AdamProgress::start(lr);
            for step in 1..=10_000u32 {
                let c = progress.advance(&hyper);
                let t = step as f64;
                assert_eq!(progress.step, t);
                let step_size = lr / (1.0 - hyper.beta1.powf(t));
                let inv_sqrt_bias2 = 1.0 / (1.0 - hyper.beta2.powf(t)).sqrt();
                for (what, got, want) in
                    [("step_size", c.step_size, step_size), ("inv_sqrt_bias2", c.inv_sqrt_bias2, inv_sqrt_bias2)]
                {
                    let rel = ((got - want) / want).abs();
                    assert!(rel < 1e-11, "{hyper:?} step {step} {what}: {got:e} vs {want:e} ({rel:e})");
                }
                let fixed = [c.beta1, c.one_minus_beta1, c.beta2, c.one_minus_beta2, c.eps, c.lr_weight_decay];
                let want = [
                    hyper.beta1,
                    1.0 - hyper.beta1,
                    hyper.beta2,
                    1.0 - hyper.beta2,
                    hyper.eps,
                    lr * hyper.weight_decay,
                ];
                assert_eq!(fixed, want);
            }
        }
    }

    /// A learning rate changed between steps scales the next step's lr terms and nothing else.
    #[test]
    fn a_new_lr_applies_from_the_next_step() {
        let hyper = AdamHyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.1 };
        let (mut a, mut b) = (AdamProgress::start(1e-3), AdamProgress::start(1e-3));
        a.advance(&hyper);
        b.advance(&hyper);
        b.lr = 2.5e-4;
        let (ca, cb) = (a.advance(&hyper), b.advance(&hyper));
        assert_eq!((a.step, a.beta1_power, a.beta2_power), (b.step, b.beta1_power, b.beta2_power));
        assert_eq!(cb.step_size, 2.5e-4 / (1.0 - a.beta1_power));
        assert_eq!(cb.lr_weight_decay, 2.5e-4 * 0.1);
        assert_eq!(ca.inv_sqrt_bias2, cb.inv_sqrt_bias2);
        assert_eq!(AdamCoefficients::from_array(cb.to_array()), cb);
    }
}
