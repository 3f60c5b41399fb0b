"""benchmarks/gpu_check.py, the script the first GPU runs: its checks fail a wrong kernel, and the
whole script runs at tiny sizes on the CPU with every kernel in Triton's interpreter."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("op", ["rms_norm", "ssd", "gated_delta_rule", "selective_scan"])
def test_a_kernel_off_by_a_percent_fails_and_the_spec_itself_passes(gpu_check, op, monkeypatch):
    """The check compares the output and the gradient of every input the models train: the spec
    against itself is exact; scaled by 1.01 (output and gradients all 1% off, twice the fp32
    tolerance) it fails."""
    from archsearch_kernels import dispatch

    spec = dispatch.PAIRS[op][1]
    monkeypatch.setitem(dispatch.PAIRS, op, (spec, spec))
    same = gpu_check.check_op(op, gpu_check.TINY, "cpu", "float32", repeats=1)
    assert same["passed"] and max(same["errors"].values()) == 0
    # every input the models train through: k, g and beta of the delta rule, A of the scan too
    leaves = {"rms_norm": {"x", "weight"}, "ssd": {"x", "dt", "A", "B", "C", "D"},
              "gated_delta_rule": {"q", "k", "v", "g", "beta"},
              "selective_scan": {"u", "delta", "A", "B", "C", "D", "z"}}[op]
    assert set(same["errors"]) == {"output", *leaves}
    monkeypatch.setitem(dispatch.PAIRS, op, (lambda *a, **kw: 1.01 * spec(*a, **kw), spec))
    off = gpu_check.check_op(op, gpu_check.TINY, "cpu", "float32", repeats=1)
    assert not off["passed"] and all(error > gpu_check.TOLERANCE["float32"] for error in off["errors"].values())


def test_a_kernel_that_raises_is_a_failed_check_and_the_run_goes_on(gpu_check, monkeypatch):
    from archsearch_kernels import dispatch

    def broken(*args, **kwargs):
        raise RuntimeError("no such kernel")

    monkeypatch.setitem(dispatch.PAIRS, "swiglu", (broken, dispatch.PAIRS["swiglu"][1]))
    row = gpu_check.check_op("swiglu", gpu_check.TINY, "cpu", "float32", repeats=1)
    assert not row["passed"] and row["error"] == "RuntimeError: no such kernel"


@pytest.mark.slow
def test_the_dry_run_checks_every_kernel_times_them_and_trains_the_study(tmp_path):
    """About three minutes on two cores: every Triton kernel in the interpreter at tiny sizes
    against its spec, the timing script's rows, and four trials trained into a store."""
    pytest.importorskip("triton")
    from archsearch_kernels import dispatch

    out = tmp_path / "summary.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), "--work", str(tmp_path / "w")],
                          env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True, text=True)
    summary = json.loads(out.read_text())
    assert done.returncode == 0 and summary["passed"], done.stdout + done.stderr
    assert {(row["op"], row["dtype"]) for row in summary["checks"]} == {(op, "float32") for op in dispatch.PAIRS}
    assert all(row["kernel_fwd_bwd_ms"] > 0 and len(row["errors"]) >= 2 for row in summary["checks"])
    assert {row["op"] for row in summary["timings"]["rows"] if row["impl"] == "triton"} >= {"rms_norm", "ssd"}
    trials = summary["study"]["trials"]
    assert sorted(t["family"] for t in trials) == ["gdn", "mamba", "mamba2", "transformer"]
    assert all(t["status"] == "completed" and t["val_loss"] > 0 for t in trials)
    assert Path(summary["study"]["store"]).exists() and (tmp_path / "w" / "gpu_check.html").exists()


def test_without_a_gpu_it_says_to_use_the_dry_run():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", os.devnull], capture_output=True, text=True)
    assert done.returncode == 2 and "--dry-run" in done.stderr
