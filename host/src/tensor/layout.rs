//! Shape ops: `narrow`, `transpose`, `permute`, `cat`, `stack`, `squeeze`, `unsqueeze`.
//!
//! Tensors are always contiguous, so the ops that move elements (`narrow` along a dim,
//! `transpose`, `permute`, `cat`, `stack`) return a new tensor, one kernel per input on CUDA;
//! the ones that only rename dims (`squeeze`, `unsqueeze`, like `reshape`) return a view that
//! shares memory. Up to 6 dims.
use crate::ops::layout::{Piece, assemble, contiguous_strides, padded};
use crate::{Error, Result, Shape, Tensor};

fn bad(op: &'static str, reason: String) -> Error {
    Error::InvalidArgument { op, reason }
}

impl Tensor {
    /// Checks `dim` against the rank.
    fn check_dim(&self, op: &'static str, dim: usize) -> Result<()> {
        if dim >= self.dims().len() {
            return Err(bad(op, format!("dim {dim} is out of range for shape {:?}", self.dims())));
        }
        Ok(())
    }

    /// Elements `start..start + len` along `dim` (candle's argument order), as a new tensor.
    /// For a view of a flat range, see [`Tensor::flat_slice`].
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, Tensor};
    /// let x = Tensor::from_vec((0..6).map(|i| i as f32).collect(), [2, 3], Device::Cpu)?;
    /// assert_eq!(x.narrow(1, 1, 2)?.to_vec::<f32>()?, [1.0, 2.0, 4.0, 5.0]); // columns 1..3
    /// assert!(x.narrow(1, 2, 2).is_err()); // past the end of dim 1
    /// # Ok(()) }
    /// ```
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Tensor> {
        const OP: &str = "Tensor::narrow";
        self.check_dim(OP, dim)?;
        let size = self.dims()[dim];
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(bad(OP, format!("{start}..{start}+{len} along dim {dim} of shape {:?}", self.dims())));
        }
        let strides = contiguous_strides(self.dims());
        let mut dims = self.dims().to_vec();
        dims[dim] = len;
        // An empty tensor's offsets can pass its end (`[0, 5]` along dim 1); the result is empty.
        let offset = if self.elem_count() == 0 { 0 } else { start * strides[dim] };
        let src = self.flat_slice(offset, self.elem_count() - offset)?;
        self.assemble_one(OP, &src, dims, &strides)
    }

    /// A new tensor with `dims` taken from `src` at `src_strides` (one per dim of `dims`).
    fn assemble_one(&self, op: &'static str, src: &Tensor, dims: Vec<usize>, src_strides: &[usize]) -> Result<Tensor> {
        let piece = Piece {
            src,
            dims: padded(op, &dims, 1)?,
            src_strides: padded(op, src_strides, 0)?,
            dst_offset: 0,
            dst_strides: padded(op, &contiguous_strides(&dims), 0)?,
        };
        assemble(op, Shape::from(dims), self.dtype(), self.device(), &[piece])
    }

    /// The dims reordered: dim `k` of the result is dim `order[k]` of this tensor, as a new
    /// tensor.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, Tensor};
    /// let x = Tensor::from_vec((0..24).map(|i| i as f32).collect(), [2, 3, 4], Device::Cpu)?;
    /// let p = x.permute(&[2, 0, 1])?;
    /// assert_eq!(p.dims(), [4, 2, 3]);
    /// assert_eq!(p.to_vec::<f32>()?[..3], [0.0, 4.0, 8.0]); // p[0, 0, :] = x[0, :, 0]
    /// assert!(x.permute(&[0, 0, 1]).is_err());
    /// # Ok(()) }
    /// ```
    pub fn permute(&self, order: &[usize]) -> Result<Tensor> {
        const OP: &str = "Tensor::permute";
        let rank = self.dims().len();
        let mut seen = vec![false; rank];
        if order.len() != rank || order.iter().any(|&d| d >= rank || std::mem::replace(&mut seen[d], true)) {
            return Err(bad(
                OP,
                format!("{order:?} is not a permutation of the {rank} dims of shape {:?}", self.dims()),
            ));
        }
        let strides = contiguous_strides(self.dims());
        let dims: Vec<usize> = order.iter().map(|&d| self.dims()[d]).collect();
        let src_strides: Vec<usize> = order.iter().map(|&d| strides[d]).collect();
        self.assemble_one(OP, self, dims, &src_strides)
    }

    /// Dims `a` and `b` swapped, as a new tensor: `x.transpose(0, 1)` of a matrix.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, Tensor};
    /// let x = Tensor::from_vec((0..6).map(|i| i as f32).collect(), [2, 3], Device::Cpu)?;
    /// let t = x.transpose(0, 1)?;
    /// assert_eq!(t.dims(), [3, 2]);
    /// assert_eq!(t.to_vec::<f32>()?, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    /// # Ok(()) }
    /// ```
    pub fn transpose(&self, a: usize, b: usize) -> Result<Tensor> {
        self.check_dim("Tensor::transpose", a)?;
        self.check_dim("Tensor::transpose", b)?;
        let mut order: Vec<usize> = (0..self.dims().len()).collect();
        order.swap(a, b);
        self.permute(&order)
    }

    /// The tensors joined along `dim`: the same dtype, device and rank, the same sizes in every
    /// other dim.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, Tensor};
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0], [1, 2], Device::Cpu)?;
    /// let b = Tensor::from_vec(vec![3.0f32, 4.0, 5.0, 6.0], [2, 2], Device::Cpu)?;
    /// assert_eq!(Tensor::cat(&[&a, &b], 0)?.dims(), [3, 2]);
    /// let side = Tensor::cat(&[&a, &a], 1)?;
    /// assert_eq!(side.to_vec::<f32>()?, [1.0, 2.0, 1.0, 2.0]);
    /// # Ok(()) }
    /// ```
    pub fn cat(tensors: &[&Tensor], dim: usize) -> Result<Tensor> {
        const OP: &str = "Tensor::cat";
        let Some(first) = tensors.first() else {
            return Err(bad(OP, "no tensors to join".into()));
        };
        first.check_dim(OP, dim)?;
        let mut dims = first.dims().to_vec();
        dims[dim] = 0;
        for t in tensors {
            if t.dtype() != first.dtype() {
                return Err(Error::DTypeMismatch { op: OP, lhs: first.dtype(), rhs: t.dtype() });
            }
            if t.device() != first.device() {
                return Err(Error::DeviceMismatch { op: OP, lhs: first.device(), rhs: t.device() });
            }
            let same_elsewhere = t.dims().len() == first.dims().len()
                && t.dims().iter().zip(first.dims()).enumerate().all(|(k, (a, b))| k == dim || a == b);
            if !same_elsewhere {
                return Err(Error::ShapeMismatch { op: OP, lhs: first.dims().to_vec(), rhs: t.dims().to_vec() });
            }
            dims[dim] = dims[dim].checked_add(t.dims()[dim]).ok_or_else(|| {
                bad(OP, format!("the sizes along dim {dim} add up to more than usize::MAX, at shape {:?}", t.dims()))
            })?;
        }
        let out_strides = contiguous_strides(&dims);
        let dst_strides = padded(OP, &out_strides, 0)?;
        let mut pieces = Vec::with_capacity(tensors.len());
        let mut at = 0;
        for t in tensors {
            pieces.push(Piece {
                src: t,
                dims: padded(OP, t.dims(), 1)?,
                src_strides: padded(OP, &contiguous_strides(t.dims()), 0)?,
                dst_offset: at * out_strides[dim],
                dst_strides,
            });
            at += t.dims()[dim];
        }
        assemble(OP, Shape::from(dims), first.dtype(), first.device(), &pieces)
    }

    /// The tensors (all of one shape) stacked along a new dim `dim`.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, Tensor};
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?;
    /// let b = Tensor::from_vec(vec![3.0f32, 4.0], [2], Device::Cpu)?;
    /// assert_eq!(Tensor::stack(&[&a, &b], 0)?.to_vec::<f32>()?, [1.0, 2.0, 3.0, 4.0]);
    /// assert_eq!(Tensor::stack(&[&a, &b], 1)?.to_vec::<f32>()?, [1.0, 3.0, 2.0, 4.0]);
    /// # Ok(()) }
    /// ```
    pub fn stack(tensors: &[&Tensor], dim: usize) -> Result<Tensor> {
        const OP: &str = "Tensor::stack";
        let Some(first) = tensors.first() else {
            return Err(bad(OP, "no tensors to stack".into()));
        };
        if let Some(t) = tensors.iter().find(|t| t.dims() != first.dims()) {
            return Err(Error::ShapeMismatch { op: OP, lhs: first.dims().to_vec(), rhs: t.dims().to_vec() });
        }
        let expanded = tensors.iter().map(|t| t.unsqueeze(dim)).collect::<Result<Vec<_>>>()?;
        Tensor::cat(&expanded.iter().collect::<Vec<_>>(), dim)
    }

    /// Dim `dim`, of size 1, removed: a view sharing memory.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor};
    /// let x = Tensor::zeros([2, 1, 3], DType::F32, Device::Cpu)?;
    /// assert_eq!(x.squeeze(1)?.dims(), [2, 3]);
    /// assert!(x.squeeze(0).is_err()); // size 2
    /// # Ok(()) }
    /// ```
    pub fn squeeze(&self, dim: usize) -> Result<Tensor> {
        self.check_dim("Tensor::squeeze", dim)?;
        if self.dims()[dim] != 1 {
            return Err(bad("Tensor::squeeze", format!("dim {dim} of shape {:?} is not of size 1", self.dims())));
        }
        let mut dims = self.dims().to_vec();
        dims.remove(dim);
        self.reshape(dims)
    }

    /// A dim of size 1 inserted before dim `dim` (`dim` may be the rank, to append): a view
    /// sharing memory.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor};
    /// let x = Tensor::zeros([2, 3], DType::F32, Device::Cpu)?;
    /// assert_eq!(x.unsqueeze(0)?.dims(), [1, 2, 3]);
    /// assert_eq!(x.unsqueeze(2)?.dims(), [2, 3, 1]);
    /// # Ok(()) }
    /// ```
    pub fn unsqueeze(&self, dim: usize) -> Result<Tensor> {
        if dim > self.dims().len() {
            return Err(bad("Tensor::unsqueeze", format!("cannot insert dim {dim} into shape {:?}", self.dims())));
        }
        let mut dims = self.dims().to_vec();
        dims.insert(dim, 1);
        self.reshape(dims)
    }
}

/// Reductions along a dim, indexing and broadcasting, as methods (see [`crate::ops`]).
impl Tensor {
    /// The sum along `dim`, which is removed (`[2, 3]` summed along 1 is `[2]`); see
    /// [`ops::sum_dim`](crate::ops::sum_dim).
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, Tensor};
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2], Device::Cpu)?;
    /// assert_eq!(x.sum(1)?.to_vec::<f32>()?, [3.0, 7.0]);
    /// # Ok(()) }
    /// ```
    pub fn sum(&self, dim: usize) -> Result<Tensor> {
        crate::ops::sum_dim(self, dim, false)
    }

    /// The sum along `dim`, kept with size 1 (`[2, 3]` along 1 is `[2, 1]`).
    pub fn sum_keepdim(&self, dim: usize) -> Result<Tensor> {
        crate::ops::sum_dim(self, dim, true)
    }

    /// The largest value along `dim`, which is removed; [`Tensor::argmax`] gives where it is.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, Tensor};
    /// let x = Tensor::from_vec(vec![1.0f32, 5.0, 3.0, 4.0], [2, 2], Device::Cpu)?;
    /// assert_eq!(x.max(0)?.to_vec::<f32>()?, [3.0, 5.0]);
    /// # Ok(()) }
    /// ```
    pub fn max(&self, dim: usize) -> Result<Tensor> {
        crate::ops::max_dim(self, dim, false).map(|(values, _)| values)
    }

    /// The index of the largest value along `dim` (the first, for ties), which is removed, as
    /// an [`DType::I64`](crate::DType::I64) tensor.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{DType, Device, Tensor};
    /// let x = Tensor::arange(0.0, 6.0, 1.0, DType::F32, Device::Cpu)?.reshape([2, 3])?;
    /// let m = x.argmax(1)?;
    /// assert_eq!((m.dtype(), m.to_vec_f64()?), (DType::I64, vec![2.0, 2.0]));
    /// # Ok(()) }
    /// ```
    pub fn argmax(&self, dim: usize) -> Result<Tensor> {
        crate::ops::argmax(self, dim, false)
    }

    /// Entries along `dim` picked by a 1-D u32 or i64 `index`; see
    /// [`ops::index_select`](crate::ops::index_select).
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, Tensor};
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2], Device::Cpu)?;
    /// let rows = x.index_select(0, &Tensor::from_vec(vec![1u32, 1], [2], Device::Cpu)?)?;
    /// assert_eq!(rows.to_vec::<f32>()?, [3.0, 4.0, 3.0, 4.0]);
    /// # Ok(()) }
    /// ```
    pub fn index_select(&self, dim: usize, index: &Tensor) -> Result<Tensor> {
        crate::ops::index_select(self, dim, index)
    }

    /// One entry along `dim` per element of `index`; see [`ops::gather`](crate::ops::gather).
    pub fn gather(&self, dim: usize, index: &Tensor) -> Result<Tensor> {
        crate::ops::gather(self, dim, index)
    }

    /// This tensor repeated along its size-1 dims (and new leading dims) to `shape`, by
    /// NumPy's broadcasting rules, as a new contiguous tensor.
    ///
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, Tensor};
    /// let row = Tensor::from_vec(vec![1.0f32, 2.0], [2], Device::Cpu)?;
    /// assert_eq!(row.broadcast_as([2, 2])?.to_vec::<f32>()?, [1.0, 2.0, 1.0, 2.0]);
    /// assert!(row.broadcast_as([3]).is_err()); // 2 does not repeat to 3
    /// # Ok(()) }
    /// ```
    pub fn broadcast_as(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        crate::ops::index::broadcast_to("Tensor::broadcast_as", self, shape.dims())
    }
}
