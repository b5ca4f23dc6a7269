//! Threads running in-place ops over a few shared tensors, in every order: the storage locks
//! must be taken in one global order, or two threads writing each other's inputs deadlock.
use opsmith_host::{DType, Device, Result, Tensor, ops};
use rand::{Rng, SeedableRng, rngs::StdRng};
use std::sync::mpsc;
use std::time::Duration;

/// Runs `threads` threads of `ops_per_thread` random in-place ops each (`add_into`, `mul_into`,
/// `fused_mul_add_into`, `copy_from_`) whose inputs and outputs are drawn from four shared
/// tensors on `device`, and fails if they have not all finished within `deadline`: a deadlock
/// shows as a timeout, not as a hung test run. Every op must succeed.
pub fn in_place_ops_from_many_threads_finish(
    device: Device,
    threads: usize,
    ops_per_thread: usize,
    deadline: Duration,
) {
    let n = 4099;
    let shared: Vec<Tensor> =
        (0..4).map(|k| Tensor::from_f64(&vec![0.25 * (k as f64 + 1.0); n], [n], DType::F32, device).unwrap()).collect();
    let (done, finished) = mpsc::channel::<Result<()>>();
    for t in 0..threads {
        let (shared, done) = (shared.clone(), done.clone());
        std::thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(t as u64);
            let mut run = || -> Result<()> {
                for _ in 0..ops_per_thread {
                    let [a, b, c, out] = [0; 4].map(|_| &shared[rng.random_range(0..shared.len())]);
                    match rng.random_range(0..4) {
                        0 => ops::add_into(a, b, out)?,
                        1 => ops::mul_into(a, b, out)?,
                        2 => ops::fused_mul_add_into(a, b, c, out)?,
                        _ => out.copy_from_(a)?,
                    }
                    // Halved after each op, so values stay small in most interleavings.
                    ops::affine_into(out, 0.5, 0.0, out)?;
                }
                Ok(())
            };
            let _ = done.send(run());
        });
    }
    drop(done);
    let start = std::time::Instant::now();
    for finished_threads in 0..threads {
        let left = deadline.saturating_sub(start.elapsed());
        match finished.recv_timeout(left) {
            Ok(result) => result.unwrap(),
            Err(_) => panic!(
                "{} of {threads} threads still running after {deadline:?}: a deadlock in the storage locks",
                threads - finished_threads
            ),
        }
    }
    for t in &shared {
        assert_eq!(t.to_vec_f64().unwrap().len(), n);
    }
}
