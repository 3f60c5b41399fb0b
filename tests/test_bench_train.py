"""benchmarks/bench_train.py: the four families timed side by side, and its free scans (each
recurrent family's scan a pass-through) leave every parameter of the rest of the step trained."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_train.py"


@pytest.fixture(scope="module")
def bench_train():
    spec = importlib.util.spec_from_file_location("bench_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("family", ["mamba", "mamba2", "gdn"])
def test_a_free_scan_still_trains_every_parameter_around_it(bench_train, family):
    """With the scan a pass-through, the step still computes a gradient for every parameter (the
    projections into the scan included), so the rest of the step costs what it does with the scan."""
    from archsearch.arch.families import spec_maker
    from archsearch.arch.model import build_model
    from archsearch.space.schema import Mamba2Axes, ModelOptions

    axes = {"family": family, "num_layers": 1}
    if family == "mamba2":  # its space's defaults, as the script builds it
        axes |= {f"mamba2.{name}": field.default for name, field in Mamba2Axes.model_fields.items()}
    model = build_model(spec_maker(axes, ModelOptions(), vocab_size=32)(64, 128))
    bench_train.free_scans(model)
    scans = [m for m in model.modules() if getattr(m, "scan", None) in (bench_train.free_selective_scan,
                                                                      bench_train.free_ssd)
             or getattr(m, "rule", None) is bench_train.free_rule]
    assert len(scans) == 1
    tokens = torch.randint(0, 32, (2, 9))
    torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
    assert [name for name, p in model.named_parameters() if p.grad is None] == []


def test_the_script_times_the_four_families_with_scans_free():
    result = subprocess.run([sys.executable, str(SCRIPT), "--d-model", "64", "--layers", "1", "--batch", "1",
                             "--seq-len", "16", "--rounds", "1", "--steps", "1", "--threads", "1", "--free-scans"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "scans free (pass-throughs)" in result.stdout
    for family in ("transformer", "mamba", "mamba2", "gdn"):
        assert any(line.startswith(family + " ") and "tokens/s" in line for line in result.stdout.splitlines())
