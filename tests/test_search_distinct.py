"""``search.trials: N`` proposes N distinct points: a sampler that proposes a point again is
told that point's value and asked for another, and a space smaller than N runs out, said so
by the search and by ``plan``. Fake results, no training, no Ray."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import archsearch as A
from archsearch.search import make_searcher
from archsearch.search import sampled as sampled_module
from archsearch.search.preview import plan_search
from tests.test_search import drive, fake_result

SMALL = """\
name: small
axes:
  family: [transformer, mamba]
  num_layers: [1, 2, 3, 4]
model: {head_dim: 8}
"""


def write_study(folder: Path, *, sampler: str, trials: int, space: str = SMALL,
                objectives: str = "[val_loss:min]") -> Path:
    (folder / "space.yaml").write_text(space)
    path = folder / "study.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: distinct
        space: space.yaml
        budget: {{targets: [20000], tolerance: 0.05}}
        data: {{kind: text, seq_len: 16}}
        recipe: {{steps: 2, batch_size: 2}}
        search: {{sampler: {sampler}, trials: {trials}, seed: 3, objectives: {objectives}}}
        """))
    return path


def open_search(path: Path, store: Path, known: dict | None = None):
    return make_searcher(A.load_study(path), store=str(store), known=known or {})


def repeats_told(search) -> list[tuple]:
    """(a repeat's values, its original's values) for every repeated proposal."""
    trials = search._optuna.get_trials(deepcopy=False)
    return [(t.values, trials[t.user_attrs["repeat_of"]].values) for t in trials if "repeat_of" in t.user_attrs]


@pytest.mark.parametrize("sampler", ["tpe", "random", "nsga2"])
def test_n_trials_train_n_distinct_points(tmp_path, sampler):
    objectives = "[val_loss:min, tokens_per_s:max]" if sampler == "nsga2" else "[val_loss:min]"
    search = open_search(write_study(tmp_path, sampler=sampler, trials=6, objectives=objectives),
                         tmp_path / "s.duckdb")
    asked = drive(search, width=1)
    assert len(asked) == 6 == len({t.trial_id for t in asked}) == search.counted
    assert search.exhausted and search.notes == []
    assert [r["state"] for r in search.records] == ["completed"] * 6
    for told, original in repeats_told(search):  # a repeat is told what its point scored
        assert told == original and told is not None


def test_tpe_is_told_a_repeat_of_a_running_point_once_it_ends(tmp_path):
    """Two proposals in flight: a repeat of a point still training is told its value when it lands."""
    search = open_search(write_study(tmp_path, sampler="tpe", trials=8), tmp_path / "s.duckdb")
    asked = drive(search, width=3)
    assert len({t.trial_id for t in asked}) == 8
    assert all(told == original for told, original in repeats_told(search))
    states = {t.state.name for t in search._optuna.get_trials(deepcopy=False)}
    assert states <= {"COMPLETE"}, states  # nothing left running, no repeat told a failure


@pytest.mark.parametrize("sampler", ["tpe", "random", "nsga2"])
def test_a_space_smaller_than_trials_runs_out_and_says_so(tmp_path, sampler):
    path = write_study(tmp_path, sampler=sampler, trials=12)
    search = open_search(path, tmp_path / "s.duckdb")
    asked = drive(search, width=2)
    assert len(asked) == 8 == len({tuple(sorted(t.axes.items())) for t in asked}) and search.exhausted
    assert search.notes == ["the space ran out after 8 of 12 proposals: the space holds 8 points"]
    preview = plan_search(A.load_study(path))
    assert (preview.proposals, preview.asked, preview.points) == (8, 12, 8)


def test_plan_says_the_space_runs_out_before_anything_trains(tmp_path):
    from tests.test_errors import run_cli

    result = run_cli("plan", str(write_study(tmp_path, sampler="tpe", trials=12)))
    assert result.returncode == 0, result.stderr
    assert "the space runs out: it holds 8 points, fewer than search.trials (12)" in " ".join(result.stdout.split())
    assert "proposes 8 points" in result.stdout


def test_a_space_of_ranges_runs_out_after_repeats_in_a_row(tmp_path, monkeypatch):
    """Ranges cannot be counted: a run of repeats says the space is spent."""
    monkeypatch.setattr(sampled_module, "MAX_REPEATS", 20)
    space = SMALL.replace("[transformer, mamba]", "[transformer]").replace("[1, 2, 3, 4]", "{low: 1, high: 2}")
    search = open_search(write_study(tmp_path, sampler="random", trials=5, space=space), tmp_path / "s.duckdb")
    assert search.space_points is None
    asked = drive(search)
    assert sorted(t.axes["num_layers"] for t in asked) == [1, 2] and search.exhausted and search.ran_out
    assert search.notes == ["the space ran out after 2 of 5 proposals: the sampler proposed 20 points in a row "
                            "that it had proposed before"]


def test_a_resumed_search_never_proposes_a_finished_point_again(tmp_path):
    path = write_study(tmp_path, sampler="tpe", trials=8)
    store = tmp_path / "s.duckdb"
    first = open_search(path, store)
    before = drive(first, width=2, stop_after=4)  # killed with proposals in flight
    known = {t.trial_id: {**t.to_dict(), **fake_result(t), "status": "completed"} for t in before[:4]}
    second = open_search(path, store, known=known)
    after = drive(second, width=2)
    trained = [t.trial_id for t in before[:4]] + [t.trial_id for t in after]
    assert len(set(trained)) == 8 == len(trained)
    assert {t.state.name for t in second._optuna.get_trials(deepcopy=False)} == {"COMPLETE"}


@pytest.mark.parametrize("sampler", ["tpe", "nsga2"])
def test_the_last_points_of_a_listed_space_are_put_to_the_sampler(tmp_path, monkeypatch, sampler):
    """A sampler that keeps proposing what it has is handed a point not yet proposed, so
    trials equal to the space's size reach every point, well inside the repeat bound."""
    monkeypatch.setattr(sampled_module, "MAX_REPEATS", 12)
    monkeypatch.setattr(sampled_module, "REPEATS_BEFORE_FILL", 3)
    search = open_search(write_study(tmp_path, sampler=sampler, trials=8), tmp_path / "s.duckdb")
    asked = drive(search, width=1)
    assert len({t.trial_id for t in asked}) == 8 and not search.ran_out and search.notes == []


@pytest.mark.ray
@pytest.mark.slow
def test_a_run_over_a_smaller_space_trains_each_point_once_and_says_it_ran_out(tmp_path):
    from archsearch.execute import run_study

    summary = run_study(A.load_study(write_study(tmp_path, sampler="tpe", trials=12)), store=tmp_path / "s.duckdb",
                        show_progress=False)
    assert summary.completed == summary.planned == 8 and summary.failed == 0
    assert summary.notes == ("the space ran out after 8 of 12 proposals: the space holds 8 points",)
