"""Twins: trials of different arms that train the same model (same spec, data,
recipe and seed) train once, and every arm still gets its row with the result.

The study is a tiny looped one under the iso_param protocol: its baseline arm
is the shared group applied once, the same stack for loops=1 and loops=2, so
each seed plans two baseline trials that are one training.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import archsearch as A
from archsearch.execute.driver import _Scheduler
from archsearch.execute.progress import TrialProgress
from archsearch.planner import twin_lines
from archsearch.search import GridSearch, Job


def looped_study(folder: Path, *, seeds: str = "[0, 1]", targets: str = "[6000]") -> A.Study:
    (folder / "study.yaml").write_text(textwrap.dedent(f"""\
        name: twins
        space:
          axes:
            family: looped
            num_layers: 2
            loops: [1, 2]
          model:
            head_dim: 8
        budget:
          match: params
          protocol: iso_param
          targets: {targets}
          tolerance: 0.05
        data:
          kind: task
          name: phop
          params: {{num_symbols: 3, seq_len: 12, min_hops: 0, max_hops: 2}}
        recipe:
          steps: 4
          batch_size: 4
          warmup_steps: 1
          eval_every: 2
          eval_batches: 1
        seeds: {seeds}
        execution:
          max_parallel: 2
          threads_per_trial: 1
        """))
    return A.load_study(folder / "study.yaml")


def baselines(trials) -> dict[tuple[int, int], A.PlannedTrial]:
    """The baseline arm's trials by (loops, seed)."""
    return {(t.axes["loops"], t.seed): t for t in trials if t.axes.get("arm") == "baseline"}


def test_baselines_of_two_partners_are_twins_within_a_seed_never_across(tmp_path):
    """The loops=2 baseline names the loops=1 one of its own seed in ``same_as``; other seeds
    and the looped arms train their own (planted mutation: a train key that ignores the seed
    makes seed 1's baselines twins of seed 0's, and this fails)."""
    trials = A.plan(looped_study(tmp_path))
    assert len(trials) == 8  # 2 loops x 2 arms x 2 seeds
    base = baselines(trials)
    for seed in (0, 1):
        assert base[1, seed].spec == base[2, seed].spec
        assert base[1, seed].trial_id != base[2, seed].trial_id  # each partner keeps its own row
        assert base[1, seed].same_as is None and base[2, seed].same_as == base[1, seed].trial_id
    assert base[1, 0].train_key != base[1, 1].train_key
    assert [t for t in trials if t.same_as is not None] == [base[2, 0], base[2, 1]]
    lines = twin_lines(trials)
    assert lines[0].startswith("2 of 8 planned trials are duplicates")
    assert lines[1:] == ["  loops=1 arm=baseline trains once for: loops=2 (2 trials, seeds 0, 1)"]


def test_trials_that_differ_in_width_or_seed_are_not_twins(tmp_path):
    """Two targets solve two widths: a baseline is a twin only of its own target's (planted
    mutation: a train key of the recipe, data and seed alone merges the two targets' baselines)."""
    trials = A.plan(looped_study(tmp_path, seeds="[0]", targets="[6000, 12000]"))
    twins = {t.trial_id: t.same_as for t in trials if t.same_as is not None}
    assert len(twins) == 2
    by_id = {t.trial_id: t for t in trials}
    for twin, owner in twins.items():
        assert by_id[twin].target == by_id[owner].target and by_id[twin].spec == by_id[owner].spec
    widths = {t.spec.mlp_widths for t in trials if t.axes.get("arm") == "baseline"}
    assert len(widths) == 2  # the two targets' baselines really differ


def test_plan_says_how_many_trials_share_a_training(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from archsearch.cli import app

    looped_study(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    result = CliRunner().invoke(app, ["plan", str(tmp_path / "study.yaml")])
    assert result.exit_code == 0, result.output
    assert "2 of 8 planned trials are duplicates" in result.output
    assert "loops=1 arm=baseline trains once for: loops=2" in result.output
    assert "summed over the 6 trainings of the 8 trials" in result.output
    plan_json = json.loads(CliRunner().invoke(app, ["plan", str(tmp_path / "study.yaml"), "--json"]).output)
    assert sum(t["same_as"] is not None for t in plan_json) == 2


# the driver's twin logic, without Ray: a fake result stands for a training


RESULT = dict(train_loss=2.0, val_loss=2.5, val_accuracy=0.3, steps=4, tokens=192, wall_time_s=1.0,
              tokens_per_s=192.0, curve=[
                  dict(step=2, tokens=96, train_loss=2.2, val_loss=2.6, val_accuracy=0.2, lr=1e-3),
                  dict(step=4, tokens=192, train_loss=2.0, val_loss=2.5, val_accuracy=0.3, lr=1e-3)])


def scheduler(db, trials) -> _Scheduler:
    return _Scheduler(GridSearch(trials), db, None, study="twins", store=db.path, storage=None, threads=1, retries=0,
                  progress=TrialProgress(total=len(trials), enabled=False), workers={}, kernels={})


def rows(db) -> dict[str, dict]:
    return {r["trial_id"]: r for r in db.trials("twins").to_pylist()}


def curve(db, trial_id: str) -> list[tuple]:
    return [(m["step"], m["val_loss"]) for m in db.metrics().to_pylist() if m["trial_id"] == trial_id]


def test_twins_asked_together_train_once_and_both_rows_get_the_result(tmp_path):
    """Of two twins handed out at once only the first is started; when it ends the other
    gets its result and curve, ``same_as`` naming it, and no attempt of its own."""
    trials = A.plan(looped_study(tmp_path, seeds="[0]"))
    base = baselines(trials)
    owner, twin = base[1, 0], base[2, 0]
    db = A.open_store(tmp_path / "s.duckdb")
    db.add_trials("twins", [t.to_dict() for t in trials])
    d = scheduler(db, [owner, twin])
    started = d._ask(4)
    assert [job.trial.trial_id for job in started] == [owner.trial_id]  # the twin is not started
    d._write([], [(job, 1) for job in started])
    d.writer.flush()
    ended = d._with_twins([(started[0], "result", RESULT, 1.0, None)])
    assert [(job.trial.trial_id, source) for job, *_, source in ended] == [(owner.trial_id, None),
                                                                           (twin.trial_id, owner.trial_id)]
    d._write(ended, [])
    d.writer.flush()
    got = rows(db)
    assert got[owner.trial_id]["status"] == got[twin.trial_id]["status"] == "completed"
    assert got[owner.trial_id]["val_loss"] == got[twin.trial_id]["val_loss"] == 2.5
    assert (got[owner.trial_id]["attempts"], got[twin.trial_id]["attempts"]) == (1, 0)
    assert (got[owner.trial_id]["same_as"], got[twin.trial_id]["same_as"]) == (None, owner.trial_id)
    assert curve(db, twin.trial_id) == curve(db, owner.trial_id) == [(2, 2.6), (4, 2.5)]
    assert d.counts == {"completed": 1, "failed": 0, "diverged": 0, "shared": 1, "pruned": 0}
    shown = status_text(tmp_path / "s.duckdb")
    assert "1 trial shares another's training" in shown
    assert f"trial {owner.trial_id} gives its result to {twin.trial_id}" in shown


def test_a_trial_proposed_again_while_it_trains_keeps_its_curve_and_counts_once(tmp_path):
    """A sampler (TPE) can propose the very trial it is training: the second job rides on the
    first, and its end writes nothing, rather than sharing the trial's result with itself (which
    deleted its own curve) and counting a phantom trial (a run summary with skipped = -1)."""
    trials = A.plan(looped_study(tmp_path, seeds="[0]"))
    trial = baselines(trials)[1, 0]
    db = A.open_store(tmp_path / "s.duckdb")
    db.add_trials("twins", [trial.to_dict()])
    d = scheduler(db, [trial, trial])
    started = d._ask(4)
    assert [job.trial.trial_id for job in started] == [trial.trial_id]
    d._write([], [(job, 1) for job in started])
    d.writer.flush()
    ended = d._with_twins([(started[0], "result", RESULT, 1.0, None)])
    d._write(ended, [])
    d.writer.flush()
    assert d.counts == {"completed": 1, "failed": 0, "diverged": 0, "shared": 0, "pruned": 0}
    got = rows(db)[trial.trial_id]
    assert got["status"] == "completed" and got["same_as"] is None
    assert curve(db, trial.trial_id) == [(2, 2.6), (4, 2.5)]
    with pytest.raises(LookupError, match="cannot share its own result"):
        db.share(trial.trial_id, trial.trial_id)


def status_text(store: Path) -> str:
    from typer.testing import CliRunner

    from archsearch.cli import app

    result = CliRunner().invoke(app, ["status", "--store", str(store)])
    assert result.exit_code == 0, result.output
    return result.output


def test_a_twin_whose_twin_finished_before_a_crash_is_filled_without_training(tmp_path):
    """The store holds the trained twin (the driver died before the other's row was written):
    the next run fills the other from it and starts nothing (planted mutation: dropping the
    store's finished trials from the driver's twins leaves the twin to train: run() then
    needs Ray and a task, and this test fails)."""
    trials = A.plan(looped_study(tmp_path, seeds="[0]"))
    base = baselines(trials)
    owner, twin = base[1, 0], base[2, 0]
    db = A.open_store(tmp_path / "s.duckdb")
    db.add_trials("twins", [t.to_dict() for t in trials])
    db.finish(owner.trial_id, RESULT)
    db.mark_running(twin.trial_id)
    db.mark_interrupted()
    counts = scheduler(db, [twin]).run(2)  # task None: anything started would fail here
    assert counts == {"completed": 0, "failed": 0, "diverged": 0, "shared": 1, "pruned": 0}
    got = rows(db)[twin.trial_id]
    assert (got["status"], got["val_loss"], got["same_as"]) == ("completed", 2.5, owner.trial_id)
    assert curve(db, twin.trial_id) == curve(db, owner.trial_id)


def test_a_shared_row_names_the_trial_that_trained_never_another_twin(tmp_path):
    """Sharing from a twin that itself shares gives the trial that trained; training a row
    itself clears its ``same_as``."""
    trials = A.plan(looped_study(tmp_path, seeds="[0]"))
    db = A.open_store(tmp_path / "s.duckdb")
    db.add_trials("twins", [t.to_dict() for t in trials])
    first, second, third = (t.trial_id for t in trials[:3])
    db.finish(first, RESULT)
    db.share(second, first)
    db.share(third, second)
    assert rows(db)[third]["same_as"] == first and curve(db, third) == curve(db, first)
    db.finish(third, dict(RESULT, val_loss=2.4))
    assert rows(db)[third]["same_as"] is None


def test_a_failed_training_fails_its_waiting_twin_with_the_same_error(tmp_path):
    trials = A.plan(looped_study(tmp_path, seeds="[0]"))
    base = baselines(trials)
    db = A.open_store(tmp_path / "s.duckdb")
    db.add_trials("twins", [t.to_dict() for t in trials])
    d = scheduler(db, [base[1, 0], base[2, 0]])
    started = d._ask(4)
    d._write([], [(job, 1) for job in started])
    d.writer.flush()
    d._write(d._with_twins([(started[0], "failed", "RuntimeError: out of memory", 1.0, None)]), [])
    d.writer.flush()
    got = rows(db)[base[2, 0].trial_id]
    assert (got["status"], got["error"], got["same_as"]) == ("failed", "RuntimeError: out of memory",
                                                             base[1, 0].trial_id)


def test_a_store_of_schema_2_gains_the_same_as_column_when_written(tmp_path):
    import duckdb

    path = tmp_path / "old.duckdb"
    A.open_store(path)
    con = duckdb.connect(str(path))
    con.execute("ALTER TABLE trials DROP COLUMN same_as")
    con.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    con.close()
    assert "same_as" not in A.open_store(path, read_only=True).trials().column_names  # read as it is
    assert "same_as" in A.open_store(path).trials().column_names
    from archsearch.store.schema import SCHEMA_VERSION

    # taken forward to the newest schema, one migration after another
    assert A.open_store(path, read_only=True).sql("SELECT value FROM meta").column("value").to_pylist() == [
        str(SCHEMA_VERSION)]


# the whole run on Ray: trainings counted by attempts and checkpoint folders


@pytest.mark.ray
def test_a_run_trains_each_twin_once_and_a_rerun_trains_nothing(tmp_path, capsys):
    from archsearch.execute import run_study

    study = looped_study(tmp_path, seeds="[0]")
    store = tmp_path / "s.duckdb"
    summary = run_study(study, store=store, show_progress=True, heartbeat_s=1e9)
    assert (summary.planned, summary.completed, summary.shared, summary.failed) == (4, 3, 1, 0)
    assert "1 of 4 planned trials are duplicates" in capsys.readouterr().err
    base = baselines(A.plan(study))
    owner, twin = base[1, 0].trial_id, base[2, 0].trial_id
    with A.open_store(store, read_only=True) as db:
        got = rows(db)
        assert all(r["status"] == "completed" for r in got.values())
        assert got[twin]["attempts"] == 0 and got[twin]["same_as"] == owner
        assert got[twin]["val_loss"] == got[owner]["val_loss"] and curve(db, twin) == curve(db, owner)
        assert sum(r["attempts"] for r in got.values()) == 3
    trained = {p.name for p in (tmp_path / "s.duckdb.checkpoints").iterdir()}
    assert twin not in trained and owner in trained and len(trained) == 3
    again = run_study(study, store=store, show_progress=False)
    assert (again.skipped, again.completed, again.shared) == (4, 0, 0)
    with A.open_store(store, read_only=True) as db:
        assert sum(r["attempts"] for r in rows(db).values()) == 3
