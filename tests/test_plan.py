"""Planning: every trial hits its target, builds no module, and has a stable id."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import archsearch as A
from archsearch.budget import count_params

ROOT = Path(__file__).resolve().parents[1]


def test_quickstart_trials_hit_their_targets_within_one_percent():
    study = A.load_study(ROOT / "studies" / "quickstart.yaml")
    trials = A.plan(study)
    assert len(trials) == 4 * 4  # four shapes x four targets
    for trial in trials:
        assert abs(trial.match_error) <= 0.01
        assert trial.params == count_params(trial.spec)
        assert trial.match_error == pytest.approx(trial.params / trial.target - 1)


def test_taper_shapes_of_one_target_share_the_budget():
    trials = A.plan(A.load_study(ROOT / "studies" / "quickstart.yaml"))
    by_target: dict[float, set[int]] = {}
    for trial in trials:
        by_target.setdefault(trial.target, set()).add(trial.params)
    assert all(len(params) == 1 for params in by_target.values())


@pytest.mark.parametrize("target", [2e4, 7.7e4, 3.3e5, 1.2e6, 5e6])
def test_solver_hits_a_ladder_of_targets(tmp_path, corpus, target):
    from tests.conftest import TINY_SPACE, tiny_study_text

    (tmp_path / "space.yaml").write_text(TINY_SPACE.replace("num_layers: 2", "num_layers: 6"))
    path = tmp_path / "study.yaml"
    path.write_text(tiny_study_text(corpus=corpus, targets=f"[{target}]"))
    for trial in A.plan(A.load_study(path)):
        assert abs(trial.match_error) <= 0.01, trial.to_dict()


def test_plan_builds_no_torch_module(tiny_study, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("plan built a torch module")

    monkeypatch.setattr(torch.nn.Module, "__init__", refuse)
    assert len(A.plan(A.load_study(tiny_study))) == 3


def test_trial_ids_are_stable_and_depend_on_seed(tiny_study):
    first = [t.trial_id for t in A.plan(A.load_study(tiny_study))]
    assert first == [t.trial_id for t in A.plan(A.load_study(tiny_study))]
    text = tiny_study.read_text() + "seeds: [1]\n"
    tiny_study.write_text(text)
    assert set(first).isdisjoint(t.trial_id for t in A.plan(A.load_study(tiny_study)))


def test_plan_json_lists_what_the_contract_promises(tiny_study):
    from typer.testing import CliRunner

    from archsearch.cli import app

    result = CliRunner().invoke(app, ["plan", str(tiny_study), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert len(rows) == 3
    for row in rows:
        assert {"trial_id", "axes", "params", "flops_per_token", "target", "match_error"} <= set(row)
        assert row["axes"]["taper.shape"] in ("uniform", "cosine", "reverse")
        assert row["flops_per_token"] > 6 * row["params"]


def test_uniform_points_collapse_over_ratio(tmp_path, corpus):
    from tests.conftest import TINY_SPACE, tiny_study_text

    (tmp_path / "space.yaml").write_text(TINY_SPACE.replace("ratio: 3.0", "ratio: [2.0, 3.0]"))
    path = tmp_path / "study.yaml"
    path.write_text(tiny_study_text(corpus=corpus))
    shapes = [t.axes["taper.shape"] for t in A.plan(A.load_study(path))]
    assert shapes.count("uniform") == 1 and shapes.count("cosine") == 2


def test_a_learning_rate_sweep_plans_every_rate_per_arm(tiny_study):
    text = tiny_study.read_text().replace("  warmup_steps: 2", "  warmup_steps: 2\n  lr: {sweep: [1.0e-3, 3.0e-3]}")
    tiny_study.write_text(text)
    trials = A.plan(A.load_study(tiny_study))
    assert len(trials) == 3 * 2
    groups: dict[str, list[float]] = {}
    for trial in trials:
        groups.setdefault(trial.sweep_group, []).append(trial.recipe["lr"])
        assert trial.axes["lr"] == trial.recipe["lr"]
    assert sorted(groups.values()) == [[1e-3, 3e-3]] * 3


def test_quickstart_tapers_keep_their_order_after_rounding():
    """Issue 9: the quickstart's cosine arm at 80k planned widths 72, 80, 72, 72."""
    for trial in A.plan(A.load_study(ROOT / "studies" / "quickstart.yaml")):
        widths = list(trial.spec.mlp_widths)
        shape = trial.axes["taper.shape"]
        if shape in ("cosine", "linear"):
            assert all(a >= b for a, b in zip(widths, widths[1:])) and widths[0] > widths[-1], widths
        if shape == "reverse":
            assert all(a <= b for a, b in zip(widths, widths[1:])) and widths[0] < widths[-1], widths


def test_the_gated_attention_gate_defaults_to_elementwise_everywhere(tmp_path):
    """One default (the paper's best variant, papers.md §7) in the schema, the block and the docs;
    the schema said headwise while the docs and the block said elementwise."""
    import re

    from archsearch.arch.blocks.gated_attention import gate_width

    (tmp_path / "study.yaml").write_text("name: g\nspace:\n  axes:\n    family: gated_attention\n    num_layers: 2\n"
                                         "budget:\n  targets: [1.0e+5]\ndata:\n  kind: text\n  seq_len: 16\n")
    (trial,) = A.plan(A.load_study(tmp_path / "study.yaml"))
    assert trial.axes["attention.gate"] == "elementwise"
    layer = trial.spec.layers[0]
    assert layer.options["gate"] == "elementwise"
    assert gate_width(trial.spec, layer) == gate_width(trial.spec, type(layer)(mixer=layer.mixer)) == trial.spec.head_dim
    docs = (ROOT / "docs" / "architectures.md").read_text()
    assert re.search(r"^\| `gate` \| `\"elementwise\"` \|", docs, re.M)


def test_a_point_that_makes_no_valid_model_is_refused_in_one_line(tmp_path):
    """HRM needs a fast and a slow layer: one layer was a ValueError traceback out of the counts."""
    path = tmp_path / "study.yaml"
    path.write_text("name: h\nspace:\n  axes:\n    family: hrm\n    num_layers: 1\nbudget:\n  targets: [1.0e+5]\n"
                    "data:\n  kind: text\n  seq_len: 16\n")
    with pytest.raises(A.SpecError) as err:
        A.plan(A.load_study(path))
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"{path}:3: space.axes: trial (family=hrm, num_layers=1")
    assert "slow_layers" in text
