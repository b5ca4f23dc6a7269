//! Tensor shapes.
use smallvec::SmallVec;

/// The dimensions of a tensor, outermost first. A shape of no dimensions is a scalar.
///
/// Functions that take a shape take `impl Into<Shape>`: an array, a slice, a `Vec` or one
/// length.
///
/// ```
/// use opsmith_host::Shape;
/// assert_eq!(Shape::from([2, 3]), Shape::from(vec![2, 3]));
/// assert_eq!(Shape::from(5).dims(), [5]);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Shape(Dims);

/// Up to four dimensions are stored inline: cloning a tensor (which every op, view and tape
/// record does) then allocates nothing.
type Dims = SmallVec<[usize; 4]>;

impl Shape {
    /// The dimensions.
    ///
    /// ```
    /// assert_eq!(opsmith_host::Shape::from([4, 1]).dims(), [4, 1]);
    /// ```
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// The number of dimensions.
    ///
    /// ```
    /// use opsmith_host::Shape;
    /// assert_eq!(Shape::from([4, 1]).rank(), 2);
    /// assert_eq!(Shape::from([]).rank(), 0); // a scalar
    /// ```
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// The number of elements, or `None` if the product of the dims overflows `usize`, or the
    /// product of the non-zero ones does (a shape with a zero dim holds nothing, but the other
    /// dims still make its strides, so `[0, usize::MAX, usize::MAX]` is refused as too large).
    ///
    /// ```
    /// use opsmith_host::Shape;
    /// assert_eq!(Shape::from([2, 3]).checked_elem_count(), Some(6));
    /// assert_eq!(Shape::from([]).checked_elem_count(), Some(1));
    /// assert_eq!(Shape::from([0, 1 << 40]).checked_elem_count(), Some(0));
    /// assert_eq!(Shape::from([usize::MAX, 2]).checked_elem_count(), None);
    /// assert_eq!(Shape::from([0, usize::MAX, usize::MAX]).checked_elem_count(), None);
    /// ```
    pub fn checked_elem_count(&self) -> Option<usize> {
        // The non-zero dims' product must fit too, whatever the order of the dims: a shape such
        // as [0, usize::MAX, usize::MAX] holds no element, but its strides overflow.
        let nonzero = self.0.iter().filter(|&&d| d != 0).try_fold(1usize, |acc, &d| acc.checked_mul(d))?;
        Some(if self.0.contains(&0) { 0 } else { nonzero })
    }
}

impl From<Vec<usize>> for Shape {
    fn from(dims: Vec<usize>) -> Self {
        Shape(Dims::from_vec(dims))
    }
}

impl From<&[usize]> for Shape {
    fn from(dims: &[usize]) -> Self {
        Shape(Dims::from_slice(dims))
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(dims: [usize; N]) -> Self {
        Shape(Dims::from_slice(&dims))
    }
}

impl From<usize> for Shape {
    fn from(len: usize) -> Self {
        Shape(Dims::from_slice(&[len]))
    }
}
