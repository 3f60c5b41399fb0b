"""The search layer: Optuna samplers asked one point at a time, told fake
results computed from the point, so every test runs in well under a second
a proposal and needs no training and no Ray."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import archsearch as A
from archsearch.search import GridSearch, SampledSearch, make_searcher, search_journal
from archsearch.search import sampled as sampled_module
from archsearch.space.schema import FAMILY_AXES

SPACE = """\
name: s
axes:
  family: [transformer, mamba, looped]
  num_layers: {low: 1, high: 4}
  loops: [2, 3]
  taper:
    shape: [uniform, cosine]
    ratio: {low: 1.5, high: 4.0, log: true}
model:
  head_dim: 8
"""


def write_study(folder: Path, *, sampler: str = "tpe", trials: int = 8, objectives: str = "[val_loss:min]",
                constraints: str = "", seeds: str = "[0]") -> Path:
    space = SPACE + (f"constraints: {constraints}\n" if constraints else "")
    (folder / "space.yaml").write_text(space)
    path = folder / "study.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: searched
        space: space.yaml
        budget: {{targets: [20000], tolerance: 0.05}}
        data: {{kind: text, seq_len: 16}}
        recipe: {{steps: 2, batch_size: 2}}
        seeds: {seeds}
        search: {{sampler: {sampler}, trials: {trials}, seed: 3, objectives: {objectives}}}
        """))
    return path


def fake_result(trial) -> dict:
    """A deterministic 'training' result: deeper and cosine-tapered is better."""
    axes = trial.axes
    loss = 3.0 - 0.2 * axes["num_layers"] - (0.3 if axes.get("taper.shape") == "cosine" else 0.0)
    return dict(train_loss=loss, val_loss=loss, val_accuracy=0.1, steps=2, tokens=64, wall_time_s=0.01,
                tokens_per_s=1000.0 * axes["num_layers"], curve=[])


def drive(searcher, *, width: int = 2, stop_after: int | None = None) -> list:
    """Run a searcher like the driver does: ``width`` trials in flight, told
    in the order they were asked; stop (leaving trials untold) after
    ``stop_after`` tells."""
    running, told, asked = [], 0, []
    while True:
        new = searcher.ask(width - len(running))
        asked += [job.trial for job in new]
        running += new
        if not running:
            return asked
        if stop_after is not None and told >= stop_after:
            return asked
        job = running.pop(0)
        searcher.tell(job, fake_result(job.trial))
        told += 1


def open_search(path: Path, store: Path, known: dict | None = None) -> SampledSearch:
    return make_searcher(A.load_study(path), store=str(store), known=known or {})


def test_a_grid_hands_out_every_planned_trial_once(tmp_path):
    study = A.load_study(write_study(tmp_path, sampler="grid", trials=1))
    with pytest.raises(A.SpecError, match="grid: N or sample: N"):
        A.plan(study)  # a grid needs its ranges gridded; a sampler samples them as they are
    trials = [object()] * 3
    grid = GridSearch(trials)
    first, rest = grid.ask(2), grid.ask(5)
    assert [j.trial for j in first] == trials[:2] and [j.trial for j in rest] == trials[2:] and grid.exhausted


def test_proposals_come_from_the_axes_distributions(tmp_path):
    path = write_study(tmp_path, sampler="random", trials=30)
    search = open_search(path, tmp_path / "r.duckdb")
    asked = drive(search)
    points = [t.axes for t in asked]
    assert len(asked) == 30 and search.exhausted
    assert {p["family"] for p in points} == {"transformer", "mamba", "looped"}
    for p in points:
        assert 1 <= p["num_layers"] <= 4 and isinstance(p["num_layers"], int)
        # an axis a family does not read is never drawn for it
        assert set(p) <= set(FAMILY_AXES[p["family"]]) | {"arm"}
        if p["taper.shape"] == "cosine":
            assert 1.5 <= p["taper.ratio"] <= 4.0 and p["taper.ratio"] not in (1.5, 4.0)
        else:
            assert p["taper.ratio"] == 1.0  # uniform has no ratio
    assert any("loops" in p for p in points) and all(("loops" in p) == (p["family"] == "looped") for p in points)


def test_tpe_moves_towards_the_better_region(tmp_path):
    """Against random search on the same fake objective, TPE's later
    proposals are better on average (fails if tell() never reaches Optuna)."""
    means = {}
    for sampler in ("random", "tpe"):
        folder = tmp_path / sampler
        folder.mkdir()
        search = open_search(write_study(folder, sampler=sampler, trials=40), folder / "s.duckdb")
        asked = drive(search, width=1)
        late = [fake_result(t)["val_loss"] for t in asked[20:]]
        means[sampler] = sum(late) / len(late)
    assert means["tpe"] < means["random"] - 0.05, means


def test_a_resumed_tpe_search_continues_rather_than_restarts(tmp_path):
    path = write_study(tmp_path, sampler="tpe", trials=10)
    store = tmp_path / "s.duckdb"
    first = open_search(path, store)
    asked_before = drive(first, width=2, stop_after=5)  # the driver dies with trials in flight
    in_flight = [t.trial_id for t in asked_before[5:]]
    assert in_flight
    known = {t.trial_id: {**t.to_dict(), **fake_result(t), "status": "completed"} for t in asked_before[:5]}
    second = open_search(path, store, known=known)
    assert second.counted == first.counted < 10  # the history is kept, not restarted
    resumed = second.ask(len(in_flight))
    assert [j.trial.trial_id for j in resumed] == in_flight  # what was running comes first, the same trials
    for job in resumed:
        second.tell(job, fake_result(job.trial))
    drive(second)
    numbers = [t.number for t in second._optuna.get_trials() if t.user_attrs.get("counted")]
    assert len(numbers) == 10 == len(set(numbers)) and second.counted == 10
    states = {t.state.name for t in second._optuna.get_trials() if t.user_attrs.get("counted")}
    assert states == {"COMPLETE"}


def test_a_grown_search_only_proposes_the_new_points(tmp_path):
    store = tmp_path / "s.duckdb"
    first = open_search(write_study(tmp_path, trials=4), store)
    drive(first)
    grown = open_search(write_study(tmp_path, trials=7), store)
    assert grown.counted == 4
    assert len(drive(grown)) == 3


def test_known_trials_are_scored_without_training(tmp_path):
    """A proposal whose trials the store already finished is told at once."""
    path = write_study(tmp_path, sampler="random", trials=6)
    probe = open_search(path, tmp_path / "probe.duckdb")
    every = drive(probe)
    known = {t.trial_id: {**t.to_dict(), **fake_result(t), "status": "completed"} for t in every}
    again = open_search(path, tmp_path / "again.duckdb", known=known)  # same seed: the same proposals
    assert again.ask(10) == [] and again.exhausted
    assert [r["state"] for r in again.records] == ["completed"] * 6


def test_several_objectives_give_a_pareto_set(tmp_path):
    path = write_study(tmp_path, sampler="nsga2", trials=12, objectives="[val_loss:min, tokens_per_s:max]")
    search = open_search(path, tmp_path / "s.duckdb")
    drive(search)
    assert len(search.records) == 12
    values = [r["values"] for r in search.records]
    front = [t.values for t in search.best]
    for v in front:  # nothing proposed dominates a member of the front
        assert not any(o[0] <= v[0] and o[1] >= v[1] and o != v for o in values)
    assert search.records[0]["objectives"] == ["val_loss:min", "tokens_per_s:max"]


def test_a_proposal_averages_its_seeds_and_a_diverged_trial_fails_it(tmp_path):
    path = write_study(tmp_path, sampler="random", trials=2, seeds="[0, 1]")
    search = open_search(path, tmp_path / "s.duckdb")
    asked = search.ask(10)
    assert len(asked) == 4  # two points x two seeds
    for i, job in enumerate(asked):
        result = fake_result(job.trial)
        result["val_loss"] = float("nan") if i == 3 else result["val_loss"] + job.trial.seed
        search.tell(job, result)
    first, second = search.records
    assert first["state"] == "completed" and first["values"][0] == pytest.approx(fake_result(asked[0].trial)["val_loss"] + 0.5)
    assert second["state"] == "failed" and second["values"] is None


@pytest.mark.parametrize("sampler", ["random", "tpe", "nsga2", "cmaes", pytest.param("gp", marks=pytest.mark.slow)])
def test_every_sampler_proposes_valid_points(tmp_path, sampler):
    search = open_search(write_study(tmp_path, sampler=sampler, trials=5), tmp_path / "s.duckdb")
    asked = drive(search)
    assert len({t.trial_id for t in asked}) >= 1 and search.exhausted
    assert all(1 <= t.axes["num_layers"] <= 4 for t in asked)


def test_constraints_are_honoured_and_an_impossible_one_fails_cleanly(tmp_path, monkeypatch):
    path = write_study(tmp_path, sampler="random", trials=8, constraints="['num_layers >= 3']")
    asked = drive(open_search(path, tmp_path / "a.duckdb"))
    assert asked and all(t.axes["num_layers"] >= 3 for t in asked)
    monkeypatch.setattr(sampled_module, "MAX_REJECTIONS", 20)
    path = write_study(tmp_path, sampler="random", trials=8, constraints="['num_layers > 9']")
    with pytest.raises(A.SpecError, match="constraints reject"):
        open_search(path, tmp_path / "b.duckdb").ask(1)


def test_changed_objectives_are_refused_for_an_existing_search(tmp_path):
    store = tmp_path / "s.duckdb"
    drive(open_search(write_study(tmp_path, trials=2), store))
    with pytest.raises(A.SpecError, match="other objectives"):
        open_search(write_study(tmp_path, trials=2, objectives="[val_loss:min, params:min]"), store)


def test_the_journal_is_never_shared_between_two_stores(tmp_path):
    assert search_journal(tmp_path / "cp.duckdb", "x") != search_journal(tmp_path / "cp.db", "x")


@pytest.mark.parametrize("search, message", [
    ("{sampler: tpe}", "needs trials"),
    ("{sampler: cmaes, trials: 3, objectives: [val_loss:min, params:min]}", "cmaes optimises one objective"),
    ("{sampler: tpe, trials: 3, objectives: [loss:min]}", "search.objectives"),
    ("{sampler: annealing, trials: 3}", "search.sampler"),
])
def test_bad_search_sections_fail_in_one_line(tmp_path, search, message):
    from tests.test_errors import run_cli

    path = write_study(tmp_path)
    path.write_text(path.read_text().replace(path.read_text().splitlines()[-1], f"search: {search}"))
    result = run_cli("plan", str(path))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert message in result.stderr and "study.yaml:" in result.stderr


def test_a_sweep_and_a_sampler_are_refused_together(tmp_path):
    path = write_study(tmp_path)
    path.write_text(path.read_text().replace("recipe: {steps: 2, batch_size: 2}",
                                             "recipe: {steps: 2, batch_size: 2, lr: {sweep: [0.001, 0.003]}}"))
    with pytest.raises(A.SpecError, match="sweep cannot be combined"):
        open_search(path, tmp_path / "s.duckdb")


@pytest.mark.ray
@pytest.mark.slow
def test_a_sampled_study_runs_on_ray_into_the_store_and_grows(tmp_path):
    from archsearch.execute import run_study

    path = write_study(tmp_path, sampler="tpe", trials=3)
    store = tmp_path / "s.duckdb"
    first = run_study(A.load_study(path), store=store, show_progress=False)
    # three proposals, three distinct points: a point TPE proposes again is told its value, not trained
    assert first.completed == first.planned == 3 and first.failed == 0 and first.notes == ()
    grown = run_study(A.load_study(write_study(tmp_path, sampler="tpe", trials=4)), store=store,
                      show_progress=False)
    with A.open_store(store, read_only=True) as db:
        proposals = db.proposals("searched").to_pylist()
        trials = db.trials("searched").to_pylist()
    assert [p["number"] for p in proposals] == [0, 1, 2, 3]
    assert all(p["state"] == "completed" and len(json.loads(p["values"])) == 1 for p in proposals)
    assert grown.completed <= 1 and len(trials) == len({t["trial_id"] for t in trials})
    done = {t["trial_id"]: t["val_loss"] for t in trials}
    for p in proposals:  # the value told is the trial's own validation loss
        ids = json.loads(p["trial_ids"])
        assert json.loads(p["values"])[0] == pytest.approx(sum(done[i] for i in ids) / len(ids))


@pytest.mark.parametrize("sampler", ["random", "tpe", "nsga2", "cmaes", "gp"])
def test_optunas_experimental_warnings_are_silenced_inside_the_search_only(tmp_path, sampler):
    """A search uses experimental Optuna features on purpose and says nothing of them, but the
    caller's warning filters are left as they were (no process-wide 'ignore' added)."""
    import warnings

    import optuna

    before = list(warnings.filters)
    with warnings.catch_warnings():
        warnings.simplefilter("error", optuna.exceptions.ExperimentalWarning)  # any that escapes fails
        search = open_search(write_study(tmp_path, sampler=sampler, trials=6), tmp_path / "s.duckdb")
        assert len(drive(search)) == 6
        inside = list(warnings.filters)
    assert warnings.filters == before
    assert not any(f[0] == "ignore" and f[2] is optuna.exceptions.ExperimentalWarning for f in inside)
