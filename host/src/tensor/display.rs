//! `Display` for tensors, the way PyTorch and candle print them: the values, nested by dim and
//! aligned, with `...` past 3 leading and 3 trailing entries of each dim when the tensor has more
//! than 1000 elements; then the shape, dtype and device.
use crate::Tensor;
use std::fmt;

/// Above this many elements, each dim shows its first and last [`EDGE`] entries only.
const SUMMARIZE_OVER: usize = 1000;
const EDGE: usize = 3;
/// Larger tensors are not read back whole to be printed: only their first and last values.
const READ_LIMIT: usize = 1 << 24;

/// How the numbers of one tensor are written: integers as they are; floats fixed with 4
/// decimals, or scientific when the magnitudes call for it; padded to one width.
struct NumberFormat {
    integer: bool,
    scientific: bool,
    width: usize,
}

impl NumberFormat {
    fn new(values: &[f64], integer: bool) -> NumberFormat {
        let finite = values.iter().copied().filter(|v| v.is_finite() && *v != 0.0).map(f64::abs);
        let (min, max) = finite.fold((f64::INFINITY, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
        let scientific = !integer && (max >= 1e8 || (min < 1e-4 && max > 0.0));
        let mut f = NumberFormat { integer, scientific, width: 0 };
        f.width = values.iter().map(|&v| f.write(v).len()).max().unwrap_or(0);
        f
    }

    fn write(&self, v: f64) -> String {
        match (v.is_finite(), self.scientific) {
            (false, _) => format!("{v}"),
            _ if self.integer => format!("{v}"),
            (true, true) => format!("{v:.4e}"),
            (true, false) => format!("{v:.4}"),
        }
    }
}

/// The indices shown along a dim of `size`: all, or the edges with a gap (`None`) between.
/// Lazy, so a summarized dim costs its shown entries only, whatever its size.
fn shown(size: usize, summarize: bool) -> impl Iterator<Item = Option<usize>> {
    let (head, gap) = if summarize && size > 2 * EDGE { (EDGE, true) } else { (size, false) };
    let tail = if gap { size - EDGE } else { size };
    (0..head).map(Some).chain(gap.then_some(None)).chain((tail..size).map(Some))
}

fn write_dim(
    out: &mut String,
    values: &[f64],
    dims: &[usize],
    offset: usize,
    depth: usize,
    summarize: bool,
    format: &NumberFormat,
) {
    if dims.is_empty() {
        out.push_str(&format!("{:>w$}", format.write(values[offset]), w = format.width));
        return;
    }
    let inner: usize = dims[1..].iter().product();
    out.push('[');
    for (k, entry) in shown(dims[0], summarize).enumerate() {
        if k > 0 {
            out.push(',');
            if dims.len() > 1 {
                out.push_str(&"\n".repeat(dims.len() - 1));
                out.push_str(&" ".repeat(depth + 1));
            } else {
                out.push(' ');
            }
        }
        match entry {
            Some(i) => write_dim(out, values, &dims[1..], offset + i * inner, depth + 1, summarize, format),
            None => out.push_str("..."),
        }
    }
    out.push(']');
}

impl fmt::Display for Tensor {
    /// ```
    /// # fn main() -> opsmith_host::Result<()> {
    /// use opsmith_host::{Device, Tensor};
    /// let x = Tensor::from_vec(vec![1.0f32, -2.5, 3.0, 4.0], [2, 2], Device::Cpu)?;
    /// assert_eq!(x.to_string(), "[[ 1.0000, -2.5000],\n [ 3.0000,  4.0000]]\nTensor[[2, 2], f32, cpu]");
    /// # Ok(()) }
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.elem_count();
        let header = format!("Tensor[{:?}, {}, {}]", self.dims(), self.dtype(), self.device());
        let integer = !self.dtype().is_float();
        if n == 0 {
            // Nothing to nest: a dim of an empty tensor may be huge (`[usize::MAX, 0]`).
            return write!(f, "[]\n{header}");
        }
        if n > READ_LIMIT {
            // Only the ends, read through flat views.
            let ends = self
                .flat_slice(0, EDGE)
                .and_then(|a| a.to_vec_f64())
                .and_then(|a| self.flat_slice(n - EDGE, EDGE).and_then(|b| b.to_vec_f64()).map(|b| (a, b)));
            return match ends {
                Ok((a, b)) => {
                    let format = NumberFormat::new(&[a.clone(), b.clone()].concat(), integer);
                    let list = |v: &[f64]| v.iter().map(|&x| format.write(x)).collect::<Vec<_>>().join(", ");
                    write!(f, "[{}, ..., {}] (flat; {n} elements)\n{header}", list(&a), list(&b))
                }
                Err(e) => write!(f, "<values not readable: {e}>\n{header}"),
            };
        }
        let values = match self.to_vec_f64() {
            Ok(v) => v,
            Err(e) => return write!(f, "<values not readable: {e}>\n{header}"),
        };
        let summarize = n > SUMMARIZE_OVER;
        let format = if summarize {
            // Only the shown values set the width.
            let mut shown_values = Vec::new();
            collect_shown(&values, self.dims(), 0, &mut shown_values);
            NumberFormat::new(&shown_values, integer)
        } else {
            NumberFormat::new(&values, integer)
        };
        let mut out = String::new();
        write_dim(&mut out, &values, self.dims(), 0, 0, summarize, &format);
        write!(f, "{out}\n{header}")
    }
}

fn collect_shown(values: &[f64], dims: &[usize], offset: usize, out: &mut Vec<f64>) {
    if dims.is_empty() {
        out.push(values[offset]);
        return;
    }
    let inner: usize = dims[1..].iter().product();
    for i in shown(dims[0], true).flatten() {
        collect_shown(values, &dims[1..], offset + i * inner, out);
    }
}

#[cfg(test)]
mod tests {
    use crate::{DType, Device, Tensor};

    #[test]
    fn small_tensors_print_whole() -> crate::Result<()> {
        let x = Tensor::from_vec(vec![0.5f64, 2.0, -3.0], [3], Device::Cpu)?;
        assert_eq!(x.to_string(), "[ 0.5000,  2.0000, -3.0000]\nTensor[[3], f64, cpu]");
        let s = Tensor::from_vec(vec![7.0f32], [], Device::Cpu)?;
        assert_eq!(s.to_string(), "7.0000\nTensor[[], f32, cpu]");
        let tiny = Tensor::from_vec(vec![1e-6f32, 1.0], [2], Device::Cpu)?;
        assert_eq!(tiny.to_string(), "[1.0000e-6,  1.0000e0]\nTensor[[2], f32, cpu]");
        let empty = Tensor::zeros([0, 2], DType::F16, Device::Cpu)?;
        assert_eq!(empty.to_string(), "[]\nTensor[[0, 2], f16, cpu]");
        Ok(())
    }

    #[test]
    fn empty_tensors_print_without_walking_their_dims() -> crate::Result<()> {
        // The dims are in the header; the values are none, whatever the dims' sizes.
        for dims in [vec![2, 0], vec![1 << 40, 0], vec![usize::MAX, 0], vec![0, usize::MAX], vec![3, 0, 1 << 50]] {
            let empty = Tensor::zeros(dims.clone(), DType::F32, Device::Cpu)?;
            assert_eq!(empty.to_string(), format!("[]\nTensor[{dims:?}, f32, cpu]"));
        }
        Ok(())
    }

    #[test]
    fn integers_print_without_decimals() -> crate::Result<()> {
        let x = Tensor::from_vec(vec![3i64, -12, 0, 7], [2, 2], Device::Cpu)?;
        assert_eq!(x.to_string(), "[[  3, -12],\n [  0,   7]]\nTensor[[2, 2], i64, cpu]");
        Ok(())
    }

    #[test]
    fn large_tensors_are_summarized() -> crate::Result<()> {
        let values: Vec<f32> = (0..40 * 50).map(|i| i as f32).collect();
        let x = Tensor::from_vec(values, [40, 50], Device::Cpu)?;
        let text = x.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 8, "{text}"); // 3 rows, ..., 3 rows, the header
        assert!(lines[0].starts_with("[[   0.0000,    1.0000,    2.0000, ...,   47.0000,"), "{text}");
        assert_eq!(lines[3], " ...,");
        assert!(lines[6].ends_with("1999.0000]]"), "{text}");
        assert_eq!(lines[7], "Tensor[[40, 50], f32, cpu]");
        Ok(())
    }
}
