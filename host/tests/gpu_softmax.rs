//! The GPU suite of softmax, cross-entropy and the squared error (`--features gpu-tests`; needs
//! a CUDA device): the shared cases on `Device::Cuda(0)` against f64, and what only CUDA has:
//! many more rows than resident warps or blocks (each loops over rows), at each kernel's row
//! length boundaries, outputs written over NaN-poisoned memory, and operands on different
//! devices.
mod common;
mod softmax_cases;

use opsmith_host::{DType, Device, Error, Labels, Result, Tensor, ops};
use rand::{Rng, SeedableRng, rngs::StdRng};
use softmax_cases::{poison_pool, random_values, round_to, softmax_reference, tensor_at};

const GPU: Device = Device::Cuda(0);

softmax_cases!(GPU);

/// One many-rows case, forward and backward, every element checked against f64 over poisoned
/// output memory: `x` of `[rows, cols]` viewed `offset` elements into its buffer (an odd offset
/// forces the scalar path), with a `[mask_rows, cols]` mask broadcast over the rows, a third of
/// its terms `-inf` and, when `mask_rows > 1`, its row 1 wholly `-inf` (so every `mask_rows`-th
/// row of `x` is fully masked and must come out as zeros).
fn many_rows_case(
    rng: &mut StdRng,
    dtype: DType,
    rows: usize,
    cols: usize,
    mask_rows: usize,
    offset: usize,
) -> Result<()> {
    // The mask must be x's trailing dims: x is [rows / mask_rows, mask_rows, cols].
    let rows = rows - rows % mask_rows;
    let n = rows * cols;
    let what = format!("{dtype} [{rows}, {cols}], mask [{mask_rows}, {cols}], offset {offset}");
    let x = random_values(rng, n, dtype);
    let mut mask = random_values(rng, mask_rows * cols, dtype);
    mask.iter_mut().step_by(3).for_each(|m| *m = f64::NEG_INFINITY);
    if mask_rows > 1 {
        mask[cols..2 * cols].iter_mut().for_each(|m| *m = f64::NEG_INFINITY);
    }
    let xt = tensor_at(&x, &[rows / mask_rows, mask_rows, cols], offset, dtype, GPU)?;
    let mt = tensor_at(&mask, &[mask_rows, cols], offset, dtype, GPU)?;
    poison_pool(n, dtype, GPU)?;
    let y = ops::softmax(&xt, 0.5, Some(&mt))?.to_vec_f64()?;
    let (want, magnitude) = softmax_reference(&x, Some(&mask), cols, 0.5);
    let u = f32::EPSILON as f64 / 2.0;
    let store = if dtype == DType::F32 { 0.0 } else { dtype.unit_roundoff() * 1.01 };
    for i in 0..n {
        if magnitude[i].is_infinite() || (want[i] == 0.0 && magnitude[i] == 0.0) {
            assert_eq!(y[i], 0.0, "{what} element {i}: masked out");
        } else {
            let tol = want[i] * (u * (16.0 + 4.0 * magnitude[i] + cols as f64 / 16.0) + store) + 2f64.powi(-24);
            assert!((y[i] - want[i]).abs() <= tol, "{what} element {i}: {} vs {}", y[i], want[i]);
        }
    }

    // Backward from the rounded forward output (fully masked rows give y = 0, so gx = 0).
    let yr: Vec<f64> = want.iter().map(|&v| round_to(dtype, v)).collect();
    let g = random_values(rng, n, dtype);
    let gt = tensor_at(&g, &[rows, cols], offset, dtype, GPU)?;
    let yt = tensor_at(&yr, &[rows, cols], 0, dtype, GPU)?;
    poison_pool(n, dtype, GPU)?;
    let gx = ops::softmax_backward(&gt, &yt, 2.0)?.to_vec_f64()?;
    for (r, (grow, yrow)) in g.chunks(cols).zip(yr.chunks(cols)).enumerate() {
        let dot: f64 = grow.iter().zip(yrow).map(|(g, y)| g * y).sum();
        let dot_abs: f64 = grow.iter().zip(yrow).map(|(g, y)| (g * y).abs()).sum();
        for c in 0..cols {
            let i = r * cols + c;
            let want = 2.0 * yrow[c] * (grow[c] - dot);
            let tol = 2.0 * yrow[c] * u * ((cols as f64 / 32.0 + 8.0) * dot_abs + 3.0 * (grow[c].abs() + dot.abs()))
                + store * want.abs()
                + 2f64.powi(-24);
            assert!((gx[i] - want).abs() <= tol, "backward {what} element {i}: {} vs {want}", gx[i]);
        }
    }
    Ok(())
}

/// Thousands of rows per launch (several per warp) at each kernel tier: one-warp short and full
/// rows, block-per-row rows, and the two-pass long rows; forward with a row mask and backward.
#[test]
fn many_rows_per_warp() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(21);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (rows, cols) in [(20_000, 64), (3_000, 4096), (2_000, 1000), (600, 8192), (200, 20_000)] {
            many_rows_case(&mut rng, dtype, rows, cols, 1, 0)?;
        }
    }
    Ok(())
}

/// The block-per-row kernels at every boundary of their block sizes: each warp of a block holds
/// `32 * per_thread` values, so row lengths at, below and above a whole number of warps (the
/// smallest block just past the one-warp kernels, capacity ± 1 of several block sizes, the
/// largest block and one past it, which takes the long kernel), odd lengths (the scalar path),
/// and unaligned views. More rows than resident blocks, so each block loops over rows and
/// reuses its shared-memory scratch; a `[3, cols]` mask with one row wholly `-inf`, so fully
/// masked rows sit among the others in each block's loop.
#[test]
fn many_rows_per_block() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(23);
    use opsmith_kernels::names::softmax;
    for (dtype, table) in [(DType::F32, softmax::F32), (DType::F16, softmax::F16), (DType::BF16, softmax::BF16)] {
        let warp_max = table.forward.last().unwrap().max_cols as usize;
        let kernel = table.forward_block[0];
        let (per_warp, max_cols) = (32 * kernel.per_thread as usize, kernel.max_cols() as usize);
        let mut lengths = vec![warp_max + 1, warp_max + 7, 3 * per_warp - 1, 3 * per_warp, 3 * per_warp + 1];
        lengths.extend([8 * per_warp, 8 * per_warp + 8, 13 * per_warp + 5, max_cols - 1, max_cols, max_cols + 1]);
        for cols in lengths {
            // About 2^21 elements, and never fewer than 300 rows.
            let rows = ((1 << 21) / cols).max(300);
            many_rows_case(&mut rng, dtype, rows, cols, 3, 0)?;
            many_rows_case(&mut rng, dtype, rows / 4, cols, 3, 1)?;
        }
    }
    Ok(())
}

/// Cross-entropy over more rows than resident warps, with labels uploaded on the device, over
/// poisoned memory; the backward reads `g` on the device.
#[test]
fn cross_entropy_many_rows() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(22);
    let (rows, classes) = (50_000, 37);
    let x = random_values(&mut rng, rows * classes, DType::F32);
    let labels: Vec<u32> = (0..rows).map(|_| rng.random_range(0..classes as u32)).collect();
    let xt = Tensor::from_f64(&x, [rows, classes], DType::F32, GPU)?;
    let lt = Labels::new(&labels, GPU)?;
    poison_pool(rows, DType::F32, GPU)?;
    let loss = ops::cross_entropy(&xt, &lt)?.to_vec_f64()?[0];
    let mut total = 0.0;
    for (row, &label) in x.chunks(classes).zip(&labels) {
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        total += max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln() - row[label as usize];
    }
    let want = total / rows as f64;
    // Per row: logits up to 16 and 37 exponentials; then 50 000 losses added in one warp.
    let u = f32::EPSILON as f64 / 2.0;
    assert!((loss - want).abs() <= u * (rows as f64 / 32.0 + 150.0) * want.abs(), "{loss} vs {want}");
    let g = Tensor::from_f64(&[3.0], [], DType::F32, GPU)?;
    poison_pool(rows * classes, DType::F32, GPU)?;
    let gx = ops::cross_entropy_backward(&g, &xt, &lt)?.to_vec_f64()?;
    let (p, _) = softmax_reference(&x, None, classes, 1.0);
    for i in 0..rows * classes {
        let target = if i % classes == labels[i / classes] as usize { 1.0 } else { 0.0 };
        let want = (p[i] - target) * 3.0 / rows as f64;
        assert!((gx[i] - want).abs() <= 2e-5 * 3.0 / rows as f64, "element {i}: {} vs {want}", gx[i]);
    }
    Ok(())
}

/// The cross-entropy kernels launched directly, which the checked ops cannot do: labels the
/// host rejects (`cols` and `u32::MAX`: a NaN loss and a gradient without the one-hot term,
/// reading nothing at the label, so `u32::MAX` cannot fault), a row of `-inf` (a NaN loss and a
/// gradient of `-onehot * g`), and any grid: one block of 32 threads looping over the rows, a
/// thread per row, a warp per row. Every row's loss and every gradient against f64, over NaN,
/// for rows of a thread's copy sizes and of more (a warp per row), aligned and not.
#[test]
fn cross_entropy_kernels_take_any_grid_and_bad_labels() -> Result<()> {
    use opsmith_host::cuda::{CudaDevice, KernelArg, LaunchConfig};
    use opsmith_kernels::names::loss::{self, THREAD_ROW_MAX_COLS};
    use softmax_cases::{check_cross_entropy_gradient, cross_entropy_reference};

    let device = CudaDevice::get(0)?;
    let stream = device.current_stream();
    let mut rng = StdRng::seed_from_u64(23);
    let rows = 300;
    let limit = THREAD_ROW_MAX_COLS as usize;
    for (dtype, table) in [(DType::F32, loss::F32), (DType::F16, loss::F16), (DType::BF16, loss::BF16)] {
        for cols in [1, 2, 3, limit, limit + 1, 40] {
            let mut labels: Vec<u32> = (0..rows).map(|_| rng.random_range(0..cols as u32)).collect();
            labels[7] = cols as u32;
            labels[rows - 1] = u32::MAX;
            let mut x = random_values(&mut rng, rows * cols, dtype);
            x[11 * cols..12 * cols].fill(f64::NEG_INFINITY);
            let lt = Tensor::from_vec(labels.clone(), [rows], GPU)?;
            let g0 = round_to(dtype, 1.5);
            let g = Tensor::from_f64(&[g0], [], dtype, GPU)?;
            let scale = 1.0 / rows as f32;
            let grids = [
                LaunchConfig { grid: 1, block: 32, shared_mem_bytes: 0 },
                LaunchConfig { grid: rows.div_ceil(256) as u32, block: 256, shared_mem_bytes: 0 },
                LaunchConfig { grid: (32 * rows).div_ceil(128) as u32, block: 128, shared_mem_bytes: 0 },
            ];
            for offset in [0, 1] {
                let xt = tensor_at(&x, &[rows, cols], offset, dtype, GPU)?;
                for cfg in grids {
                    let what = || format!("{dtype} [{rows}, {cols}], offset {offset}, {cfg:?}");
                    let losses = Tensor::full(f64::NAN, [rows], DType::F32, GPU)?;
                    let fwd = device.kernel(table.cross_entropy)?;
                    let args = [
                        KernelArg::Input(&xt),
                        KernelArg::Input(&lt),
                        KernelArg::Output(&losses),
                        KernelArg::U64(rows as u64),
                        KernelArg::U64(cols as u64),
                    ];
                    // SAFETY: (logits, labels, losses, rows, cols), with `rows * cols` logits and
                    // `rows` labels and losses; blocks of whole warps.
                    unsafe { fwd.launch(&stream, cfg, &args)? };
                    let got = losses.to_vec_f64()?;
                    for (r, (row, &label)) in x.chunks(cols).zip(&labels).enumerate() {
                        if label as usize >= cols || r == 11 {
                            assert!(got[r].is_nan(), "{}: row {r}, label {label}: loss {}", what(), got[r]);
                        } else {
                            let (want, tol) = cross_entropy_reference(row, &[label], cols, DType::F32);
                            assert!((got[r] - want).abs() <= tol, "{}: row {r}: loss {} vs {want}", what(), got[r]);
                        }
                    }

                    let gx = Tensor::full(f64::NAN, [rows, cols], dtype, GPU)?;
                    let bwd = device.kernel(table.cross_entropy_backward)?;
                    let args = [
                        KernelArg::Input(&g),
                        KernelArg::Input(&xt),
                        KernelArg::Input(&lt),
                        KernelArg::Output(&gx),
                        KernelArg::U64(rows as u64),
                        KernelArg::U64(cols as u64),
                        KernelArg::F32(scale),
                    ];
                    // SAFETY: (g, logits, labels, gx, rows, cols, scale), with one `g`,
                    // `rows * cols` logits and gradients and `rows` labels; blocks of whole warps.
                    unsafe { bwd.launch(&stream, cfg, &args)? };
                    let got = gx.to_vec_f64()?;
                    let coef = g0 * scale as f64;
                    check_cross_entropy_gradient(&got, &x, &labels, cols, dtype, coef, what);
                }
            }
        }
    }
    Ok(())
}

/// `ops::cross_entropy` of up to 4096 rows of at most `THREAD_ROW_MAX_COLS` classes is one
/// launch (`cross_entropy_mean`): bit for bit the per-row kernel and `sum_finish` launched
/// directly, at the row counts where the one block's threads take one row, a partial warp, and
/// four rows each, and at each row length, over NaN-poisoned memory; one row past it (more
/// rows, or longer ones) is the two launches, which give the same bits too. A label out of
/// range, which the op rejects, makes the one-launch mean NaN.
#[test]
fn cross_entropy_mean_in_one_launch_equals_the_two_launches() -> Result<()> {
    use opsmith_host::cuda::{CudaDevice, KernelArg, LaunchConfig};
    use opsmith_kernels::names::loss::{self, THREAD_ROW_MAX_COLS};
    use opsmith_kernels::names::reduction;
    let device = CudaDevice::get(0)?;
    let stream = device.current_stream();
    let mut rng = StdRng::seed_from_u64(24);
    let limit = THREAD_ROW_MAX_COLS as usize;
    let tables = [
        (DType::F32, loss::F32, reduction::F32),
        (DType::F16, loss::F16, reduction::F16),
        (DType::BF16, loss::BF16, reduction::BF16),
    ];
    for (dtype, table, sums) in tables {
        for (rows, cols) in
            [(1, 2), (33, 2), (1000, 2), (1024, 3), (1025, 5), (4096, limit), (4097, 2), (300, limit + 1)]
        {
            let what = format!("cross_entropy {dtype} [{rows}, {cols}]");
            let labels: Vec<u32> = (0..rows).map(|_| rng.random_range(0..cols as u32)).collect();
            let x = random_values(&mut rng, rows * cols, dtype);
            let xt = Tensor::from_f64(&x, [rows, cols], dtype, GPU)?;
            let lt = Tensor::from_vec(labels.clone(), [rows], GPU)?;
            poison_pool(rows, DType::F32, GPU)?;
            let got = ops::cross_entropy(&xt, &Labels::new(&labels, GPU)?)?.to_vec_f64()?[0];

            let losses = Tensor::full(f64::NAN, [rows], DType::F32, GPU)?;
            let args = [
                KernelArg::Input(&xt),
                KernelArg::Input(&lt),
                KernelArg::Output(&losses),
                KernelArg::U64(rows as u64),
                KernelArg::U64(cols as u64),
            ];
            let cfg = LaunchConfig { grid: (32 * rows).div_ceil(256) as u32, block: 256, shared_mem_bytes: 0 };
            // SAFETY: (logits, labels, losses, rows, cols), with `rows * cols` logits and `rows`
            // labels and losses; blocks of whole warps.
            unsafe { device.kernel(table.cross_entropy)?.launch(&stream, cfg, &args)? };
            let two = Tensor::full(f64::NAN, [], dtype, GPU)?;
            let args = [
                KernelArg::Input(&losses),
                KernelArg::Output(&two),
                KernelArg::U64(rows as u64),
                KernelArg::F32((1.0 / rows as f64) as f32),
            ];
            let block = rows.clamp(1, 1024).next_multiple_of(32) as u32;
            let one_block = LaunchConfig { grid: 1, block, shared_mem_bytes: 0 };
            // SAFETY: (partials, out, count, scale): `rows` f32 partials, one output; one block
            // of whole warps up to 1024, as `sum_finish` takes for `rows` partials.
            unsafe { device.kernel(sums.sum_finish)?.launch(&stream, one_block, &args)? };
            let want = two.to_vec_f64()?[0];
            assert!(want.is_finite(), "{what}: the two launches gave {want}");
            assert_eq!(got.to_bits(), want.to_bits(), "{what}: one launch {got} vs two {want}");

            if cols <= limit && rows <= 4096 {
                // A label the op would refuse: the kernel's mean is NaN.
                let mut bad = labels.clone();
                bad[rows / 2] = cols as u32;
                let bad = Tensor::from_vec(bad, [rows], GPU)?;
                let out = Tensor::full(0.0, [], dtype, GPU)?;
                let args = [
                    KernelArg::Input(&xt),
                    KernelArg::Input(&bad),
                    KernelArg::Output(&out),
                    KernelArg::U64(rows as u64),
                    KernelArg::U64(cols as u64),
                    KernelArg::F32((1.0 / rows as f64) as f32),
                ];
                // SAFETY: (logits, labels, out, rows, cols, scale), with `rows * cols` logits,
                // `rows` labels and one output; one block of whole warps up to 1024.
                unsafe { device.kernel(table.cross_entropy_mean)?.launch(&stream, one_block, &args)? };
                assert!(out.to_vec_f64()?[0].is_nan(), "{what}: a label out of range");
            }
        }
    }
    Ok(())
}

/// Operands on different devices are rejected with the op named, before any launch.
#[test]
fn device_mismatch_is_an_error() -> Result<()> {
    let x = Tensor::from_f64(&[1.0; 6], [2, 3], DType::F32, GPU)?;
    let cpu_mask = Tensor::from_f64(&[0.0; 3], [3], DType::F32, Device::Cpu)?;
    let err = ops::softmax(&x, 1.0, Some(&cpu_mask)).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "softmax", lhs: GPU, rhs: Device::Cpu }), "{err}");
    let cpu_labels = Labels::new(&[0, 1], Device::Cpu)?;
    let err = ops::cross_entropy(&x, &cpu_labels).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "cross_entropy", lhs: GPU, rhs: Device::Cpu }), "{err}");
    let labels = Labels::new(&[0, 1], GPU)?;
    let cpu_g = Tensor::from_f64(&[1.0], [], DType::F32, Device::Cpu)?;
    let err = ops::cross_entropy_backward(&cpu_g, &x, &labels).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "cross_entropy_backward", .. }), "{err}");
    let cpu_x = Tensor::from_f64(&[1.0; 6], [2, 3], DType::F32, Device::Cpu)?;
    let err = ops::mse_loss(&x, &cpu_x).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { op: "mse_loss", .. }), "{err}");
    Ok(())
}
