//! Concurrency on the CPU: in-place ops from many threads over shared tensors finish (the GPU
//! suite runs the same body on CUDA, in `gpu_reliability.rs`).
mod common;

use opsmith_host::{Device, Tensor, ops};
use std::time::Duration;

#[test]
fn in_place_ops_from_many_threads_do_not_deadlock() {
    common::stress::in_place_ops_from_many_threads_finish(Device::Cpu, 8, 400, Duration::from_secs(60));
}

/// The two-thread case of the report: `add_into(a, b, c)` and `add_into(c, d, a)` at once,
/// many times over. Each reads what the other writes.
#[test]
fn two_threads_writing_each_others_inputs() {
    let t = |v: f32| Tensor::from_vec(vec![v; 1 << 16], [1 << 16], Device::Cpu).unwrap();
    let (a, b, c, d) = (t(1.0), t(2.0), t(3.0), t(4.0));
    let (tx, rx) = std::sync::mpsc::channel();
    for (x, y, out) in [(a.clone(), b.clone(), c.clone()), (c.clone(), d.clone(), a.clone())] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for _ in 0..2000 {
                ops::add_into(&x, &y, &out).unwrap();
                ops::affine_into(&out, 0.5, 0.0, &out).unwrap();
            }
            tx.send(()).unwrap();
        });
    }
    for _ in 0..2 {
        rx.recv_timeout(Duration::from_secs(60)).expect("add_into(a, b, c) and add_into(c, d, a) deadlocked");
    }
    // b and d are only read.
    assert_eq!(b.to_vec::<f32>().unwrap()[0], 2.0);
    assert_eq!(d.to_vec::<f32>().unwrap()[0], 4.0);
}
