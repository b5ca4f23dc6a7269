//! Shared cases for the ops along a dim, the indexing ops, broadcasting, integer tensors and the
//! random fills, each against an independent host reference (f64 sums, index arithmetic).
use opsmith_host::{DType, Device, Error, Result, Tensor, ops};

const FLOATS: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::F64];

/// Distinct, exactly representable values (multiples of 1/4 up to 30 in magnitude), with ties
/// placed on purpose in `max` tests below.
fn values(n: usize) -> Vec<f64> {
    (0..n).map(|i| ((i * 37 + 11) % 61) as f64 * 0.25 - 7.5).collect()
}

fn on(values: &[f64], dims: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
    Tensor::from_f64(values, dims.to_vec(), dtype, Device::Cpu)?.to_device(device)
}

/// `sum_dim`, `max_dim` and `argmax` along every dim of a rank-3 tensor, against loops in f64.
pub fn dim_reductions_against_f64(device: Device) -> Result<()> {
    let dims = [3usize, 4, 5];
    let x64 = values(60);
    for dtype in FLOATS {
        if device.is_cuda() && dtype == DType::F64 {
            continue; // no f64 kernels
        }
        let x = on(&x64, &dims, dtype, device)?;
        let stored = x.to_vec_f64()?; // the values as rounded to the dtype
        for dim in 0..3 {
            let (outer, d, inner) =
                (dims[..dim].iter().product::<usize>(), dims[dim], dims[dim + 1..].iter().product::<usize>());
            let (mut sums, mut maxes, mut args) = (vec![], vec![], vec![]);
            for a in 0..outer {
                for i in 0..inner {
                    let column: Vec<f64> = (0..d).map(|j| stored[(a * d + j) * inner + i]).collect();
                    sums.push(column.iter().sum::<f64>());
                    let best = column.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    maxes.push(best);
                    args.push(column.iter().position(|&v| v == best).unwrap() as f64);
                }
            }
            let sum = x.sum(dim)?;
            let mut want_dims = dims.to_vec();
            want_dims.remove(dim);
            assert_eq!(sum.dims(), want_dims, "sum {dtype} dim {dim}");
            let tol = 4.0 * dtype.unit_roundoff() * 30.0 * d as f64;
            for (k, (got, want)) in sum.to_vec_f64()?.iter().zip(&sums).enumerate() {
                assert!((got - want).abs() <= tol, "sum {dtype} dim {dim} [{k}]: {got} vs {want}");
            }
            assert_eq!(x.sum_keepdim(dim)?.dims()[dim], 1);
            let (values, indices) = ops::max_dim(&x, dim, false)?;
            assert_eq!((values.device(), indices.dtype()), (device, DType::I64));
            assert_eq!(values.to_vec_f64()?, maxes, "max {dtype} dim {dim}");
            assert_eq!(indices.to_vec_f64()?, args, "argmax {dtype} dim {dim}");
            assert_eq!(x.argmax(dim)?.to_vec::<i64>()?, args.iter().map(|&v| v as i64).collect::<Vec<_>>());
        }
        // Ties pick the first index; a NaN wins.
        let t = on(&[1.0, 3.0, 3.0, f64::NAN, 2.0, f64::NAN], &[2, 3], dtype, device)?;
        assert_eq!(t.argmax(1)?.to_vec::<i64>()?, [1, 0]);
        assert!(t.max(1)?.to_vec_f64()?[1].is_nan());
        // Errors name the op and the offending dim.
        assert!(matches!(x.sum(3), Err(Error::InvalidArgument { op: "sum_dim", .. })));
        let empty = Tensor::zeros([2, 0], dtype, device)?;
        assert!(matches!(empty.argmax(1), Err(Error::InvalidArgument { op: "max_dim", .. })));
        assert_eq!(empty.sum(1)?.to_vec_f64()?, [0.0, 0.0]);
    }
    Ok(())
}

/// `index_select` and `gather` along every dim, for every dtype (integers included) and both
/// index dtypes, against index arithmetic on the host; copies, so bit for bit.
pub fn index_ops_against_index_math(device: Device) -> Result<()> {
    let dims = [3usize, 4, 5];
    let x64 = values(60);
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64, DType::U32, DType::I64] {
        let source: Vec<f64> =
            if dtype.is_float() { x64.clone() } else { (0..60).map(|i| (i * 7 % 60) as f64).collect() };
        let x = on(&source, &dims, dtype, device)?;
        let stored = x.to_vec_f64()?;
        for dim in 0..3 {
            let d = dims[dim];
            let picks: Vec<usize> = vec![d - 1, 0, d / 2, d - 1];
            for index_dtype in [DType::I64, DType::U32] {
                let index = on(&picks.iter().map(|&p| p as f64).collect::<Vec<_>>(), &[4], index_dtype, device)?;
                let got = x.index_select(dim, &index)?;
                let mut want_dims = dims.to_vec();
                want_dims[dim] = 4;
                let want: Vec<f64> = (0..want_dims.iter().product())
                    .map(|o| {
                        let mut ix = unravel(o, &want_dims);
                        ix[dim] = picks[ix[dim]];
                        stored[ravel(&ix, &dims)]
                    })
                    .collect();
                assert_eq!((got.dims(), got.dtype()), (&want_dims[..], dtype));
                assert_eq!(got.to_vec_f64()?, want, "index_select {dtype} dim {dim} ({index_dtype} indices)");
            }
            // gather: an index per output element, two along the dim.
            let mut index_dims = dims.to_vec();
            index_dims[dim] = 2;
            let count: usize = index_dims.iter().product();
            let at: Vec<f64> = (0..count).map(|o| ((o * 5 + 3) % d) as f64).collect();
            let index = on(&at, &index_dims, DType::I64, device)?;
            let want: Vec<f64> = (0..count)
                .map(|o| {
                    let mut ix = unravel(o, &index_dims);
                    ix[dim] = at[o] as usize;
                    stored[ravel(&ix, &dims)]
                })
                .collect();
            assert_eq!(x.gather(dim, &index)?.to_vec_f64()?, want, "gather {dtype} dim {dim}");
        }
        // Bad operands are typed errors.
        let float_index = on(&[0.0], &[1], DType::F32, device)?;
        assert!(matches!(x.index_select(0, &float_index), Err(Error::InvalidArgument { op: "index_select", .. })));
        let wrong = on(&[0.0; 6], &[2, 3], DType::I64, device)?;
        assert!(matches!(x.gather(1, &wrong), Err(Error::ShapeMismatch { op: "gather", .. })));
        if !device.is_cuda() {
            let past = on(&[3.0], &[1], DType::I64, device)?;
            assert!(matches!(x.index_select(0, &past), Err(Error::InvalidArgument { op: "index_select", .. })));
        }
    }
    Ok(())
}

/// The backwards of `index_select` and `gather` (scatter-adds, repeated indices included)
/// against sums in f64 on the host.
pub fn index_backwards_against_f64(device: Device) -> Result<()> {
    let dims = [3usize, 4, 5];
    for dtype in FLOATS {
        if device.is_cuda() && dtype == DType::F64 {
            continue;
        }
        for dim in 0..3 {
            let d = dims[dim];
            let picks = [d - 1, 0, d - 1, 1];
            let mut g_dims = dims.to_vec();
            g_dims[dim] = picks.len();
            let count: usize = g_dims.iter().product();
            let g = on(&values(count), &g_dims, dtype, device)?;
            let gv = g.to_vec_f64()?;
            let index = on(&picks.map(|p| p as f64), &[4], DType::I64, device)?;
            let mut want = vec![0.0; 60];
            for (o, v) in gv.iter().enumerate() {
                let mut ix = unravel(o, &g_dims);
                ix[dim] = picks[ix[dim]];
                want[ravel(&ix, &dims)] += v;
            }
            let got = ops::index_select_backward(&g, dim, &index, d)?;
            assert_eq!(got.dims(), dims);
            let tol = 4.0 * dtype.unit_roundoff() * 60.0;
            for (k, (x, w)) in got.to_vec_f64()?.iter().zip(&want).enumerate() {
                assert!((x - w).abs() <= tol, "index_select_backward {dtype} dim {dim} [{k}]: {x} vs {w}");
            }
            // gather's: one index per element of g.
            let at: Vec<f64> = (0..count).map(|o| ((o * 3 + 1) % d) as f64).collect();
            let index = on(&at, &g_dims, DType::I64, device)?;
            let mut want = vec![0.0; 60];
            for (o, v) in gv.iter().enumerate() {
                let mut ix = unravel(o, &g_dims);
                ix[dim] = at[o] as usize;
                want[ravel(&ix, &dims)] += v;
            }
            let got = ops::gather_backward(&g, dim, &index, d)?;
            for (k, (x, w)) in got.to_vec_f64()?.iter().zip(&want).enumerate() {
                assert!((x - w).abs() <= tol, "gather_backward {dtype} dim {dim} [{k}]: {x} vs {w}");
            }
        }
    }
    Ok(())
}

/// Binary ops and `broadcast_as` with shapes that broadcast, against index arithmetic.
pub fn broadcasting_against_index_math(device: Device) -> Result<()> {
    let (a_dims, b_dims, out_dims) = ([2usize, 1, 3], [4usize, 1], [2usize, 4, 3]);
    let (a64, b64) = (values(6), values(4).iter().map(|v| v + 20.0).collect::<Vec<_>>());
    for dtype in FLOATS {
        if device.is_cuda() && dtype == DType::F64 {
            continue;
        }
        let (a, b) = (on(&a64, &a_dims, dtype, device)?, on(&b64, &b_dims, dtype, device)?);
        let (sa, sb) = (a.to_vec_f64()?, b.to_vec_f64()?);
        let pairs: Vec<(f64, f64)> = (0..24)
            .map(|o| {
                let ix = unravel(o, &out_dims);
                (sa[ix[0] * 3 + ix[2]], sb[ix[1]])
            })
            .collect();
        let round = |v: f64| Tensor::from_f64(&[v], [1], dtype, Device::Cpu).unwrap().to_vec_f64().unwrap()[0];
        type Case = (&'static str, Tensor, fn(f64, f64) -> f64);
        let cases: [Case; 4] = [
            ("add", ops::add(&a, &b)?, |x, y| x + y),
            ("sub", (&b - &a)?, |x, y| y - x),
            ("mul", (&a * &b)?, |x, y| x * y),
            ("div", ops::div(&a, &b)?, |x, y| x / y),
        ];
        for (name, got, f) in cases {
            assert_eq!(got.dims(), out_dims, "{name} {dtype}");
            let want: Vec<f64> = pairs.iter().map(|&(x, y)| round(f(x, y))).collect();
            assert_eq!(got.to_vec_f64()?, want, "{name} {dtype}");
        }
        let repeated = b.broadcast_as(out_dims)?;
        assert_eq!(repeated.to_vec_f64()?, pairs.iter().map(|p| p.1).collect::<Vec<_>>());
        assert_eq!(
            ops::sum_to_shape(&repeated, &b_dims)?.to_vec_f64()?,
            sb.iter().map(|v| round(v * 6.0)).collect::<Vec<_>>()
        ); // 2 × 3 copies
        assert!(matches!(
            ops::add(&a, &on(&[1.0, 2.0], &[2], dtype, device)?),
            Err(Error::ShapeMismatch { op: "add", .. })
        ));
    }
    Ok(())
}

/// `rand` and `randn`: the values on `device` are the CPU's bit for bit; the CPU's are
/// uniform in `[0, 1)` and standard normal by their first moments and a coarse histogram.
pub fn random_streams(device: Device) -> Result<()> {
    let n = 1 << 16;
    for dtype in FLOATS {
        for normal in [false, true] {
            let make = |device| {
                if normal { Tensor::randn([n], dtype, device, 1234) } else { Tensor::rand([n], dtype, device, 1234) }
            };
            let here = make(device)?;
            let cpu = make(Device::Cpu)?.to_vec_f64()?;
            assert_eq!((here.dtype(), here.device()), (dtype, device));
            let got = here.to_vec_f64()?;
            assert!(got == cpu, "{dtype} normal={normal}: the device's stream differs from the CPU's");
            let mean = got.iter().sum::<f64>() / n as f64;
            let var = got.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
            let (want_mean, want_var) = if normal { (0.0, 1.0) } else { (0.5, 1.0 / 12.0) };
            // Five standard errors, plus the dtype's rounding.
            let slack = 5.0 * (want_var / n as f64).sqrt() + 2.0 * dtype.unit_roundoff();
            assert!((mean - want_mean).abs() < slack, "{dtype} normal={normal}: mean {mean}");
            assert!((var - want_var).abs() < 0.02 * want_var + 4.0 * dtype.unit_roundoff(), "{dtype}: var {var}");
            if normal {
                // About 68.3% within one sigma, 95.4% within two.
                let within = |k: f64| got.iter().filter(|v| v.abs() < k).count() as f64 / n as f64;
                assert!((within(1.0) - 0.6827).abs() < 0.01 && (within(2.0) - 0.9545).abs() < 0.01, "{dtype}");
            } else {
                assert!(got.iter().all(|v| (0.0..1.0).contains(v)), "{dtype}: a value outside [0, 1)");
                let mut bins = [0usize; 8];
                got.iter().for_each(|v| bins[(v * 8.0) as usize] += 1);
                assert!(
                    bins.iter().all(|&c| (c as f64 - n as f64 / 8.0).abs() < 0.05 * n as f64 / 8.0),
                    "{dtype}: {bins:?}"
                );
            }
        }
        // The stream depends on the seed and the index only.
        let small = Tensor::rand([10], dtype, device, 9)?.to_vec_f64()?;
        let large = Tensor::rand([2, 50], dtype, device, 9)?.to_vec_f64()?;
        assert_eq!(small, large[..10]);
        assert_ne!(small, Tensor::rand([10], dtype, device, 10)?.to_vec_f64()?);
    }
    assert!(matches!(
        Tensor::randn([2], DType::I64, device, 0),
        Err(Error::UnsupportedDType { op: "Tensor::randn", dtype: DType::I64, .. })
    ));
    Ok(())
}

/// Integer tensors: made, converted, printed, copied and moved in layout ops.
pub fn integer_tensors(device: Device) -> Result<()> {
    let big = (1i64 << 40) + 3;
    let x = Tensor::from_vec(vec![5i64, -2, big, 0, 7, -9], [2, 3], Device::Cpu)?.to_device(device)?;
    assert_eq!(x.to_vec::<i64>()?, [5, -2, big, 0, 7, -9]);
    assert_eq!(x.transpose(0, 1)?.to_vec::<i64>()?, [5, 0, -2, 7, big, -9]);
    assert_eq!(Tensor::cat(&[&x, &x.narrow(0, 1, 1)?], 0)?.to_vec::<i64>()?[6..], [0, 7, -9]);
    let u = Tensor::from_vec(vec![3u32, u32::MAX, 0], [3], Device::Cpu)?.to_device(device)?;
    assert_eq!(u.to_dtype(DType::I64)?.to_vec::<i64>()?, [3, u32::MAX as i64, 0]);
    assert_eq!(u.to_dtype(DType::F32)?.to_vec::<f32>()?, [3.0, 4294967296.0, 0.0]);
    let f = Tensor::from_vec(vec![2.5f32, -1.5, 7.0], [3], Device::Cpu)?.to_device(device)?;
    // Round half away from zero, saturating at the type's ends.
    assert_eq!(f.to_dtype(DType::I64)?.to_vec::<i64>()?, [3, -2, 7]);
    assert_eq!(f.to_dtype(DType::U32)?.to_vec::<u32>()?, [3, 0, 7]);
    assert_eq!(Tensor::full(4.0, [2], DType::U32, device)?.to_vec::<u32>()?, [4, 4]);
    assert_eq!(Tensor::zeros([2], DType::I64, device)?.to_vec::<i64>()?, [0, 0]);
    assert!(x.to_string().contains("Tensor[[2, 3], i64"));
    assert!(matches!(ops::add(&x, &x), Err(Error::UnsupportedDType { op: "add", dtype: DType::I64, .. })));
    Ok(())
}

fn unravel(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut ix = vec![0; dims.len()];
    for k in (0..dims.len()).rev() {
        ix[k] = i % dims[k];
        i /= dims[k];
    }
    ix
}

fn ravel(index: &[usize], dims: &[usize]) -> usize {
    index.iter().zip(dims).fold(0, |acc, (&i, &d)| acc * d + i)
}
