"""`plan` estimates the wall time from a store's measured speed: each trial's training FLOPs
over its family's median FLOP/s there, shared over the trials that run at once."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from archsearch.analysis.walltime import duration, estimate
from archsearch.cli import app
from tests.analysis_support import write_store


def test_each_trial_takes_its_flops_over_its_familys_median_rate():
    completed = [dict(family="mamba", tokens_per_s=100.0, flops_per_token=1e6),  # 1e8 FLOP/s
                 dict(family="mamba", tokens_per_s=300.0, flops_per_token=1e6),  # 3e8
                 dict(family="mamba", tokens_per_s=200.0, flops_per_token=1e6),  # median 2e8
                 dict(family="gdn", tokens_per_s=None, flops_per_token=1e6)]     # no speed: not counted
    planned = [dict(family="mamba", train_flops=2e10), dict(family="mamba", train_flops=6e10),
               dict(family="gdn", train_flops=1e10)]
    found = estimate(planned, completed, at_once=2)
    assert (found.covered, found.trials, found.measured) == (2, 3, 3)
    assert found.wall_s == pytest.approx(max((100 + 300) / 2, 300))  # the longest trial bounds it
    assert estimate([dict(family="hrm", train_flops=1.0)], completed, at_once=1) is None
    assert (duration(45), duration(600), duration(7200)) == ("45 s", "10.0 min", "2.0 h")


def test_plan_says_the_estimate_only_where_the_store_measured(tmp_path, tiny_study, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    missing = CliRunner().invoke(app, ["plan", str(tiny_study), "--store", str(tmp_path / "none.duckdb")])
    assert missing.exit_code == 0 and "estimated training time" not in missing.output
    store = write_store(tmp_path / "s.duckdb", trials=[
        dict(family="transformer", params=6000, achieved=6000.0, target=6000.0, val_loss=3.0, tokens_per_s=1000.0)])
    done = CliRunner().invoke(app, ["plan", str(tiny_study), "--store", str(store)])
    assert done.exit_code == 0, done.output
    assert "estimated training time: about" in done.output and "1 completed trials" in " ".join(done.output.split())
