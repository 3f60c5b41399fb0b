"""Multi-fidelity over a sampler's proposals (BOHB-style): ASHA, successive halving and
Hyperband stop the trials random search, TPE or NSGA-II proposed, with one objective or two.
Fake curves that cross (one family starts worse and ends better), no training, no Ray."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import archsearch as A
from archsearch.search import HalvingSearch, make_searcher
from tests.test_search_distinct import SMALL


def write_study(folder: Path, *, sampler: str, kind: str, objectives: str, trials: int = 8) -> Path:
    (folder / "space.yaml").write_text(SMALL)
    path = folder / "study.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: fidelity
        space: space.yaml
        budget: {{targets: [20000], tolerance: 0.05}}
        data: {{kind: text, seq_len: 16}}
        recipe: {{steps: 9, batch_size: 2, schedule: wsd, decay_fraction: 0.2}}
        search: {{sampler: {sampler}, trials: {trials}, seed: 3, objectives: {objectives},
                  fidelity: {{kind: {kind}, rungs: 2, eta: 2}}}}
        """))
    return path


def final_loss(axes: dict) -> float:
    return 3.0 - 0.2 * axes["num_layers"] - (0.5 if axes["family"] == "mamba" else 0.0)


def fake(trial, fraction: float) -> dict:
    """Mamba starts 1.2 worse and ends 0.5 better: the first rung does not decide the answer."""
    loss = final_loss(trial.axes) + (1.2 if trial.axes["family"] == "mamba" else 0.0) * (1 - fraction)
    return dict(train_loss=loss, val_loss=loss, val_accuracy=0.1, steps=9, tokens=int(64 * fraction),
                wall_time_s=0.01, tokens_per_s=1000.0 * trial.axes["num_layers"], curve=[])


def drive(search, width: int = 2) -> list:
    running, log = [], []
    while True:
        running += search.ask(width - len(running))
        if not running:
            return log
        job = running.pop(0)
        log.append(job)
        search.tell(job, fake(job.trial, job.stop_at or 1.0))


KINDS = ("asha", "halving", "hyperband")
CASES = [(sampler, kind, "[val_loss:min]") for sampler in ("random", "tpe") for kind in KINDS]
CASES += [(sampler, kind, "[val_loss:min, tokens_per_s:max]") for sampler in ("tpe", "nsga2") for kind in KINDS]


@pytest.mark.parametrize("sampler, kind, objectives", CASES)
def test_rungs_stop_the_trials_a_sampler_proposed(tmp_path, sampler, kind, objectives):
    search = make_searcher(A.load_study(write_study(tmp_path, sampler=sampler, kind=kind, objectives=objectives)),
                           store=str(tmp_path / "s.duckdb"), known={})
    assert isinstance(search, HalvingSearch)
    log = drive(search)
    trials = {job.trial.trial_id: job.trial for job in log}
    assert len(trials) == 8 and search.exhausted  # eight distinct proposals, each planned once
    ended = {job.trial.trial_id for job in log if job.stop_at is None}
    pruned = {trial.trial_id for trial, _ in search.pruned}
    assert ended and pruned and ended | pruned == set(trials) and not ended & pruned
    # every trial that trained to the end was first stopped at the half-way rung, but one
    # that Hyperband's last bracket starts at the end
    halfway = {job.trial.trial_id for job in log if job.stop_at == 0.5}
    assert ended <= halfway or kind == "hyperband"
    assert halfway == set(trials) or kind == "hyperband"
    # the sampler is told each proposal's end: the value at the full budget, or pruned
    told = {record["trial_ids"][0]: record for record in search.records}
    assert set(told) == set(trials)
    for trial_id, record in told.items():
        if trial_id in ended:
            assert record["state"] == "completed"
            assert record["values"][0] == pytest.approx(final_loss(trials[trial_id].axes))
        else:
            assert record["state"] == "pruned" and record["values"] is None
    spent = sum((job.stop_at or 1.0) - (0.5 if job.rung == 1 and job.trial.trial_id in halfway else 0.0)
                for job in log)
    assert spent < len(trials)  # cheaper than every proposal to its end


def test_asha_over_tpe_finds_the_best_though_the_first_rung_ranks_it_worse(tmp_path):
    """Mamba L4 ends best, yet at the rung a transformer leads: with eta 2 half the rung goes
    on, so ASHA over TPE still trains it to the end, and TPE hears its final value."""
    path = write_study(tmp_path, sampler="tpe", kind="asha", objectives="[val_loss:min]")
    search = make_searcher(A.load_study(path), store=str(tmp_path / "s.duckdb"), known={})
    log = drive(search, width=1)
    at_rung = min((job for job in log if job.stop_at == 0.5), key=lambda job: fake(job.trial, 0.5)["val_loss"])
    best = min((job for job in log if job.stop_at is None), key=lambda job: final_loss(job.trial.axes))
    point = {name: best.trial.axes[name] for name in ("family", "num_layers")}
    assert point == {"family": "mamba", "num_layers": 4} and at_rung.trial.axes["family"] == "transformer"
    assert search.inner.best[0].values[0] == pytest.approx(final_loss(best.trial.axes))
    states = {t.state.name for t in search.inner._optuna.get_trials(deepcopy=False)}
    assert states <= {"COMPLETE", "PRUNED"}  # nothing left running in the sampler's history


def test_tpe_under_asha_hears_each_rung_and_each_late_promotion(tmp_path):
    """The sampler learns from the rungs: a proposal stopped at a rung is told pruned there,
    with the rung's value, before anything reaches the end (TPE counts those towards its
    start-up and its model); one promoted to the end later is told its final value as well."""
    path = write_study(tmp_path, sampler="tpe", kind="asha", objectives="[val_loss:min]")
    search = make_searcher(A.load_study(path), store=str(tmp_path / "s.duckdb"), known={})
    first = search.ask(2)
    for job in first:
        search.tell(job, fake(job.trial, 0.5))
    history = [t for t in search.inner._optuna.get_trials(deepcopy=False) if t.user_attrs.get("counted")]
    assert [t.state.name for t in history] == ["PRUNED", "PRUNED"]
    assert [t.intermediate_values for t in history] == [{0: fake(job.trial, 0.5)["val_loss"]} for job in first]
    log = first + drive(search, width=1)
    ended = [job for job in log if job.stop_at is None]
    continued = [t for t in search.inner._optuna.get_trials(deepcopy=False) if "continues" in t.user_attrs]
    assert len(continued) == len(ended)  # every trial trained to the end was paused at the rung first
    assert sorted(t.values[0] for t in continued) == pytest.approx(sorted(final_loss(j.trial.axes) for j in ended))


def test_asha_over_tpe_resumed_after_a_kill_goes_on_from_its_rungs(tmp_path):
    """Killed with trials waiting at the rung: the resumed search keeps them (the sampler's
    journal and the store's rungs), trains none of them at the rung again, and ends."""
    path = write_study(tmp_path, sampler="tpe", kind="asha", objectives="[val_loss:min]")
    store = tmp_path / "s.duckdb"
    first = make_searcher(A.load_study(path), store=str(store), known={})
    before = [job for job in (first.ask(1) + first.ask(1) + first.ask(1))]
    for job in before:
        first.tell(job, fake(job.trial, 0.5))
    known = {job.trial.trial_id: {**job.trial.to_dict(), "status": "paused"} for job in before}
    rungs = {job.trial.trial_id: {0: {**job.trial.to_dict(), **fake(job.trial, 0.5)}} for job in before}
    second = make_searcher(A.load_study(path), store=str(store), known=known, rungs=rungs)
    after = drive(second)
    again_at_rung = [job for job in after if job.stop_at == 0.5 and job.trial.trial_id in known]
    assert not again_at_rung and second.exhausted
    # each trial that waited is still the search's: promoted on, or pruned at the rung at the end
    went_on = {job.trial.trial_id for job in after if job.rung == 1}
    assert set(known) <= went_on | {trial.trial_id for trial, _ in second.pruned}
    points = {job.trial.trial_id for job in before + after}
    assert len(points) == 8  # the three that waited and five new proposals
    states = {t.state.name for t in second.inner._optuna.get_trials(deepcopy=False)}
    assert states <= {"COMPLETE", "PRUNED"}
