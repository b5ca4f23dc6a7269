//! A no-grad forward allocates nothing for the tape: counted with a global allocator, the same
//! forward through autograd ops under `no_grad` makes exactly as many allocations as through the
//! plain tensor ops. (One test in this binary, so no other test allocates meanwhile.)
use opsmith_autograd::{Tape, no_grad, ops};
use opsmith_host::{Device, Tensor, ops as host};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn count(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    f();
    ALLOCATIONS.load(Ordering::Relaxed) - before
}

#[test]
fn no_grad_forward_allocates_nothing_for_the_tape() {
    let t = |v: f32| Tensor::full(v as f64, [256], opsmith_host::DType::F32, Device::Cpu).unwrap();
    let (a, b, c) = (t(1.5), t(-2.0), t(0.25));
    let tape = Tape::new();
    let (va, vb, vc) = (tape.var(a.clone()), tape.var(b.clone()), tape.var(c.clone()));
    // Warm up lazily initialised state on both paths.
    for _ in 0..2 {
        let _ = host::sum(&host::add_mul(&a, &b, &c).unwrap());
        let _g = no_grad();
        let _ = ops::sum(&ops::add_mul(&va, &vb, &vc).unwrap());
    }
    let plain = count(|| {
        let z = host::add_mul(&a, &b, &c).unwrap();
        let d = host::fused_mul_add(&z, &b, &c).unwrap();
        let _ = host::sum(&d).unwrap();
    });
    let recorded_nothing = count(|| {
        let _g = no_grad();
        let z = ops::add_mul(&va, &vb, &vc).unwrap();
        let d = ops::fused_mul_add(&z, &vb, &vc).unwrap();
        let _ = ops::sum(&d).unwrap();
    });
    assert_eq!(tape.len(), 0, "no node recorded");
    assert_eq!(recorded_nothing, plain, "the tape allocated under no_grad");
    // And with recording on, the tape does allocate (the counter can tell the difference).
    let recorded = count(|| {
        let z = ops::add_mul(&va, &vb, &vc).unwrap();
        let _ = ops::sum(&z).unwrap();
    });
    assert_eq!(tape.len(), 2);
    assert!(recorded > 0);
}
