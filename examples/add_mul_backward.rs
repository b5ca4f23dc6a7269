//! Step 3b: `z = (x + y) * w` and its backward, fused and unfused: the host ops alone, then a
//! whole forward and backward through the tape, with the bytes each must move and the time.
//!
//! The backward, for an upstream gradient g, is `gx = gy = g * w` and `gw = g * (x + y)`. Why
//! fusion saves:
//!
//! * bytes. `add_mul_backward` reads g, x, y and w once and writes `g * w` and `g * (x + y)`: 6
//!   values per element. Unfused, `mul` (g, w → g·w), `add` (x, y → s) and `mul` (g, s → g·s)
//!   move 3 each, 9 in all, because s goes out to memory and comes back. One gradient serves x
//!   and y both: the kernel writes it once, and the tape copies it for the second variable,
//!   since each variable's gradient is a tensor of its own.
//! * passes. Through the tape, the fused forward and backward are one kernel each (10 values
//!   per element); `add` then `mul` nodes are two kernels each way (12).
//! * rounding. In f32 both orders round x + y, then the product, so the bits agree. In f16 and
//!   bf16 the fused kernels keep x + y in f32 where the unfused path stores it in the dtype,
//!   rounding once more.
//!
//! ```text
//! cargo run --release --example add_mul_backward              # 2^24 elements on CUDA, 2^20 on the CPU
//! cargo run --release --example add_mul_backward -- --log2 26 --dtype f16
//! cargo run --example add_mul_backward -- --quick             # 2^16, for unoptimised builds
//! ```
mod fusion;

use fusion::{Args, Row};
use opsmith::autograd::{self, Gradients, Tape, Var};
use opsmith::{Device, Tensor, ops};

/// A forward and backward of `(x + y) * w` through the tape, from the gradient `g`: fused (one
/// `add_mul` node) or not (an `add` node, then a `mul` node). Returns the tape's gradients and
/// the variables, to read them by.
fn tape_step(fused: bool, x: &Tensor, y: &Tensor, w: &Tensor, g: &Tensor) -> autograd::Result<(Gradients, [Var; 3])> {
    let tape = Tape::new();
    let (x, y, w) = (tape.var(x.clone()), tape.var(y.clone()), tape.var(w.clone()));
    let z =
        if fused { autograd::ops::add_mul(&x, &y, &w)? } else { autograd::ops::mul(&autograd::ops::add(&x, &y)?, &w)? };
    Ok((tape.backward_with(&z, g.clone())?, [x, y, w]))
}

fn main() -> autograd::Result<()> {
    let device = Device::cuda_if_available();
    let args = Args::parse(device);
    let (n, dtype) = (args.n(), args.dtype);
    println!("add_mul and its backward on {}, {dtype}, n = 2^{} ({n} elements)", fusion::describe(device)?, args.log2);

    let [g, x, y, w] = [1, 2, 3, 4].map(|seed| fusion::random_input(n, dtype, seed, device));
    let (g, x, y, w) = (g?, x?, y?, w?);
    let (gt, xt, yt, wt) = (&g.tensor, &x.tensor, &y.tensor, &w.tensor);
    let out = || Tensor::zeros([n], dtype, device);
    let (gxy, gw, sum) = (out()?, out()?, out()?);

    println!("\nthe backward alone, from a given g (outputs allocated once):\n");
    let reps = args.reps;
    let backward_rows = [
        Row {
            what: "add_mul_backward",
            kernels: 1,
            values_per_element: 6, // read g, x, y, w; write g·w, g·(x+y)
            ms: fusion::median_ms(device, reps, || ops::add_mul_backward_into(gt, xt, yt, wt, &gxy, &gw))?,
        },
        Row {
            what: "mul, then add_mul",
            kernels: 2,
            values_per_element: 7, // mul: g, w → g·w (3). add_mul: x, y, g → (x+y)·g (4)
            ms: fusion::median_ms(device, reps, || {
                ops::mul_into(gt, wt, &gxy)?;
                ops::add_mul_into(xt, yt, gt, &gw)
            })?,
        },
        Row {
            what: "mul, add, mul",
            kernels: 3,
            values_per_element: 9, // three binary ops of 3 values each; s = x + y round-trips
            ms: fusion::median_ms(device, reps, || {
                ops::mul_into(gt, wt, &gxy)?;
                ops::add_into(xt, yt, &sum)?;
                ops::mul_into(gt, &sum, &gw)
            })?,
        },
    ];
    fusion::print_table(&args, &backward_rows);
    // The first row wrote gxy and gw last but its outputs were overwritten since: run it again
    // to check what it computes.
    ops::add_mul_backward_into(gt, xt, yt, wt, &gxy, &gw)?;
    let exact_gxy = |i: usize| g.host[i] * w.host[i];
    let exact_gw = |i: usize| g.host[i] * (x.host[i] + y.host[i]);

    println!("\nforward and backward through the tape (each node allocates its outputs):\n");
    let tape_rows = [
        Row {
            what: "tape: add_mul",
            kernels: 2,
            values_per_element: 10, // forward: x, y, w → z (4); backward: as add_mul_backward (6)
            ms: fusion::median_ms(device, reps, || tape_step(true, xt, yt, wt, gt).map(drop))?,
        },
        Row {
            what: "tape: add, then mul",
            kernels: 4,
            values_per_element: 12, // forward: add (3), mul (3); backward: mul's two products (6)
            ms: fusion::median_ms(device, reps, || tape_step(false, xt, yt, wt, gt).map(drop))?,
        },
    ];
    fusion::print_table(&args, &tape_rows);

    println!("\nlargest error against f64 on the head and tail (in ulps of {dtype}):");
    println!("| path | g·w (gradient of x and y) | g·(x + y) (gradient of w) |");
    println!("|---|---|---|");
    let report = |what: &str, gxy: &Tensor, gw: &Tensor| -> opsmith::Result<(f64, f64)> {
        let errors = (fusion::max_error_ulps(gxy, dtype, exact_gxy)?, fusion::max_error_ulps(gw, dtype, exact_gw)?);
        println!("| {what} | {:.3} | {:.3} |", errors.0, errors.1);
        Ok(errors)
    };
    let mut checked = vec![report("add_mul_backward", &gxy, &gw)?];
    for fused in [true, false] {
        let (grads, [xv, yv, wv]) = tape_step(fused, xt, yt, wt, gt)?;
        let gradient = |v: &Var| grads.get(v).expect("x, y and w require gradients");
        let (gx, gy, gw) = (gradient(&xv), gradient(&yv), gradient(&wv));
        assert!(!gx.shares_storage(gy), "x and y each get their own gradient tensor");
        assert_eq!(gx.to_vec_f64()?, gy.to_vec_f64()?, "x and y have the same gradient");
        let what = if fused { "tape: add_mul" } else { "tape: add, then mul" };
        let errors = report(what, gx, gw)?;
        if fused {
            checked.push(errors);
        }
    }
    // g·w is one product, rounded once. g·(x + y) rounds the sum, then the product: each
    // rounding costs at most one unit roundoff of relative error, and 2u relative is at most 2 ulps.
    for (gxy_error, gw_error) in checked {
        assert!(gxy_error <= fusion::one_rounding_ulps(dtype), "g·w is off by {gxy_error} ulp: more than one rounding");
        assert!(gw_error <= 2.0, "g·(x + y) is off by {gw_error} ulp");
    }
    Ok(())
}
