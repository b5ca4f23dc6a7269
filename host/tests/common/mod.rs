//! Test bodies shared by the CPU suite (`cpu.rs`) and the GPU suite (`gpu.rs`): each case takes
//! a device, so the same assertions prove both backends.
#![allow(dead_code)]

pub mod activation;
pub mod indexing;
pub mod matmul;
pub mod optim;
pub mod stress;

use opsmith_host::{DType, Device, Error, Result, Tensor, ops};
use proptest::prelude::*;
use rand::{Rng, SeedableRng, rngs::StdRng};

/// The sizes every op is checked at: empty, below, at and above a 16-byte pack and a block, and
/// a large odd size that needs many grid-stride iterations and a tail.
pub const SIZES: [usize; 9] = [0, 1, 3, 4, 5, 1023, 1024, 1025, (1 << 20) + 3];

/// Element offsets for input and output views: 0 keeps 16-byte alignment, the others break it
/// for every dtype.
pub const OFFSETS: [usize; 3] = [0, 1, 3];

/// A value that no op produces from the test inputs, written around output views to catch
/// out-of-range writes. Exactly representable in every dtype.
pub const SENTINEL: f64 = -7.5;

/// The scalars of the `affine` case: exactly representable, not a power of two.
pub const ALPHA: f64 = -1.5;
pub const BETA: f64 = 0.375;

/// The uniform upstream gradient of the `add_mul_backward_uniform` case.
pub const UNIFORM_G: f64 = -1.25;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Add,
    Sub,
    Mul,
    Div,
    /// `x * ALPHA + BETA`.
    Affine,
    FusedMulAdd,
    AddMul,
    AddMulBackward,
    /// `add_mul`'s backward for a gradient of `UNIFORM_G` everywhere.
    AddMulBackwardUniform,
    /// `add_mul`'s backward with `x`'s and `y`'s gradients in two tensors.
    AddMulBackwardSplit,
    /// The same for a gradient of `UNIFORM_G` everywhere.
    AddMulBackwardSplitUniform,
}

impl Op {
    pub const ALL: [Op; 11] = [
        Op::Add,
        Op::Sub,
        Op::Mul,
        Op::Div,
        Op::Affine,
        Op::FusedMulAdd,
        Op::AddMul,
        Op::AddMulBackward,
        Op::AddMulBackwardUniform,
        Op::AddMulBackwardSplit,
        Op::AddMulBackwardSplitUniform,
    ];

    pub fn arity(self) -> (usize, usize) {
        match self {
            Op::Affine => (1, 1),
            Op::Add | Op::Sub | Op::Mul | Op::Div => (2, 1),
            Op::FusedMulAdd | Op::AddMul => (3, 1),
            Op::AddMulBackward => (4, 2),
            Op::AddMulBackwardUniform => (3, 2),
            Op::AddMulBackwardSplit => (4, 3),
            Op::AddMulBackwardSplitUniform => (3, 3),
        }
    }

    /// The exact result in f64 of the op on the (already rounded) inputs.
    pub fn reference(self, x: &[f64]) -> Vec<f64> {
        match self {
            Op::Add => vec![x[0] + x[1]],
            Op::Sub => vec![x[0] - x[1]],
            Op::Mul => vec![x[0] * x[1]],
            Op::Div => vec![x[0] / x[1]],
            Op::Affine => vec![x[0] * ALPHA + BETA],
            Op::FusedMulAdd => vec![x[0] * x[1] + x[2]],
            Op::AddMul => vec![(x[0] + x[1]) * x[2]],
            Op::AddMulBackward => vec![x[0] * x[3], x[0] * (x[1] + x[2])],
            Op::AddMulBackwardUniform => vec![UNIFORM_G * x[2], UNIFORM_G * (x[0] + x[1])],
            Op::AddMulBackwardSplit => vec![x[0] * x[3], x[0] * x[3], x[0] * (x[1] + x[2])],
            Op::AddMulBackwardSplitUniform => vec![UNIFORM_G * x[2], UNIFORM_G * x[2], UNIFORM_G * (x[0] + x[1])],
        }
    }

    /// The largest error allowed for a result whose reference is `r` and whose terms have
    /// magnitude `scale`: the f32 roundings of the arithmetic (2 for add_mul's gw and z, 1
    /// otherwise) plus the final rounding to the storage dtype, plus half its smallest subnormal.
    pub fn tolerance(self, dtype: DType, r: f64, scale: f64) -> f64 {
        let u = DType::F32.unit_roundoff();
        let arith = match (self, dtype) {
            (_, DType::F64) => 4.0 * DType::F64.unit_roundoff(),
            (
                Op::AddMul
                | Op::AddMulBackward
                | Op::AddMulBackwardUniform
                | Op::AddMulBackwardSplit
                | Op::AddMulBackwardSplitUniform,
                _,
            ) => 2.01 * u,
            _ => 1.01 * u,
        };
        arith * scale + store_roundoff(dtype) * r.abs() * 1.01 + store_floor(dtype)
    }

    /// The magnitude of the terms that make up output `k`, which bounds the rounding error
    /// (relative to the result itself it is unbounded when terms cancel).
    pub fn scale(self, k: usize, x: &[f64]) -> f64 {
        match (self, k) {
            (Op::Add | Op::Sub, _) => x[0].abs() + x[1].abs(),
            (Op::Mul, _) => (x[0] * x[1]).abs(),
            (Op::Div, _) => (x[0] / x[1]).abs(),
            (Op::Affine, _) => (x[0] * ALPHA).abs() + BETA.abs(),
            (Op::FusedMulAdd, _) => (x[0] * x[1]).abs() + x[2].abs(),
            (Op::AddMul, _) => (x[0].abs() + x[1].abs()) * x[2].abs(),
            (Op::AddMulBackward, 0) => (x[0] * x[3]).abs(),
            (Op::AddMulBackward, _) => x[0].abs() * (x[1].abs() + x[2].abs()),
            (Op::AddMulBackwardUniform, 0) => (UNIFORM_G * x[2]).abs(),
            (Op::AddMulBackwardUniform, _) => UNIFORM_G.abs() * (x[0].abs() + x[1].abs()),
            (Op::AddMulBackwardSplit, 0 | 1) => (x[0] * x[3]).abs(),
            (Op::AddMulBackwardSplit, _) => x[0].abs() * (x[1].abs() + x[2].abs()),
            (Op::AddMulBackwardSplitUniform, 0 | 1) => (UNIFORM_G * x[2]).abs(),
            (Op::AddMulBackwardSplitUniform, _) => UNIFORM_G.abs() * (x[0].abs() + x[1].abs()),
        }
    }

    pub fn apply(self, ins: &[&Tensor], outs: &[&Tensor]) -> Result<()> {
        match self {
            Op::Add => ops::add_into(ins[0], ins[1], outs[0]),
            Op::Sub => ops::sub_into(ins[0], ins[1], outs[0]),
            Op::Mul => ops::mul_into(ins[0], ins[1], outs[0]),
            Op::Div => ops::div_into(ins[0], ins[1], outs[0]),
            Op::Affine => ops::affine_into(ins[0], ALPHA, BETA, outs[0]),
            Op::FusedMulAdd => ops::fused_mul_add_into(ins[0], ins[1], ins[2], outs[0]),
            Op::AddMul => ops::add_mul_into(ins[0], ins[1], ins[2], outs[0]),
            Op::AddMulBackward => ops::add_mul_backward_into(ins[0], ins[1], ins[2], ins[3], outs[0], outs[1]),
            Op::AddMulBackwardUniform => {
                ops::add_mul_backward_uniform_into(UNIFORM_G, ins[0], ins[1], ins[2], outs[0], outs[1])
            }
            Op::AddMulBackwardSplit => {
                ops::add_mul_backward_split_into(ins[0], ins[1], ins[2], ins[3], outs[0], outs[1], outs[2])
            }
            Op::AddMulBackwardSplitUniform => {
                ops::add_mul_backward_split_uniform_into(UNIFORM_G, ins[0], ins[1], ins[2], outs[0], outs[1], outs[2])
            }
        }
    }

    pub fn apply_new(self, ins: &[&Tensor]) -> Result<Vec<Tensor>> {
        Ok(match self {
            Op::Add => vec![ops::add(ins[0], ins[1])?],
            Op::Sub => vec![ops::sub(ins[0], ins[1])?],
            Op::Mul => vec![ops::mul(ins[0], ins[1])?],
            Op::Div => vec![ops::div(ins[0], ins[1])?],
            Op::Affine => vec![ops::affine(ins[0], ALPHA, BETA)?],
            Op::FusedMulAdd => vec![ops::fused_mul_add(ins[0], ins[1], ins[2])?],
            Op::AddMul => vec![ops::add_mul(ins[0], ins[1], ins[2])?],
            Op::AddMulBackward => {
                let (a, b) = ops::add_mul_backward(ins[0], ins[1], ins[2], ins[3])?;
                vec![a, b]
            }
            Op::AddMulBackwardUniform => {
                let (a, b) = ops::add_mul_backward_uniform(UNIFORM_G, ins[0], ins[1], ins[2])?;
                vec![a, b]
            }
            Op::AddMulBackwardSplit => {
                let (a, b, c) = ops::add_mul_backward_split(ins[0], ins[1], ins[2], ins[3])?;
                vec![a, b, c]
            }
            Op::AddMulBackwardSplitUniform => {
                let (a, b, c) = ops::add_mul_backward_split_uniform(UNIFORM_G, ins[0], ins[1], ins[2])?;
                vec![a, b, c]
            }
        })
    }
}

pub const DTYPES: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::F64];

/// The relative error of rounding an f32 (or f64) result to the storage dtype: 0 where the
/// arithmetic type is the storage type.
pub fn store_roundoff(dtype: DType) -> f64 {
    if dtype == DType::F32 || dtype == DType::F64 { 0.0 } else { dtype.unit_roundoff() }
}

/// The absolute error of rounding to the storage dtype below its normal range: half its
/// smallest subnormal.
pub fn store_floor(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2f64.powi(-25),
        DType::BF16 => 2f64.powi(-134),
        DType::F32 => 2f64.powi(-150),
        DType::F64 => 0.0,
        DType::U32 | DType::I64 => unreachable!("{dtype} is not a float dtype"),
    }
}

/// Random values with both signs and magnitudes from 1/16 to 16, never zero, rounded to `dtype`.
pub fn random_values(rng: &mut StdRng, n: usize, dtype: DType) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let sign = if rng.random_bool(0.5) { 1.0 } else { -1.0 };
            let v = sign * 2f64.powf(rng.random_range(-4.0..4.0));
            round_to(dtype, v)
        })
        .collect()
}

/// Frees a NaN-filled block of `n` elements just before an op allocates its output: on CUDA the
/// device's memory pool hands the same block back, so an element the kernel fails to write
/// reads as NaN rather than as a correct value left by an earlier run. (On the CPU, where every
/// output is a fresh vector, it changes nothing.)
pub fn poison_pool(n: usize, dtype: DType, device: Device) -> Result<()> {
    drop(Tensor::full(f64::NAN, [n.max(1)], dtype, device)?);
    Ok(())
}

pub fn round_to(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F32 => v as f32 as f64,
        DType::F16 => half::f16::from_f64(v).to_f64(),
        DType::BF16 => half::bf16::from_f64(v).to_f64(),
        DType::F64 => v,
        DType::U32 | DType::I64 => unreachable!("{dtype} is not a float dtype"),
    }
}

/// A tensor of `values` (converted to `dtype`) on `device`.
pub fn tensor(values: &[f64], dtype: DType, device: Device) -> Result<Tensor> {
    Tensor::from_f64(values, values.len(), dtype, device)
}

/// A tensor's values as f64.
pub fn values(t: &Tensor) -> Result<Vec<f64>> {
    t.to_vec_f64()
}

/// Every element of [`long_chain`]'s result: x0 = 1.5 * 2, x_{k+1} = 2 x_k + 1.5, so
/// x_20 = 4.5 * 2^20 - 1.5, exact in f32.
pub const CHAIN_RESULT: f64 = 4.5 * 1048576.0 - 1.5;

/// Work long enough that what is queued after it on another stream starts while it still runs:
/// 21 launches over 2^22 f32 elements on the current stream, each reading `a` (all 1.5).
/// Returns `a` and the result (all [`CHAIN_RESULT`]).
pub fn long_chain(device: Device) -> Result<(Tensor, Tensor)> {
    let n = 1 << 22;
    let a = Tensor::full(1.5, [n], DType::F32, device)?;
    let b = Tensor::full(2.0, [n], DType::F32, device)?;
    let mut x = ops::mul(&a, &b)?;
    for _ in 0..20 {
        x = ops::fused_mul_add(&x, &b, &a)?;
    }
    Ok((a, x))
}

/// A view of `n` elements at `offset` into a buffer of `offset + n + 2` elements whose other
/// elements hold [`SENTINEL`]; the view itself holds `fill`.
pub fn padded_view(n: usize, offset: usize, fill: f64, dtype: DType, device: Device) -> Result<(Tensor, Tensor)> {
    let mut data = vec![SENTINEL; offset + n + 2];
    data[offset..offset + n].iter_mut().for_each(|v| *v = fill);
    let whole = tensor(&data, dtype, device)?;
    let view = whole.flat_slice(offset, n)?;
    Ok((whole, view))
}

/// Whether this op and dtype has an implementation on `device`.
pub fn supported(dtype: DType, device: Device) -> bool {
    !(dtype == DType::F64 && device.is_cuda())
}

/// One op, one dtype, one size, one offset: random inputs at `offset`, outputs poisoned with
/// NaN inside a sentinel-padded buffer at `offset`, every result checked against f64, and every
/// element outside the views checked untouched.
pub fn check_op(device: Device, op: Op, dtype: DType, n: usize, offset: usize, seed: u64) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(seed);
    let (n_in, n_out) = op.arity();
    let inputs_f64: Vec<Vec<f64>> = (0..n_in).map(|_| random_values(&mut rng, n, dtype)).collect();
    let mut input_bufs = Vec::new();
    let mut inputs = Vec::new();
    for (k, v) in inputs_f64.iter().enumerate() {
        // Different offsets per operand, so that aligned and unaligned pointers mix.
        let off = (offset * (k + 1)) % 4;
        let mut data = vec![1.0; off];
        data.extend_from_slice(v);
        let whole = tensor(&data, dtype, device)?;
        inputs.push(whole.flat_slice(off, n)?);
        input_bufs.push(whole);
    }
    let mut out_bufs = Vec::new();
    let mut outputs = Vec::new();
    for _ in 0..n_out {
        let (whole, view) = padded_view(n, offset, f64::NAN, dtype, device)?;
        out_bufs.push(whole);
        outputs.push(view);
    }
    let in_refs: Vec<&Tensor> = inputs.iter().collect();
    let out_refs: Vec<&Tensor> = outputs.iter().collect();

    if !supported(dtype, device) {
        let err = op.apply(&in_refs, &out_refs).expect_err("f64 has no CUDA kernels");
        assert!(matches!(err, Error::UnsupportedDType { dtype: DType::F64, .. }), "{err}");
        return Ok(());
    }
    op.apply(&in_refs, &out_refs)?;

    let got: Vec<Vec<f64>> = outputs.iter().map(values).collect::<Result<_>>()?;
    for i in 0..n {
        let x: Vec<f64> = inputs_f64.iter().map(|v| v[i]).collect();
        for (k, r) in op.reference(&x).into_iter().enumerate() {
            let tol = op.tolerance(dtype, r, op.scale(k, &x));
            let g = got[k][i];
            assert!(
                (g - r).abs() <= tol,
                "{op:?} {dtype} on {device}, n={n} offset={offset}: output {k}[{i}] = {g:e}, f64 reference {r:e}, \
                 tolerance {tol:e}, inputs {x:?}"
            );
        }
    }
    for buf in &out_bufs {
        let v = values(buf)?;
        let outside = v[..offset].iter().chain(&v[offset + n..]);
        assert!(
            outside.into_iter().all(|&s| s == SENTINEL),
            "{op:?} {dtype} on {device}, n={n} offset={offset}: wrote outside its output view"
        );
    }
    // Inputs are read-only.
    for (t, v) in inputs.iter().zip(&inputs_f64) {
        assert_eq!(&values(t)?, v, "{op:?} {dtype} on {device}: an input changed");
    }
    Ok(())
}

/// Every dtype × size × offset of one op on `device`.
pub fn op_against_f64(device: Device, op: Op) -> Result<()> {
    let mut seed = 1000 * op as u64;
    for dtype in DTYPES {
        for n in SIZES {
            for offset in OFFSETS {
                seed += 1;
                check_op(device, op, dtype, n, offset, seed)?;
            }
        }
    }
    Ok(())
}

/// The functional forms return what the `_into` forms write.
pub fn functional_matches_into(device: Device) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(7);
    for op in Op::ALL {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let n = 1029;
            let (n_in, n_out) = op.arity();
            let ins: Vec<Tensor> =
                (0..n_in).map(|_| tensor(&random_values(&mut rng, n, dtype), dtype, device)).collect::<Result<_>>()?;
            let in_refs: Vec<&Tensor> = ins.iter().collect();
            let fresh = op.apply_new(&in_refs)?;
            let outs: Vec<Tensor> =
                (0..n_out).map(|_| Tensor::full(f64::NAN, [n], dtype, device)).collect::<Result<_>>()?;
            let out_refs: Vec<&Tensor> = outs.iter().collect();
            op.apply(&in_refs, &out_refs)?;
            for (a, b) in fresh.iter().zip(&outs) {
                assert_eq!(values(a)?, values(b)?, "{op:?} {dtype} on {device}");
                assert_eq!(a.dims(), [n]);
            }
        }
    }
    Ok(())
}

/// An output that is exactly one of the inputs is computed in place.
pub fn in_place_output(device: Device) -> Result<()> {
    for dtype in [DType::F32, DType::BF16] {
        let a = tensor(&[1.0, 2.0, 3.0, 4.0, 5.0], dtype, device)?;
        let b = tensor(&[0.5, 0.25, 2.0, -1.0, 3.0], dtype, device)?;
        let c = tensor(&[1.0, 1.0, 1.0, 1.0, 1.0], dtype, device)?;
        let before = a.version();
        ops::fused_mul_add_into(&a, &b, &c, &a)?;
        assert_eq!(values(&a)?, [1.5, 1.5, 7.0, -3.0, 16.0]);
        assert!(a.version() > before, "an in-place write must bump the version");
    }
    Ok(())
}

/// Views share memory with their tensor; `copy` does not.
pub fn views_share_memory(device: Device) -> Result<()> {
    let t = tensor(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], DType::F32, device)?.reshape([2, 3])?;
    let view = t.flat_slice(2, 3)?;
    let copy = t.copy()?;
    assert!(view.shares_storage(&t));
    assert!(!copy.shares_storage(&t));
    view.fill_(9.0)?;
    assert_eq!(values(&t)?, [1.0, 2.0, 9.0, 9.0, 9.0, 6.0]);
    assert_eq!(values(&copy)?, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(t.dims(), [2, 3]);
    // A fill writes its view's range only, in every dtype (odd offsets included), and bumps the
    // version as any in-place write does.
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64, DType::U32, DType::I64] {
        let t = tensor(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], dtype, device)?;
        let before = t.version();
        t.flat_slice(1, 3)?.fill_(9.0)?;
        assert_eq!(values(&t)?, [1.0, 9.0, 9.0, 9.0, 5.0, 6.0, 7.0], "{dtype}");
        assert!(t.version() > before, "{dtype}: a fill must bump the version");
        t.flat_slice(4, 0)?.fill_(0.0)?;
        assert_eq!(values(&t)?, [1.0, 9.0, 9.0, 9.0, 5.0, 6.0, 7.0], "{dtype}: an empty view's fill");
    }
    Ok(())
}

/// Round trips through `Vec`, `ndarray` and between dtypes.
pub fn conversions(device: Device) -> Result<()> {
    let a = ndarray::array![[1.0f32, -2.5], [3.25, 4.0]];
    let t = Tensor::from_array(&a, device)?;
    assert_eq!(t.dims(), [2, 2]);
    assert_eq!(t.to_array::<f32>()?, a.into_dyn());
    // A transposed (non-standard layout) array is copied into row-major order.
    let at = ndarray::array![[1.0f32, 2.0], [3.0, 4.0]].reversed_axes();
    assert_eq!(Tensor::from_array(&at, device)?.to_vec::<f32>()?, [1.0, 3.0, 2.0, 4.0]);
    let h = t.to_dtype(DType::F16)?;
    assert_eq!(h.dtype(), DType::F16);
    assert_eq!(values(&h)?, [1.0, -2.5, 3.25, 4.0]);
    let back = h.to_device(Device::Cpu)?;
    assert_eq!(back.device(), Device::Cpu);
    assert_eq!(values(&back)?, [1.0, -2.5, 3.25, 4.0]);

    // Every pair of dtypes, with values that round (ties both ways, overflow, subnormals, NaN,
    // -0): on `device` the same values as the host's conversion through f64 (the half crate).
    let tricky = [
        1.0,
        -2.5,
        1.0 + 2f64.powi(-11),
        1.0 + 3.0 * 2f64.powi(-11),
        1.0 + 2f64.powi(-8),
        65520.0,
        -1e6,
        3.0e-6,
        1e-8,
        2f64.powi(-130),
        f64::INFINITY,
        f64::NAN,
        0.1,
        -0.0,
    ];
    for from in DTYPES {
        let src = Tensor::from_f64(&tricky, vec![tricky.len()], from, Device::Cpu)?;
        for to in DTYPES {
            let want = src.to_dtype(to)?.to_vec_f64()?;
            let converted = src.to_device(device)?.to_dtype(to)?;
            assert_eq!((converted.dtype(), converted.device()), (to, device));
            let got = converted.to_vec_f64()?;
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                let same = (g.is_nan() && w.is_nan()) || (g == w && g.is_sign_negative() == w.is_sign_negative());
                assert!(same, "{from} -> {to} on {device}: element {k} ({}): {g}, the host gives {w}", tricky[k]);
            }
        }
    }
    Ok(())
}

/// Operand checks return typed errors that name the op and the offending values.
pub fn operand_errors(device: Device) -> Result<()> {
    let a = tensor(&[1.0, 2.0, 3.0], DType::F32, device)?;
    let b4 = tensor(&[1.0, 2.0, 3.0, 4.0], DType::F32, device)?;
    let h = tensor(&[1.0, 2.0, 3.0], DType::F16, device)?;
    match ops::add(&a, &b4) {
        Err(Error::ShapeMismatch { op: "add", lhs, rhs }) => assert_eq!((lhs, rhs), (vec![3], vec![4])),
        other => panic!("expected a shape mismatch, got {other:?}"),
    }
    match ops::fused_mul_add(&a, &a, &h) {
        Err(Error::DTypeMismatch { op: "fused_mul_add", lhs: DType::F32, rhs: DType::F16 }) => {}
        other => panic!("expected a dtype mismatch, got {other:?}"),
    }
    let out = Tensor::zeros([3], DType::F16, device)?;
    assert!(matches!(ops::add_into(&a, &a, &out), Err(Error::DTypeMismatch { op: "add", .. })));
    // Partial overlap between an output and an input.
    let buf = tensor(&[1.0, 2.0, 3.0, 4.0], DType::F32, device)?;
    let (lo, hi) = (buf.flat_slice(0, 3)?, buf.flat_slice(1, 3)?);
    assert!(matches!(ops::add_into(&lo, &lo, &hi), Err(Error::Overlap { op: "add", output: 0 })));
    // Two outputs that overlap.
    let g = tensor(&[1.0, 2.0, 3.0], DType::F32, device)?;
    let outs = Tensor::zeros([4], DType::F32, device)?;
    let (o1, o2) = (outs.flat_slice(0, 3)?, outs.flat_slice(1, 3)?);
    assert!(matches!(
        ops::add_mul_backward_into(&g, &g, &g, &g, &o1, &o2),
        Err(Error::Overlap { op: "add_mul_backward", output: 1 })
    ));
    // Inputs untouched by failed calls.
    assert_eq!(values(&a)?, [1.0, 2.0, 3.0]);
    assert_eq!(values(&buf)?, [1.0, 2.0, 3.0, 4.0]);
    // Constructors and views.
    assert!(matches!(
        Tensor::from_vec(vec![1.0f32; 5], [2, 3], device),
        Err(Error::ElementCount { expected: 6, actual: 5, .. })
    ));
    assert!(matches!(a.flat_slice(2, 2), Err(Error::OutOfRange { start: 2, end: 4, len: 3, .. })));
    assert!(matches!(a.reshape([2, 2]), Err(Error::ElementCount { .. })));
    assert!(matches!(a.to_vec::<f64>(), Err(Error::ElementType { requested: DType::F64, actual: DType::F32, .. })));
    assert!(matches!(Tensor::zeros([usize::MAX, 2], DType::F32, device), Err(Error::TooLarge { .. })));
    Ok(())
}

/// `sum`, `mean`, `expand_scalar`, `add_row` and `sum_rows` against f64, for every dtype.
pub fn reductions_against_f64(device: Device) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(31);
    for dtype in DTYPES {
        if !supported(dtype, device) {
            let t = tensor(&[1.0, 2.0], dtype, device)?;
            assert!(matches!(ops::sum(&t), Err(Error::UnsupportedDType { op: "sum", .. })));
            continue;
        }
        let u = dtype.unit_roundoff().max(DType::F32.unit_roundoff());
        for n in [1usize, 5, 1000, 33 * 1024 + 7, (1 << 20) + 3] {
            let v = random_values(&mut rng, n, dtype);
            let t = tensor(&v, dtype, device)?;
            let exact: f64 = v.iter().sum();
            let abs_sum: f64 = v.iter().map(|x| x.abs()).sum();
            // f32 accumulation error grows at most linearly in the terms; the result is then
            // rounded once to the dtype.
            let tol = 2.0 * DType::F32.unit_roundoff() * abs_sum * (n as f64).log2().max(1.0) + u * exact.abs() * 1.01;
            let s = values(&ops::sum(&t)?)?;
            assert!((s[0] - exact).abs() <= tol, "sum {dtype} n={n} on {device}: {} vs {exact} (tol {tol:e})", s[0]);
            let m = values(&ops::mean(&t)?)?;
            let mean_tol = tol / n as f64 + u * (exact / n as f64).abs();
            assert!((m[0] - exact / n as f64).abs() <= mean_tol, "mean {dtype} n={n} on {device}");
        }
        // expand_scalar: the backward of sum/mean.
        let g = tensor(&[2.5], dtype, device)?;
        let e = values(&ops::expand_scalar(&g, [3, 5], 0.25)?)?;
        assert_eq!(e, vec![0.625; 15], "expand_scalar {dtype} on {device}");
        // add_row and sum_rows on matrices with odd column counts. On CUDA, sum_rows takes a
        // block per column for the first two (few columns, a tail of rows past the last batch
        // of loads) and a block per tile of 32 columns for the third (over 2^20 elements).
        for (rows, cols) in [(37, 133), (1029, 2), (300, 4099)] {
            let x = random_values(&mut rng, rows * cols, dtype);
            let b = random_values(&mut rng, cols, dtype);
            let xt = tensor(&x, dtype, device)?.reshape([rows, cols])?;
            let bt = tensor(&b, dtype, device)?;
            let y = values(&ops::add_row(&xt, &bt)?)?;
            for i in 0..rows * cols {
                let r = x[i] + b[i % cols];
                let tol = Op::Add.tolerance(dtype, r, x[i].abs() + b[i % cols].abs());
                assert!((y[i] - r).abs() <= tol, "add_row {dtype} on {device} at {i}: {} vs {r}", y[i]);
            }
            let sr = values(&ops::sum_rows(&xt)?)?;
            for c in 0..cols {
                let exact: f64 = (0..rows).map(|r| x[r * cols + c]).sum();
                let abs: f64 = (0..rows).map(|r| x[r * cols + c].abs()).sum();
                let tol = rows as f64 * DType::F32.unit_roundoff() * abs + u * exact.abs() * 1.01;
                assert!(
                    (sr[c] - exact).abs() <= tol,
                    "sum_rows {dtype} [{rows}, {cols}] on {device} col {c}: {} vs {exact}",
                    sr[c]
                );
            }
        }
        let (rows, cols) = (37, 133);
        let b = random_values(&mut rng, cols, dtype);
        let xt = tensor(&random_values(&mut rng, rows * cols, dtype), dtype, device)?.reshape([rows, cols])?;
        let bt = tensor(&b, dtype, device)?;
        // Shape errors.
        assert!(matches!(
            ops::add_row(&xt, &tensor(&b[..cols - 1], dtype, device)?),
            Err(Error::ShapeMismatch { op: "add_row", .. })
        ));
        assert!(matches!(ops::sum_rows(&bt), Err(Error::InvalidArgument { op: "sum_rows", .. })));
        assert!(matches!(ops::expand_scalar(&bt, [2], 1.0), Err(Error::ShapeMismatch { op: "expand_scalar", .. })));
        assert!(matches!(ops::mean(&tensor(&[], dtype, device)?), Err(Error::InvalidArgument { op: "mean", .. })));
    }
    Ok(())
}

/// Lists every shared case, for the suites to run.
#[macro_export]
macro_rules! shared_cases {
    ($device:expr) => {
        #[test]
        fn add_against_f64() -> opsmith_host::Result<()> {
            common::op_against_f64($device, common::Op::Add)
        }
        #[test]
        fn mul_against_f64() -> opsmith_host::Result<()> {
            common::op_against_f64($device, common::Op::Mul)
        }
        #[test]
        fn fused_mul_add_against_f64() -> opsmith_host::Result<()> {
            common::op_against_f64($device, common::Op::FusedMulAdd)
        }
        #[test]
        fn add_mul_against_f64() -> opsmith_host::Result<()> {
            common::op_against_f64($device, common::Op::AddMul)
        }
        #[test]
        fn add_mul_backward_against_f64() -> opsmith_host::Result<()> {
            common::op_against_f64($device, common::Op::AddMulBackward)
        }
        #[test]
        fn add_mul_backward_uniform_against_f64() -> opsmith_host::Result<()> {
            common::op_against_f64($device, common::Op::AddMulBackwardUniform)
        }
        #[test]
        fn add_mul_backward_split_against_f64() -> opsmith_host::Result<()> {
            common::op_against_f64($device, common::Op::AddMulBackwardSplit)
        }
        #[test]
        fn add_mul_backward_split_uniform_against_f64() -> opsmith_host::Result<()> {
            common::op_against_f64($device, common::Op::AddMulBackwardSplitUniform)
        }
        #[test]
        fn sub_against_f64() -> opsmith_host::Result<()> {
            common::op_against_f64($device, common::Op::Sub)
        }
        #[test]
        fn layout_ops_against_index_math() -> opsmith_host::Result<()> {
            common::layout_ops_against_index_math($device)
        }
        #[test]
        fn dim_reductions_against_f64() -> opsmith_host::Result<()> {
            common::indexing::dim_reductions_against_f64($device)
        }
        #[test]
        fn index_ops_against_index_math() -> opsmith_host::Result<()> {
            common::indexing::index_ops_against_index_math($device)
        }
        #[test]
        fn index_backwards_against_f64() -> opsmith_host::Result<()> {
            common::indexing::index_backwards_against_f64($device)
        }
        #[test]
        fn broadcasting_against_index_math() -> opsmith_host::Result<()> {
            common::indexing::broadcasting_against_index_math($device)
        }
        #[test]
        fn random_streams() -> opsmith_host::Result<()> {
            common::indexing::random_streams($device)
        }
        #[test]
        fn integer_tensors() -> opsmith_host::Result<()> {
            common::indexing::integer_tensors($device)
        }
        #[test]
        fn div_against_f64() -> opsmith_host::Result<()> {
            common::op_against_f64($device, common::Op::Div)
        }
        #[test]
        fn affine_against_f64() -> opsmith_host::Result<()> {
            common::op_against_f64($device, common::Op::Affine)
        }
        #[test]
        fn reductions_against_f64() -> opsmith_host::Result<()> {
            common::reductions_against_f64($device)
        }
        #[test]
        fn functional_matches_into() -> opsmith_host::Result<()> {
            common::functional_matches_into($device)
        }
        #[test]
        fn in_place_output() -> opsmith_host::Result<()> {
            common::in_place_output($device)
        }
        #[test]
        fn views_share_memory() -> opsmith_host::Result<()> {
            common::views_share_memory($device)
        }
        #[test]
        fn conversions() -> opsmith_host::Result<()> {
            common::conversions($device)
        }
        #[test]
        fn operand_errors() -> opsmith_host::Result<()> {
            common::operand_errors($device)
        }
    };
}

/// What an op must produce for inputs that may be ±0, subnormal, ±inf or NaN: the f64
/// reference rounded to the dtype; NaN where IEEE 754 says NaN, the same infinity where it
/// says infinity, else within [`Op::tolerance`]. Overflow in the f32 arithmetic is allowed to
/// give an infinity of the reference's sign when the reference is beyond the dtype's range.
pub fn check_special(op: Op, dtype: DType, inputs: &[Vec<f64>], outputs: &[Vec<f64>], context: &str) {
    let max = match dtype {
        DType::F32 => f32::MAX as f64,
        DType::F16 => 65504.0,
        DType::BF16 => half::bf16::MAX.to_f64(),
        DType::F64 => f64::MAX,
        DType::U32 | DType::I64 => unreachable!("{dtype} is not a float dtype"),
    };
    for i in 0..inputs.first().map_or(0, Vec::len) {
        let x: Vec<f64> = inputs.iter().map(|v| v[i]).collect();
        for (k, r) in op.reference(&x).into_iter().enumerate() {
            let g = outputs[k][i];
            let ok = if r.is_nan() {
                g.is_nan()
            } else if r.is_infinite() || r.abs() > max {
                g == r
                    || (g.is_infinite() && g.signum() == r.signum())
                    || (g.abs() >= max * 0.99 && g.signum() == r.signum())
            } else if g.is_nan() {
                // f32 intermediates can overflow where the exact result is finite: inf - inf.
                x.iter().any(|v| v.abs() > 1e30)
            } else {
                (g - r).abs() <= op.tolerance(dtype, r, op.scale(k, &x))
            };
            assert!(ok, "{context}: {op:?} {dtype} output {k}[{i}] = {g:e}, f64 reference {r:e}, inputs {x:?}");
        }
    }
}

/// A value for property tests: mostly ordinary numbers, with ±0, subnormals, ±inf and NaN mixed in.
pub fn special_value(dtype: DType, kind: u8, magnitude: f64, negative: bool) -> f64 {
    let tiny = match dtype {
        DType::F16 => 2f64.powi(-20),
        DType::BF16 => 2f64.powi(-130),
        DType::F32 => 2f64.powi(-140),
        DType::F64 => 2f64.powi(-1070),
        DType::U32 | DType::I64 => unreachable!("{dtype} is not a float dtype"),
    };
    let v = match kind % 20 {
        0 => 0.0,
        1 => tiny * (1.0 + magnitude.fract()),
        2 => f64::INFINITY,
        3 => f64::NAN,
        _ => magnitude,
    };
    round_to(dtype, if negative { -v } else { v })
}

pub fn dtype_strategy() -> impl Strategy<Value = DType> {
    prop_oneof![Just(DType::F32), Just(DType::F16), Just(DType::BF16), Just(DType::F64)]
}

/// Lengths: anything up to 600, and primes around pack and block boundaries.
pub fn length_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![0usize..600, prop::sample::select(vec![0usize, 1, 2, 3, 5, 7, 13, 31, 127, 257, 509, 1021, 4099])]
}

/// One op on random data at random offsets on `device`, checked against f64 with IEEE special
/// values; returns the outputs (as f64) for cross-device comparison.
pub fn run_case(
    device: Device,
    op: Op,
    dtype: DType,
    n: usize,
    offset: usize,
    seeds: &[(u8, f64, bool)],
) -> Vec<Vec<f64>> {
    let (n_in, n_out) = op.arity();
    let inputs: Vec<Vec<f64>> = (0..n_in)
        .map(|k| {
            (0..n)
                .map(|i| {
                    let (kind, mag, neg) = seeds[(i * n_in + k) % seeds.len()];
                    special_value(
                        dtype,
                        kind.wrapping_add((i * 7 + k) as u8),
                        mag * (1.0 + (i % 13) as f64 * 0.37),
                        neg ^ (i % 3 == 0),
                    )
                })
                .collect()
        })
        .collect();
    let views: Vec<Tensor> = inputs
        .iter()
        .map(|v| {
            let mut data = vec![1.0; offset];
            data.extend_from_slice(v);
            tensor(&data, dtype, device).and_then(|t| t.flat_slice(offset, n)).expect("input view")
        })
        .collect();
    let outs: Vec<Tensor> = (0..n_out).map(|_| Tensor::full(-7.5, [n], dtype, device).expect("output")).collect();
    let (ins, outs_ref): (Vec<&Tensor>, Vec<&Tensor>) = (views.iter().collect(), outs.iter().collect());
    op.apply(&ins, &outs_ref).expect("op");
    let got: Vec<Vec<f64>> = outs.iter().map(|t| values(t).expect("read back")).collect();
    check_special(op, dtype, &inputs, &got, &format!("{device} n={n} offset={offset}"));
    for (t, v) in views.iter().zip(&inputs) {
        let after = values(t).expect("read back");
        assert!(
            after.iter().zip(v).all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())),
            "an input changed"
        );
    }
    got
}

pub fn seeds_strategy() -> impl Strategy<Value = Vec<(u8, f64, bool)>> {
    prop::collection::vec((any::<u8>(), 2f64.powi(-8)..2f64.powi(8), any::<bool>()), 1..32)
}

/// The row-major multi-index of flat index `i` in `dims`.
fn unravel(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut index = vec![0; dims.len()];
    for k in (0..dims.len()).rev() {
        index[k] = i % dims[k];
        i /= dims[k];
    }
    index
}

/// The flat index of a multi-index in `dims`.
fn ravel(index: &[usize], dims: &[usize]) -> usize {
    index.iter().zip(dims).fold(0, |acc, (i, d)| acc * d + i)
}

/// `narrow`, `transpose`, `permute`, `cat` and `stack` on `device`, in every dtype, against the
/// same moves done with multi-indices on the host; outputs must match bit for bit (they are
/// copies). Distinct values everywhere, so a misplaced element shows.
pub fn layout_ops_against_index_math(device: Device) -> Result<()> {
    let dims = [3usize, 4, 5];
    let n: usize = dims.iter().product();
    let values: Vec<f64> = (0..n).map(|i| (i as f64) * 0.5 - 7.0).collect();
    let other_dims = [3usize, 2, 5];
    let other: Vec<f64> = (0..30).map(|i| 100.0 + i as f64).collect();
    for dtype in DTYPES {
        let x = Tensor::from_f64(&values, dims.to_vec(), dtype, Device::Cpu)?.to_device(device)?;
        let y = Tensor::from_f64(&other, other_dims.to_vec(), dtype, Device::Cpu)?.to_device(device)?;
        let check = |what: &str, got: Tensor, want_dims: &[usize], want: Vec<f64>| -> Result<()> {
            assert_eq!(got.dims(), want_dims, "{what} {dtype}: dims");
            assert_eq!(got.device(), device, "{what} {dtype}: device");
            assert_eq!(got.to_vec_f64()?, want, "{what} {dtype}");
            Ok(())
        };
        // narrow(1, 1, 2)
        let want_dims = [3, 2, 5];
        let want = (0..30)
            .map(|i| {
                let mut ix = unravel(i, &want_dims);
                ix[1] += 1;
                values[ravel(&ix, &dims)]
            })
            .collect();
        check("narrow", x.narrow(1, 1, 2)?, &want_dims, want)?;
        // permute([2, 0, 1]): out[a, b, c] = x[b, c, a]
        let want_dims = [5, 3, 4];
        let want = (0..n)
            .map(|i| {
                let ix = unravel(i, &want_dims);
                values[ravel(&[ix[1], ix[2], ix[0]], &dims)]
            })
            .collect();
        check("permute", x.permute(&[2, 0, 1])?, &want_dims, want)?;
        // transpose(0, 2)
        let want_dims = [5, 4, 3];
        let want = (0..n)
            .map(|i| {
                let ix = unravel(i, &want_dims);
                values[ravel(&[ix[2], ix[1], ix[0]], &dims)]
            })
            .collect();
        check("transpose", x.transpose(0, 2)?, &want_dims, want)?;
        // cat([x, y, x], 1)
        let want_dims = [3, 10, 5];
        let want = (0..150)
            .map(|i| {
                let ix = unravel(i, &want_dims);
                match ix[1] {
                    j if j < 4 => values[ravel(&[ix[0], j, ix[2]], &dims)],
                    j if j < 6 => other[ravel(&[ix[0], j - 4, ix[2]], &other_dims)],
                    j => values[ravel(&[ix[0], j - 6, ix[2]], &dims)],
                }
            })
            .collect();
        check("cat", Tensor::cat(&[&x, &y, &x], 1)?, &want_dims, want)?;
        // stack([x, x], 3): out[a, b, c, s] = x[a, b, c]
        let want_dims = [3, 4, 5, 2];
        let want = (0..2 * n)
            .map(|i| {
                let ix = unravel(i, &want_dims);
                values[ravel(&ix[..3], &dims)]
            })
            .collect();
        check("stack", Tensor::stack(&[&x, &x], 3)?, &want_dims, want)?;
        // Errors name the op.
        assert!(matches!(x.narrow(3, 0, 1), Err(Error::InvalidArgument { op: "Tensor::narrow", .. })));
        assert!(matches!(
            Tensor::cat(&[&x, &x.narrow(0, 0, 1)?], 1),
            Err(Error::ShapeMismatch { op: "Tensor::cat", .. })
        ));
    }
    Ok(())
}
