"""Time the elementwise C++ CPU kernels against the PyTorch paths they replace, on CPU.

    python benchmarks/bench_cpu_kernels.py                 # the two bench sizes of docs/performance.md
    python benchmarks/bench_cpu_kernels.py --repeats 50 --threads 1

Each op's forward and backward at a training step's shape (B 8, T 256): RMSNorm on [B, T, D],
SwiGLU on the halves of the fused [B, T, 2F] projection, the rotary q, k, v heads of the fused
[B, T, 3D] projection, and a recurrent mixer's step sizes softplus(x + bias) on [B, T, 2D] (Mamba's
delta at inner width E = 2D). The two paths are timed alternately, median of --repeats after a warm-up,
so a slow spell hits both; the last column is PyTorch over C++ from the same run.
Dimensions: B batch, T time, D model width, H heads, F MLP width.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from archsearch_kernels.rmsnorm import rms_norm_cpu
from archsearch_kernels.rope import rope_heads_cpu, rope_heads_naive, rope_tables
from archsearch_kernels.softplus import softplus_cpu
from archsearch_kernels.swiglu import swiglu_cpu

# (name, D, H, F): Transformer++ of benchmarks/bench_small.yaml and benchmarks/bench_llama.yaml
SIZES = [("d128", 128, 4, 352), ("d512", 512, 8, 1368)]


def cases(D: int, H: int, F_: int, batch: int, seq_len: int) -> list[tuple[str, Callable, Callable]]:
    """(op, PyTorch forward + backward, C++ forward + backward) at one size."""
    x = torch.randn(batch, seq_len, D, requires_grad=True)
    weight = torch.randn(D, requires_grad=True)
    dy = torch.randn(batch, seq_len, D)
    gate_up = torch.randn(batch, seq_len, 2 * F_, requires_grad=True)
    dh = torch.randn(batch, seq_len, F_)
    qkv = torch.randn(batch, seq_len, 3 * D, requires_grad=True)
    cos, sin = rope_tables(seq_len, D // H, 10000.0, torch.device("cpu"))
    dheads = [torch.randn(batch, H, seq_len, D // H) for _ in range(3)]
    steps, bias = torch.randn(batch, seq_len, 2 * D, requires_grad=True), torch.randn(2 * D, requires_grad=True)
    dsteps = torch.randn(batch, seq_len, 2 * D)
    grad = torch.autograd.grad  # the op's own backward, no accumulation into .grad
    return [
        ("rms_norm", lambda: grad(F.rms_norm(x, (D,), weight, 1e-6), [x, weight], dy),
         lambda: grad(rms_norm_cpu(x, weight, 1e-6), [x, weight], dy)),
        ("swiglu", lambda: grad((lambda g, u: F.silu(g) * u)(*gate_up.chunk(2, -1)), [gate_up], dh),
         lambda: grad(swiglu_cpu(*gate_up.chunk(2, -1)), [gate_up], dh)),
        ("rope_heads", lambda: grad(rope_heads_naive(qkv, H, cos, sin), [qkv], dheads),
         lambda: grad(rope_heads_cpu(qkv, H, cos, sin), [qkv], dheads)),
        ("softplus", lambda: grad(F.softplus(steps + bias), [steps, bias], dsteps),
         lambda: grad(softplus_cpu(steps, bias), [steps, bias], dsteps)),
    ]


def timed(fn: Callable) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}  threads {torch.get_num_threads()}  load avg {os.getloadavg()[0]:.2f}  "
          f"B {args.batch}  T {args.seq_len}  fwd+bwd, median of {args.repeats}")
    print(f"{'size':6s} {'op':12s} {'pytorch ms':>11s} {'c++ ms':>8s} {'speed-up':>9s}")
    for name, D, H, F_ in SIZES:
        for op, reference, kernel in cases(D, H, F_, args.batch, args.seq_len):
            times: dict[str, list[float]] = {"ref": [], "cpp": []}
            for i in range(args.repeats + 2):
                for key, fn in (("ref", reference), ("cpp", kernel)):
                    took = timed(fn)
                    if i >= 2:  # two warm-ups
                        times[key].append(took)
            ref, cpp = statistics.median(times["ref"]), statistics.median(times["cpp"])
            print(f"{name:6s} {op:12s} {1e3 * ref:11.3f} {1e3 * cpp:8.3f} {ref / cpp:8.1f}x")
    print(f"load avg at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
