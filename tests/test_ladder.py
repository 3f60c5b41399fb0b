"""The fidelity ladder: every point on a synthetic probe first, the best
share on the study's data, and the rank correlation between the two."""

from __future__ import annotations

import textwrap

import pytest

import archsearch as A
from archsearch.search import ProbeSearch, make_searcher, spearman_interval


def write_study(tmp_path, *, keep=0.5, seeds="[0]"):
    path = tmp_path / "study.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: ladder
        space:
          axes:
            family: transformer
            num_layers: [1, 2, 3, 4]
          model: {{head_dim: 8}}
        budget: {{targets: [20000], tolerance: 0.05}}
        data: {{kind: text, seq_len: 16}}
        recipe: {{steps: 2, batch_size: 2, eval_every: 2, eval_batches: 1}}
        seeds: {seeds}
        search:
          probe:
            data: {{kind: mqar, seq_len: 16, vocab_size: 32, num_pairs: 2}}
            keep: {keep}
        """))
    return path


def fake(job, *, flip=False):
    """Deeper is better on text; the probe agrees, or (flip) disagrees."""
    layers = job.trial.axes["num_layers"]
    probe = job.trial.axes.get("fidelity") == "probe"
    loss = 3.0 - 0.1 * layers if not (probe and flip) else 3.0 + 0.1 * layers
    return dict(val_loss=loss, val_accuracy=0.0, tokens=1, tokens_per_s=1.0)


def drive(search, **fake_kw):
    log = []
    while True:
        jobs = search.ask(3)
        if not jobs:
            return log
        for job in jobs:
            log.append(job.trial)
            search.tell(job, fake(job, **fake_kw))


def test_every_probe_runs_before_any_trial_on_the_studys_data(tmp_path):
    search = make_searcher(A.load_study(write_study(tmp_path)), store=str(tmp_path / "s"), known={})
    assert isinstance(search, ProbeSearch)
    log = drive(search)
    fidelity = [t.axes.get("fidelity") for t in log]
    assert fidelity == ["probe"] * 4 + [None] * 2
    assert sorted(t.axes["num_layers"] for t in log[4:]) == [3, 4]  # the best half by the probe
    assert log[0].data["kind"] == "mqar" and log[4].data["kind"] == "text"
    assert log[0].spec.vocab_size == 32 and log[4].spec.vocab_size == 256
    assert search.exhausted and search.ladder["points"] == 2


def test_the_ladder_measures_agreement_and_disagreement(tmp_path):
    for flip, sign in ((False, 1), (True, -1)):
        search = make_searcher(A.load_study(write_study(tmp_path, keep=1.0)), store="s", known={})
        drive(search, flip=flip)
        ladder = search.ladder
        assert ladder["points"] == 4 and ladder["spearman"] == pytest.approx(sign * 1.0)
        assert ladder["low"] <= ladder["spearman"] <= ladder["high"]


def test_known_probes_are_not_trained_again(tmp_path):
    study = A.load_study(write_study(tmp_path, keep=1.0))
    first = make_searcher(study, store="s", known={})
    log = drive(first)
    known = {t.trial_id: {**t.to_dict(), "status": "completed", "val_loss": 3.0 - 0.1 * t.axes["num_layers"]}
             for t in log}
    again = make_searcher(study, store="s", known=known)
    assert drive(again) == [] and again.ladder["spearman"] == pytest.approx(1.0)


def test_spearman_interval_is_wide_for_noise_and_narrow_for_signal():
    import random

    rng = random.Random(0)
    x = [rng.random() for _ in range(40)]
    rho, low, high = spearman_interval(x, [v + 0.01 * rng.random() for v in x])
    assert rho > 0.95 and high - low < 0.1
    rho, low, high = spearman_interval(x, [rng.random() for _ in x])
    assert abs(rho) < 0.4 and low < 0 < high and high - low > 0.3


def test_a_probe_needs_a_grid(tmp_path):
    from tests.test_errors import run_cli

    path = write_study(tmp_path)
    path.write_text(path.read_text() + "  sampler: random\n  trials: 3\n")
    result = run_cli("plan", str(path))
    assert result.returncode == 2 and "search.probe ranks a grid" in result.stderr, result.stderr


@pytest.mark.ray
@pytest.mark.slow
def test_a_ladder_study_runs_and_the_store_keeps_the_correlation(tmp_path):
    from archsearch.execute import run_study

    path = write_study(tmp_path, keep=0.75)
    run_study(A.load_study(path), store=tmp_path / "s.duckdb", show_progress=False)
    with A.open_store(tmp_path / "s.duckdb", read_only=True) as db:
        trials = db.trials("ladder").to_pylist()
        ladder = db.ladders("ladder").to_pylist()
    kinds = sorted(json_kind(t["data"]) for t in trials)
    assert kinds == ["mqar"] * 4 + ["text"] * 3
    assert ladder and ladder[0]["points"] == 3 and -1.0 <= ladder[0]["spearman"] <= 1.0


def json_kind(data: str) -> str:
    import json

    return json.loads(data)["kind"]
