"""A trial's id: each input of its hash (spec, recipe, data, seed, a baseline's
partner) changes it when varied alone, and nothing else does (the code version
is recorded beside the result instead, so an upgrade never retrains a study).

Planted defects each test catches: the data (or the recipe, the seed, the
spec) left out of the hash; the partner kept in the train key.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import archsearch as A
from archsearch.planner import training_key, trial_id


def base_trial(tiny_study) -> A.PlannedTrial:
    return A.plan(A.load_study(tiny_study))[0]


def varied(trial: A.PlannedTrial, which: str, tmp_path) -> dict:
    """The trial's hash inputs with ``which`` changed and every other kept."""
    inputs = dict(spec=trial.spec, recipe=trial.recipe, data=trial.data, seed=trial.seed)
    if which == "spec":
        inputs["spec"] = replace(trial.spec, d_model=trial.spec.d_model + trial.spec.d_model // trial.spec.num_heads)
    elif which == "recipe":
        inputs["recipe"] = dict(trial.recipe, lr=trial.recipe["lr"] * 2)
    elif which == "data":
        other = tmp_path / "another-corpus"
        other.mkdir()
        inputs["data"] = dict(trial.data, paths=[str(other)])
    elif which == "seed":
        inputs["seed"] = trial.seed + 1
    return inputs


@pytest.mark.parametrize("which", ["spec", "recipe", "data", "seed"])
def test_each_input_alone_changes_the_id_and_the_train_key(tiny_study, tmp_path, which):
    trial = base_trial(tiny_study)
    assert trial.trial_id == trial_id(trial.spec, trial.recipe, trial.data, trial.seed)
    inputs = varied(trial, which, tmp_path)
    assert trial_id(**inputs) != trial.trial_id
    assert training_key(inputs["spec"].to_dict(), inputs["recipe"], inputs["data"], inputs["seed"]) != trial.train_key


def test_a_study_on_another_corpus_plans_new_trials(tiny_study, tmp_path, corpus):
    """The same study pointed at a different corpus must not reuse the old results."""
    first = {t.trial_id for t in A.plan(A.load_study(tiny_study))}
    other = tmp_path / "other"
    other.mkdir()
    (other / "doc.txt").write_text((corpus / "doc00.txt").read_text()[::-1])
    tiny_study.write_text(tiny_study.read_text().replace(str(corpus), str(other)))
    assert first.isdisjoint(t.trial_id for t in A.plan(A.load_study(tiny_study)))


def test_a_partner_changes_the_id_but_not_the_train_key(tiny_study):
    """A protocol's baseline is its partner's: two partners never share one baseline id, but
    the model they train is one (they share that training)."""
    trial = base_trial(tiny_study)
    paired = trial_id(trial.spec, trial.recipe, trial.data, trial.seed, pair="partner-a")
    assert paired not in (trial.trial_id, trial_id(trial.spec, trial.recipe, trial.data, trial.seed, pair="partner-b"))
    assert training_key(trial.spec.to_dict(), trial.recipe, trial.data, trial.seed) == trial.train_key


def test_a_trial_without_a_partner_trains_under_its_own_id(tiny_study):
    """The train key leaves out only the partner: for a trial without one it is the trial id."""
    for trial in A.plan(A.load_study(tiny_study)):
        assert trial.train_key == trial.trial_id


def test_the_train_key_survives_the_store_round_trip(tiny_study):
    """The driver keys trained results by the store's JSON columns: they must give the key the
    planner gave."""
    trial = base_trial(tiny_study)
    row = json.loads(json.dumps(trial.to_dict()))
    assert training_key(row["spec"], row["recipe"], row["data"], row["seed"]) == trial.train_key


def test_the_code_version_is_recorded_not_hashed(tiny_study, monkeypatch):
    """Ids stay the same across versions of archsearch (a re-run reuses finished trials); the
    version that made a result is the row's ``code_version`` (tests/test_store.py)."""
    import archsearch

    before = [t.trial_id for t in A.plan(A.load_study(tiny_study))]
    monkeypatch.setattr(archsearch, "__version__", "99.0.0")
    assert [t.trial_id for t in A.plan(A.load_study(tiny_study))] == before


def test_how_often_a_trial_reports_its_training_loss_is_no_part_of_its_id(tiny_study):
    """``recipe.log_every`` changes what is reported, not what trains: a store's finished
    trials stay finished when it changes (and the checkpoint of a run resumes under it)."""
    trial = base_trial(tiny_study)
    recipe = dict(trial.recipe, log_every=trial.recipe["log_every"] + 7)
    assert trial_id(trial.spec, recipe, trial.data, trial.seed) == trial.trial_id
    assert training_key(trial.spec.to_dict(), recipe, trial.data, trial.seed) == trial.train_key
