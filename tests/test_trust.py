"""A fit that converged but says little is flagged with the reason, in the fit's JSON and the
`fit` table's lines: a floor run to zero, an interval of zero width or many decades, sizes too
close together, too few points, points that scatter. A well-posed fit carries no caution."""

from __future__ import annotations

import numpy as np
from typer.testing import CliRunner

from archsearch import analysis
from archsearch.cli import app
from tests.analysis_support import write_store


def law(sizes, *, e=1.7, a=400.0, alpha=0.34, noise=0.003, seed=0):
    rng = np.random.default_rng(seed)
    sizes = np.asarray(sizes, dtype=float)
    return (e + a * sizes**-alpha) * np.exp(noise * rng.standard_normal(sizes.size))


def test_a_well_posed_fit_has_no_caution():
    sizes = np.geomspace(1e6, 1e10, 30)
    fit = analysis.fit_law({"N": sizes}, law(sizes), "N", bootstrap=50, grid=False)
    assert fit.cautions == [] and fit.to_dict()["cautions"] == []


def test_sizes_close_together_and_few_points_are_flagged():
    sizes = np.array([1e6, 1.5e6, 2e6, 3e6, 4e6])
    fit = analysis.fit_law({"N": sizes}, law(sizes), "N", bootstrap=50, grid=False)
    assert any(c.startswith("N spans only 4x (too little spread") for c in fit.cautions), fit.cautions
    spread = sizes[:4] * [1, 10, 100, 1000]
    few = analysis.fit_law({"N": spread}, law(spread), "N", bootstrap=20, grid=False)
    assert "4 points for 3 constants (too few sizes)" in few.cautions and not any("spans" in c for c in few.cautions)


def test_a_floor_run_to_zero_and_noisy_points_are_flagged():
    sizes = np.geomspace(1e6, 1e10, 30)
    floorless = analysis.fit_law({"N": sizes}, 50.0 * sizes**-0.1, "N", bootstrap=30, grid=False)
    assert any(c.startswith("E ran to zero") for c in floorless.cautions), floorless.cautions
    noisy = analysis.fit_law({"N": sizes}, law(sizes, noise=0.12), "N", bootstrap=30, grid=False)
    assert any("scatter" in c and "(noise)" in c for c in noisy.cautions), noisy.cautions


def test_the_fit_command_prints_each_caution_under_its_table(tmp_path, monkeypatch):
    sizes = [1e6, 1.3e6, 1.6e6, 2e6]
    trials = [dict(family="transformer", params=int(n), achieved=n, target=n, val_loss=float(v), tokens_per_s=1.0,
                   axes={"family": "transformer"}) for n, v in zip(sizes, law(sizes))]
    store = write_store(tmp_path / "s.duckdb", trials=trials)
    monkeypatch.setenv("COLUMNS", "200")
    out = CliRunner().invoke(app, ["fit", "--store", str(store), "--law", "N"]).output
    assert "caution: transformer L(N): N spans only 2x (too little spread to pin an exponent" in out, out
    import json

    data = json.loads(CliRunner().invoke(app, ["fit", "--store", str(store), "--law", "N", "--json"]).output)
    assert any(c.startswith("N spans only 2x") for c in data["fits"][0]["cautions"])
