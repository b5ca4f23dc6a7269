//! A two-layer block, `y = relu(x · w1 + b1) · w2 + b2`, as one op, and its first layer's
//! gradients as one op: the shape of a small MLP (a classifier's hidden layer and its logits).
//!
//! On CUDA, when the block's inputs and outputs are narrow (at most
//! [`TWO_LAYER_MAX_IN`](opsmith_kernels::names::matmul::TWO_LAYER_MAX_IN) and
//! [`TWO_LAYER_MAX_OUT`](opsmith_kernels::names::matmul::TWO_LAYER_MAX_OUT) features) and both
//! products small ([`SMALL_PRODUCT_MACS`](super::SMALL_PRODUCT_MACS)), each is one launch where the layers apart are two:
//! in a captured training step, two nodes fewer one after another. The kernels add in the order
//! of the separate layers' kernels where those take the same mapping, so both ways give the same
//! bits: the forward with 33 to 256 hidden units, the gradients with up to 1024 rows (elsewhere
//! the order of the sums differs, within f32 rounding). Otherwise, and on the CPU, the ops are
//! [`linear_relu`], [`linear`], [`matmul_t`] and [`linear_grads`].
use super::check;
use super::matmul::{linear, linear_grads, linear_relu, matmul_t};
use crate::{Error, Result, Tensor};

/// A two-layer block, `(y, h)` with `h = relu(x · w1 + b1)` and `y = h · w2 + b2`, for
/// `x [m, d_in]`, `w1 [d_in, hidden]`, `b1 [hidden]`, `w2 [hidden, d_out]`, `b2 [d_out]`: the
/// output `[m, d_out]` and the hidden layer `[m, hidden]`, which the block's backward needs
/// ([`linear_relu_linear_first_grads`]).
///
/// The same values as [`linear_relu`] then [`linear`] (on CUDA with 33 to 256 hidden units the
/// same bits); on CUDA, with
/// narrow inputs and outputs and small products, one launch (see the module docs). Errors: every
/// tensor on one device and of one dtype, the shapes above ([`Error::ShapeMismatch`] or
/// [`Error::InvalidArgument`], naming `linear_relu_linear`).
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], [1, 2], Device::Cpu)?;
/// let w1 = Tensor::from_vec(vec![1.0f32, -1.0, 1.0, -1.0], [2, 2], Device::Cpu)?;
/// let b1 = Tensor::from_vec(vec![0.5f32, 0.5], [2], Device::Cpu)?;
/// let w2 = Tensor::from_vec(vec![2.0f32, 1.0], [2, 1], Device::Cpu)?;
/// let b2 = Tensor::from_vec(vec![-1.0f32], [1], Device::Cpu)?;
/// let (y, h) = ops::linear_relu_linear(&x, &w1, &b1, &w2, &b2)?;
/// assert_eq!(h.to_vec::<f32>()?, [3.5, 0.0]); // relu([1 + 2 + 0.5, -1 - 2 + 0.5])
/// assert_eq!(y.to_vec::<f32>()?, [6.0]); // 3.5·2 + 0·1 - 1
/// # Ok(()) }
/// ```
pub fn linear_relu_linear(x: &Tensor, w1: &Tensor, b1: &Tensor, w2: &Tensor, b2: &Tensor) -> Result<(Tensor, Tensor)> {
    let op = "linear_relu_linear";
    let sizes = block_sizes(op, x, w1, w2)?;
    let [_, _, hidden, d_out] = sizes;
    check::same_device(op, &[x, b1, b2])?;
    check::same_dtype(op, &[x, b1, b2])?;
    if b1.dims() != [hidden] {
        return Err(Error::ShapeMismatch { op, lhs: vec![hidden], rhs: b1.dims().to_vec() });
    }
    if b2.dims() != [d_out] {
        return Err(Error::ShapeMismatch { op, lhs: vec![d_out], rhs: b2.dims().to_vec() });
    }
    #[cfg(feature = "cuda")]
    if fused(x, sizes) {
        return cuda::forward(op, [x, w1, b1, w2, b2], sizes);
    }
    let h = linear_relu(x, w1, b1)?;
    Ok((linear(&h, w2, b2)?, h))
}

/// The first layer's weight and bias gradients of a [`linear_relu_linear`] block, `(dw1, db1)`,
/// from its input `x [m, d_in]`, its hidden layer `h [m, hidden]`, the gradient `g [m, d_out]` of
/// its output and its second weight `w2 [hidden, d_out]`: with `d = (g · w2ᵀ) · [h > 0]` (the
/// gradient of the hidden layer's pre-activation), `dw1 = xᵀ · d` (`[d_in, hidden]`) and
/// `db1 = Σ_rows d` (`[hidden]`).
///
/// On CUDA, with narrow inputs and outputs and small products, one launch that computes `d` as it
/// reads it, never as a tensor; otherwise, and on the CPU, [`matmul_t`] then [`linear_grads`],
/// the same values (on CUDA, with up to 1024 rows, the same bits). Errors as for
/// [`linear_relu_linear`], naming `linear_relu_linear_first_grads`.
///
/// ```
/// # fn main() -> opsmith_host::Result<()> {
/// use opsmith_host::{ops, Device, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], [1, 2], Device::Cpu)?;
/// let h = Tensor::from_vec(vec![3.5f32, 0.0], [1, 2], Device::Cpu)?;
/// let g = Tensor::from_vec(vec![1.0f32], [1, 1], Device::Cpu)?;
/// let w2 = Tensor::from_vec(vec![2.0f32, 1.0], [2, 1], Device::Cpu)?;
/// let (dw1, db1) = ops::linear_relu_linear_first_grads(&x, &h, &g, &w2)?;
/// assert_eq!(db1.to_vec::<f32>()?, [2.0, 0.0]); // g · w2ᵀ where h > 0
/// assert_eq!(dw1.to_vec::<f32>()?, [2.0, 0.0, 4.0, 0.0]); // xᵀ · d
/// # Ok(()) }
/// ```
pub fn linear_relu_linear_first_grads(x: &Tensor, h: &Tensor, g: &Tensor, w2: &Tensor) -> Result<(Tensor, Tensor)> {
    let op = "linear_relu_linear_first_grads";
    for (name, t) in [("x", x), ("h", h), ("g", g), ("w2", w2)] {
        if t.dims().len() != 2 {
            return Err(Error::InvalidArgument {
                op,
                reason: format!("expects 2-D x, h, g and w2, got {name} of shape {:?}", t.dims()),
            });
        }
    }
    check::same_device(op, &[x, h, g, w2])?;
    check::same_dtype(op, &[x, h, g, w2])?;
    let sizes = [x.dims()[0], x.dims()[1], w2.dims()[0], w2.dims()[1]];
    let [m, _, hidden, d_out] = sizes;
    if h.dims() != [m, hidden] {
        return Err(Error::ShapeMismatch { op, lhs: vec![m, hidden], rhs: h.dims().to_vec() });
    }
    if g.dims() != [m, d_out] {
        return Err(Error::ShapeMismatch { op, lhs: vec![m, d_out], rhs: g.dims().to_vec() });
    }
    #[cfg(feature = "cuda")]
    if fused(x, sizes) && sizes[1] > 0 {
        return cuda::first_grads(op, [x, h, g, w2], sizes);
    }
    let d = matmul_t(g, false, w2, true)?;
    linear_grads(x, &d, Some(h))
}

/// `[m, d_in, hidden, d_out]` of a block, with `x`, `w1` and `w2` 2-D, on one device, of one
/// dtype, and their inner dimensions agreeing.
fn block_sizes(op: &'static str, x: &Tensor, w1: &Tensor, w2: &Tensor) -> Result<[usize; 4]> {
    for (name, t) in [("x", x), ("w1", w1), ("w2", w2)] {
        if t.dims().len() != 2 {
            return Err(Error::InvalidArgument {
                op,
                reason: format!(
                    "expects x [m, d_in], w1 [d_in, hidden] and w2 [hidden, d_out], got {name} of shape {:?}",
                    t.dims()
                ),
            });
        }
    }
    check::same_device(op, &[x, w1, w2])?;
    check::same_dtype(op, &[x, w1, w2])?;
    if x.dims()[1] != w1.dims()[0] {
        return Err(Error::ShapeMismatch { op, lhs: x.dims().to_vec(), rhs: w1.dims().to_vec() });
    }
    if w1.dims()[1] != w2.dims()[0] {
        return Err(Error::ShapeMismatch { op, lhs: w1.dims().to_vec(), rhs: w2.dims().to_vec() });
    }
    Ok([x.dims()[0], x.dims()[1], w1.dims()[1], w2.dims()[1]])
}

/// Whether a block of these sizes takes the fused kernels: on CUDA, narrow inputs and outputs,
/// no empty dimension, both products small, and small products not turned off
/// (`OPSMITH_SMALL_MATMUL=0`).
#[cfg(feature = "cuda")]
fn fused(x: &Tensor, [m, d_in, hidden, d_out]: [usize; 4]) -> bool {
    use opsmith_kernels::names::matmul::{TWO_LAYER_MAX_IN, TWO_LAYER_MAX_OUT};
    let macs = |k: usize, n: usize| (m as u128) * (k as u128) * (n as u128);
    x.device().is_cuda()
        && super::matmul::small_products_enabled()
        && (d_in as u64) <= TWO_LAYER_MAX_IN
        && (1..=TWO_LAYER_MAX_OUT).contains(&(d_out as u64))
        && m > 0
        && hidden > 0
        && macs(d_in, hidden).max(macs(hidden, d_out)) <= u128::from(super::SMALL_PRODUCT_MACS)
}

/// The CUDA halves: one launch each.
#[cfg(feature = "cuda")]
mod cuda {
    use crate::cuda::{self, Grid};
    use crate::ops::matmul::column_split_block;
    use crate::{Result, Shape, Tensor};
    use opsmith_kernels::names::matmul::{self, TWO_LAYER_GRADS_MAX_BLOCK};

    /// One warp per row of `x`.
    pub(super) fn forward(
        op: &'static str,
        [x, w1, b1, w2, b2]: [&Tensor; 5],
        [m, d_in, hidden, d_out]: [usize; 4],
    ) -> Result<(Tensor, Tensor)> {
        let table = crate::ops::cuda::dtype_table(op, x, [matmul::F32, matmul::F16, matmul::BF16])?;
        let h = Tensor::empty(Shape::from([m, hidden]), x.dtype(), x.device())?;
        let y = Tensor::empty(Shape::from([m, d_out]), x.dtype(), x.device())?;
        let sizes = (m as u64, d_in as u64, hidden as u64, d_out as u64);
        let args = (x, w1, b1, w2, b2, &h, &y, sizes.0, sizes.1, sizes.2, sizes.3);
        cuda::launch(table.two_layer_forward, Grid::covering(sizes.0 * 32), args)?;
        Ok((y, h))
    }

    /// One block per four hidden units of a row of `dw1` or of `db1`, as `linear_grads`'s blocks
    /// (at most 512 threads).
    pub(super) fn first_grads(
        op: &'static str,
        [x, h, g, w2]: [&Tensor; 4],
        [m, d_in, hidden, d_out]: [usize; 4],
    ) -> Result<(Tensor, Tensor)> {
        let table = crate::ops::cuda::dtype_table(op, x, [matmul::F32, matmul::F16, matmul::BF16])?;
        let dw1 = Tensor::empty(Shape::from([d_in, hidden]), x.dtype(), x.device())?;
        let db1 = Tensor::empty(Shape::from([hidden]), x.dtype(), x.device())?;
        let sizes = (m as u64, d_in as u64, hidden as u64, d_out as u64);
        let block = column_split_block(sizes.0).min(TWO_LAYER_GRADS_MAX_BLOCK);
        // The rows of `dw1` and the bias's row of ones, four hidden units a block.
        let tiles = (sizes.1 + 1) * sizes.2.div_ceil(4);
        let args = (x, h, g, w2, &dw1, &db1, sizes.0, sizes.1, sizes.2, sizes.3);
        cuda::launch(table.two_layer_first_grads, Grid::covering(tiles * u64::from(block)).with_block(block), args)?;
        Ok((dw1, db1))
    }
}
