#!/usr/bin/env python3
"""PyTorch's side of opsmith's attention benchmark (examples/attention_bench.rs, issue #20):
torch.nn.functional.scaled_dot_product_attention with one backend forced at a time, on the same
grid, timed and counted the same way.

    python3 benches/attention_torch.py [--quick] [--seqs 1024,2048] [--head-dims 64,128]
        [--dtype bf16,f16] [--batch 4] [--heads 16] [--no-backward] [--no-math]

Grid: batch 4 x heads 16, seq_q = seq_k in {1024, 2048, 4096, 8192} (--quick: 1024, 4096),
head_dim in {64, 128}, bf16 and f16, causal off and on; no mask, scale 1/sqrt(head_dim);
q, k, v and the output gradient dO standard normal.

Backends, each forced with torch.nn.attention.sdpa_kernel: FLASH_ATTENTION, CUDNN_ATTENTION,
and MATH (the composed reference, as opsmith's composed path) at seq <= 2048 unless --no-math.
A backend that cannot take a shape (or runs out of memory) prints "skipped: <error>" and the
run goes on.

Timing, as opsmith's `cuda::time_runs`: warm-up runs (5; 2 with --quick), then timed runs (20;
5) each between two CUDA events, all queued behind a GPU spin (torch.cuda._sleep) so they run
back to back; the median run (the upper middle one). Forward: one call under torch.no_grad().
Forward + backward: the call on q, k, v that require grad, then torch.autograd.grad(out,
(q, k, v), dO) for a fixed random dO (fresh gradients, .grad untouched, no loss op).

FLOPs, FlashAttention's benchmark convention: forward = 4*b*h*s_q*s_k*d (the two products),
halved when causal; backward = 2.5 x forward, so forward + backward = 3.5 x forward.

Check, at seq <= 2048: the backend's output against the MATH backend on the same inputs cast
to f32, the largest absolute difference (nan if either has a NaN).
"""
import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = [
    ("flash", SDPBackend.FLASH_ATTENTION),
    ("cudnn", SDPBackend.CUDNN_ATTENTION),
    ("math", SDPBackend.MATH),
]
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
CHECK_MAX_SEQ = 2048  # the f32 reference holds [b, h, s, s] f32 scores
MATH_MAX_SEQ = 2048  # the MATH backend holds them in the dtype, and in f32 for its softmax


def median_ms(fn, warmup, reps):
    """Median of `reps` event-timed runs after `warmup`, queued as opsmith's `cuda::time_runs`
    queues them: a GPU spin long enough for the host to queue every timed run first, then one
    synchronize, so each pair of events measures GPU time, not the host's pace."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    queued = time.perf_counter()
    fn()
    host_s = time.perf_counter() - queued
    torch.cuda.synchronize()
    # ~2e9 cycles a second on an H100/H200 SM; a slower clock only lengthens the lead.
    torch.cuda._sleep(int(min(2 * reps * host_s, 0.2) * 2e9))
    events = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return statistics.median_high(start.elapsed_time(end) for start, end in events)


def forward_flops(batch, heads, seq, head_dim, causal):
    full = 4.0 * batch * heads * seq * seq * head_dim
    return full / 2 if causal else full


def max_abs_diff(out, q, k, v, scale, causal):
    """The largest |out - reference|, the reference the MATH backend on f32 copies."""
    with sdpa_kernel(SDPBackend.MATH):
        reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal, scale=scale)
    diff = (out.float() - reference).abs()
    return float("nan") if diff.isnan().any() else diff.max().item()


def attempt(label, what, fn):
    """fn(), or None after printing why it failed (no kernel for the shape, out of memory)."""
    try:
        return fn()
    except (RuntimeError, ValueError) as e:  # torch.OutOfMemoryError is a RuntimeError
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"{label}: {what} skipped: {first_line}", flush=True)
        torch.cuda.empty_cache()  # what the failed call cached, for the next shape
        return None


def measure(args, backend_name, backend, dtype_name, causal, head_dim, seq, warmup, reps):
    """One row: (fwd ms, fwd+bwd ms, max abs diff), each None when skipped or "-" when not run."""
    label = f"torch {backend_name} {dtype_name} {'causal' if causal else 'full'} d={head_dim} seq={seq}"
    shape = (args.batch, args.heads, seq, head_dim)
    g = torch.Generator(device="cuda").manual_seed(seq * 1000 + head_dim)
    q, k, v, dout = (torch.randn(shape, dtype=DTYPES[dtype_name], device="cuda", generator=g) for _ in range(4))
    scale = head_dim**-0.5

    def forward():
        with torch.no_grad(), sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))

    def forward_backward():
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, scale=scale)
        torch.autograd.grad(out, (qg, kg, vg), dout)

    diff = "-"
    if seq <= CHECK_MAX_SEQ:
        diff = attempt(label, "check", lambda: max_abs_diff(forward(), q, k, v, scale, causal))
    fwd = attempt(label, "forward", lambda: median_ms(forward, warmup, reps))
    fwd_bwd = "-"
    if not args.no_backward:
        fwd_bwd = attempt(label, "forward+backward", lambda: median_ms(forward_backward, warmup, reps))
    return fwd, fwd_bwd, diff


def cell(value, fmt):
    if value is None:
        return "skipped"
    return value if isinstance(value, str) else fmt(value)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="seq 1024 and 4096 (unless --seqs), 2 + 5 runs")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seqs", help="comma-separated [default: 1024,2048,4096,8192]")
    parser.add_argument("--head-dims", default="64,128", help="comma-separated [default: 64,128]")
    parser.add_argument("--dtype", default="bf16,f16", help="comma-separated, of bf16 and f16")
    parser.add_argument("--no-backward", action="store_true", help="the forward only")
    parser.add_argument("--no-math", action="store_true", help="leave out the MATH backend")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("attention_torch.py needs a CUDA device", file=sys.stderr)
        sys.exit(2)
    seqs = [int(s) for s in args.seqs.split(",")] if args.seqs else ([1024, 4096] if args.quick else [1024, 2048, 4096, 8192])
    head_dims = [int(d) for d in args.head_dims.split(",")]
    dtypes = args.dtype.split(",")
    for name in dtypes:
        if name not in DTYPES:
            parser.error(f"--dtype: {name!r} is not one of {', '.join(DTYPES)}")
    warmup, reps = (2, 5) if args.quick else (5, 20)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}", flush=True)

    rows = []
    for backend_name, backend in BACKENDS:
        for dtype_name in dtypes:
            for causal in (False, True):
                for head_dim in head_dims:
                    for seq in seqs:
                        if backend == SDPBackend.MATH and (args.no_math or seq > MATH_MAX_SEQ):
                            continue
                        fwd, fwd_bwd, diff = measure(
                            args, backend_name, backend, dtype_name, causal, head_dim, seq, warmup, reps
                        )
                        flops = forward_flops(args.batch, args.heads, seq, head_dim, causal)
                        row = [
                            f"torch {backend_name}",
                            dtype_name,
                            str(causal).lower(),
                            str(head_dim),
                            str(seq),
                            cell(fwd, "{:.3f}".format),
                            cell(fwd, lambda ms: f"{flops / ms / 1e9:.1f}"),
                            cell(fwd_bwd, "{:.3f}".format),
                            cell(fwd_bwd, lambda ms: f"{3.5 * flops / ms / 1e9:.1f}"),
                            cell(diff, "{:.2e}".format),
                        ]
                        print(", ".join(row), flush=True)
                        rows.append(row)

    print(
        f"\nattention_torch.py on {torch.cuda.get_device_name()}: batch {args.batch}, heads {args.heads}, "
        f"median of {reps} runs after {warmup} warm-up; FLOPs fwd = 4*b*h*s^2*d (/2 causal), "
        f"fwd+bwd = 3.5 x fwd; max abs diff: against f32 MATH, seq <= {CHECK_MAX_SEQ}"
    )
    print("| backend | dtype | causal | head_dim | seq | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
