#!/usr/bin/env python3
"""PyTorch's side of opsmith's CUDA-graph comparison: eager training steps against
`torch.cuda.graph` replays of the same steps, on one GPU.

    python3 benches/torch_graph.py [--quick] [--json PATH]
    python3 benches/torch_graph.py --cpu-smoke    # no GPU: one eager step of each, shapes only

Steps:
  * n = 1024: x, y, w are f32 leaves of 1024 elements that require grad; z = (x + y) * w,
    loss = z.sum(), and the gradients of loss for x, y and w from torch.autograd.grad (fresh
    tensors, .grad untouched): the same call eager and captured.
  * MLP, the shape of opsmith's train_mlp example: Linear(2, 128) -> ReLU -> Linear(128, 2) on
    a static [1024, 2] input with 1024 labels in {0, 1}, cross-entropy, backward, Adam(lr=0.02).

Modes:
  * eager: the step launched op by op. For the MLP, once with Adam's default (foreach) and once
    with capturable=True, the Adam that the graph captures.
  * graph: PyTorch's whole-network capture recipe (three warm-up steps on a side stream, grads
    set to None, the step captured in torch.cuda.graph), the step timed as g.replay() alone,
    on static inputs.
  * graph + copy_: each replay preceded by a copy_ into every static input from a pre-made
    device tensor, the way opsmith feeds a replay new data.

Timing: WARMUP steps, then REPEATS blocks of K back-to-back steps (K = 1000 for the n = 1024
step, 500 for the MLP). Around each block, CUDA events give GPU time, and time.perf_counter
around the same steps plus a closing torch.cuda.synchronize gives host wall time; each column
is the median over the blocks, per step, in µs. An eager step of small kernels is bound by the
host's launches, so the GPU waits on the host and its events read close to the wall time.

Checks (they stop the script if they fail): the graph's n = 1024 gradients equal eager's
exactly, also after copying new inputs in; and the MLP's parameters after the capture recipe
(3 eager warm-up steps, then N replays) are within 1e-6 of 3 + N eager steps of the capturable
Adam from the same initial weights.
"""
import argparse
import copy
import datetime
import json
import platform
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

SEED = 0
N = 1024  # elements of x, y and w; rows of the MLP's input
HIDDEN = 128
LR = 0.02
CAPTURE_WARMUP = 3  # eager steps on a side stream before a capture, as PyTorch's recipe runs
WARMUP = 100  # steps before the timed blocks
BLOCK_ADD_MUL, BLOCK_MLP = 1000, 500  # K, steps per timed block
REPEATS, QUICK_REPEATS = 7, 3
CHECK_REPLAYS = 100  # N, replays in the MLP's parameter check
MLP_TOLERANCE = 1e-6


def add_mul_grads(x, y, w):
    """The n = 1024 step: the gradients of sum((x + y) * w) for x, y and w."""
    loss = ((x + y) * w).sum()
    return torch.autograd.grad(loss, (x, y, w))


def make_mlp():
    """The MLP with the same initial weights on every call (they are drawn on the CPU)."""
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(2, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 2))


def mlp_update(model, opt, inputs, labels):
    """Forward, backward and Adam step, with every .grad None at the start, so that backward
    writes fresh gradients rather than adding to old ones."""
    loss = F.cross_entropy(model(inputs), labels)
    loss.backward()
    opt.step()
    return loss


def mlp_step(model, opt, inputs, labels):
    """One eager training step, gradients cleared the way zero_grad does by default."""
    opt.zero_grad(set_to_none=True)
    return mlp_update(model, opt, inputs, labels)


def random_leaves(gen, device):
    """x, y, w: random f32 leaves that require grad (drawn on the CPU, so any device gets the
    same values)."""
    return [torch.randn(N, generator=gen).to(device).requires_grad_() for _ in range(3)]


def random_batch(gen, device):
    """An MLP input [N, 2] and its N labels in {0, 1}."""
    inputs = torch.randn(N, 2, generator=gen)
    labels = torch.randint(0, 2, (N,), generator=gen)
    return inputs.to(device), labels.to(device)


def warm_up_on_side_stream(step):
    """The recipe's warm-up: a few eager steps on a side stream, so that lazy one-time work
    (cuBLAS handles and workspaces, Adam's state, autograd's first-use setup) happens outside
    the capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(CAPTURE_WARMUP):
            step()
    torch.cuda.current_stream().wait_stream(side)


def capture_add_mul(x, y, w):
    """A graph of the n = 1024 step and the gradient tensors that each replay rewrites."""
    warm_up_on_side_stream(lambda: add_mul_grads(x, y, w))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grads = add_mul_grads(x, y, w)
    return graph, grads


def capture_mlp(model, opt, inputs, labels):
    """A graph of the MLP's forward, backward and Adam step (opt must be capturable)."""
    warm_up_on_side_stream(lambda: mlp_step(model, opt, inputs, labels))
    # With every .grad None, backward in the capture allocates the gradients from the graph's
    # private pool, and each replay overwrites them there: no zero_grad inside the graph.
    opt.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mlp_update(model, opt, inputs, labels)
    return graph


def copy_then_replay(graph, static_inputs, new_inputs):
    """A replay fed new data: copy_ into each tensor the capture read, then replay."""

    def step():
        for static, new in zip(static_inputs, new_inputs):
            static.copy_(new)
        graph.replay()

    return step


def time_per_step(step, block, repeats):
    """Median µs per step over `repeats` blocks of `block` back-to-back steps, after WARMUP
    steps: by CUDA events around each block, and by host wall time up to the block's end on
    the GPU."""
    for _ in range(WARMUP):
        step()
    events_us, wall_us = [], []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        began = time.perf_counter()
        start.record()
        for _ in range(block):
            step()
        end.record()
        torch.cuda.synchronize()
        wall_us.append((time.perf_counter() - began) * 1e6 / block)
        events_us.append(start.elapsed_time(end) * 1e3 / block)
    return {
        "events_us": statistics.median(events_us),
        "wall_us": statistics.median(wall_us),
        "events_us_per_block": events_us,
        "wall_us_per_block": wall_us,
    }


def fail(message):
    raise SystemExit(f"check failed: {message}")


def bench_add_mul(gen, repeats, checks):
    x, y, w = random_leaves(gen, "cuda")
    new_inputs = [torch.randn(N, generator=gen).cuda() for _ in range(3)]
    rows = [("eager", time_per_step(lambda: add_mul_grads(x, y, w), BLOCK_ADD_MUL, repeats))]

    graph, static_grads = capture_add_mul(x, y, w)
    graph.replay()
    if not all(map(torch.equal, static_grads, add_mul_grads(x, y, w))):
        fail("n = 1024: the graph's gradients differ from eager's")
    rows.append(("graph", time_per_step(graph.replay, BLOCK_ADD_MUL, repeats)))

    # Detached aliases of the leaves: copy_ writes the same memory without autograd's refusal
    # of in-place writes to leaves that require grad (and without a no_grad block per step).
    static_inputs = [t.detach() for t in (x, y, w)]
    with_copy = copy_then_replay(graph, static_inputs, new_inputs)
    with_copy()
    if not all(map(torch.equal, static_grads, add_mul_grads(x, y, w))):
        fail("n = 1024: after copy_ of new inputs, the graph's gradients differ from eager's")
    checks["add_mul_grads_equal"] = True
    print("check: n = 1024 graph gradients equal eager's exactly (static inputs and copied-in inputs)")
    rows.append(("graph + copy_ of new inputs", time_per_step(with_copy, BLOCK_ADD_MUL, repeats)))
    return rows


def bench_mlp(gen, repeats, checks):
    inputs, labels = random_batch(gen, "cuda")
    new_inputs = random_batch(gen, "cuda")
    base = make_mlp().cuda()

    def fresh(capturable):
        model = copy.deepcopy(base)
        return model, torch.optim.Adam(model.parameters(), lr=LR, capturable=capturable)

    eager_model, eager_opt = fresh(capturable=True)
    graph_model, graph_opt = fresh(capturable=True)
    graph = capture_mlp(graph_model, graph_opt, inputs, labels)
    # The capture recipe's warm-up trained graph_model CAPTURE_WARMUP steps already.
    for _ in range(CAPTURE_WARMUP + CHECK_REPLAYS):
        mlp_step(eager_model, eager_opt, inputs, labels)
    for _ in range(CHECK_REPLAYS):
        graph.replay()
    diff = max((a - b).abs().max().item() for a, b in zip(eager_model.parameters(), graph_model.parameters()))
    checks["mlp_max_abs_diff"] = diff
    print(
        f"check: MLP parameters, {CAPTURE_WARMUP} warm-up steps + {CHECK_REPLAYS} replays against "
        f"{CAPTURE_WARMUP + CHECK_REPLAYS} eager capturable-Adam steps: max abs diff {diff:.3e} "
        f"(tolerance {MLP_TOLERANCE:.0e})"
    )
    if not diff <= MLP_TOLERANCE:
        fail(f"MLP: max abs diff {diff:.3e} > {MLP_TOLERANCE:.0e}")

    foreach_model, foreach_opt = fresh(capturable=False)
    steps = [
        ("eager (foreach Adam)", lambda: mlp_step(foreach_model, foreach_opt, inputs, labels)),
        ("eager (capturable Adam)", lambda: mlp_step(eager_model, eager_opt, inputs, labels)),
        ("graph", graph.replay),
        ("graph + copy_ of new inputs", copy_then_replay(graph, (inputs, labels), new_inputs)),
    ]
    return [(mode, time_per_step(step, BLOCK_MLP, repeats)) for mode, step in steps]


def cpu_smoke():
    """One eager step of each on the CPU, checking shapes only (no graphs, no timing)."""
    gen = torch.Generator().manual_seed(SEED)
    x, y, w = random_leaves(gen, "cpu")
    grads = add_mul_grads(x, y, w)
    assert len(grads) == 3 and all(g.shape == (N,) for g in grads), [g.shape for g in grads]

    inputs, labels = random_batch(gen, "cpu")
    model = make_mlp()
    # capturable=True needs the parameters on a GPU, so the default Adam here.
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    assert model(inputs).shape == (N, 2)
    loss = mlp_step(model, opt, inputs, labels)
    assert loss.shape == (), loss.shape
    assert all(p.grad.shape == p.shape for p in model.parameters())
    print(f"cpu smoke: shapes ok (torch {torch.__version__})")


def environment():
    props = torch.cuda.get_device_properties(0)
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": props.name,
        "sms": props.multi_processor_count,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_REPEATS} timed blocks per row instead of {REPEATS}")
    parser.add_argument("--json", metavar="PATH", help="also write the environment, numbers and checks as JSON")
    parser.add_argument("--cpu-smoke", action="store_true", help="no GPU: one eager step of each on the CPU, shapes only")
    args = parser.parse_args()
    if args.cpu_smoke:
        cpu_smoke()
        return
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device (for a check without one: --cpu-smoke)")

    env = environment()
    print(f"torch {env['torch']}, CUDA {env['cuda']}, {env['gpu']} ({env['sms']} SMs), python {env['python']}, {env['date']}")
    repeats = QUICK_REPEATS if args.quick else REPEATS
    print(
        f"timing: {WARMUP} warm-up steps, then the median of {repeats} blocks of {BLOCK_ADD_MUL} "
        f"(n = 1024) or {BLOCK_MLP} (MLP) back-to-back steps"
    )

    gen = torch.Generator().manual_seed(SEED)
    checks = {}
    sections = [
        ("n=1024 step", bench_add_mul(gen, repeats, checks)),
        ("mlp step", bench_mlp(gen, repeats, checks)),
    ]

    rows = []
    for step, timed in sections:
        eager_us = timed[0][1]["events_us"]  # each section's first row is its baseline
        for mode, timing in timed:
            rows.append({"step": step, "mode": mode, "speedup_vs_eager": eager_us / timing["events_us"], **timing})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "repeats": repeats, "warmup": WARMUP, "checks": checks, "rows": rows}, f, indent=2)
        print(f"wrote {args.json}")

    print("speedup: eager's µs/step (events) over the row's; the MLP's eager is the foreach Adam row\n")
    print("| step | mode | µs/step (events) | µs/step (wall) | speedup vs eager |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['step']} | {r['mode']} | {r['events_us']:.2f} | {r['wall_us']:.2f} | {r['speedup_vs_eager']:.2f}× |")


if __name__ == "__main__":
    main()
