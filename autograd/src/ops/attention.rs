//! Scaled dot-product attention on variables: the forward is the host's
//! [`ops::attention`](opsmith_host::ops::attention), the backward FlashAttention-2's equations
//! computed with the host's products and softmax backward.
use crate::Result;
use crate::onnx::trace::{self, Traced};
use crate::tape::{Var, tracking};
use opsmith_host::{Tensor, ops as host};

/// `softmax(scale · q·kᵀ + mask) · v` over `q [batch, heads, seq_q, head_dim]`,
/// `k [batch, heads, seq_k, head_dim]` and `v [batch, heads, seq_k, head_dim_v]`, as
/// [`opsmith_host::ops::attention`] (which documents the shapes, the top-left `causal` mask, the
/// additive `mask` and the errors). `q`, `k` and `v` get gradients; `mask` is a constant.
///
/// Where the host's fused kernels serve the call
/// ([`attention_is_fused`](opsmith_host::ops::attention_is_fused)), the node saves the output and
/// its log-sum-exp too, and its backward is
/// [`attention_backward`](opsmith_host::ops::attention_backward)'s fused kernels. Otherwise the
/// backward is composed, with `P = softmax(scale · q·kᵀ + mask)` and the output's gradient `dO`:
/// `dV = Pᵀ·dO`, `dP = dO·Vᵀ`, `dS = scale · P ⊙ (dP − rowsum(dP ⊙ P))` (the host's
/// [`softmax_backward`](opsmith_host::ops::softmax_backward) with the scale), `dQ = dS·K` and
/// `dK = dSᵀ·Q`, each product one batched GEMM reading its transposed operand in place. The
/// node saves `q`, `k`, `v` and the mask, and the backward recomputes `P`
/// ([`attention_weights`](opsmith_host::ops::attention_weights)) rather than keeping the
/// `[batch, heads, seq_q, seq_k]` probabilities alive between forward and backward, as a fused
/// FlashAttention backward does; the composed backward still builds that matrix while it runs.
/// Only the gradients of inputs that require them are computed (`dP` and `dS` only when `q` or
/// `k` does).
///
/// ```
/// # fn main() -> opsmith_autograd::Result<()> {
/// use opsmith_autograd::{Tape, ops};
/// use opsmith_host::{Device, Tensor};
/// let tape = Tape::new();
/// let q = tape.var(Tensor::from_vec(vec![0.0f64, 0.0], [1, 1, 2, 1], Device::Cpu)?);
/// let k = tape.var(Tensor::from_vec(vec![1.0f64, -1.0], [1, 1, 2, 1], Device::Cpu)?);
/// let v = tape.var(Tensor::from_vec(vec![2.0f64, 4.0], [1, 1, 2, 1], Device::Cpu)?);
/// let out = ops::attention(&q, &k, &v, 1.0, false, None)?;
/// assert_eq!(out.value().to_vec::<f64>()?, [3.0, 3.0]); // q = 0: equal weights
/// let grads = tape.backward(&ops::sum(&out)?)?;
/// // Each query gives each value half its gradient.
/// assert_eq!(grads.get(&v).unwrap().to_vec::<f64>()?, [1.0, 1.0]);
/// // d out / d q = Σ_j p_j (v_j − out) k_j = 0.5·(−1)·1 + 0.5·1·(−1) = −1 per query.
/// assert_eq!(grads.get(&q).unwrap().to_vec::<f64>()?, [-1.0, -1.0]);
/// # Ok(()) }
/// ```
pub fn attention(q: &Var, k: &Var, v: &Var, scale: f64, causal: bool, mask: Option<&Tensor>) -> Result<Var> {
    // Where the fused kernels serve the call, the forward keeps its log-sum-exp and the backward
    // is the fused one, which reads `out` and `lse` instead of recomputing `P` through memory.
    let fused = host::attention_is_fused(q.value(), k.value(), v.value(), causal, mask);
    let (out, lse) = if fused {
        let (out, lse) = host::attention_with_lse(q.value(), k.value(), v.value(), scale, causal, mask)?;
        (out, Some(lse))
    } else {
        (host::attention(q.value(), k.value(), v.value(), scale, causal, mask)?, None)
    };
    // The tracer exports the caller's mask as a constant; the causal one it builds from the sizes.
    let mask_var = mask.map(|m| Var::constant(m.clone()));
    let traced: Vec<&Var> = [q, k, v].into_iter().chain(mask_var.as_ref()).collect();
    let (seq_q, seq_k) = (q.value().dims()[2], k.value().dims()[2]); // rank 4: checked by the host
    let op = Traced::Attention { scale, causal: causal.then_some((seq_q, seq_k)), masked: mask.is_some() };
    record_or_constant!("attention", op, &[q, k, v], traced_as & traced, out, |tape| {
        let needs = [q.requires_grad(), k.requires_grad(), v.requires_grad()];
        let (qt, kt, vt, mt) = (q.value().clone(), k.value().clone(), v.value().clone(), mask.cloned());
        let fused_saved = lse.map(|lse| (out.clone(), lse));
        let saved: Vec<&Tensor> = [&qt, &kt, &vt]
            .into_iter()
            .chain(mt.as_ref())
            .chain(fused_saved.iter().flat_map(|(o, l)| [o, l]))
            .collect();
        let saved: Vec<Tensor> = saved.into_iter().cloned().collect();
        tape.record("attention", &[q, k, v], out, &saved.iter().collect::<Vec<_>>(), move |g| match &fused_saved {
            Some((out, lse)) => {
                let (dq, dk, dv) = host::attention_backward(&qt, &kt, &vt, out, lse, g, scale, causal, mt.as_ref())?;
                Ok([dq, dk, dv].into_iter().zip(needs).map(|(grad, need)| need.then_some(grad)).collect())
            }
            None => backward(g, [&qt, &kt, &vt], scale, causal, mt.as_ref(), needs),
        })
    })
}

/// The composed backward: `[dQ, dK, dV]`, each `None` where `needs` says no.
fn backward(
    g: &Tensor,
    [q, k, v]: [&Tensor; 3],
    scale: f64,
    causal: bool,
    mask: Option<&Tensor>,
    [q_needs, k_needs, v_needs]: [bool; 3],
) -> Result<Vec<Option<Tensor>>> {
    // Rank 4, as the forward checked.
    let rank4 = |t: &Tensor| {
        <[usize; 4]>::try_from(t.dims()).map_err(|_| opsmith_host::Error::InvalidArgument {
            op: "attention",
            reason: format!("saved operand of shape {:?} is not of rank 4", t.dims()),
        })
    };
    let ([b, h, seq_q, d], [_, _, seq_k, dv]) = (rank4(q)?, rank4(v)?);
    // The batched products take rank 3: [batch · heads, rows, cols], the same memory.
    let flat = |t: &Tensor, rows: usize, cols: usize| t.reshape([b * h, rows, cols]);
    let p = flat(&host::attention_weights(q, k, scale, causal, mask)?, seq_q, seq_k)?;
    let g = flat(g, seq_q, dv)?;
    let dv_grad = match v_needs {
        true => Some(host::matmul_t(&p, true, &g, false)?.reshape(v.dims().to_vec())?),
        false => None,
    };
    let (mut dq, mut dk) = (None, None);
    if q_needs || k_needs {
        let dp = host::matmul_t(&g, false, &flat(v, seq_k, dv)?, true)?;
        // With respect to the unscaled scores q·kᵀ: the scale is softmax_backward's.
        let ds = host::softmax_backward(&dp, &p, scale)?;
        if q_needs {
            dq = Some(host::matmul(&ds, &flat(k, seq_k, d)?)?.reshape(q.dims().to_vec())?);
        }
        if k_needs {
            dk = Some(host::matmul_t(&ds, true, &flat(q, seq_q, d)?, false)?.reshape(k.dims().to_vec())?);
        }
    }
    Ok(vec![dq, dk, dv_grad])
}
