//! The fused op against independent references: finite differences and PyTorch's tanh-form
//! GeLU written out in f64, on the CPU (always) and, when a device is present, on CUDA in f32,
//! f16 and bf16, on the vector path (whole 16-byte packs per row) and the scalar one (odd
//! widths, unaligned views). This test binary is part of the GPU bundle.
use opsmith::autograd::{CustomOp, Error, GradcheckOptions, Var, compare_devices, custom, gradcheck};
use opsmith::{DType, Device, Tensor};
use opsmith_example_bias_gelu::BiasGeluResidual;
use std::sync::Arc;

fn op() -> Arc<dyn CustomOp> {
    Arc::new(BiasGeluResidual)
}

/// Values in about ±4, every one different.
fn values(n: usize, phase: f64) -> Vec<f64> {
    (0..n).map(|i| 4.0 * ((i as f64 + phase) * 0.618).sin()).collect()
}

fn inputs(rows: usize, cols: usize, dtype: DType) -> [Tensor; 3] {
    let t = |v: Vec<f64>, shape: &[usize]| Tensor::from_vec(v, shape, Device::Cpu).unwrap().to_dtype(dtype).unwrap();
    [
        t(values(rows * cols, 0.0), &[rows, cols]),
        t(values(cols, 0.3), &[cols]),
        t(values(rows * cols, 0.7), &[rows, cols]),
    ]
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_device(Device::Cpu).unwrap().to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

/// PyTorch's `gelu(approximate="tanh")`, as written in its documentation.
fn gelu_tanh(z: f64) -> f64 {
    0.5 * z * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (z + 0.044715 * z.powi(3))).tanh())
}

/// `(y, dx, db, db_scale)` in f64 from the inputs' values: the forward, the backward by central
/// differences of `gelu_tanh` (step 1e-6, error about 1e-10), and per column `Σ |dx|`, the
/// scale of `db`'s rounding errors (it sums `dx` as stored, each rounded to the dtype).
fn reference(x: &[f64], b: &[f64], r: &[f64], g: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let cols = b.len();
    let z = |i: usize| x[i] + b[i % cols];
    let y = (0..x.len()).map(|i| gelu_tanh(z(i)) + r[i]).collect();
    let dx: Vec<f64> = (0..x.len()).map(|i| g[i] * (gelu_tanh(z(i) + 1e-6) - gelu_tanh(z(i) - 1e-6)) / 2e-6).collect();
    let (mut db, mut db_scale) = (vec![0.0; cols], vec![0.0; cols]);
    dx.iter().enumerate().for_each(|(i, d)| {
        db[i % cols] += d;
        db_scale[i % cols] += d.abs();
    });
    (y, dx, db, db_scale)
}

/// Runs the op's forward and backward on `device` and returns the largest error of each of
/// `y`, `dx`, `db` against [`reference`], relative to `1 + |reference|` (`1 + Σ |dx|` for
/// `db`). Also checks that `dr` is `g`.
fn errors(x: &Tensor, b: &Tensor, r: &Tensor, device: Device) -> [f64; 3] {
    let g = Tensor::from_vec(values(x.elem_count(), 1.9), x.dims(), Device::Cpu).unwrap().to_dtype(x.dtype()).unwrap();
    let on = |t: &Tensor| t.to_device(device).unwrap();
    let (xd, bd, rd, gd) = (on(x), on(b), on(r), on(&g));
    let op = op();
    let (y, grads) = if device.is_cuda() {
        let y = op.cuda_forward(&[&xd, &bd, &rd]).unwrap();
        (y.clone(), op.cuda_backward(&[&xd, &bd, &rd], &y, &gd).unwrap())
    } else {
        let y = op.cpu_forward(&[&xd, &bd, &rd]).unwrap();
        (y.clone(), op.cpu_backward(&[&xd, &bd, &rd], &y, &gd).unwrap())
    };
    let [dx, db, dr] = [0, 1, 2].map(|k| grads[k].clone().expect("every input gets a gradient"));
    assert_eq!((y.dims(), dx.dims(), db.dims()), (x.dims(), x.dims(), b.dims()));
    assert_eq!((y.dtype(), dx.dtype(), db.dtype()), (x.dtype(), x.dtype(), b.dtype()));
    assert_eq!(f64s(&dr), f64s(&g), "r's gradient is g");
    let (ry, rdx, rdb, db_scale) = reference(&f64s(x), &f64s(b), &f64s(r), &f64s(&g));
    let worst = |got: &Tensor, want: &[f64], scale: &[f64]| {
        let got = f64s(got);
        (0..want.len()).map(|i| (got[i] - want[i]).abs() / (1.0 + scale[i])).fold(0.0, f64::max)
    };
    let (ry_abs, rdx_abs): (Vec<f64>, Vec<f64>) =
        (ry.iter().map(|v| v.abs()).collect(), rdx.iter().map(|v| v.abs()).collect());
    [worst(&y, &ry, &ry_abs), worst(&dx, &rdx, &rdx_abs), worst(&db, &rdb, &db_scale)]
}

#[test]
fn cpu_matches_the_reference_and_finite_differences() {
    for (rows, cols) in [(1, 1), (3, 5), (7, 16)] {
        let [x, b, r] = inputs(rows, cols, DType::F64);
        let [y, dx, db] = errors(&x, &b, &r, Device::Cpu);
        assert!(y < 1e-12 && dx < 1e-6 && db < 1e-6, "{rows}x{cols}: y {y:e}, dx {dx:e}, db {db:e}");
        let f = |v: &[Var]| custom(&op(), &[&v[0], &v[1], &v[2]]);
        gradcheck(f, &inputs(rows, cols, DType::F64), &GradcheckOptions::for_dtype(DType::F64))
            .unwrap_or_else(|e| panic!("{rows}x{cols}: {e}"));
    }
}

#[test]
fn mismatched_shapes_are_typed_errors_naming_the_op() {
    let [x, b, r] = inputs(3, 4, DType::F32);
    let op = op();
    let long_b = Tensor::zeros([5], DType::F32, Device::Cpu).unwrap();
    let transposed_r = r.reshape([4, 3]).unwrap();
    let flat_x = x.reshape([12]).unwrap();
    for bad in [[&x, &long_b, &r], [&x, &b, &transposed_r], [&flat_x, &b, &r]] {
        let err = op.cpu_forward(&bad).unwrap_err();
        assert!(matches!(&err, Error::Host(_)) && err.to_string().contains("bias_gelu_residual"), "{err}");
    }
}

#[test]
fn cuda_matches_the_reference_in_every_dtype() {
    let device = Device::cuda_if_available();
    if !device.is_cuda() {
        eprintln!("no CUDA device: skipping (it runs in the GPU bundle)");
        return;
    }
    // Whole packs per row (vector path), odd widths (scalar path), many rows (several bands of
    // rows in the backward, the last one short), and no rows at all (db is zeros).
    for (rows, cols) in [(1, 1), (3, 5), (64, 256), (33, 1000), (50, 16), (1024, 24), (0, 8)] {
        for (dtype, tol) in [(DType::F32, 2e-6), (DType::F16, 2e-3), (DType::BF16, 1e-2)] {
            let [x, b, r] = inputs(rows, cols, dtype);
            let [y, dx, db] = errors(&x, &b, &r, device);
            assert!(y < tol && dx < tol && db < tol, "{dtype} {rows}x{cols}: y {y:e}, dx {dx:e}, db {db:e}");
        }
    }
}

#[test]
fn cuda_unaligned_views_take_the_scalar_path() {
    let device = Device::cuda_if_available();
    if !device.is_cuda() {
        return;
    }
    let [x, b, r] = inputs(16, 64, DType::F32);
    // x at an offset of one element: no pointer of it is 16-byte aligned any more.
    let x_odd =
        Tensor::from_vec(f64s(&x).into_iter().map(|v| v as f32).collect::<Vec<_>>(), [1024], Device::Cpu).unwrap();
    let padded = Tensor::from_vec([vec![7.0f32], x_odd.to_vec::<f32>().unwrap()].concat(), [1025], device).unwrap();
    let view = padded.flat_slice(1, 1024).unwrap().reshape([16, 64]).unwrap();
    let op = op();
    let (bd, rd) = (b.to_device(device).unwrap(), r.to_device(device).unwrap());
    let unaligned = f64s(&op.cuda_forward(&[&view, &bd, &rd]).unwrap());
    let aligned = f64s(&op.cuda_forward(&[&x.to_device(device).unwrap(), &bd, &rd]).unwrap());
    assert_eq!(unaligned, aligned);
}

#[test]
fn cuda_gradcheck_and_cpu_agreement() {
    let device = Device::cuda_if_available();
    if !device.is_cuda() {
        return;
    }
    let op = op();
    let f = |v: &[Var]| custom(&op, &[&v[0], &v[1], &v[2]]);
    let small: Vec<Tensor> = inputs(3, 8, DType::F32).iter().map(|t| t.to_device(device).unwrap()).collect();
    gradcheck(f, &small, &GradcheckOptions::for_dtype(DType::F32)).unwrap();
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        compare_devices(f, &inputs(40, 96, dtype), device, &GradcheckOptions::for_dtype(dtype)).unwrap();
    }
    // A dtype with no kernel is a typed error, not a launch.
    let x64: Vec<Tensor> = inputs(2, 4, DType::F64).iter().map(|t| t.to_device(device).unwrap()).collect();
    let err = op.cuda_forward(&[&x64[0], &x64[1], &x64[2]]).unwrap_err();
    assert!(err.to_string().contains("bias_gelu_residual") && err.to_string().contains("f64"), "{err}");
}
