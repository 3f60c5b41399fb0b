"""Budgets: every measure is matched within tolerance; protocols give arms."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import archsearch as A
from archsearch.budget import count_params, flops_per_token, state_size


def study_of(tmp_path: Path, *, axes: str, budget: str, model: str = "head_dim: 16") -> A.Study:
    text = textwrap.dedent("""\
        name: b
        space:
          axes:
        {axes}
          model:
            {model}
        budget:
        {budget}
        data:
          kind: text
          seq_len: 64
        """).format(axes=textwrap.indent(textwrap.dedent(axes), "    "),
                    budget=textwrap.indent(textwrap.dedent(budget), "  "), model=model)
    (tmp_path / "study.yaml").write_text(text)
    return A.load_study(tmp_path / "study.yaml")


AXES = "num_layers: [2, 6]\ntaper:\n  shape: [uniform, cosine]\n"


def test_parameter_ladder_within_half_a_percent(tmp_path):
    study = study_of(tmp_path, axes=AXES, budget="targets: {start: 2.0e+5, stop: 2.0e+7, count: 5}\n")
    trials = A.plan(study)
    assert len(trials) == 2 * 2 * 5
    for trial in trials:
        assert abs(trial.match_error) <= 0.005
        assert trial.achieved == count_params(trial.spec)


def test_flops_matching_counts_training_flops_at_the_study_length(tmp_path):
    study = study_of(tmp_path, axes=AXES, budget="match: flops\ntargets: [5.0e+6, 5.0e+7]\n")
    for trial in A.plan(study):
        assert trial.achieved == flops_per_token(trial.spec, seq_len=64, kind="train")
        assert abs(trial.match_error) <= 0.005


def test_embeddings_can_count(tmp_path):
    study = study_of(tmp_path, axes="num_layers: 4\n", budget="targets: [1.0e+6]\ncount_embeddings: true\n")
    (trial,) = A.plan(study)
    assert trial.achieved == trial.total_params == count_params(trial.spec, embeddings=True)
    assert abs(trial.total_params / 1e6 - 1) <= 0.005


def test_state_matching_reports_the_kv_cache(tmp_path):
    study = study_of(tmp_path, axes="num_layers: 4\n", budget="match: state\ntargets: [65536]\ntolerance: 0.05\n")
    (trial,) = A.plan(study)
    assert trial.state == state_size(trial.spec, seq_len=64) == 2 * 4 * 64 * trial.spec.d_model


def test_solve_for_mlp_keeps_d_model(tmp_path):
    study = study_of(tmp_path, axes=AXES, budget="targets: [3.0e+6]\nsolve_for: mlp\n",
                     model="d_model: 256")
    for trial in A.plan(study):
        assert trial.spec.d_model == 256 and abs(trial.match_error) <= 0.005


@pytest.mark.parametrize("protocol", ["iso_param", "iso_flop"])
def test_looped_protocols_add_a_baseline_arm(tmp_path, protocol):
    study = study_of(tmp_path, axes="family: looped\nnum_layers: 2\nloops: 3\n",
                     budget=f"targets: [1.0e+6]\nprotocol: {protocol}\n")
    looped, baseline = A.plan(study)
    assert (looped.axes["arm"], baseline.axes["arm"]) == ("looped", "baseline")
    assert baseline.spec.structure == "stack"
    seq = 64
    if protocol == "iso_param":
        assert baseline.spec.num_layers == 2
        assert abs(baseline.params / looped.params - 1) < 0.01
        assert flops_per_token(baseline.spec, seq_len=seq) < flops_per_token(looped.spec, seq_len=seq)
    else:
        assert baseline.spec.num_layers == 6
        assert baseline.flops_per_token == pytest.approx(looped.flops_per_token, rel=0.01)
        assert baseline.params > 2.5 * looped.params
    assert baseline.match == protocol and abs(baseline.match_error) < 0.01


def test_an_unreachable_target_names_the_closest_and_a_fix(tmp_path):
    study = study_of(tmp_path, axes="num_layers: 2\n", budget="targets: [1.0e+6]\ntolerance: 0.0001\n",
                     model="head_dim: 64\n    multiple_of: 256")
    with pytest.raises(A.SpecError) as err:
        A.plan(study)
    text = str(err.value)
    assert "closest is" in text and "budget.targets[0]" in text and "multiple_of" in text
