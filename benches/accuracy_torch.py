"""PyTorch's normwise relative errors on the inputs that host/tests/gpu_accuracy.rs wrote with
OPSMITH_ACCURACY_DUMP=DIR: the same mean, softmax and softmax backward, in f32 on CUDA, against
float64 on the CPU.

    python3 benches/accuracy_torch.py DIR
"""
import sys
import numpy as np
import torch

d = sys.argv[1]


def normwise(got, exact):
    got = got.double().cpu()
    return ((got - exact).norm() / exact.norm()).item()


x = torch.from_numpy(np.fromfile(f"{d}/mean_x.f32", dtype="<f4"))
print(f"torch mean of {x.numel()}: normwise relative error {normwise(x.cuda().mean().reshape(1), x.double().mean().reshape(1)):.3e}")

x = torch.from_numpy(np.fromfile(f"{d}/softmax_x.f32", dtype="<f4")).reshape(64, 40000)
g = torch.from_numpy(np.fromfile(f"{d}/softmax_g.f32", dtype="<f4")).reshape(64, 40000)
y = torch.softmax(x.cuda(), dim=-1)
forward = normwise(y, torch.softmax(x.double(), dim=-1))
gx = torch._softmax_backward_data(g.cuda(), y, -1, torch.float32)
yd = y.double().cpu()
exact_gx = yd * (g.double() - (g.double() * yd).sum(-1, keepdim=True))
print(f"torch softmax [64, 40000]: forward {forward:.3e}, backward {normwise(gx, exact_gx):.3e}")
