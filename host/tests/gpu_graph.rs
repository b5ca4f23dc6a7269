//! CUDA graphs (`--features gpu-tests`; needs a CUDA device): replays equal eager runs bit for
//! bit, capture errors are typed and leave the stream usable, memory stays flat over many
//! replays, and the graph keeps what it uses alive and ordered across streams.
//!
//! One test at a time, each on a stream of its own: a capture records everything queued on its
//! stream, and one device holds one capture at a time.
use opsmith_host::cuda::{CudaDevice, Graph, Stream, StreamGuard};
use opsmith_host::{DType, Device, Error, Labels, Result, Tensor, ops};
use std::sync::Mutex;

const GPU: Device = Device::Cuda(0);
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A fresh stream made current on this thread (held with the returned guard).
fn own_stream(dev: &CudaDevice) -> Result<(Stream, StreamGuard)> {
    let stream = dev.new_stream()?;
    let guard = stream.make_current();
    Ok((stream, guard))
}

/// `n` values in about [-2, 2] from a small LCG: every element differs, none is zero.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let v = ((state >> 40) as f64 / (1u64 << 24) as f64) * 4.0 - 2.0;
            if v.abs() < 1e-3 { 0.5 } else { v as f32 }
        })
        .collect()
}

fn bits(t: &Tensor) -> Result<Vec<u32>> {
    Ok(t.to_vec::<f32>()?.iter().map(|v| v.to_bits()).collect())
}

/// The n = 1024 step the graph benchmarks use: `z = (x + y)·w`, `loss = Σz`, and the gradients
/// of the loss (`gxy` for x and y, `gw` for w), from the uniform upstream gradient 1.
fn step(x: &Tensor, y: &Tensor, w: &Tensor) -> Result<[Tensor; 3]> {
    let z = ops::add_mul(x, y, w)?;
    let loss = ops::sum(&z)?;
    let (gxy, gw) = ops::add_mul_backward_uniform(1.0, x, y, w)?;
    Ok([loss, gxy, gw])
}

#[test]
fn replays_equal_eager_steps_bit_for_bit_with_new_inputs_each_time() -> Result<()> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dev = CudaDevice::get(0)?;
    let (_stream, _on) = own_stream(&dev)?;
    let n = 1024;
    let input = |seed| Tensor::from_vec(values(n, seed), [n], GPU);
    let (x, y, w) = (input(1)?, input(2)?, input(3)?);
    step(&x, &y, &w)?; // warm-up: loads the kernels outside the capture
    let (graph, outputs) = Graph::capture(&dev, || step(&x, &y, &w))?;
    assert!(graph.node_count() >= 3, "{graph:?}");
    for round in 0..5u64 {
        let (nx, ny, nw) = (input(10 + 3 * round)?, input(11 + 3 * round)?, input(12 + 3 * round)?);
        x.copy_from_(&nx)?;
        y.copy_from_(&ny)?;
        w.copy_from_(&nw)?;
        // Poisoned between replays: a replay that skipped an output would leave NaN.
        for out in &outputs {
            ops::affine_into(out, 0.0, f64::NAN, out)?;
        }
        graph.replay()?;
        let eager = step(&nx, &ny, &nw)?;
        for (k, (replayed, eager)) in outputs.iter().zip(&eager).enumerate() {
            assert_eq!(bits(replayed)?, bits(eager)?, "round {round}, output {k}");
        }
        // And against f64 arithmetic: Σ (x+y)·w, and the gradients (w, x + y).
        let (xv, yv, wv) = (nx.to_vec::<f32>()?, ny.to_vec::<f32>()?, nw.to_vec::<f32>()?);
        let want: f64 = (0..n).map(|i| (xv[i] as f64 + yv[i] as f64) * wv[i] as f64).sum();
        let got = outputs[0].to_vec::<f32>()?[0] as f64;
        assert!((got - want).abs() <= 1e-4 * want.abs().max(1.0), "loss {got} vs {want}");
        assert_eq!(outputs[1].to_vec::<f32>()?, wv);
        let sums: Vec<f32> = (0..n).map(|i| xv[i] + yv[i]).collect();
        assert_eq!(outputs[2].to_vec::<f32>()?, sums);
    }
    Ok(())
}

#[test]
fn a_replay_repeats_in_place_updates_and_cublas_matmuls() -> Result<()> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dev = CudaDevice::get(0)?;
    let (_stream, _on) = own_stream(&dev)?;
    let (m, k, n) = (64, 48, 32);
    let a = Tensor::from_vec(values(m * k, 21), [m, k], GPU)?;
    let b = Tensor::from_vec(values(k * n, 22), [k, n], GPU)?;
    let acc = Tensor::zeros([m, n], DType::F32, GPU)?;
    let record = || -> Result<()> {
        let p = ops::matmul(&a, &b)?;
        ops::add_into(&acc, &p, &acc)
    };
    record()?; // warm-up: cuBLAS handle, kernels
    let (graph, ()) = Graph::capture(&dev, record)?;
    let once = acc.to_vec::<f32>()?; // the warm-up's result: the capture itself ran nothing
    for _ in 0..4 {
        graph.replay()?;
    }
    // acc = 5·(a·b), each add rounding; compare with the same adds done eagerly.
    let product = ops::matmul(&a, &b)?;
    let eager = Tensor::from_vec(once, [m, n], GPU)?;
    for _ in 0..4 {
        ops::add_into(&eager, &product, &eager)?;
    }
    assert_eq!(bits(&acc)?, bits(&eager)?);
    // And the product against f64.
    let (av, bv, pv) = (a.to_vec::<f32>()?, b.to_vec::<f32>()?, product.to_vec::<f32>()?);
    for i in (0..m).step_by(7) {
        for j in (0..n).step_by(5) {
            let want: f64 = (0..k).map(|l| av[i * k + l] as f64 * bv[l * n + j] as f64).sum();
            assert!((pv[i * n + j] as f64 - want).abs() < 1e-4, "({i}, {j}): {} vs {want}", pv[i * n + j]);
        }
    }
    Ok(())
}

#[test]
fn fills_of_views_and_empty_edge_cases_are_captured_and_replayed() -> Result<()> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dev = CudaDevice::get(0)?;
    let (_stream, _on) = own_stream(&dev)?;
    let start = values(9, 31);
    let t = Tensor::from_vec(start.clone(), [9], GPU)?;
    let h = Tensor::from_vec(values(5, 32).into_iter().map(half::f16::from_f32).collect(), [5], GPU)?;
    // A fill of a view, one at an odd f16 offset, and ops whose results are zeros by a fill: a
    // sum over an empty dim and a product with an empty inner dimension.
    let record = || -> Result<[Tensor; 2]> {
        t.flat_slice(2, 4)?.fill_(-4.5)?;
        h.flat_slice(1, 3)?.fill_(0.25)?;
        let empty = Tensor::empty([3, 0], DType::F32, GPU)?;
        Ok([ops::sum_dim(&empty, 1, false)?, ops::matmul(&empty, &Tensor::empty([0, 2], DType::F32, GPU)?)?])
    };
    record()?;
    t.copy_from_(&Tensor::from_vec(start.clone(), [9], GPU)?)?;
    h.fill_(3.0)?;
    let (graph, [sums, product]) = Graph::capture(&dev, record)?;
    assert_eq!(t.to_vec::<f32>()?, start, "the capture ran nothing");
    sums.fill_(7.0)?;
    product.fill_(7.0)?;
    graph.replay()?;
    let mut want = start.clone();
    want[2..6].fill(-4.5);
    assert_eq!(t.to_vec::<f32>()?, want);
    assert_eq!(h.to_vec::<half::f16>()?, [3.0, 0.25, 0.25, 0.25, 3.0].map(half::f16::from_f32));
    assert_eq!(sums.to_vec::<f32>()?, [0.0; 3]);
    assert_eq!(product.to_vec::<f32>()?, [0.0; 6]);
    Ok(())
}

#[test]
fn what_cannot_be_captured_is_a_typed_error_and_the_stream_stays_usable() -> Result<()> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dev = CudaDevice::get(0)?;
    let (stream, _on) = own_stream(&dev)?;
    let x = Tensor::from_vec(values(256, 5), [256], GPU)?;
    let cpu = Tensor::from_vec(values(4, 6), [4], Device::Cpu)?;
    let side = dev.new_stream()?;
    let elsewhere = {
        let _on_side = side.make_current();
        ops::scale(&x, 2.0)? // last written on `side`
    };
    let event = side.record_event()?;
    let labels = Labels::new(&[0, 1], GPU)?;

    let refused = |what: &str, expected_op: &str, record: &dyn Fn() -> Result<()>| -> Result<()> {
        match Graph::capture(&dev, record) {
            Err(Error::Capture { op, reason }) => {
                assert_eq!(op, expected_op, "{what}: {reason}");
                assert!(!reason.is_empty());
            }
            Err(other) => panic!("{what}: expected Error::Capture, got {other}"),
            Ok(_) => panic!("{what}: the capture succeeded"),
        }
        // The stream runs eager work again, and a later capture works.
        let y = ops::add(&x, &x)?;
        assert_eq!(y.to_vec::<f32>()?[3], 2.0 * x.to_vec::<f32>()?[3], "{what}");
        Ok(())
    };
    refused("a host read", "Tensor::to_vec", &|| ops::add(&x, &x)?.to_vec::<f32>().map(drop))?;
    refused("a host write", "Tensor::write", &|| Tensor::from_vec(vec![1.0f32; 8], [8], GPU).map(drop))?;
    refused("a stream synchronize", "Stream::synchronize", &|| stream.synchronize())?;
    refused("a device synchronize", "CudaDevice::synchronize", &|| dev.synchronize())?;
    refused("an event wait", "Stream::wait", &|| stream.wait(&event))?;
    refused("a CPU op", "add", &|| ops::add(&cpu, &cpu).map(drop))?;
    refused("an operand of another stream", "mul_f32", &|| ops::mul(&x, &elsewhere).map(drop))?;
    refused("a label upload", "Labels::new", &|| Labels::new(&[1, 0], GPU).map(drop))?;
    refused("a label read", "Labels::to_vec", &|| labels.to_vec().map(drop))?;
    refused("a nested capture", "Graph::capture", &|| Graph::capture(&dev, || ops::add(&x, &x)).map(drop))?;
    // The closure's own error comes back as it was.
    let own = Graph::capture(&dev, || -> Result<()> {
        ops::add(&x, &x)?;
        Err(Error::InvalidArgument { op: "mine", reason: "stop".into() })
    });
    assert!(matches!(own, Err(Error::InvalidArgument { op: "mine", .. })));

    let (graph, y) = Graph::capture(&dev, || ops::add(&x, &x))?;
    graph.replay()?;
    assert_eq!(bits(&y)?, bits(&ops::add(&x, &x)?)?);
    Ok(())
}

#[test]
fn memory_stays_flat_over_ten_thousand_replays() -> Result<()> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dev = CudaDevice::get(0)?;
    let (stream, _on) = own_stream(&dev)?;
    let n = 1 << 16;
    let (x, y, w) = (
        Tensor::from_vec(values(n, 31), [n], GPU)?,
        Tensor::from_vec(values(n, 32), [n], GPU)?,
        Tensor::from_vec(values(n, 33), [n], GPU)?,
    );
    step(&x, &y, &w)?;
    // Temporaries freed during the capture go back to the graph's pool for its later
    // allocations: ten chained ops of one size need a few blocks, not ten.
    let (graph, outputs) = Graph::capture(&dev, || {
        let mut t = ops::add(&x, &y)?;
        for _ in 0..10 {
            t = ops::mul(&t, &w)?;
        }
        let [loss, gxy, gw] = step(&t, &y, &w)?;
        Ok::<_, Error>([loss, gxy, gw, t])
    })?;
    let block = 4 * n;
    assert!(graph.pool_bytes() <= 6 * block + 4096, "pool of {} bytes for blocks of {block}", graph.pool_bytes());
    graph.replay()?;
    stream.synchronize()?;
    let (free_before, _) = dev.memory_info()?;
    let (pool_before, cached_before) = (graph.pool_bytes(), dev.cached_block_bytes());
    for _ in 0..10_000 {
        graph.replay()?;
    }
    stream.synchronize()?;
    let (free_after, _) = dev.memory_info()?;
    assert_eq!(graph.pool_bytes(), pool_before);
    assert_eq!(dev.cached_block_bytes(), cached_before);
    // The driver's count moves only if something allocated; allow for other processes' noise.
    assert!(free_before.abs_diff(free_after) < 8 << 20, "free memory {free_before} -> {free_after}");
    let first = outputs[3].to_vec::<f32>()?;
    graph.replay()?;
    assert_eq!(outputs[3].to_vec::<f32>()?, first, "the same inputs give the same values");
    Ok(())
}

#[test]
fn the_graph_keeps_what_it_uses_alive_and_orders_replays_across_streams() -> Result<()> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dev = CudaDevice::get(0)?;
    let (_stream, _on) = own_stream(&dev)?;
    let n = 4096;
    let x = Tensor::from_vec(values(n, 41), [n], GPU)?;
    let w = Tensor::from_vec(values(n, 42), [n], GPU)?;
    let w_values = w.to_vec::<f32>()?;
    let (graph, z) = Graph::capture(&dev, || ops::mul(&x, &w))?;
    drop(w); // the graph still holds its memory
    // Allocations of the same size must not get w's memory while the graph lives.
    let decoys: Vec<Tensor> = (0..8).map(|k| Tensor::full(k as f64, [n], DType::F32, GPU)).collect::<Result<_>>()?;

    // A new input written on another stream: the replay waits for it, and a reader of the
    // output on that stream waits for the replay.
    let side = dev.new_stream()?;
    let fresh = values(n, 43);
    let read_back = {
        let _on_side = side.make_current();
        x.copy_from_(&Tensor::from_vec(fresh.clone(), [n], GPU)?)?;
        drop(_on_side);
        graph.replay()?;
        let _on_side = side.make_current();
        ops::scale(&z, 1.0)?.to_vec::<f32>()?
    };
    let want: Vec<f32> = fresh.iter().zip(&w_values).map(|(a, b)| a * b).collect();
    assert_eq!(read_back, want);
    drop(decoys);
    Ok(())
}

/// A grouped Adam step's operands from each parameter's `[param, grad, m, v]`.
fn adam_slots(set: &[[Tensor; 4]]) -> Vec<opsmith_host::ops::AdamTensors<'_>> {
    set.iter().map(|[param, grad, m, v]| opsmith_host::ops::AdamTensors { param, grad, m, v }).collect()
}

/// The ops that do two launches' work in one record one node: a cross-entropy mean of up to
/// 4096 short rows, and a whole Adam step (advance and update) of up to four parameters of up
/// to 1024 packs of 4; one past either limit, the two launches (three for five parameters: the
/// advance and two groups). Each replay gives what the eager op gives.
#[test]
fn ops_fused_for_small_sizes_record_one_node() -> Result<()> {
    use opsmith_host::ops::{AdamHyper, AdamState};
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dev = CudaDevice::get(0)?;
    let (_stream, _on) = own_stream(&dev)?;
    for (rows, nodes) in [(4096usize, 1), (4097, 2)] {
        let logits = Tensor::from_vec(values(rows * 2, 41), [rows, 2], GPU)?;
        let classes: Vec<u32> = (0..rows).map(|r| (r % 3 % 2) as u32).collect();
        let labels = Labels::new(&classes, GPU)?;
        let eager = ops::cross_entropy(&logits, &labels)?.to_vec::<f32>()?[0];
        let (graph, loss) = Graph::capture(&dev, || ops::cross_entropy(&logits, &labels))?;
        assert_eq!(graph.node_count(), nodes, "cross_entropy of {rows} rows: {graph:?}");
        graph.replay()?;
        assert_eq!(loss.to_vec::<f32>()?[0].to_bits(), eager.to_bits(), "cross_entropy of {rows} rows");
    }
    let hyper = AdamHyper { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 };
    for (sizes, nodes) in [(&[4096usize][..], 1), (&[4093, 6][..], 2), (&[3, 5, 3, 7, 3][..], 3)] {
        // Each parameter twice, [p, g, m, v]: one stepped eagerly, one by the replay.
        let make = || -> Result<Vec<[Tensor; 4]>> {
            sizes
                .iter()
                .enumerate()
                .map(|(k, &n)| {
                    let (p, g) = (values(n, 50 + k as u64), values(n, 60 + k as u64));
                    let zeros = || Tensor::zeros([n], DType::F32, GPU);
                    Ok([Tensor::from_vec(p, [n], GPU)?, Tensor::from_vec(g, [n], GPU)?, zeros()?, zeros()?])
                })
                .collect()
        };
        let (eager, replayed) = (make()?, make()?);
        let (eager_state, state) = (AdamState::new(1e-2, GPU)?, AdamState::new(1e-2, GPU)?);
        let (eager_slots, replayed_slots) = (adam_slots(&eager), adam_slots(&replayed));
        let (graph, ()) = Graph::capture(&dev, || ops::adam_advance_step_group(&replayed_slots, &state, &hyper))?;
        assert_eq!(graph.node_count(), nodes, "Adam over {sizes:?}: {graph:?}");
        for step in 1..=2u64 {
            ops::adam_advance_step_group(&eager_slots, &eager_state, &hyper)?;
            graph.replay()?;
            assert_eq!(state.step()?, step, "Adam over {sizes:?}");
            for (k, (a, b)) in eager.iter().zip(&replayed).enumerate() {
                for i in [0, 2, 3] {
                    let (a, b) = (a[i].to_vec::<f32>()?, b[i].to_vec::<f32>()?);
                    assert!(
                        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "Adam over {sizes:?}: step {step}, parameter {k}, tensor {i}"
                    );
                }
            }
        }
    }
    Ok(())
}

/// Whether this run records parallel branches (`OPSMITH_GRAPH_BRANCHES=0` turns them off).
fn branches_on() -> bool {
    std::env::var(opsmith_host::cuda::GRAPH_BRANCHES_ENV).as_deref() != Ok("0")
}

#[test]
fn independent_kernels_become_branches_and_every_hazard_keeps_its_order() -> Result<()> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dev = CudaDevice::get(0)?;
    let (_stream, _on) = own_stream(&dev)?;
    let n = 4096;
    let (xv, yv) = (values(n, 21), values(n, 22));
    let x = Tensor::from_vec(xv.clone(), [n], GPU)?;
    let y = Tensor::from_vec(yv.clone(), [n], GPU)?;
    let one = Tensor::from_vec(vec![1.0f32; n], [n], GPU)?;
    // The nodes, the longest chain and the edges a capture must record (without branches,
    // every node follows the one before: one chain).
    let chain = |nodes: usize, depth: usize, edges: usize, graph: &Graph| {
        let expected = if branches_on() { (nodes, depth, edges) } else { (nodes, nodes, nodes - 1) };
        assert_eq!((graph.node_count(), graph.depth(), graph.edge_count()), expected, "{graph:?}");
    };
    ops::add(&x, &y)?; // loads the kernels outside the captures

    // One node, no edges: a chain of one (the edge query must not be asked for zero edges).
    let (graph, sum) = Graph::capture(&dev, || ops::add(&x, &y))?;
    assert_eq!((graph.node_count(), graph.depth(), graph.edge_count()), (1, 1, 0), "{graph:?}");
    assert_eq!(graph.programmatic_edges(), 0, "{graph:?}");
    graph.replay()?;
    assert_eq!(sum.to_vec::<f32>()?, xv.iter().zip(&yv).map(|(&x, &y)| x + y).collect::<Vec<_>>());

    // Two chains that share no memory, joined at the end: 5 nodes, 3 in a row. (The
    // temporaries are held: a block given back to the pool and reused would order the chains.)
    let (graph, (z, _temporaries)) = Graph::capture(&dev, || {
        let (x2, y2) = (ops::add(&x, &x)?, ops::add(&y, &y)?);
        let (a, b) = (ops::mul(&x2, &x)?, ops::mul(&y2, &y)?);
        Ok::<_, Error>((ops::add(&a, &b)?, [x2, y2, a, b]))
    })?;
    chain(5, 3, 4, &graph);
    graph.replay()?;
    let expected: Vec<f32> = xv.iter().zip(&yv).map(|(&x, &y)| (x + x) * x + (y + y) * y).collect();
    assert_eq!(z.to_vec::<f32>()?, expected);

    // Read x, then write it in place, then read both: the write waits for the read before it
    // (write after read), and the last read for the write (read after write) and the first.
    let (graph, (first, last)) = Graph::capture(&dev, || {
        let first = ops::add(&x, &x)?;
        ops::add_into(&x, &one, &x)?;
        let last = ops::add(&first, &x)?;
        Ok::<_, Error>((first, last))
    })?;
    chain(3, 3, 3, &graph);
    for round in 1..=3 {
        graph.replay()?;
        // Before replay r, x holds x0 + (r - 1).
        let before: Vec<f32> = xv.iter().map(|&v| v + (round - 1) as f32).collect();
        let first_expected: Vec<f32> = before.iter().map(|&v| v + v).collect();
        assert_eq!(first.to_vec::<f32>()?, first_expected, "replay {round}");
        let last_expected: Vec<f32> = first_expected.iter().zip(&before).map(|(&f, &v)| f + (v + 1.0)).collect();
        assert_eq!(last.to_vec::<f32>()?, last_expected, "replay {round}");
    }
    x.copy_from_(&Tensor::from_vec(xv.clone(), [n], GPU)?)?;

    // A temporary's block, given back to the graph's pool and handed to a new tensor: the new
    // tensor's writer waits for the old one's last reader, and through it for the old writer
    // (no edge of its own: 2 edges, not 3).
    let (graph, (u, v)) = Graph::capture(&dev, || {
        let t = ops::add(&x, &x)?;
        let u = ops::mul(&t, &t)?;
        drop(t);
        let v = ops::add(&y, &y)?; // t's block, same size
        Ok::<_, Error>((u, v))
    })?;
    chain(3, 3, 2, &graph);
    graph.replay()?;
    assert_eq!(u.to_vec::<f32>()?, xv.iter().map(|&x| (x + x) * (x + x)).collect::<Vec<_>>());
    assert_eq!(v.to_vec::<f32>()?, yv.iter().map(|&y| y + y).collect::<Vec<_>>());

    // Fills and copies are branches too: each writes one allocation (and a copy reads one).
    let spare = Tensor::zeros([n], DType::F32, GPU)?;
    let (graph, (a, filled, _held)) = Graph::capture(&dev, || {
        let a = ops::add(&x, &x)?;
        spare.copy_from_(&one)?;
        let filled = Tensor::full(3.0, [n], DType::F32, GPU)?;
        let x2 = ops::add(&x, &spare)?; // after the copy
        Ok::<_, Error>((a, filled, x2))
    })?;
    chain(4, 2, 1, &graph);
    graph.replay()?;
    assert_eq!(a.to_vec::<f32>()?, xv.iter().map(|&x| x + x).collect::<Vec<_>>());
    assert_eq!(spare.to_vec::<f32>()?, vec![1.0f32; n]);
    assert_eq!(filled.to_vec::<f32>()?, vec![3.0f32; n]);

    // Other work (a cuBLAS product) is a fence: it waits for everything before it, and
    // everything after waits for it, whatever memory each uses.
    let m = 128; // 2^21 multiply-adds: past opsmith's small products, so cuBLAS
    let (am, bm) =
        (Tensor::from_vec(values(m * m, 23), [m, m], GPU)?, Tensor::from_vec(values(m * m, 24), [m, m], GPU)?);
    ops::matmul(&am, &bm)?; // creates the cuBLAS handle outside the capture
    let (graph, (a, _product, b)) = Graph::capture(&dev, || {
        let a = ops::add(&x, &x)?;
        let product = ops::matmul(&am, &bm)?;
        let b = ops::add(&y, &y)?;
        Ok::<_, Error>((a, product, b))
    })?;
    if branches_on() {
        assert_eq!(graph.depth(), graph.node_count(), "{graph:?}");
    }
    graph.replay()?;
    assert_eq!(a.to_vec::<f32>()?, xv.iter().map(|&x| x + x).collect::<Vec<_>>());
    assert_eq!(b.to_vec::<f32>()?, yv.iter().map(|&y| y + y).collect::<Vec<_>>());
    Ok(())
}

/// Programmatic dependent launch: on sm_90 and newer opsmith's kernels are launched before the
/// kernel ahead of them finishes, and each waits for it before touching memory. A chain where
/// every kernel reads what the one before it wrote (multi-wave adds of 2^21 elements, with
/// sums of the whole tensor between them, and memory freed and reused along the way) must then
/// give exactly the sequential results, eagerly and replayed.
#[test]
fn dependent_launches_see_every_write_of_the_kernels_before_them() -> Result<()> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dev = CudaDevice::get(0)?;
    let (_stream, _on) = own_stream(&dev)?;
    let (major, _) = dev.compute_capability()?;
    let off = std::env::var(opsmith_host::cuda::DEPENDENT_LAUNCH_ENV).as_deref() == Ok("0");
    assert_eq!(dev.kernel("add_f32")?.dependent_launch(), major >= 9 && !off);

    let n = 1 << 21;
    // Small integers: every add is exact, so the chain's values are known exactly.
    let xv: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1001) as f32 - 500.0).collect();
    let x = Tensor::from_vec(xv.clone(), [n], GPU)?;
    let one = Tensor::from_vec(vec![1.0f32; n], [n], GPU)?;
    let steps = 24;
    let chain = || -> Result<(Tensor, Vec<Tensor>)> {
        let (mut t, mut sums) = (x.clone(), Vec::new());
        for k in 0..steps {
            t = ops::add(&t, &one)?;
            if k % 3 == 0 {
                sums.push(ops::sum(&t)?);
            }
        }
        Ok((t, sums))
    };
    let base: f64 = xv.iter().map(|&v| v as f64).sum();
    let check = |t: &Tensor, sums: &[Tensor], what: &str| -> Result<()> {
        let got = t.to_vec::<f32>()?;
        let wrong = (0..n).find(|&i| got[i] != xv[i] + steps as f32);
        assert_eq!(wrong.map(|i| (i, got[i])), None, "{what}: x + {steps} is wrong at (index, value)");
        for (j, s) in sums.iter().enumerate() {
            let k = 3 * j + 1;
            let expected = base + (k * n) as f64;
            let got = s.to_vec::<f32>()?[0] as f64;
            assert!(
                (got - expected).abs() <= 1e-6 * expected.abs().max(1.0),
                "{what}: sum after {k} adds: {got} vs {expected}"
            );
        }
        Ok(())
    };
    let (t, sums) = chain()?;
    check(&t, &sums, "eager")?;
    let (graph, (gt, gsums)) = Graph::capture(&dev, chain)?;
    // Every kernel after the first follows a kernel: with dependent launch, by programmatic
    // edges (the plain edge query refuses such a graph, so this also checks the depth query).
    let early = major >= 9 && !off;
    assert_eq!(graph.programmatic_edges() > 0, early, "{graph:?}");
    assert!(graph.depth() >= steps, "the adds are a chain: {graph:?}");
    for round in 0..3 {
        graph.replay()?;
        check(&gt, &gsums, &format!("replay {round}"))?;
    }
    Ok(())
}
