//! The GPU suite of attention (`--features gpu-tests`; needs a CUDA device): the shared cases of
//! `attention_cases` on `Device::Cuda(0)` against f64 (f32, f16 and bf16; CUDA has no f64), over
//! NaN-poisoned output memory, and the CUDA results against the CPU's on the same inputs.
mod attention_cases;

use opsmith_host::Device;

const GPU: Device = Device::Cuda(0);

attention_cases!(GPU);

#[test]
fn cuda_matches_cpu() -> opsmith_host::Result<()> {
    attention_cases::devices_agree(GPU, Device::Cpu)
}

// ---------------------------------------------------------------------------------------------
// The fused kernel (the attention family, sm_80 and newer): f16 and bf16, head_dim 64 and 128,
// no mask. The shared cases above reach it too (their unmasked f16/bf16 cases at head_dim 64 and
// 128); these add lengths around and across its 64-row tiles, a large and a negative scale, and
// check that the calls do take it.

use attention_cases::{Shape, Tolerance, Worst, check_case, reference, uniform};
use opsmith_host::{DType, Tensor, ops};
use rand::{SeedableRng, rngs::StdRng};

/// The fused path serves f16/bf16 at head_dim 64 and 128 without a mask on this GPU, and
/// nothing else.
#[test]
fn fused_path_serves_exactly_its_calls() -> opsmith_host::Result<()> {
    let t = |dims: [usize; 4], dtype| Tensor::zeros(dims, dtype, GPU);
    for dtype in [DType::F16, DType::BF16] {
        for d in [64, 128] {
            let (q, k) = (t([2, 3, 65, d], dtype)?, t([2, 3, 17, d], dtype)?);
            for causal in [false, true] {
                assert!(ops::attention_is_fused(&q, &k, &k, causal, None), "{dtype} d{d}");
            }
            let mask = Tensor::zeros([17], dtype, GPU)?;
            assert!(!ops::attention_is_fused(&q, &k, &k, false, Some(&mask)), "{dtype} d{d} with a mask");
            // A view at an offset of one element is not 16-byte aligned.
            let n = q.elem_count();
            let flat = t([1, 1, 1, n + 1], dtype)?.reshape([n + 1])?;
            let shifted = flat.flat_slice(1, n)?.reshape([2, 3, 65, d])?;
            assert!(!ops::attention_is_fused(&shifted, &k, &k, false, None), "{dtype} d{d} unaligned");
        }
        let (q, k) = (t([1, 1, 8, 32], dtype)?, t([1, 1, 8, 32], dtype)?);
        assert!(!ops::attention_is_fused(&q, &k, &k, false, None), "{dtype} d32");
        let v96 = t([1, 1, 8, 96], dtype)?;
        let (q, k) = (t([1, 1, 8, 64], dtype)?, t([1, 1, 8, 64], dtype)?);
        assert!(!ops::attention_is_fused(&q, &k, &v96, false, None), "{dtype} head_dim_v 96");
    }
    let q = t([1, 1, 8, 64], DType::F32)?;
    assert!(!ops::attention_is_fused(&q, &q, &q, false, None), "f32");
    Ok(())
}

/// Lengths below, at and across the kernel's 64-query and 64-key tiles (one, two and more), `seq_q` above and below
/// `seq_k`, causal or not: out, lse and (composed) weights against f64, over poisoned memory.
#[test]
fn fused_against_f64_across_tiles() -> opsmith_host::Result<()> {
    // (batch, heads, seq_q, seq_k)
    let shapes = [
        (1, 1, 1, 1),
        (2, 3, 63, 63),
        (1, 2, 64, 64),
        (2, 1, 65, 65),
        (1, 2, 127, 200),
        (1, 2, 128, 128),
        (2, 1, 129, 129),
        (1, 2, 200, 127),
        (1, 1, 300, 520),
    ];
    let mut seed = 1000;
    for dtype in [DType::F16, DType::BF16] {
        let mut worst = Worst::default();
        for d in [64, 128] {
            for &(b, h, sq, sk) in &shapes {
                for causal in [false, true] {
                    seed += 1;
                    let s = Shape::new(b, h, sq, sk, d);
                    let (q, k) = (Tensor::zeros(s.q(), dtype, GPU)?, Tensor::zeros(s.k(), dtype, GPU)?);
                    assert!(ops::attention_is_fused(&q, &k, &k, causal, None));
                    check_case(GPU, dtype, s, causal, attention_cases::MaskKind::None, seed, &mut worst)?;
                }
            }
        }
        eprintln!(
            "fused {dtype}: max |error| vs f64: out {:.3e} ({:.2} of tolerance), lse {:.3e} ({:.2})",
            worst.out_abs, worst.out_ratio, worst.lse_abs, worst.lse_ratio
        );
        assert!(worst.out_abs > 0.0, "{dtype}: no rounding error at all is suspicious");
    }
    Ok(())
}

/// A causal call with enough heads for the 128-query forward (the small causal grids above take
/// the 64-query one): at least four waves of two resident blocks a multiprocessor.
#[test]
fn fused_causal_on_a_large_grid() -> opsmith_host::Result<()> {
    let sm_count = opsmith_host::cuda::CudaDevice::get(0)?.sm_count() as usize;
    // Two 128-query blocks a head (seq 130 also crosses the 64-key tiles).
    let heads = 4 * sm_count + 3;
    let mut worst = Worst::default();
    for (d, seed) in [(64, 7001), (128, 7002)] {
        let s = Shape::new(1, heads, 130, 130, d);
        check_case(GPU, DType::BF16, s, true, attention_cases::MaskKind::None, seed, &mut worst)?;
    }
    assert!(worst.out_abs > 0.0, "no rounding error at all is suspicious");
    Ok(())
}

/// Scales that make the online softmax work: a large one (logits up to about ±500, so each new
/// key tile raises the running maximum by far and rescales the output) and a negative one.
#[test]
fn fused_online_softmax_rescales() -> opsmith_host::Result<()> {
    for dtype in [DType::F16, DType::BF16] {
        for (d, scale) in [(64, 1.0), (128, 1.0), (64, -0.3), (128, -0.05)] {
            for causal in [false, true] {
                let s = Shape::new(1, 2, 130, 300, d);
                let mut rng = StdRng::seed_from_u64(d as u64 + causal as u64);
                let q = uniform(&mut rng, s.q().iter().product(), dtype);
                let mut k = uniform(&mut rng, s.k().iter().product(), dtype);
                // Later keys score higher, so the running maximum keeps growing tile after tile.
                for (j, row) in k.chunks_mut(d).enumerate() {
                    row.iter_mut().for_each(|x| *x *= 1.0 + (j % s.seq_k) as f64 / 100.0);
                }
                let k: Vec<f64> = Tensor::from_f64(&k, [k.len()], dtype, GPU)?.to_vec_f64()?;
                let v = uniform(&mut rng, s.v().iter().product(), dtype);
                let want = reference(&s, &q, &k, &v, scale, causal, None);
                let t = |x: &[f64], dims: [usize; 4]| Tensor::from_f64(x, dims, dtype, GPU);
                let (qt, kt, vt) = (t(&q, s.q())?, t(&k, s.k())?, t(&v, s.v())?);
                assert!(ops::attention_is_fused(&qt, &kt, &vt, causal, None));
                attention_cases::poison_pool(q.len(), dtype, GPU)?;
                let (out, lse) = ops::attention_with_lse(&qt, &kt, &vt, scale, causal, None)?;
                let (out, lse) = (out.to_vec_f64()?, lse.to_vec_f64()?);
                for row in 0..want.lse.len() {
                    let tol = Tolerance::new(dtype, &s, &want, row);
                    let what = format!("{dtype} d{d} scale {scale} causal {causal} row {row}");
                    assert!(
                        (lse[row] - want.lse[row]).abs() <= tol.lse,
                        "{what}: lse {} vs {}",
                        lse[row],
                        want.lse[row]
                    );
                    for c in 0..d {
                        let (g, w) = (out[row * d + c], want.out[row * d + c]);
                        let allowed = tol.out(w, want.out_magnitude[row * d + c]);
                        assert!((g - w).abs() <= allowed, "{what} col {c}: {g} vs {w} (tolerance {allowed:e})");
                    }
                }
            }
        }
    }
    Ok(())
}

/// No queries, no heads: empty results of the right shapes from the fused dispatch.
#[test]
fn fused_empty_shapes() -> opsmith_host::Result<()> {
    for (b, h, sq) in [(2, 3, 0), (0, 3, 4)] {
        let s = Shape::new(b, h, sq, 6, 64);
        let t = |dims: [usize; 4]| Tensor::zeros(dims, DType::BF16, GPU);
        let (out, lse) = ops::attention_with_lse(&t(s.q())?, &t(s.k())?, &t(s.v())?, 0.125, true, None)?;
        assert_eq!((out.dims(), lse.dims()), (&s.q()[..], &[b, h, sq][..]));
    }
    Ok(())
}

/// The fused backward's `(dq, dk, dv)` against the composed backward in f64 on the CPU, on the
/// same (rounded) inputs and the same `dout`, over poisoned memory: lengths across the 64-row
/// tiles and the 32-row streamed tiles, `seq_q` above and below `seq_k`, causal or not. The
/// error of each gradient is measured against its largest magnitude (at least 1, the inputs'
/// scale), and must stay within a few
/// units of the dtype's roundoff (the kernels round `P` and `dS` to the dtype for the tensor
/// cores, as FlashAttention does).
#[test]
fn fused_backward_against_f64() -> opsmith_host::Result<()> {
    let shapes = [(1, 1, 1, 1), (2, 3, 63, 65), (1, 2, 64, 64), (1, 2, 127, 200), (1, 2, 200, 127), (1, 1, 300, 520)];
    let mut seed = 5000;
    for dtype in [DType::F16, DType::BF16] {
        let mut worst = [0.0f64; 3];
        for d in [64, 128] {
            for &(b, h, sq, sk) in &shapes {
                for causal in [false, true] {
                    seed += 1;
                    let s = Shape::new(b, h, sq, sk, d);
                    let mut rng = StdRng::seed_from_u64(seed);
                    let q = uniform(&mut rng, s.q().iter().product(), dtype);
                    let k = uniform(&mut rng, s.k().iter().product(), dtype);
                    let v = uniform(&mut rng, s.v().iter().product(), dtype);
                    let dout = uniform(&mut rng, s.q().iter().product(), dtype);
                    let scale = 1.0 / (d as f64).sqrt();
                    let on = |x: &[f64], dims: [usize; 4], dtype, device| Tensor::from_f64(x, dims, dtype, device);

                    // The reference: f64 on the CPU (the composed path), from the same values.
                    let cpu = |x: &[f64], dims| on(x, dims, DType::F64, Device::Cpu);
                    let (q64, k64, v64) = (cpu(&q, s.q())?, cpu(&k, s.k())?, cpu(&v, s.v())?);
                    let (o64, l64) = ops::attention_with_lse(&q64, &k64, &v64, scale, causal, None)?;
                    let want = ops::attention_backward(
                        &q64,
                        &k64,
                        &v64,
                        &o64,
                        &l64,
                        &cpu(&dout, s.q())?,
                        scale,
                        causal,
                        None,
                    )?;

                    let gpu = |x: &[f64], dims| on(x, dims, dtype, GPU);
                    let (qt, kt, vt) = (gpu(&q, s.q())?, gpu(&k, s.k())?, gpu(&v, s.v())?);
                    assert!(ops::attention_is_fused(&qt, &kt, &vt, causal, None));
                    let (out, lse) = ops::attention_with_lse(&qt, &kt, &vt, scale, causal, None)?;
                    attention_cases::poison_pool(s.k().iter().product(), dtype, GPU)?;
                    let got =
                        ops::attention_backward(&qt, &kt, &vt, &out, &lse, &gpu(&dout, s.q())?, scale, causal, None)?;

                    let what = format!("{dtype} d{d} {s:?} causal {causal}");
                    for (i, (name, g, w)) in [("dq", &got.0, &want.0), ("dk", &got.1, &want.1), ("dv", &got.2, &want.2)]
                        .into_iter()
                        .enumerate()
                    {
                        assert_eq!(g.dims(), w.dims(), "{what}: {name}");
                        let (g, w) = (g.to_vec_f64()?, w.to_vec_f64()?);
                        let scale_of = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
                        let err = g.iter().zip(&w).fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
                        assert!(err.is_finite(), "{what}: {name} has a non-finite value (an unwritten element?)");
                        // At least the inputs' own scale (1): with one key, dq is 0 in exact
                        // arithmetic and its rounding error is measured against that scale.
                        let relative = err / scale_of.max(1.0);
                        // 8 units of roundoff of the largest magnitude, the sums' rounding included.
                        let allowed = 8.0 * dtype.unit_roundoff();
                        assert!(
                            relative <= allowed,
                            "{what}: {name}: max |error| {err:e} over max |grad| {scale_of:e} = {relative:e} > {allowed:e}"
                        );
                        worst[i] = worst[i].max(relative);
                    }
                }
            }
        }
        eprintln!(
            "fused backward {dtype}: max |error| / max |grad| vs f64: dq {:.2e}, dk {:.2e}, dv {:.2e}",
            worst[0], worst[1], worst[2]
        );
        assert!(worst.iter().all(|&w| w > 0.0), "{dtype}: no rounding error at all is suspicious");
    }
    Ok(())
}
