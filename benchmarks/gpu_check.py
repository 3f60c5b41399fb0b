"""A GPU check: every Triton kernel against its reference, timed, and one study trained on CUDA.

    python benchmarks/gpu_check.py [--out gpu_check.json] [--work DIR]       # one H200: about 5 minutes
    TRITON_INTERPRET=1 python benchmarks/gpu_check.py --dry-run --out x.json # any CPU: tiny sizes (tests/test_gpu_check.py)

Three parts, each written to the JSON summary as it finishes, so a run cut short keeps what it did:

1. ``checks``: each op of ``archsearch_kernels.dispatch.PAIRS`` (its Triton kernel and its naive.py
   spec; ``--ops`` names some) at the sizes below, in fp32 and in bf16: the kernel's output and
   its gradient for every input that takes one in the models, against the spec run in fp32 on
   the same (rounded) inputs, as the largest absolute difference over the largest reference
   value, within ``TOLERANCE`` of the dtype. The kernel's forward and forward+backward time
   beside the spec's.
2. ``timings``: ``bench_kernels_gpu.py`` at its defaults (B 8, T 2048, d 1024, bf16): each kernel
   against the PyTorch path and against flash-linear-attention, mamba-ssm and liger-kernel where
   they import; its rows as it writes them.
3. ``study``: a four-family study (Transformer++, Mamba, Mamba-2, Gated DeltaNet at 2 layers,
   one GPU a trial, bf16 autocast, the kernels on) run by ``archsearch run`` into a store, and what
   the store holds afterwards: each trial's status and validation loss.

Sizes for the checks (the papers' layer shapes, one sequence of 2048 steps, batch 2 so that the spec
loops finish in seconds): RMSNorm and SwiGLU at d 1024 (SwiGLU width 2816), linear + cross-entropy
V 32000 over d 1024, Mamba's scan E 2048 N 16, the gated delta rule H 8 K = V 128, SSD H 32 P 64 N 128
over 1 group. ``--dry-run`` shrinks every size to a few steps and channels, checks fp32 only (the
interpreter cannot run bf16 ``tl.dot``), times nothing against other libraries and trains the study
on the CPU for two steps: it checks the script, never the GPU.

docs/performance.md gives what it found on an H200, and docs/data/ its JSON summaries.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
# largest |kernel - spec| over the largest |spec|, per dtype: fp32 allows TF32 tl.dot, bf16 its 8-bit mantissa
TOLERANCE = {"float32": 5e-3, "bfloat16": 5e-2}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Sizes:
    batch: int = 2
    seq_len: int = 2048
    d_model: int = 1024
    mlp: int = 2816
    vocab: int = 32000
    scan_channels: int = 2048
    scan_state: int = 16
    gdn_heads: int = 8
    gdn_dim: int = 128
    ssd_heads: int = 32
    ssd_head_dim: int = 64
    ssd_state: int = 128


# a length past one chunk (64) and ragged, channels off powers of two
TINY = Sizes(batch=1, seq_len=70, d_model=24, mlp=40, vocab=1000, scan_channels=12, scan_state=4, gdn_heads=2,
             gdn_dim=16, ssd_heads=4, ssd_head_dim=8, ssd_state=8)


def inputs_for(op: str, s: Sizes, device: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Seeded inputs of one op in `dtype`; those that take a gradient are leaves that require it."""
    gen = torch.Generator().manual_seed(0)

    def leaf(*shape, scale=1.0, fn=None):
        x = torch.randn(*shape, generator=gen) * scale
        return (fn(x) if fn else x).to(device, dtype).requires_grad_()

    B, T = s.batch, s.seq_len
    if op == "rms_norm":
        return dict(x=leaf(B, T, s.d_model), weight=leaf(s.d_model))
    if op == "swiglu":
        return dict(gate=leaf(B, T, s.mlp), up=leaf(B, T, s.mlp))
    if op == "linear_cross_entropy":
        return dict(x=leaf(B * T, s.d_model), weight=leaf(s.vocab, s.d_model, scale=s.d_model ** -0.5))
    if op in ("gated_delta_rule", "gated_delta_rule_chunked"):
        H, K = s.gdn_heads, s.gdn_dim
        return dict(q=leaf(B, T, H, K, scale=K ** -0.5), k=leaf(B, T, H, K, fn=lambda x: F.normalize(x, dim=-1)),
                    v=leaf(B, T, H, K), g=leaf(B, T, H, fn=lambda x: F.logsigmoid(2 + x)),
                    beta=leaf(B, T, H, fn=lambda x: torch.rand(x.shape, generator=gen)))
    if op == "ssd":
        H, P, N = s.ssd_heads, s.ssd_head_dim, s.ssd_state
        return dict(x=leaf(B, T, H, P), dt=leaf(B, T, H, fn=lambda x: F.softplus(x - 3)),
                    A=leaf(H, fn=lambda x: -torch.rand(H, generator=gen) * 4 - 0.5),
                    B=leaf(B, T, 1, N, scale=N ** -0.5), C=leaf(B, T, 1, N, scale=N ** -0.5), D=leaf(H))
    E, N = s.scan_channels, s.scan_state  # selective_scan
    return dict(u=leaf(B, E, T), delta=leaf(B, E, T, scale=0.5, fn=lambda x: x - 2),
                A=leaf(E, N, fn=lambda x: -torch.rand(E, N, generator=gen) * 4 - 0.1), B=leaf(B, N, T),
                C=leaf(B, N, T), D=leaf(E), z=leaf(B, E, T))


def _version(module: str) -> str | None:
    """An installed module's version, or None where it does not import."""
    try:
        return getattr(__import__(module), "__version__", "installed")
    except Exception:
        return None


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _seconds(fn, device: str, repeats: int) -> float:
    """Median seconds of `fn` after one warm call."""
    fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def check_op(op: str, sizes: Sizes, device: str, dtype_name: str, repeats: int,
             spec_repeats: int | None = None) -> dict:
    """One op in one dtype: the worst relative error of its output and each gradient, and its times
    (the kernel's median of `repeats`, the spec's of `spec_repeats`: its step loops are slow)."""
    from archsearch_kernels import dispatch

    kernel, spec = dispatch.PAIRS[op]
    inputs = inputs_for(op, sizes, device, DTYPES[dtype_name])
    as_fp32 = {name: (x.detach().float().requires_grad_(x.requires_grad)) for name, x in inputs.items()}
    leaves = [name for name, x in inputs.items() if x.requires_grad]
    row: dict = {"op": op, "dtype": dtype_name, "tolerance": TOLERANCE[dtype_name], "errors": {}}
    try:
        out = dispatch._call(kernel, op, inputs)
        ref = dispatch._call(spec, op, as_fp32)
        cotangent = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1)).to(device)
        grads = torch.autograd.grad(out, [inputs[n] for n in leaves], cotangent.to(out.dtype))
        ref_grads = torch.autograd.grad(ref, [as_fp32[n] for n in leaves], cotangent)
        for name, got, want in zip(["output", *leaves], [out, *grads], [ref, *ref_grads]):
            error = (got.double() - want.double()).abs().max().item()
            row["errors"][name] = error / max(want.double().abs().max().item(), 1e-30)
        row["passed"] = all(e <= TOLERANCE[dtype_name] for e in row["errors"].values())  # NaN fails
        for name, fn, args, times in (("kernel", kernel, inputs, repeats),
                                      ("reference", spec, as_fp32, spec_repeats or repeats)):
            row[f"{name}_forward_ms"] = 1e3 * _seconds(lambda: dispatch._call(fn, op, args).detach(), device, times)
            row[f"{name}_fwd_bwd_ms"] = 1e3 * _seconds(
                lambda: dispatch._call(fn, op, args).backward(cotangent.to(args[leaves[0]].dtype)), device, times)
    except Exception as err:  # a kernel that does not compile or run is a failed check, and the run goes on
        row.update(passed=False, error=f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
    return row


STUDY = """name: gpu_check
space:
  axes:
    family: [transformer, mamba, mamba2, gdn]
    num_layers: 2
budget:
  targets: [{target}]
  tolerance: 0.15
data:
  kind: text
  seq_len: {seq_len}
recipe:
  steps: {steps}
  batch_size: 8
  eval_every: {steps}
  eval_batches: 2
  autocast: "{autocast}"
seeds: [0]
execution:
  max_parallel: 1
  gpus: {gpus}
  threads_per_trial: 2
"""


def run_study(work: Path, *, dry_run: bool) -> dict:
    """The four-family study through ``archsearch run`` into a store in `work`; what the store holds."""
    study = work / "gpu_check.yaml"
    study.write_text(STUDY.format(target=40_000 if dry_run else 2_000_000, seq_len=32 if dry_run else 512,
                                  steps=2 if dry_run else 200, autocast="off" if dry_run else "bf16",
                                  gpus=0 if dry_run else 1))
    store = work / "gpu_check.duckdb"
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "archsearch.cli", "run", str(study), "--store", str(store), "--no-progress",
                           "--report", str(work / "gpu_check.html")],
                          capture_output=True, text=True)
    result = {"returncode": done.returncode, "seconds": time.perf_counter() - began, "store": str(store),
              "output_tail": (done.stdout + done.stderr)[-2000:]}
    if store.exists():
        from archsearch.analysis.tables import decoded_rows
        from archsearch.store.duck import open_store

        with open_store(store, read_only=True, must_exist=True) as handle:
            rows = decoded_rows(handle.trials())
        result["trials"] = [{k: row.get(k) for k in ("trial_id", "family", "status", "val_loss", "params")}
                            for row in rows]
    result["passed"] = done.returncode == 0 and len(result.get("trials", [])) == 4 and all(
        t["status"] == "completed" and t["val_loss"] is not None for t in result["trials"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_check.json", help="the JSON summary")
    parser.add_argument("--work", default=None, help="where the study's store goes (a temporary folder by default)")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU under TRITON_INTERPRET=1")
    parser.add_argument("--skip", default="", help="parts to leave out, comma-separated: checks, timings, study")
    parser.add_argument("--ops", default="", help="check only these ops, comma-separated (default: every op)")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls of each kernel (the median is kept)")
    parser.add_argument("--spec-repeats", type=int, default=3, help="timed calls of each spec (its step loops are slow)")
    args = parser.parse_args()
    device = "cpu" if args.dry_run else "cuda"
    if args.dry_run and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("--dry-run runs the kernels in Triton's interpreter: set TRITON_INTERPRET=1")
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device here; --dry-run (with TRITON_INTERPRET=1) checks the script on a CPU")
    from archsearch_kernels import dispatch

    skip = set(filter(None, args.skip.split(",")))
    out = Path(args.out)
    summary = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)",
               "torch": torch.__version__, "triton": _version("triton"),
               "peers": {name: _version(name) for name in ("fla", "mamba_ssm", "liger_kernel")},
               "dry_run": args.dry_run, "sizes": asdict(TINY if args.dry_run else Sizes()),
               "checks": [], "timings": None, "study": None}

    def save():
        out.write_text(json.dumps(summary, indent=2, default=str))

    began = time.perf_counter()
    ops = [op for op in args.ops.split(",") if op] or list(dispatch.PAIRS)
    unknown = sorted(set(ops) - set(dispatch.PAIRS))
    if unknown:
        parser.error(f"no kernel named {', '.join(unknown)}; the ops are {', '.join(dispatch.PAIRS)}")
    if "checks" not in skip:
        for op in ops:
            for dtype_name in ("float32",) if args.dry_run else ("float32", "bfloat16"):
                took = time.perf_counter()
                row = check_op(op, TINY if args.dry_run else Sizes(), device, dtype_name,
                               1 if args.dry_run else args.repeats, 1 if args.dry_run else args.spec_repeats)
                summary["checks"].append(row)
                times = (f"fwd+bwd {row['kernel_fwd_bwd_ms']:8.2f} ms, spec {row['reference_fwd_bwd_ms']:9.1f} ms"
                         if "kernel_fwd_bwd_ms" in row else "")
                print(f"{op:<26} {dtype_name:<9} {'ok  ' if row['passed'] else 'FAIL'} "
                      f"{max(row['errors'].values(), default=float('nan')):.1e} {times} "
                      f"({time.perf_counter() - took:.0f} s) {row.get('error', '')}", flush=True)
                save()
    if "timings" not in skip:
        smoke = ["--device", "cpu", "--dtype", "float32", "--batch", "1", "--seq-len", "8", "--d-model", "16",
                 "--vocab", "50", "--repeats", "1"] if args.dry_run else []
        with tempfile.TemporaryDirectory(prefix="gpu_check_timings_") as folder:
            rows = Path(folder) / "rows.json"
            done = subprocess.run([sys.executable, str(HERE / "bench_kernels_gpu.py"), *smoke, "--json", str(rows)],
                                  capture_output=True, text=True)
            summary["timings"] = {"returncode": done.returncode, "output_tail": (done.stdout + done.stderr)[-2000:],
                                  "rows": json.loads(rows.read_text())["rows"] if rows.exists() else []}
        print(done.stdout + (done.stderr[-1500:] if done.returncode else ""), end="", flush=True)
        save()
    if "study" not in skip:
        work = Path(args.work or tempfile.mkdtemp(prefix="gpu_check_"))
        work.mkdir(parents=True, exist_ok=True)
        summary["study"] = run_study(work, dry_run=args.dry_run)
        study = summary["study"]
        for trial in study.get("trials", []):
            print(f"  {trial['family']:<12} {trial['status']:<10} val_loss {trial['val_loss']}", flush=True)
        if not study["passed"]:
            print(study["output_tail"], flush=True)
        print(f"study: {'ok' if study['passed'] else 'FAIL'} in {study['seconds']:.0f} s", flush=True)
    summary["seconds"] = time.perf_counter() - began
    summary["passed"] = (all(row["passed"] for row in summary["checks"])
                         and (summary["timings"] is None or summary["timings"]["returncode"] == 0)
                         and (summary["study"] is None or summary["study"]["passed"]))
    save()
    print(f"{'passed' if summary['passed'] else 'FAILED'} in {summary['seconds']:.0f} s; summary in {out}")
    sys.exit(0 if summary["passed"] else 1)


if __name__ == "__main__":
    main()
