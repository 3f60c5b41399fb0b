"""The generalisation gap, ``gen_gap`` = val_loss - train_loss at the end of training:
a column of every trials read (the Arrow table, status, pareto) and a search objective.
Planted mutation that fails here: the gap computed as train_loss - val_loss in the
store's read (every test below but the objective's)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import archsearch as A
from archsearch import analysis
from archsearch.cli import app
from archsearch.search import objective_values, parse_objectives
from tests.analysis_support import cli_json, write_store

# (val_loss, train_loss): gaps 0.5, 0.1, 0.3
LOSSES = [(3.0, 2.5), (3.2, 3.1), (2.9, 2.6)]


@pytest.fixture
def store(tmp_path):
    trials = [dict(family="transformer", params=1000 * (i + 1), achieved=1000.0 * (i + 1), target=1000.0 * (i + 1),
                   val_loss=val, train_loss=train, tokens_per_s=1.0) for i, (val, train) in enumerate(LOSSES)]
    return write_store(tmp_path / "s.duckdb", trials=trials)


def test_the_trials_table_has_the_gap(store):
    with A.open_store(store, read_only=True) as db:
        gaps = db.trials().column("gen_gap").to_pylist()
        done = analysis.completed_trials(db, "scaling").column("gen_gap").to_pylist()
    assert gaps == pytest.approx([0.5, 0.1, 0.3]) and done == pytest.approx(gaps)


def test_status_shows_the_gap(store):
    result = CliRunner().invoke(app, ["status", "--store", str(store), "--wide"])
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if line.startswith("trial ")).split()
    rows = [line.split() for line in result.output.splitlines() if line.startswith("t") and line[1:2].isdigit()]
    assert [row[header.index("gap")] for row in rows] == ["0.5000", "0.1000", "0.3000"]
    data = cli_json("status", "--store", str(store))
    assert [t["gen_gap"] for t in data["trials"]] == pytest.approx([0.5, 0.1, 0.3])


def test_pareto_rows_carry_the_gap_and_it_is_an_objective(store):
    front = cli_json("pareto", "--store", str(store), "--objectives", "gen_gap,params")["front"]
    # (gap, params): (0.5, 1000) (0.1, 2000) (0.3, 3000): the third is dominated by the second
    assert sorted((row["trial_id"], row["gen_gap"]) for row in front) == [("t0", pytest.approx(0.5)),
                                                                          ("t1", pytest.approx(0.1))]
    assert all("gen_gap" in row for row in cli_json("pareto", "--store", str(store))["front"])


def test_a_search_can_minimise_the_gap(tmp_path):
    """The objective a sampler is told: from a trial's result (or its stored row)."""
    (objective,) = parse_objectives(["gen_gap:min"])
    assert objective_values([objective], dict(val_loss=3.0, train_loss=2.75)) == [0.25]
    assert objective_values([objective], dict(val_loss=3.0, train_loss=None)) is None
    path = tmp_path / "search.yaml"
    path.write_text(json.dumps(dict(name="s", space=dict(axes=dict(num_layers=2)), budget=dict(targets=[1e4]),
                                    search=dict(sampler="random", trials=2, objectives=["gen_gap:min"]))))
    assert A.load_study(path).search.objectives == ["gen_gap:min"]
