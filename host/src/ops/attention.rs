//! Scaled dot-product attention, `softmax(scale · q·kᵀ + mask) · v`, over tensors of
//! `[batch, heads, seq, head_dim]`.
//!
//! Two paths compute it:
//! * **fused**: on CUDA GPUs of sm_80 and newer, for f16 and bf16 with head_dim 64 or 128 and no
//!   `mask` (causal or not), one kernel of the attention family (`kernels-gpu`'s
//!   `device::flash`) walks the keys in tiles on tensor cores with an online softmax. The scores
//!   stay on chip in f32; nothing of size `[seq_q, seq_k]` is written. It also writes the
//!   log-sum-exp, so [`attention_with_lse`] costs no more than [`attention`].
//!   [`attention_is_fused`] says whether a call takes it.
//! * **composed**, for everything else (the CPU, f32 and f64, other head sizes, a `mask`, older
//!   GPUs, `OPSMITH_FUSED_ATTENTION=0`): one batched product for the scores, the softmax kernel
//!   with the causal and user masks added into one, and a second product. It holds the
//!   `[batch, heads, seq_q, seq_k]` scores and probabilities in memory, and on f16 and bf16 it
//!   rounds the scores to the storage dtype before the softmax (as PyTorch's math path does).
//!
//! The two agree within the storage dtype's rounding; the fused path is the more accurate one
//! on f16 and bf16, since it rounds neither the scores nor the probabilities' sum.
use super::check;
use super::softmax::{row_logits, row_max_sum};
use crate::dtype::{Accumulator, with_float_type};
use crate::{DType, Device, Element, Error, Result, Tensor};
#[cfg(feature = "cuda")]
use opsmith_kernels::decl::{In, Out};

const OP: &str = "attention";

/// The sizes of one checked call: `q [batch, heads, seq_q, head_dim]`,
/// `k [batch, heads, seq_k, head_dim]`, `v [batch, heads, seq_k, head_dim_v]`.
#[derive(Clone, Copy, Debug)]
struct Dims {
    batch: usize,
    heads: usize,
    seq_q: usize,
    seq_k: usize,
    head_dim: usize,
    head_dim_v: usize,
}

impl Dims {
    /// Checks every operand before any work, so a failed call changes nothing. `v` is absent
    /// for [`attention_weights`].
    fn check(
        op: &'static str,
        q: &Tensor,
        k: &Tensor,
        v: Option<&Tensor>,
        scale: f64,
        mask: Option<&Tensor>,
    ) -> Result<Dims> {
        let operands: Vec<&Tensor> = [q, k].into_iter().chain(v).chain(mask).collect();
        check::same_device(op, &operands)?;
        check::same_dtype(op, &operands)?;
        check::float(op, q)?;
        if q.dtype() == DType::F64 && q.device().is_cuda() {
            // The composed path's products and softmax have no f64 kernels.
            return Err(Error::UnsupportedDType { op, dtype: DType::F64, device: q.device() });
        }
        let rank4 = |name: &str, t: &Tensor| -> Result<[usize; 4]> {
            <[usize; 4]>::try_from(t.dims()).map_err(|_| Error::InvalidArgument {
                op,
                reason: format!("{name} must have rank 4, [batch, heads, seq, head_dim]; got shape {:?}", t.dims()),
            })
        };
        let [batch, heads, seq_q, head_dim] = rank4("q", q)?;
        let [kb, kh, seq_k, kd] = rank4("k", k)?;
        if (kb, kh, kd) != (batch, heads, head_dim) {
            return Err(Error::ShapeMismatch { op, lhs: q.dims().to_vec(), rhs: k.dims().to_vec() });
        }
        let head_dim_v = match v {
            Some(v) => {
                let [vb, vh, vs, vd] = rank4("v", v)?;
                if (vb, vh, vs) != (batch, heads, seq_k) {
                    return Err(Error::ShapeMismatch { op, lhs: k.dims().to_vec(), rhs: v.dims().to_vec() });
                }
                vd
            }
            None => 0,
        };
        if seq_k == 0 {
            return Err(Error::InvalidArgument {
                op,
                reason: format!(
                    "k of shape {:?} has no keys (seq_k = 0): a softmax over no keys is undefined",
                    k.dims()
                ),
            });
        }
        if !scale.is_finite() {
            return Err(Error::InvalidArgument { op, reason: format!("scale must be finite, got {scale}") });
        }
        let scores = [batch, heads, seq_q, seq_k];
        if let Some(m) = mask {
            // As softmax takes it: the scores' trailing dims, repeated over the leading ones.
            let md = m.dims();
            if md.is_empty() || md.len() > 4 || scores[4 - md.len()..] != *md {
                return Err(Error::ShapeMismatch { op, lhs: scores.to_vec(), rhs: md.to_vec() });
            }
        }
        Ok(Dims { batch, heads, seq_q, seq_k, head_dim, head_dim_v })
    }

    /// `[batch · heads, seq, dim]`: the batched products take rank 3.
    fn flat(&self, seq: usize, dim: usize) -> [usize; 3] {
        [self.batch * self.heads, seq, dim]
    }

    fn scores(&self) -> [usize; 4] {
        [self.batch, self.heads, self.seq_q, self.seq_k]
    }
}

/// Scaled dot-product attention: `softmax(scale · q·kᵀ + mask) · v` for each batch and head.
///
/// Shapes: `q [batch, heads, seq_q, head_dim]`, `k [batch, heads, seq_k, head_dim]` and
/// `v [batch, heads, seq_k, head_dim_v]` (`v` may have its own head size, as in PyTorch's
/// `scaled_dot_product_attention`); the result is `[batch, heads, seq_q, head_dim_v]` in the
/// inputs' dtype. `scale` is usually `1 / sqrt(head_dim)`.
///
/// `causal` lets query `i` see keys `j <= i` only (top-left aligned, as PyTorch's `is_causal`:
/// with `seq_q > seq_k` the last queries see every key, with `seq_q < seq_k` the last keys are
/// seen by no query). `mask` is added to the scaled scores: it has the inputs' dtype and device
/// and dims equal to the scores' trailing dims, `[seq_k]` (one row for every query, e.g. key
/// padding), `[seq_q, seq_k]`, `[heads, seq_q, seq_k]` or `[batch, heads, seq_q, seq_k]`; `-inf`
/// removes a key. With both, the causal mask is added to `mask`. A query whose every key is
/// removed gets a row of zeros (PyTorch gives NaN).
///
/// Errors, before any work: operands on different devices ([`Error::DeviceMismatch`]) or of
/// different dtypes ([`Error::DTypeMismatch`]), an integer dtype, or f64 on CUDA
/// ([`Error::UnsupportedDType`]); a rank other than 4 ([`Error::InvalidArgument`]); `k` whose
/// batch, heads or head_dim differ from `q`'s, or `v` whose batch, heads or seq_k differ from
/// `k`'s, or a mask of other dims ([`Error::ShapeMismatch`]); no keys (`seq_k = 0`) or a scale
/// that is not finite ([`Error::InvalidArgument`]). Every error names `"attention"`. An empty
/// batch, heads or `seq_q` gives an empty result.
///
/// Arithmetic: the fused kernel (see [`attention_is_fused`]) keeps the scores, the running
/// maxima and sums and the output in f32, rounds the probabilities to the dtype for the second
/// product on tensor cores (as FlashAttention does), and rounds the output once. The composed
/// path computes the scores with [`matmul_t`](super::matmul_t) and rounds them to the dtype,
/// then [`softmax`](super::softmax), then [`matmul`](super::matmul): f32 for f16, bf16 and f32,
/// f64 for f64, each step rounded once to the dtype.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{Device, Tensor, ops};
/// // One batch, one head, two queries and three keys of head_dim 1.
/// let q = Tensor::from_vec(vec![0.0f32, 0.0], [1, 1, 2, 1], Device::Cpu)?;
/// let k = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [1, 1, 3, 1], Device::Cpu)?;
/// let v = Tensor::from_vec(vec![3.0f32, 6.0, 9.0], [1, 1, 3, 1], Device::Cpu)?;
/// // q = 0: every score is 0, so each query averages the values it may see.
/// assert_eq!(ops::attention(&q, &k, &v, 1.0, false, None)?.to_vec::<f32>()?, [6.0, 6.0]);
/// // Causal: query 0 sees key 0, query 1 keys 0 and 1.
/// assert_eq!(ops::attention(&q, &k, &v, 1.0, true, None)?.to_vec::<f32>()?, [3.0, 4.5]);
/// // A [seq_k] mask removing key 0 for every query.
/// let mask = Tensor::from_vec(vec![f32::NEG_INFINITY, 0.0, 0.0], [3], Device::Cpu)?;
/// assert_eq!(ops::attention(&q, &k, &v, 1.0, false, Some(&mask))?.to_vec::<f32>()?, [7.5, 7.5]);
/// # Ok(()) }
/// ```
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    causal: bool,
    mask: Option<&Tensor>,
) -> Result<Tensor> {
    let dims = Dims::check(OP, q, k, Some(v), scale, mask)?;
    if let Some((out, _lse)) = fused(&dims, q, k, v, scale, causal, mask)? {
        return Ok(out);
    }
    // `..` drops the scores and the mask before the second product allocates its output.
    let Composed { p, .. } = composed(&dims, q, k, scale, causal, mask)?;
    apply(&dims, &p, v)
}

/// [`attention`], and the log-sum-exp of each query's row of scaled, masked scores:
/// `lse[b, h, i] = ln(Σ_j exp(scale · q_i·k_j + mask_ij))` (natural log), the number a
/// FlashAttention backward recomputes the probabilities from, `p_ij = exp(scale · q_i·k_j +
/// mask_ij − lse_i)`.
///
/// Returns `(out, lse)`: `out` bit for bit as [`attention`] gives it, and `lse` of shape
/// `[batch, heads, seq_q]`, f32 for f16, bf16 and f32 inputs and f64 for f64. A query whose every
/// key is masked has `lse = -inf`. Shapes and errors as for [`attention`].
///
/// The fused kernel writes the log-sum-exp itself, from its f32 scores. On the CPU it is
/// computed in f64 from the same rounded scores the softmax uses. On CUDA the composed path gets
/// each row's maximum and sum from existing kernels in f32 and, having no logarithm kernel,
/// finishes the `ln` on the host: it reads `batch · heads · seq_q` values back, so it waits for
/// the device and cannot be captured in a CUDA graph. [`attention`] has no such step.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{DType, Device, Tensor, ops};
/// let q = Tensor::from_vec(vec![1.0f32, 0.0], [1, 1, 1, 2], Device::Cpu)?;
/// let k = Tensor::from_vec(vec![0.0f32, 0.0, 2.0, 0.0], [1, 1, 2, 2], Device::Cpu)?;
/// let v = Tensor::from_vec(vec![1.0f32, -1.0], [1, 1, 2, 1], Device::Cpu)?;
/// let (out, lse) = ops::attention_with_lse(&q, &k, &v, 0.5, false, None)?;
/// // Scores 0 and 2, scaled by 0.5: lse = ln(e^0 + e^1).
/// assert_eq!((lse.dims(), lse.dtype()), (&[1, 1, 1][..], DType::F32));
/// assert!((lse.to_vec::<f32>()?[0] - (1.0f32 + 1.0f32.exp()).ln()).abs() < 1e-6);
/// assert_eq!(out.to_vec::<f32>()?, ops::attention(&q, &k, &v, 0.5, false, None)?.to_vec::<f32>()?);
/// # Ok(()) }
/// ```
pub fn attention_with_lse(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    causal: bool,
    mask: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    let dims = Dims::check(OP, q, k, Some(v), scale, mask)?;
    if let Some(fused) = fused(&dims, q, k, v, scale, causal, mask)? {
        return Ok(fused);
    }
    let c = composed(&dims, q, k, scale, causal, mask)?;
    let lse = log_sum_exp(&dims, &c.scores, scale, c.mask.as_ref())?;
    Ok((apply(&dims, &c.p, v)?, lse))
}

/// The attention probabilities `softmax(scale · q·kᵀ + mask)`, shape
/// `[batch, heads, seq_q, seq_k]` in the inputs' dtype: the weights [`attention`] applies to
/// `v`, to inspect, or for a backward that recomputes them. Arguments and errors as for
/// [`attention`], without `v`.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{Device, Tensor, ops};
/// let q = Tensor::from_vec(vec![0.0f32; 3], [1, 1, 3, 1], Device::Cpu)?;
/// let k = Tensor::from_vec(vec![1.0f32, 2.0], [1, 1, 2, 1], Device::Cpu)?;
/// let p = ops::attention_weights(&q, &k, 1.0, true, None)?;
/// // Causal, top-left: query 0 sees key 0; queries 1 and 2 see both keys.
/// assert_eq!(p.to_vec::<f32>()?, [1.0, 0.0, 0.5, 0.5, 0.5, 0.5]);
/// # Ok(()) }
/// ```
pub fn attention_weights(q: &Tensor, k: &Tensor, scale: f64, causal: bool, mask: Option<&Tensor>) -> Result<Tensor> {
    let dims = Dims::check(OP, q, k, None, scale, mask)?;
    Ok(composed(&dims, q, k, scale, causal, mask)?.p)
}

/// What the composed path computes before the product with `v`.
struct Composed {
    /// `q·kᵀ`, unscaled, `[batch, heads, seq_q, seq_k]`.
    scores: Tensor,
    /// The causal and the caller's mask in one, if any.
    mask: Option<Tensor>,
    /// `softmax(scale · scores + mask)`, the scores' shape.
    p: Tensor,
}

/// The gradients of [`attention`] with respect to `q`, `k` and `v`, given the output's
/// gradient `dout`: returns `(dq, dk, dv)` in the shapes and dtype of `q`, `k` and `v`.
///
/// `out` and `lse` are what [`attention_with_lse`] returned for the same arguments. With
/// `P = softmax(scale · q·kᵀ + mask)`: `dv = Pᵀ·dout`, `dP = dout·vᵀ`,
/// `dS = scale · P ⊙ (dP − rowsum(dout ⊙ out))`, `dq = dS·k`, `dk = dSᵀ·q` (FlashAttention-2's
/// equations).
///
/// Where the fused forward serves the call (see [`attention_is_fused`]), fused kernels compute
/// them from `out` and `lse` without a `[seq_q, seq_k]` matrix in memory, FlashAttention-2's way:
/// one block per 128 keys computes that tile's `dk` and `dv` and adds its share of `dq` to an f32
/// accumulator with atomic adds. The order of those adds varies, so `dq` may differ in its last
/// bits between runs (as with PyTorch's flash backend); `dk` and `dv` are the same on every run.
/// Elsewhere the composed path recomputes `P` ([`attention_weights`]) and uses batched products
/// and [`softmax_backward`](super::softmax_backward); it does not read `out` and `lse`, but
/// checks them all the same.
///
/// Errors: those of [`attention`], and [`Error::ShapeMismatch`] when `out` or `dout` is not
/// `[batch, heads, seq_q, head_dim_v]` or `lse` not `[batch, heads, seq_q]`,
/// [`Error::DTypeMismatch`] / [`Error::DeviceMismatch`] when they differ from `q`'s (`lse` is f32,
/// f64 for f64 inputs). Every error names `"attention_backward"`.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{Device, Tensor, ops};
/// let q = Tensor::from_vec(vec![0.0f32, 0.0], [1, 1, 2, 1], Device::Cpu)?;
/// let k = Tensor::from_vec(vec![1.0f32, -1.0], [1, 1, 2, 1], Device::Cpu)?;
/// let v = Tensor::from_vec(vec![2.0f32, 4.0], [1, 1, 2, 1], Device::Cpu)?;
/// let (out, lse) = ops::attention_with_lse(&q, &k, &v, 1.0, false, None)?;
/// let dout = Tensor::ones([1, 1, 2, 1], opsmith_host::DType::F32, Device::Cpu)?;
/// let (dq, dk, dv) = ops::attention_backward(&q, &k, &v, &out, &lse, &dout, 1.0, false, None)?;
/// // q = 0: equal weights, so each value gets half of each query's gradient.
/// assert_eq!(dv.to_vec::<f32>()?, [1.0, 1.0]);
/// // Σ_j p_j (v_j − out) k_j = 0.5·(−1)·1 + 0.5·1·(−1) = −1 per query.
/// assert_eq!(dq.to_vec::<f32>()?, [-1.0, -1.0]);
/// assert_eq!(dk.dims(), k.dims());
/// # Ok(()) }
/// ```
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    lse: &Tensor,
    dout: &Tensor,
    scale: f64,
    causal: bool,
    mask: Option<&Tensor>,
) -> Result<(Tensor, Tensor, Tensor)> {
    const BACKWARD: &str = "attention_backward";
    let dims = Dims::check(BACKWARD, q, k, Some(v), scale, mask)?;
    check::same_device(BACKWARD, &[q, out, lse, dout])?;
    check::same_dtype(BACKWARD, &[q, out, dout])?;
    let lse_dtype = if q.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
    if lse.dtype() != lse_dtype {
        return Err(Error::DTypeMismatch { op: BACKWARD, lhs: lse_dtype, rhs: lse.dtype() });
    }
    let out_dims = [dims.batch, dims.heads, dims.seq_q, dims.head_dim_v];
    for t in [out, dout] {
        if t.dims() != out_dims {
            return Err(Error::ShapeMismatch { op: BACKWARD, lhs: out_dims.to_vec(), rhs: t.dims().to_vec() });
        }
    }
    if lse.dims() != [dims.batch, dims.heads, dims.seq_q] {
        let want = vec![dims.batch, dims.heads, dims.seq_q];
        return Err(Error::ShapeMismatch { op: BACKWARD, lhs: want, rhs: lse.dims().to_vec() });
    }
    if let Some(grads) = fused_backward(&dims, [q, k, v, out, lse, dout], scale, causal, mask)? {
        return Ok(grads);
    }
    composed_backward(&dims, [q, k, v], dout, scale, causal, mask)
}

/// The composed backward (see [`attention_backward`]).
fn composed_backward(
    dims: &Dims,
    [q, k, v]: [&Tensor; 3],
    dout: &Tensor,
    scale: f64,
    causal: bool,
    mask: Option<&Tensor>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let p = attention_weights(q, k, scale, causal, mask)?.reshape(dims.flat(dims.seq_q, dims.seq_k))?;
    let g = dout.reshape(dims.flat(dims.seq_q, dims.head_dim_v))?;
    let dv = super::matmul_t(&p, true, &g, false)?.reshape(v.dims().to_vec())?;
    let dp = super::matmul_t(&g, false, &v.reshape(dims.flat(dims.seq_k, dims.head_dim_v))?, true)?;
    // With respect to the unscaled scores q·kᵀ: the scale is softmax_backward's.
    let ds = super::softmax_backward(&dp, &p, scale)?;
    let dq = super::matmul(&ds, &k.reshape(dims.flat(dims.seq_k, dims.head_dim))?)?.reshape(q.dims().to_vec())?;
    let dk = super::matmul_t(&ds, true, &q.reshape(dims.flat(dims.seq_q, dims.head_dim))?, false)?;
    Ok((dq, dk.reshape(k.dims().to_vec())?, dv))
}

/// `(dq, dk, dv)` from the fused backward kernels when the fused forward serves the call;
/// `None` sends it to the composed path. Three launches: `Δ` and a zeroed f32 `dQ` accumulator,
/// the backward proper (`dK`, `dV`, `dQ` by atomic adds), and `dQ` rounded from the accumulator.
#[cfg(feature = "cuda")]
fn fused_backward(
    dims: &Dims,
    [q, k, v, out, lse, dout]: [&Tensor; 6],
    scale: f64,
    causal: bool,
    mask: Option<&Tensor>,
) -> Result<Option<(Tensor, Tensor, Tensor)>> {
    use crate::cuda::{Grid, LaunchConfig};
    use opsmith_kernels::names::attention::{BF16, F16};
    if fused_kernel(dims, q, k, v, mask).is_none()
        || ![out, dout].iter().all(|t| (t.offset * t.dtype().size_in_bytes()) % 16 == 0)
    {
        return Ok(None);
    }
    let (scale_log2, scale32) = ((scale * std::f64::consts::LOG2_E) as f32, scale as f32);
    if !scale_log2.is_finite() {
        return Ok(None);
    }
    let table = if q.dtype() == DType::F16 { F16 } else { BF16 };
    let (prep_kernel, backward_kernel) = match dims.head_dim {
        64 => (table.backward_prep_d64, table.backward_d64),
        _ => (table.backward_prep_d128, table.backward_d128),
    };
    let dq = Tensor::empty(q.dims().to_vec(), q.dtype(), q.device())?;
    let dk = Tensor::empty(k.dims().to_vec(), k.dtype(), k.device())?;
    let dv = Tensor::empty(v.dims().to_vec(), v.dtype(), v.device())?;
    let heads = dims.batch * dims.heads;
    if heads == 0 {
        return Ok(Some((dq, dk, dv)));
    }
    if dims.seq_q == 0 {
        // No query: no gradient reaches k or v.
        dk.fill_(0.0)?;
        dv.fill_(0.0)?;
        return Ok(Some((dq, dk, dv)));
    }
    let rows = heads * dims.seq_q;
    let elements = rows * dims.head_dim;
    // The kernels index `dq`'s elements in u32, and the key grid must fit: past either, the
    // composed path.
    let key_blocks = heads.saturating_mul(dims.seq_k.div_ceil(128));
    let (Ok(elements32), true) = (u32::try_from(elements), key_blocks <= i32::MAX as usize) else { return Ok(None) };
    let delta = Tensor::empty([rows], DType::F32, q.device())?;
    let dq_accum = Tensor::empty([elements], DType::F32, q.device())?;
    let lse = lse.reshape([rows])?;
    // Checked by `fused_kernel`: every size fits u32 and the grids an i32.
    let sizes = (heads as u32, dims.seq_q as u32, dims.seq_k as u32);
    let c = causal as u32;
    let prep_grid = LaunchConfig { grid: rows.div_ceil(32) as u32, block: 128, shared_mem_bytes: 0 };
    crate::cuda::launch(prep_kernel, Grid::Config(prep_grid), (out, dout, &delta, &dq_accum, rows as u32))?;
    // A block per 128 keys, 256 threads. Shared memory: 128-row k and v tiles, 32-row q and dO
    // tiles (2-byte elements), the 128 × 32 dSᵀ tile in rows padded to 80 bytes, and 32 f32 each
    // of lse and Δ (`device::flash_backward::backward_shared_bytes`).
    let shared_mem_bytes = ((2 * 128 + 2 * 32) * dims.head_dim * 2 + 128 * 80 + 2 * 32 * 4) as u32;
    let grid = LaunchConfig { grid: key_blocks as u32, block: 256, shared_mem_bytes };
    crate::cuda::launch(
        backward_kernel,
        Grid::Config(grid),
        (q, k, v, dout, &lse, &delta, &dk, &dv, &dq_accum, sizes.0, sizes.1, sizes.2, scale_log2, scale32, c),
    )?;
    crate::cuda::launch(table.backward_dq, Grid::stride(elements as u64 / 8), (&dq_accum, &dq, elements32, scale32))?;
    Ok(Some((dq, dk, dv)))
}

#[cfg(not(feature = "cuda"))]
fn fused_backward(
    _: &Dims,
    _: [&Tensor; 6],
    _: f64,
    _: bool,
    _: Option<&Tensor>,
) -> Result<Option<(Tensor, Tensor, Tensor)>> {
    Ok(None)
}

/// The environment variable that turns the fused kernel off: `OPSMITH_FUSED_ATTENTION=0` sends
/// every call to the composed path (to compare the two, or to rule the kernel out). Read once
/// per process.
pub const FUSED_ATTENTION_ENV: &str = "OPSMITH_FUSED_ATTENTION";

/// Whether a call of these operands takes the fused kernel: CUDA, f16 or bf16, head_dim 64 or
/// 128 for `q`, `k` and `v` alike, no `mask` (causal is fine), a GPU of sm_80 or newer, operands
/// at 16-byte aligned addresses, sizes that fit the kernel's 32-bit indices, and
/// [`FUSED_ATTENTION_ENV`] not `0`. Every other call takes the composed path.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{DType, Device, Tensor, ops};
/// let q = Tensor::zeros([1, 2, 16, 64], DType::BF16, Device::Cpu)?;
/// // The CPU always composes.
/// assert!(!ops::attention_is_fused(&q, &q, &q, false, None));
/// # Ok(()) }
/// ```
pub fn attention_is_fused(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool, mask: Option<&Tensor>) -> bool {
    let _ = causal; // both ways are fused
    match Dims::check(OP, q, k, Some(v), 1.0, mask) {
        Ok(dims) => fused_kernel(&dims, q, k, v, mask).is_some(),
        Err(_) => false,
    }
}

/// Queries per block of the fused forward: four warps of 32 (`wide`) or of 16 (`narrow`).
#[cfg(feature = "cuda")]
const WIDE_ROWS: usize = 128;
#[cfg(feature = "cuda")]
const NARROW_ROWS: usize = 64;

/// A fused forward kernel: `q, k, v, out, lse, heads, seq_q, seq_k, scale_log2, causal`.
#[cfg(feature = "cuda")]
type ForwardKernel = opsmith_kernels::decl::KernelDecl<(In, In, In, Out, Out, u32, u32, u32, f32, u32)>;

/// The two fused forwards of one dtype and head size, and the device's multiprocessor count
/// that picks between them.
#[cfg(feature = "cuda")]
struct ForwardKernels {
    wide: ForwardKernel,
    narrow: ForwardKernel,
    sm_count: usize,
}

#[cfg(feature = "cuda")]
impl ForwardKernels {
    /// The kernel for a call and its queries per block. With causal masking a block sees from
    /// one key tile to all of them; when the 128-query grid is under four waves of resident
    /// blocks (two a multiprocessor), its uneven tail costs more than 64-query blocks lose to
    /// reading `k` and `v` for half the queries (H100, bf16, seq 1024, 64 heads: narrow 10–13%
    /// faster; seq 4096: wide 2–4% faster; without masking wide wins at every size measured).
    fn pick(&self, heads: usize, seq_q: usize, causal: bool) -> (ForwardKernel, usize) {
        let wide_blocks = heads.saturating_mul(seq_q.div_ceil(WIDE_ROWS));
        if causal && wide_blocks < 4 * 2 * self.sm_count { (self.narrow, NARROW_ROWS) } else { (self.wide, WIDE_ROWS) }
    }
}

/// The fused kernels that serve these checked operands, if any (see [`attention_is_fused`]).
#[cfg(feature = "cuda")]
fn fused_kernel(dims: &Dims, q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Option<ForwardKernels> {
    use opsmith_kernels::names::attention::{BF16, F16};
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let enabled = *ENABLED.get_or_init(|| std::env::var(FUSED_ATTENTION_ENV).map_or(true, |v| v.trim() != "0"));
    let Device::Cuda(ordinal) = q.device() else { return None };
    let table = match q.dtype() {
        DType::F16 => F16,
        DType::BF16 => BF16,
        _ => return None,
    };
    let (wide, narrow) = match (dims.head_dim, dims.head_dim_v) {
        (64, 64) => (table.forward_d64, table.forward_narrow_d64),
        (128, 128) => (table.forward_d128, table.forward_narrow_d128),
        _ => return None,
    };
    let fits_u32 = |n: usize| u32::try_from(n).is_ok();
    let heads = dims.batch * dims.heads;
    // The narrow grid, the larger of the two.
    let blocks = heads.checked_mul(dims.seq_q.div_ceil(NARROW_ROWS))?;
    let sizes_fit = fits_u32(heads) && fits_u32(dims.seq_q) && fits_u32(dims.seq_k) && blocks <= i32::MAX as usize;
    // Whole allocations are 256-byte aligned; a view's offset may not be.
    let aligned = [q, k, v].iter().all(|t| (t.offset * t.dtype().size_in_bytes()) % 16 == 0);
    let device = crate::cuda::CudaDevice::get(ordinal).ok()?;
    let arch_ok = device
        .compute_capability()
        .is_ok_and(|(major, minor)| 10 * major + minor >= opsmith_kernels::Family::Attention.min_arch());
    let kernels = ForwardKernels { wide, narrow, sm_count: device.sm_count() as usize };
    (enabled && mask.is_none() && sizes_fit && aligned && arch_ok).then_some(kernels)
}

#[cfg(not(feature = "cuda"))]
fn fused_kernel(_: &Dims, _: &Tensor, _: &Tensor, _: &Tensor, _: Option<&Tensor>) -> Option<std::convert::Infallible> {
    None
}

/// `(out, lse)` from the fused kernel when it serves the call (see [`attention_is_fused`]), in
/// one launch; `None` sends the call to the composed path.
#[cfg(feature = "cuda")]
fn fused(
    dims: &Dims,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    causal: bool,
    mask: Option<&Tensor>,
) -> Result<Option<(Tensor, Tensor)>> {
    use crate::cuda::{Grid, LaunchConfig};
    let Some(kernels) = fused_kernel(dims, q, k, v, mask) else { return Ok(None) };
    let scale_log2 = (scale * std::f64::consts::LOG2_E) as f32;
    if !scale_log2.is_finite() {
        // A scale past f32's range: the composed path scales in the accumulator's precision.
        return Ok(None);
    }
    let out = Tensor::empty([dims.batch, dims.heads, dims.seq_q, dims.head_dim], q.dtype(), q.device())?;
    let lse = Tensor::empty([dims.batch, dims.heads, dims.seq_q], DType::F32, q.device())?;
    let heads = dims.batch * dims.heads;
    if heads == 0 || dims.seq_q == 0 {
        return Ok(Some((out, lse)));
    }
    let (kernel, rows) = kernels.pick(heads, dims.seq_q, causal);
    // Checked by `fused_kernel`: every size fits u32 and either grid an i32.
    let blocks = (heads * dims.seq_q.div_ceil(rows)) as u32;
    // The q tile and one 64-row tile each of k and v, in dynamic shared memory.
    let shared_mem_bytes = ((rows + 2 * 64) * dims.head_dim * 2) as u32;
    let grid = Grid::Config(LaunchConfig { grid: blocks, block: 128, shared_mem_bytes });
    let sizes = (heads as u32, dims.seq_q as u32, dims.seq_k as u32);
    crate::cuda::launch(kernel, grid, (q, k, v, &out, &lse, sizes.0, sizes.1, sizes.2, scale_log2, causal as u32))?;
    Ok(Some((out, lse)))
}

#[cfg(not(feature = "cuda"))]
fn fused(
    _: &Dims,
    _: &Tensor,
    _: &Tensor,
    _: &Tensor,
    _: f64,
    _: bool,
    _: Option<&Tensor>,
) -> Result<Option<(Tensor, Tensor)>> {
    Ok(None)
}

/// The composed path up to the probabilities: `matmul_t`, then `softmax`.
fn composed(dims: &Dims, q: &Tensor, k: &Tensor, scale: f64, causal: bool, mask: Option<&Tensor>) -> Result<Composed> {
    let scores = scores(dims, q, k)?;
    let mask = combined_mask(dims, q, causal, mask)?;
    let p = super::softmax(&scores, scale, mask.as_ref())?;
    Ok(Composed { scores, mask, p })
}

/// `p · v`, `[batch, heads, seq_q, head_dim_v]`.
fn apply(dims: &Dims, p: &Tensor, v: &Tensor) -> Result<Tensor> {
    let p = p.reshape(dims.flat(dims.seq_q, dims.seq_k))?;
    let out = super::matmul(&p, &v.reshape(dims.flat(dims.seq_k, dims.head_dim_v))?)?;
    out.reshape([dims.batch, dims.heads, dims.seq_q, dims.head_dim_v])
}

/// `q·kᵀ`, unscaled, `[batch, heads, seq_q, seq_k]` in the inputs' dtype: one batched product
/// that reads `k` transposed in place.
fn scores(dims: &Dims, q: &Tensor, k: &Tensor) -> Result<Tensor> {
    let q3 = q.reshape(dims.flat(dims.seq_q, dims.head_dim))?;
    let k3 = k.reshape(dims.flat(dims.seq_k, dims.head_dim))?;
    super::matmul_t(&q3, false, &k3, true)?.reshape(dims.scores())
}

/// The one additive mask the softmax takes: the causal mask, the caller's, both added, or none.
fn combined_mask(dims: &Dims, like: &Tensor, causal: bool, mask: Option<&Tensor>) -> Result<Option<Tensor>> {
    if !causal {
        return Ok(mask.cloned());
    }
    let causal = causal_mask(dims.seq_q, dims.seq_k, like.dtype(), like.device())?;
    match mask {
        // Broadcasts: a [seq_k] mask becomes [seq_q, seq_k]; a longer one keeps its dims.
        Some(m) => super::add(m, &causal).map(Some),
        None => Ok(Some(causal)),
    }
}

/// `[seq_q, seq_k]` of 0 where key `j <= i` and `-inf` where `j > i` (top-left aligned), built on
/// the host in `dtype` and copied to `device`.
fn causal_mask(seq_q: usize, seq_k: usize, dtype: DType, device: Device) -> Result<Tensor> {
    with_float_type!(dtype, OP, device, T => {
        let (open, shut) = (<T as Element>::from_f64(0.0), <T as Element>::from_f64(f64::NEG_INFINITY));
        let mut values = crate::tensor::host_vec(OP, seq_q * seq_k, open)?;
        for (i, row) in values.chunks_mut(seq_k).enumerate() {
            row.iter_mut().skip(i + 1).for_each(|m| *m = shut);
        }
        Tensor::from_vec(values, [seq_q, seq_k], device)
    })
}

/// The log-sum-exp of each row of `scale · scores + mask`: f32 (f64 for f64) of shape
/// `[batch, heads, seq_q]`.
fn log_sum_exp(dims: &Dims, scores: &Tensor, scale: f64, mask: Option<&Tensor>) -> Result<Tensor> {
    match scores.device() {
        Device::Cpu => {
            check::cpu_work(OP)?;
            with_float_type!(scores.dtype(), OP, Device::Cpu, T => log_sum_exp_cpu::<T>(dims, scores, scale, mask))
        }
        Device::Cuda(_) => log_sum_exp_by_ops(dims, scores, scale, mask),
    }
}

/// In f64 per row, from the logits rounded exactly as the CPU softmax rounds them.
fn log_sum_exp_cpu<T: Element>(dims: &Dims, scores: &Tensor, scale: f64, mask: Option<&Tensor>) -> Result<Tensor> {
    let xs = scores.to_vec::<T>()?;
    let ms = mask.map(|m| m.to_vec::<T>()).transpose()?;
    let scale = T::Acc::from_f64(scale);
    let cols = dims.seq_k; // > 0, checked
    let lse: Vec<f64> = xs
        .chunks(cols)
        .enumerate()
        .map(|(r, row)| {
            let (shift, sum) = row_max_sum(&row_logits(row, r, cols, ms.as_deref(), scale));
            // A fully masked row: shift 0 and sum 0, so -inf. A NaN or +inf logit: NaN.
            shift + sum.ln()
        })
        .collect();
    let dtype = if T::DTYPE == DType::F64 { DType::F64 } else { DType::F32 };
    Tensor::from_f64(&lse, [dims.batch, dims.heads, dims.seq_q], dtype, Device::Cpu)
}

/// The log-sum-exp from existing ops, on any device (CUDA's path; a unit test runs it on the
/// CPU): in f32, each row's maximum `m` of `scale · s + mask` ([`max_dim`](super::max_dim)),
/// and `Σ exp(z − m)` as `1 / max_j p_j`, since the softmax's largest probability is
/// `exp(0) / Σ`. No kernel takes a logarithm, so `m − ln(max p)` is finished on the host.
fn log_sum_exp_by_ops(dims: &Dims, scores: &Tensor, scale: f64, mask: Option<&Tensor>) -> Result<Tensor> {
    let wide = |t: &Tensor| if t.dtype() == DType::F32 { Ok(t.clone()) } else { t.to_dtype(DType::F32) };
    let z = wide(scores)?;
    let mask = mask.map(wide).transpose()?;
    let mut logits = super::scale(&z, scale)?;
    if let Some(m) = &mask {
        logits = super::add(&logits, m)?;
    }
    let (row_max, _) = super::max_dim(&logits, 3, false)?;
    let (p_max, _) = super::max_dim(&super::softmax(&z, scale, mask.as_ref())?, 3, false)?;
    let lse: Vec<f32> = row_max
        .to_vec::<f32>()?
        .into_iter()
        .zip(p_max.to_vec::<f32>()?)
        .map(|(m, p)| match m {
            // Every key masked: the softmax row is zeros, and ln(0) would turn -inf into NaN.
            f32::NEG_INFINITY => f32::NEG_INFINITY,
            m => (f64::from(m) - f64::from(p).ln()) as f32,
        })
        .collect();
    Tensor::from_vec(lse, [dims.batch, dims.heads, dims.seq_q], scores.device())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CUDA's log-sum-exp, run here on the CPU, against the CPU's f64 one.
    #[test]
    fn log_sum_exp_by_ops_matches_the_cpu() -> Result<()> {
        let (b, h, sq, sk) = (2, 3, 5, 7);
        let dims = Dims { batch: b, heads: h, seq_q: sq, seq_k: sk, head_dim: 1, head_dim_v: 1 };
        let n = b * h * sq * sk;
        let x: Vec<f64> = (0..n).map(|i| ((i * 37 % 23) as f64 - 11.0) / 4.0).collect();
        let mut m: Vec<f64> = (0..h * sq * sk).map(|i| ((i * 13 % 7) as f64 - 3.0) / 8.0).collect();
        m[2] = f64::NEG_INFINITY;
        m[sk..2 * sk].iter_mut().for_each(|v| *v = f64::NEG_INFINITY); // one row fully masked
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let scores = Tensor::from_f64(&x, [b, h, sq, sk], dtype, Device::Cpu)?;
            let mask = Tensor::from_f64(&m, [h, sq, sk], dtype, Device::Cpu)?;
            for mask in [None, Some(&mask)] {
                let cpu =
                    with_float_type!(dtype, OP, Device::Cpu, T => log_sum_exp_cpu::<T>(&dims, &scores, 0.75, mask))?;
                let ops = log_sum_exp_by_ops(&dims, &scores, 0.75, mask)?;
                assert_eq!((ops.dims(), ops.dtype()), (cpu.dims(), DType::F32));
                let (cpu, ops) = (cpu.to_vec_f64()?, ops.to_vec_f64()?);
                let mut masked_rows = 0;
                for (r, (c, o)) in cpu.iter().zip(&ops).enumerate() {
                    if *c == f64::NEG_INFINITY {
                        assert_eq!(*o, f64::NEG_INFINITY, "{dtype} row {r}");
                        masked_rows += 1;
                    } else {
                        assert!((c - o).abs() <= 1e-5 * (1.0 + c.abs()), "{dtype} row {r}: {o} vs {c}");
                    }
                }
                assert_eq!(masked_rows, if mask.is_some() { b } else { 0 }, "{dtype}");
            }
        }
        Ok(())
    }
}
