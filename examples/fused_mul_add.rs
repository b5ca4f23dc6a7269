//! Step 3a: the fused multiply-add `d = a * b + c`, against `mul` then `add`, with what fusion
//! saves, in bytes moved, time and rounding error.
//!
//! Why fusion saves, for an elementwise op that memory bounds (every one here: a few flops per
//! element, and a GPU moves far fewer bytes per second than it does flops):
//!
//! * bytes. The fused kernel reads a, b and c and writes d: 4 values per element. Unfused, `mul`
//!   reads a and b and writes t = a * b (3 values), then `add` reads t and c and writes d (3
//!   more): 6 values, because the intermediate t goes out to memory and comes back. At the
//!   memory's speed, 4/6 of the traffic takes about 4/6 of the time.
//! * rounding. The fused op rounds once (a true FMA), `mul` then `add` twice: t is rounded
//!   before c is added, which loses digits exactly when a * b and c nearly cancel.
//!
//! ```text
//! cargo run --release --example fused_mul_add                 # 2^24 elements on CUDA, 2^20 on the CPU
//! cargo run --release --example fused_mul_add -- --log2 26 --dtype bf16
//! cargo run --example fused_mul_add -- --quick                # 2^16, for unoptimised builds
//! ```
mod fusion;

use fusion::{Args, Row};
use opsmith::{Device, Result, Tensor, ops};

fn main() -> Result<()> {
    let device = Device::cuda_if_available();
    let args = Args::parse(device);
    let (n, dtype) = (args.n(), args.dtype);
    println!("fused_mul_add on {}, {dtype}, n = 2^{} ({n} elements)\n", fusion::describe(device)?, args.log2);

    let [a, b, c] = [1, 2, 3].map(|seed| fusion::random_input(n, dtype, seed, device));
    let (a, b, c) = (a?, b?, c?);
    // Outputs allocated once, so the timings are of the kernels (or CPU passes), not allocation.
    let fused = Tensor::zeros([n], dtype, device)?;
    let (product, unfused) = (Tensor::zeros([n], dtype, device)?, Tensor::zeros([n], dtype, device)?);

    let rows = [
        Row {
            what: "fused_mul_add",
            kernels: 1,
            values_per_element: 4, // read a, b, c; write d
            ms: fusion::median_ms(device, args.reps, || {
                ops::fused_mul_add_into(&a.tensor, &b.tensor, &c.tensor, &fused)
            })?,
        },
        Row {
            what: "mul, then add",
            kernels: 2,
            values_per_element: 6, // mul: read a, b; write t. add: read t, c; write d
            ms: fusion::median_ms(device, args.reps, || {
                ops::mul_into(&a.tensor, &b.tensor, &product)?;
                ops::add_into(&product, &c.tensor, &unfused)
            })?,
        },
    ];
    fusion::print_table(&args, &rows);

    // a * b is exact in f64 (two 24-bit significands make at most 48 bits), so this reference
    // is a * b + c rounded once, at f64's precision: far finer than any dtype here.
    let exact = |i: usize| a.host[i] * b.host[i] + c.host[i];
    let fused_error = fusion::max_error_ulps(&fused, dtype, exact)?;
    let unfused_error = fusion::max_error_ulps(&unfused, dtype, exact)?;
    println!(
        "\nlargest error against f64 on the head and tail: fused {fused_error:.3} ulp (one rounding), \
         unfused {unfused_error:.3} ulp (two; where a * b and c nearly cancel, the rounding of a * b \
         is a large part of a small d)"
    );
    let bound = fusion::one_rounding_ulps(dtype);
    assert!(fused_error <= bound, "fused_mul_add is off by {fused_error} ulp: more than one rounding");
    Ok(())
}
