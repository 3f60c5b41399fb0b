"""A trial that fails every time it trains (a deterministic failure) is not trained again on
every resume: after ``execution.max_attempts`` attempts over all runs a failed or diverged
trial is left as it is, `run` and `resume` say so with the command that trains it once more
(``--retry-failed``), and every other trial still trains and counts.

The store here is written by hand (no Ray): every trial but one completed, the last failed
after some number of attempts, so the resume has nothing to start unless it retrains that
trial.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import archsearch as A
from archsearch.cli import app
from archsearch.search import make_searcher

RESULT = dict(train_loss=3.0, val_loss=3.1, val_accuracy=0.1, steps=12, tokens=768, wall_time_s=1.0,
              tokens_per_s=768.0, curve=[])


def store_with_a_failed_trial(tiny_study, path, *, attempts: int, status: str = "failed"):
    study = A.load_study(tiny_study)
    trials = A.plan(study)
    with A.open_store(path) as db:
        db.add_study(name=study.name, path=str(tiny_study), config={})
        db.add_trials(study.name, [t.to_dict() for t in trials])
        for trial in trials[:-1]:
            db.mark_running(trial.trial_id)
            db.finish(trial.trial_id, RESULT)
        for _ in range(attempts):
            db.mark_running(trials[-1].trial_id)
        db.fail(trials[-1].trial_id, "RuntimeError: out of memory building the model", status=status)
    return study, trials


@pytest.mark.parametrize("status", ["failed", "diverged"])
def test_a_trial_out_of_attempts_is_left_as_it_is(status, tiny_study, tmp_path):
    store = tmp_path / "s.duckdb"
    study, trials = store_with_a_failed_trial(tiny_study, store, attempts=study_attempts(tiny_study), status=status)
    with A.open_store(store, read_only=True) as db:
        known = db.trial_rows()
    assert make_searcher(study, store=str(store), known=known).expected == 0
    assert make_searcher(study, store=str(store), known=known, retry_failed=True).expected == 1
    result = CliRunner().invoke(app, ["resume", str(tiny_study), "--store", str(store), "--no-progress",
                                      "--report", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert f"{len(trials)} trials planned, {len(trials) - 1} already done, 0 trained" in result.output
    assert "1 failed or diverged trial left as it is after 3 attempts (execution.max_attempts)" in result.output
    assert f"archsearch resume {tiny_study} --store {store} --report {tmp_path / 'r.html'} --retry-failed" \
        in result.output.replace("\n", "")
    with A.open_store(store, read_only=True) as db:
        row = [r for r in db.trials(study.name).to_pylist() if r["trial_id"] == trials[-1].trial_id][0]
    assert (row["status"], row["attempts"]) == (status, 3)  # not trained again, not counted again


def study_attempts(tiny_study) -> int:
    return A.load_study(tiny_study).execution.max_attempts


@pytest.mark.parametrize("attempts, retried", [(1, True), (2, True), (3, False), (7, False)])
def test_a_failed_trial_is_retried_until_its_attempts_are_spent(attempts, retried, tiny_study, tmp_path):
    store = tmp_path / "s.duckdb"
    study, trials = store_with_a_failed_trial(tiny_study, store, attempts=attempts)
    with A.open_store(store, read_only=True) as db:
        searcher = make_searcher(study, store=str(store), known=db.trial_rows())
    assert searcher.expected == int(retried)
    if retried:
        assert [job.trial.trial_id for job in searcher.ask(5)] == [trials[-1].trial_id]


def test_the_cap_is_the_studys_to_set(tiny_study, tmp_path):
    store = tmp_path / "s.duckdb"
    store_with_a_failed_trial(tiny_study, store, attempts=3)
    study = A.load_study(tiny_study, overrides=["execution.max_attempts=5"])
    with A.open_store(store, read_only=True) as db:
        assert make_searcher(study, store=str(store), known=db.trial_rows()).expected == 1
    with pytest.raises(A.SpecError, match="max_attempts"):
        A.load_study(tiny_study, overrides=["execution.max_attempts=0"])
