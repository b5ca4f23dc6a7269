#!/usr/bin/env python3
"""PyTorch's side of the comparison: the same ops on the same GPU, timed the same way as
opsmith's `bandwidth` example (CUDA events, warm-up, every run queued behind a GPU spin,
median of 30), with the bytes each
version must move printed beside its time.

    python3 benches/torch_compare.py [--quick | --host-only]

Compared:
  * d = a*b + c: eager (two kernels), torch.addcmul (one), torch.compile (one, generated);
  * z = (x+y)*w forward + backward from a given gradient: eager autograd and torch.compile'd
    autograd, gradients cleared between steps the way a training loop clears them (grad = None);
  * softmax(x*scale + mask) along the last axis, with a full additive mask: eager (three
    kernels) and torch.compile (one, generated), forward and forward + backward from a given
    gradient, at the shapes of the `bandwidth` example's softmax section. Bytes are what the op
    must move (x, mask, y: 3 values an element forward; g, y, gx: 3 more backward), as there;
  * host overhead at n = 1024: per op, and per forward+sum+backward step.
"""
import statistics
import sys
import time

import torch

WARMUP, REPS = 5, 30
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
# (rows, cols): square matrices, and 2^24 elements as rows of 1024, 4096 and 16384 values.
SOFTMAX_SHAPES = [(1024, 1024), (4096, 4096), (8192, 8192), (16384, 1024), (1024, 16384)]
SOFTMAX_SCALE = 0.125


def median_ms(fn):
    """Median of REPS event-timed runs after WARMUP, queued the way opsmith's `cuda::time_runs`
    queues them: a GPU spin (torch.cuda._sleep) long enough for the host to queue every timed
    run first, then one synchronize, so each pair of events measures GPU time, not host pace."""
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    queued = time.perf_counter()
    fn()
    host_s = time.perf_counter() - queued
    torch.cuda.synchronize()
    # ~2e9 cycles a second on an H100/H200 SM; a slower clock only lengthens the lead.
    torch.cuda._sleep(int(min(2 * REPS * host_s, 0.2) * 2e9))
    events = []
    for _ in range(REPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return statistics.median_high(start.elapsed_time(end) for start, end in events)


def random(n, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    sign = torch.where(torch.rand(n, device="cuda", generator=g) < 0.5, -1.0, 1.0)
    return (sign * (0.5 + 1.5 * torch.rand(n, device="cuda", generator=g))).to(dtype)


def main():
    quick = "--quick" in sys.argv
    sizes = [20, 24] if quick else [24, 26, 28]
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    if "--host-only" in sys.argv:
        host_overhead()
        return
    n = 1 << sizes[-1]
    src, dst = random(n, torch.float32, 1), torch.empty(n, device="cuda")
    copy_ms = median_ms(lambda: dst.copy_(src))
    copy_gbs = 2 * n * 4 / copy_ms / 1e6
    del src, dst
    print(f"device-to-device copy, 2^{sizes[-1]} f32: {copy_ms:.3f} ms, {copy_gbs:.0f} GB/s (read + write)")

    fma_compiled = torch.compile(lambda a, b, c: a * b + c)

    def add_mul_fn(x, y, w):
        return (x + y) * w

    add_mul_compiled = torch.compile(add_mul_fn)
    rows = []
    for log2n in sizes:
        n = 1 << log2n
        for name, dtype in DTYPES.items():
            size = torch.tensor([], dtype=dtype).element_size()
            a, b, c, g = (random(n, dtype, s) for s in (10, 11, 12, 13))

            def row(what, values, ms):
                rows.append((what, name, log2n, ms, values * n * size))

            row("torch eager a*b+c", 6, median_ms(lambda: a * b + c))
            row("torch.addcmul", 4, median_ms(lambda: torch.addcmul(c, a, b)))
            row("torch.compile a*b+c", 4, median_ms(lambda: fma_compiled(a, b, c)))
            x, y, w = (t.clone().requires_grad_(True) for t in (a, b, c))

            def step(fn):
                def run():
                    x.grad = y.grad = w.grad = None
                    fn(x, y, w).backward(g)
                return run

            # eager: add (3 values) and mul (3) forward; mul's backward (6); add's backward hands
            # the same gradient to x and y.
            row("torch eager (x+y)*w fwd+bwd", 12, median_ms(step(add_mul_fn)))
            # compiled: one fused kernel forward (4), one backward (g, x, y, w in; gx, gw out: 6).
            row("torch.compile (x+y)*w fwd+bwd", 10, median_ms(step(add_mul_compiled)))
            del a, b, c, g, x, y, w

    softmax_rows(rows, quick)

    print("\n| op | dtype | n | median ms | bytes moved | GB/s | % of copy |")
    print("|---|---|---|---|---|---|---|")
    for what, dtype, log2n, ms, nbytes in rows:
        gbs = nbytes / ms / 1e6
        print(f"| {what} | {dtype} | 2^{log2n} | {ms:.4f} | {nbytes:.3e} | {gbs:.0f} | {100 * gbs / copy_gbs:.1f}% |")
    host_overhead()


def host_overhead():
    """Host time per op and per step at n = 1024 (the `bandwidth` example's last table)."""
    n, iters = 1024, 2000
    a, b, c, g = (random(n, torch.float32, s) for s in (20, 21, 22, 23))
    x, y, w = (t.clone().requires_grad_(True) for t in (a, b, c))

    def per_call_us(fn):
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e6 / iters

    def step():
        x.grad = y.grad = w.grad = None
        ((x + y) * w).sum().backward()

    print(f"\nhost overhead at n = 1024, f32 (wall time per call, {iters} calls, one synchronize):")
    print("| what | µs per call |")
    print("|---|---|")
    print(f"| torch.addcmul | {per_call_us(lambda: torch.addcmul(c, a, b)):.2f} |")
    print(f"| torch eager a*b+c | {per_call_us(lambda: a * b + c):.2f} |")
    print(f"| torch eager step: (x+y)*w, sum, backward | {per_call_us(step):.2f} |")


def masked_softmax(x, mask):
    return torch.softmax(x * SOFTMAX_SCALE + mask, -1)


def softmax_rows(rows, quick):
    compiled = torch.compile(masked_softmax)
    shapes = [(4096, 4096)] if quick else SOFTMAX_SHAPES
    for r, c in shapes:
        dtypes = DTYPES.items() if (r, c) == (4096, 4096) else [("f32", torch.float32)]
        for name, dtype in dtypes:
            n = r * c
            size = torch.tensor([], dtype=dtype).element_size()
            x, mask, g = (random(n, dtype, s).view(r, c) for s in (60, 61, 62))

            def row(what, values, ms):
                rows.append((f"{what} [{r}x{c}]", name, n.bit_length() - 1, ms, values * n * size))

            row("torch eager softmax(x*s+mask) fwd", 3, median_ms(lambda: masked_softmax(x, mask)))
            row("torch.compile softmax(x*s+mask) fwd", 3, median_ms(lambda: compiled(x, mask)))
            xg = x.clone().requires_grad_(True)

            def step(fn):
                def run():
                    xg.grad = None
                    fn(xg, mask).backward(g)
                return run

            row("torch eager softmax(x*s+mask) fwd+bwd", 6, median_ms(step(masked_softmax)))
            row("torch.compile softmax(x*s+mask) fwd+bwd", 6, median_ms(step(compiled)))
            del x, mask, g, xg


if __name__ == "__main__":
    main()
