"""`plan` of a search says what will run: the sampler, its proposals and the space they come
from (ranges accepted, as the sampler draws them), the fidelity rungs, and the training FLOPs
all that implies, at most and as expected under the promotion rule."""

from __future__ import annotations

import json
import textwrap

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from archsearch.search.preview import trained_share

SPACE = """\
name: s
axes:
  family: transformer
  num_layers: {low: 2, high: 6}
  taper:
    shape: [uniform, cosine]
model:
  head_dim: 8
"""


def study(folder, search: str) -> str:
    (folder / "space.yaml").write_text(SPACE if "sampler" in search else SPACE.replace(
        "{low: 2, high: 6}", "[2, 3]"))
    path = folder / "study.yaml"
    path.write_text(textwrap.dedent("""\
        name: s
        space: space.yaml
        budget: {targets: [6000, 12000], tolerance: 0.05}
        data: {kind: task, name: mqar, params: {vocab_size: 64, seq_len: 32, num_pairs: 4}}
        recipe: {steps: 90, schedule: wsd, decay_fraction: 0.2}
        """) + search)
    return str(path)


def test_the_share_a_trial_trains_under_halving_is_the_rule_s():
    # 3 rungs, eta 3: all to 1/9, a third on to 1/3, a ninth on to the end
    assert trained_share("asha", 3, 3, 100) == pytest.approx(1 / 9 + (1 / 3) * (2 / 9) + (1 / 9) * (2 / 3))
    assert trained_share("halving", 2, 2, 10) == pytest.approx(1 / 2 + 1 / 2 * 1 / 2)
    # hyperband's later brackets start higher: a larger share than halving's
    assert 1 > trained_share("hyperband", 3, 3, 81) > trained_share("asha", 3, 3, 81)


def test_a_samplers_plan_says_what_it_proposes_and_what_that_costs(tmp_path, monkeypatch):
    path = study(tmp_path, "search: {sampler: tpe, trials: 6, fidelity: {kind: asha, rungs: 3, eta: 3}}\n")
    monkeypatch.setenv("COLUMNS", "200")
    result = CliRunner().invoke(app, ["plan", path])
    assert result.exit_code == 0, result.output  # the range is the sampler's, not a grid's error
    text = " ".join(result.output.split())
    assert "search: tpe proposes 6 points of a space of ranges: num_layers in [2, 6] x taper.shape (2 values)" in text
    assert "(2 trials a point)" in text and "trials stop at 1/9, 1/3, 1 of their tokens" in text
    out = json.loads(CliRunner().invoke(app, ["plan", path, "--json"]).output)
    assert out["sampler"] == "tpe" and out["proposals"] == 6 and out["points"] is None
    assert out["rungs"] == pytest.approx([1 / 9, 1 / 3, 1])
    costs = {}
    for trial in out["sample"]:
        point = (trial["axes"]["num_layers"], trial["axes"]["taper.shape"])
        costs[point] = costs.get(point, 0) + trial["train_flops"]
    assert {n for n, _ in costs} <= {2, 3, 4, 5, 6} and len(costs) >= 6  # drawn from the range
    assert out["most_train_flops"] == pytest.approx(6 * max(costs.values()))
    mean = sum(costs.values()) / len(costs)
    assert out["expected_train_flops"] == pytest.approx(6 * mean * trained_share("asha", 3, 3, 12))


def test_a_grid_with_rungs_keeps_its_table_and_json_and_adds_the_rungs_cost(tmp_path, monkeypatch):
    path = study(tmp_path, "search: {fidelity: {kind: halving, rungs: 2, eta: 2}}\n")
    monkeypatch.setenv("COLUMNS", "200")
    result = CliRunner().invoke(app, ["plan", path])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "8 planned trials" in text and "search: every one of the grid's 4 points" in text
    trials = json.loads(CliRunner().invoke(app, ["plan", path, "--json"]).output)
    assert isinstance(trials, list) and len(trials) == 8
    most = sum(t["train_flops"] for t in trials)
    assert f"at most {most:.3g}" in text and f"expected {most * 0.75:.3g}" in text
