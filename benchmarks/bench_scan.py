"""Time the reference loops against the chunked forms and C++ kernels of the three scan ops, on CPU.

    python benchmarks/bench_scan.py                       # T=512, the sizes in docs/performance.md
    python benchmarks/bench_scan.py --seq-len 2048 --repeats 3
    python benchmarks/bench_scan.py --ops ssd --threads 2
    python benchmarks/bench_scan.py --ops gated_delta --batch 8 --seq-len 256 --heads 8 --head-dim 16 --walks

Prints one row per (op, pass): median milliseconds of each form over --repeats runs after
one warm-up (the forms timed alternately), and the speed-up naive / chunked measured in
the same run. Each op also times its C++ CPU kernel (its cpu.py, built on first use) in the
same rounds and prints its time and speed-up over the loop beside the chunked form's; "-"
where it does not build here. With --walks it then times the C++ gated delta rule's two walks
(rows, lanes) against each other in one set of rounds.

Dimensions: B batch, T time, E inner channels, N state size, H heads, K/V head dims,
P SSD head dim, G SSD groups.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from archsearch_kernels.gated_delta import cpu as gated_delta_cpu
from archsearch_kernels.gated_delta import (
    gated_delta_rule_chunked,
    gated_delta_rule_naive,
)
from archsearch_kernels.selective_scan import cpu as selective_scan_cpu
from archsearch_kernels.selective_scan import (
    selective_scan_chunked,
    selective_scan_naive,
)
from archsearch_kernels.ssd import cpu as ssd_cpu
from archsearch_kernels.ssd import ssd_chunked, ssd_naive


def median_ms(fns: list[Callable[[], None]], repeats: int) -> list[float]:
    """Median wall times in ms of each callable, after one warm-up each.

    They are timed alternately, so load from other processes on a shared machine falls on
    all alike and their ratios stay meaningful even when the absolute times drift.
    """
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, bucket in zip(fns, times):
            start = time.perf_counter()
            fn()
            bucket.append(time.perf_counter() - start)
    return [1e3 * statistics.median(bucket) for bucket in times]


def mamba_inputs(args: argparse.Namespace) -> dict[str, torch.Tensor]:
    """Selective-scan arguments at Mamba-1 init scales (delta ~ 1e-3..1e-1, A = -(1..N))."""
    b, e, n, t = args.batch, args.channels, args.state_size, args.seq_len
    dt_E = torch.exp(torch.empty(e).uniform_(math.log(1e-3), math.log(1e-1)))
    return {
        # u, delta, z as a Mamba layer passes them: [B, E, T] views of [B, T, E] (channels adjacent)
        "u": torch.randn(b, t, e).transpose(1, 2),  # [B, E, T]
        "delta": 0.5 * torch.randn(b, t, e).transpose(1, 2),  # [B, E, T]
        "A": -torch.arange(1, n + 1).float().repeat(e, 1),  # [E, N]
        "B": torch.randn(b, n, t),  # [B, N, T]
        "C": torch.randn(b, n, t),  # [B, N, T]
        "D": torch.ones(e),  # [E]
        "z": torch.randn(b, t, e).transpose(1, 2),  # [B, E, T]
        "delta_bias": torch.log(torch.expm1(dt_E)),  # [E]
    }


def gdn_inputs(args: argparse.Namespace) -> dict[str, torch.Tensor]:
    """Gated-delta arguments as a Gated DeltaNet layer produces them (unit q and k)."""
    b, t, h, d = args.batch, args.seq_len, args.heads, args.head_dim
    return {
        "q": F.normalize(torch.randn(b, t, h, d), dim=-1),  # [B, T, H, K]
        "k": F.normalize(torch.randn(b, t, h, d), dim=-1),  # [B, T, H, K]
        "v": torch.randn(b, t, h, d),  # [B, T, H, V]
        "g": F.logsigmoid(torch.randn(b, t, h) + 3.0),  # [B, T, H]
        "beta": torch.sigmoid(torch.randn(b, t, h)),  # [B, T, H]
    }


def ssd_inputs(args: argparse.Namespace) -> dict[str, torch.Tensor]:
    """SSD arguments at Mamba-2 init scales (dt = softplus around 1e-3..1e-1, A ~ -U(1, 16)), one group."""
    b, t, h, p, n = args.batch, args.seq_len, args.ssd_heads, args.ssd_head_dim, args.ssd_state_size
    return {
        "x": torch.randn(b, t, h, p),  # [B, T, H, P]
        "dt": F.softplus(torch.randn(b, t, h) - 3.0),  # [B, T, H]
        "A": -torch.empty(h).uniform_(1, 16),  # [H]
        "B": torch.randn(b, t, 1, n),  # [B, T, G, N]
        "C": torch.randn(b, t, 1, n),  # [B, T, G, N]
        "D": torch.ones(h),  # [H]
    }


def passes(op: Callable[..., torch.Tensor], inputs: dict[str, torch.Tensor], **kwargs) -> tuple[Callable, Callable]:
    """(forward without autograd, forward + backward with every input requiring grad) as callables."""
    leaves = {name: x.detach().clone().requires_grad_() for name, x in inputs.items()}

    def forward():
        with torch.no_grad():
            op(**inputs, **kwargs)

    def forward_backward():
        out = op(**leaves, **kwargs)
        out.backward(torch.ones_like(out))
        for x in leaves.values():
            x.grad = None

    return forward, forward_backward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--channels", type=int, default=256, help="Mamba inner channels E")
    parser.add_argument("--state-size", type=int, default=16, help="Mamba state size N")
    parser.add_argument("--heads", type=int, default=4, help="Gated DeltaNet heads H")
    parser.add_argument("--head-dim", type=int, default=64, help="Gated DeltaNet K = V")
    parser.add_argument("--ssd-heads", type=int, default=4, help="SSD heads H (E = H P = 256)")
    parser.add_argument("--ssd-head-dim", type=int, default=64, help="SSD head dim P")
    parser.add_argument("--ssd-state-size", type=int, default=64, help="SSD state size N")
    parser.add_argument("--chunk-size", type=int, default=None, help="default: each op's own")
    parser.add_argument("--ops", default="selective_scan,gated_delta,ssd", help="comma-separated ops to time")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--walks", action="store_true",
                        help="also time the C++ gated delta rule's row and lane walks against each other")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    print(
        f"{datetime.date.today()}  torch {torch.__version__}  {platform.processor() or platform.machine()}"
        f"  cpus {os.cpu_count()}  torch threads {torch.get_num_threads()}"
        f"  load avg {os.getloadavg()[0]:.2f}"
    )
    print(
        f"T={args.seq_len} B={args.batch}  mamba E={args.channels} N={args.state_size}"
        f"  gdn H={args.heads} K=V={args.head_dim}"
        f"  ssd H={args.ssd_heads} P={args.ssd_head_dim} N={args.ssd_state_size} G=1  chunk {args.chunk_size or 'default'}  median of {args.repeats}"
    )

    wanted = args.ops.split(",")

    def compiled(name: str, module, form: str):
        """The op's C++ form where it is timed and builds here (built on first use), else None."""
        return getattr(module, form) if name in wanted and module.available() else None

    # (name, reference loop, chunked form, compiled form or None, inputs, keywords)
    ops = [
        ("selective_scan", selective_scan_naive, selective_scan_chunked,
         compiled("selective_scan", selective_scan_cpu, "selective_scan_cpu"), mamba_inputs(args),
         {"delta_softplus": True}),
        ("gated_delta", gated_delta_rule_naive, gated_delta_rule_chunked,
         compiled("gated_delta", gated_delta_cpu, "gated_delta_rule_cpu"), gdn_inputs(args), {}),
        ("ssd", ssd_naive, ssd_chunked, compiled("ssd", ssd_cpu, "ssd_cpu"), ssd_inputs(args), {}),
    ]
    chunking = {} if args.chunk_size is None else {"chunk_size": args.chunk_size}
    print(f"{'op':<16}{'pass':<14}{'naive ms':>10}{'chunked ms':>12}{'speed-up':>10}{'cpp ms':>10}{'speed-up':>10}")
    unknown = set(wanted) - {op[0] for op in ops}
    if unknown:
        parser.error(f"--ops: unknown {sorted(unknown)}; known: {[op[0] for op in ops]}")
    for name, naive, chunked, compiled, inputs, kwargs in (op for op in ops if op[0] in wanted):
        forms = [passes(naive, inputs, **kwargs), passes(chunked, inputs, **kwargs, **chunking)]
        if compiled is not None:
            forms.append(passes(compiled, inputs, **kwargs))
        for index, label in enumerate(("forward", "fwd+bwd")):
            naive_ms, chunked_ms, *compiled_ms = median_ms([form[index] for form in forms], args.repeats)
            cpp = (f"{compiled_ms[0]:>10.1f}{naive_ms / compiled_ms[0]:>9.1f}x" if compiled_ms
                   else f"{'-':>10}{'-':>10}")
            print(f"{name:<16}{label:<14}{naive_ms:>10.1f}{chunked_ms:>12.1f}{naive_ms / chunked_ms:>9.1f}x{cpp}")
    if args.walks and "gated_delta" in wanted and gated_delta_cpu.available():
        inputs = gdn_inputs(args)
        walks = [passes(gated_delta_cpu.gated_delta_rule_cpu, inputs, lanes=lanes) for lanes in (False, True)]
        chosen = "lanes" if gated_delta_cpu.by_lanes(args.batch, args.heads, args.head_dim, args.head_dim) else "rows"
        print(f"gated_delta C++ walks (these sizes take {chosen}):")
        for index, label in enumerate(("forward", "fwd+bwd")):
            rows_ms, lanes_ms = median_ms([walk[index] for walk in walks], args.repeats)
            print(f"  {label:<14}rows {rows_ms:.2f} ms   lanes {lanes_ms:.2f} ms   lanes / rows {lanes_ms / rows_ms:.2f}x")


if __name__ == "__main__":
    main()
