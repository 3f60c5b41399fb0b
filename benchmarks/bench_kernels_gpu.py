"""GPU check and timing of every Triton kernel against its PyTorch path, at realistic sizes.

    python benchmarks/bench_kernels_gpu.py                     # B 8, T 2048, d 1024, bf16
    python benchmarks/bench_kernels_gpu.py --json out.json     # also write the rows as JSON
    TRITON_INTERPRET=1 python benchmarks/bench_kernels_gpu.py --device cpu --dtype float32 \
        --batch 1 --seq-len 8 --d-model 16 --vocab 50 --repeats 1    # smoke run, no GPU (tests/test_bench.py)

Needs a CUDA device and triton. For each op it first checks the kernel against the
reference on this device in bf16 (the CPU tests run fp32 in Triton's interpreter, which
cannot check bf16 tl.dot), then times forward and forward+backward of both, interleaved,
with CUDA events (median of --repeats after warm-up), and the peak memory of fwd+bwd.
Where flash-linear-attention, mamba-ssm or liger-kernel are installed, their kernel for the
same op is timed in the same rounds. Took 100 to 130 s on an H200 (flash-linear-attention's compile included).

Sizes: B 8, T 2048, d 1024; SwiGLU width 2816 (8/3 d rounded to 256); Mamba E = 2d, N 16;
linear + cross-entropy over V 32000 and 128256 (N = B T = 16384 rows); gated delta rule
H 8, K = V = 128: the chunked kernel (chunks of 32, its default, and of 64), the recurrent kernel, fla's
chunk_gated_delta_rule and the PyTorch chunked form, then the chunked kernel against the
recurrent one at T 16, 64, 256 (where archsearch_kernels.dispatch.CHUNKED_FROM should sit);
Mamba-2's SSD scan with E = 2d in heads of P 64, N 128: the kernel, mamba-ssm's
mamba_chunk_scan_combined and the PyTorch chunked form.
Dimensions: B batch, T time, D width, F MLP width, E channels, N state, V vocabulary, P head dim.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from archsearch_kernels.linear_cross_entropy import linear_cross_entropy_naive, linear_cross_entropy_triton
from archsearch_kernels.rmsnorm import rms_norm_triton
from archsearch_kernels.selective_scan import selective_scan_chunked, selective_scan_triton
from archsearch_kernels.swiglu import swiglu_triton


def timed_ms(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 3) -> dict[str, float]:
    """Median ms of each callable, the callables interleaved round by round (CUDA events on a
    GPU, the wall clock on the CPU smoke run)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    cuda = torch.cuda.is_available()
    for round_index in range(warmup + repeats):
        for name, fn in fns.items():
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                took = start.elapsed_time(end)
            else:
                began = time.perf_counter()
                fn()
                took = 1e3 * (time.perf_counter() - began)
            if round_index >= warmup:
                times[name].append(took)
    return {name: statistics.median(values) for name, values in times.items()}


def peak_mb(fn: Callable[[], object]) -> float:
    if not torch.cuda.is_available():
        return 0.0
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def fwd_bwd(fn: Callable[..., torch.Tensor], inputs: dict[str, torch.Tensor], **kwargs) -> Callable[[], None]:
    leaves = [x for x in inputs.values() if x.requires_grad]

    def run() -> None:
        out = fn(**inputs, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        torch.autograd.grad(out.float().sum(), leaves)

    return run


def forward(fn: Callable[..., torch.Tensor], inputs: dict[str, torch.Tensor], **kwargs) -> Callable[[], None]:
    def run() -> None:
        with torch.no_grad():
            fn(**inputs, **kwargs)

    return run


def max_rel_error(fn_a, fn_b, inputs: dict[str, torch.Tensor], **kwargs) -> float:
    """Largest error of output and every gradient, relative to the reference's largest entry."""
    leaves = [x for x in inputs.values() if x.requires_grad]
    results = []
    for fn in (fn_a, fn_b):
        out = fn(**inputs, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        results.append([out, *torch.autograd.grad(out.float().sum(), leaves)])
    return max(((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-6)).item()
               for a, b in zip(*results))


def optional(module: str, name: str):
    """An installed peer's function, or None."""
    try:
        return getattr(__import__(module, fromlist=[name]), name)
    except Exception:
        return None


def bench_op(op: str, impls: dict[str, Callable], inputs: dict, repeats: int, rows: list, **kwargs) -> None:
    """Time every implementation of `op` against the last one (the reference), interleaved,
    and check each against it."""
    names = list(impls)
    reference = names[-1]
    errors = {}
    for name in names[:-1]:
        try:
            errors[name] = max_rel_error(impls[name], impls[reference], inputs, **kwargs)
        except Exception as err:  # a peer that refuses this GPU or these shapes is a row, and the run goes on
            line = str(err).strip().splitlines()
            rows.append(dict(op=op, impl=name, error=f"{type(err).__name__}: {line[0] if line else ''}"))
            print(f"{op:22s} {name:14s} failed: {rows[-1]['error'][:160]}", flush=True)
            del impls[name]
    names = list(impls)
    fwd = timed_ms({n: forward(f, inputs, **kwargs) for n, f in impls.items()}, repeats)
    both = timed_ms({n: fwd_bwd(f, inputs, **kwargs) for n, f in impls.items()}, repeats)
    for name in names:
        rows.append(dict(op=op, impl=name, forward_ms=fwd[name], fwd_bwd_ms=both[name],
                         speedup_fwd_bwd=both[reference] / both[name],
                         peak_mb=peak_mb(fwd_bwd(impls[name], inputs, **kwargs)),
                         rel_error_vs_reference=errors.get(name, 0.0)))
        print(f"{op:22s} {name:14s} fwd {fwd[name]:8.3f} ms  fwd+bwd {both[name]:8.3f} ms  "
              f"x{both[reference] / both[name]:5.2f}  peak {rows[-1]['peak_mb']:8.0f} MB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000, 128256])
    parser.add_argument("--device", default="cuda", help="cpu only for a smoke run under TRITON_INTERPRET=1")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_kernels_gpu.py needs a CUDA device (or --device cpu under TRITON_INTERPRET=1)")
    torch.manual_seed(0)
    dev, bf16 = args.device, getattr(torch, args.dtype)
    device_name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    b, t, d = args.batch, args.seq_len, args.d_model
    rows: list[dict] = []

    def leaf(*shape, dtype=bf16, scale=1.0):
        return (scale * torch.randn(*shape, device=dev)).to(dtype).requires_grad_()

    print(f"{device_name}  B {b}  T {t}  d {d}  {args.dtype}", flush=True)

    norm_inputs = dict(x=leaf(b, t, d), weight=leaf(d, dtype=torch.float32))
    impls = {"triton": lambda x, weight: rms_norm_triton(x, weight, 1e-6)}
    liger_norm = optional("liger_kernel.transformers.functional", "liger_rms_norm")
    if liger_norm is not None:
        impls["liger"] = lambda x, weight: liger_norm(x, weight, 1e-6)
    impls["torch"] = lambda x, weight: F.rms_norm(x, (d,), weight, 1e-6)
    bench_op("rms_norm", impls, norm_inputs, args.repeats, rows)

    width = max(8, 256 * round(8 / 3 * d / 256))
    gate_up = leaf(b, t, 2 * width)
    glu_inputs = dict(gate_up=gate_up)
    bench_op("swiglu", {"triton": lambda gate_up: swiglu_triton(*gate_up.chunk(2, -1)),
                        "torch": lambda gate_up: F.silu(gate_up.chunk(2, -1)[0]) * gate_up.chunk(2, -1)[1]},
             glu_inputs, args.repeats, rows)

    for vocab in args.vocab:
        ce_inputs = dict(x=leaf(b * t, d), weight=leaf(vocab, d, scale=0.02))
        targets = torch.randint(0, vocab, (b * t,), device=dev)
        impls = {"triton": lambda x, weight: linear_cross_entropy_triton(x, weight, targets)}
        liger_ce = optional("liger_kernel.transformers.functional", "liger_fused_linear_cross_entropy")
        if liger_ce is not None:
            impls["liger"] = lambda x, weight: liger_ce(x, weight, targets)
        impls["torch"] = lambda x, weight: linear_cross_entropy_naive(x, weight, targets)
        bench_op(f"linear_cross_entropy_V{vocab}", impls, ce_inputs, args.repeats, rows)

    e, n = 2 * d, 16
    scan_inputs = dict(u=leaf(b, t, e).transpose(1, 2), delta=leaf(b, t, e, scale=0.5).transpose(1, 2),
                       A=(-torch.rand(e, n, device=dev) - 0.5).requires_grad_(), B=leaf(b, t, n).transpose(1, 2),
                       C=leaf(b, t, n).transpose(1, 2), D=leaf(e, dtype=torch.float32), z=leaf(b, t, e).transpose(1, 2),
                       delta_bias=leaf(e, dtype=torch.float32, scale=0.1))
    # leaves are the [B, T, E] tensors; the scan reads their [B, E, T] transposes, as the Mamba block passes them
    impls = {"triton": selective_scan_triton}
    mamba_scan = optional("mamba_ssm.ops.selective_scan_interface", "selective_scan_fn")
    if mamba_scan is not None:
        # mamba-ssm wants [B, E, T] contiguous in T
        impls["mamba_ssm"] = lambda **kw: mamba_scan(**{k: v.contiguous() if isinstance(v, torch.Tensor) and v.dim() == 3
                                                        else v for k, v in kw.items()})
    impls["torch-chunked"] = selective_scan_chunked
    bench_op("selective_scan", impls, scan_inputs, args.repeats, rows, delta_softplus=True)

    from archsearch_kernels.gated_delta import (
        gated_delta_rule_chunked,
        gated_delta_rule_chunked_triton,
        gated_delta_rule_triton,
    )

    h, k = 8, min(128, d)
    gdr_inputs = dict(q=F.normalize(torch.randn(b, t, h, k, device=dev), dim=-1).to(bf16).requires_grad_(),
                      k=F.normalize(torch.randn(b, t, h, k, device=dev), dim=-1).to(bf16).requires_grad_(),
                      v=leaf(b, t, h, k), g=F.logsigmoid(3 + torch.randn(b, t, h, device=dev)).requires_grad_(),
                      beta=torch.rand(b, t, h, device=dev).to(bf16).requires_grad_())
    impls = {"triton": gated_delta_rule_chunked_triton,
             "triton-chunk64": lambda **kw: gated_delta_rule_chunked_triton(**kw, chunk_size=64),
             "triton-recurrent": gated_delta_rule_triton}
    fla_gdr = optional("fla.ops.gated_delta_rule", "chunk_gated_delta_rule")
    if fla_gdr is not None:  # fla scales q by K^-1/2 unless told otherwise; ours never does
        impls["fla"] = lambda **kw: fla_gdr(**kw, scale=1.0)[0]
    impls["torch-chunked"] = gated_delta_rule_chunked
    bench_op("gated_delta_rule", impls, gdr_inputs, args.repeats, rows)
    # short sequences: which of the two kernels the dispatch should take below CHUNKED_FROM
    for steps in sorted({min(steps, t) for steps in (16, 64, 256)}):
        short = {name: x.detach()[:, :steps].clone().requires_grad_() for name, x in gdr_inputs.items()}
        bench_op(f"gated_delta_rule_T{steps}", {"triton": gated_delta_rule_chunked_triton,
                                                "triton-recurrent": gated_delta_rule_triton}, short, args.repeats, rows)

    from archsearch_kernels.ssd import ssd_chunked, ssd_triton

    # Mamba-2's SSD: E = 2d in heads of P 64, one group, N 128
    p, n = min(64, 2 * d), min(128, d)
    heads = 2 * d // p
    ssd_inputs = dict(x=leaf(b, t, heads, p), dt=F.softplus(torch.randn(b, t, heads, device=dev) - 3).requires_grad_(),
                      A=(-torch.rand(heads, device=dev) * 15 - 1).requires_grad_(), B=leaf(b, t, 1, n),
                      C=leaf(b, t, 1, n), D=leaf(heads, dtype=torch.float32))
    impls = {"triton": ssd_triton}
    mamba_ssd = optional("mamba_ssm.ops.triton.ssd_combined", "mamba_chunk_scan_combined")
    if mamba_ssd is not None:
        impls["mamba_ssm"] = lambda **kw: mamba_ssd(**kw, chunk_size=64)
    impls["torch-chunked"] = ssd_chunked
    bench_op("ssd", impls, ssd_inputs, args.repeats, rows)

    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=device_name, dtype=args.dtype, batch=b, seq_len=t, d_model=d, rows=rows), f, indent=2)


if __name__ == "__main__":
    main()
