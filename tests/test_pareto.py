"""Pareto fronts: non-dominated rows against brute force, hypervolume, matched budgets, the CLI."""

from __future__ import annotations

import importlib
import itertools

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from archsearch import analysis
from archsearch.analysis import hypervolume, nondominated, pareto, pareto_front, parse_objectives
from tests.analysis_support import cli_json, one_line_error, write_store

# the module (``archsearch.analysis.pareto`` the attribute is the function)
pareto_module = importlib.import_module("archsearch.analysis.pareto")

ROWS = [dict(id=i, loss=loss, params=p, speed=s) for i, (loss, p, s) in enumerate(
    [(3.0, 10, 5.0), (2.5, 20, 4.0), (2.6, 30, 9.0), (2.0, 40, 1.0), (3.5, 5, 2.0), (2.5, 25, 3.0)])]


def brute_front(points: np.ndarray) -> list[int]:
    """Every row no other row is no worse than everywhere and better than somewhere."""
    points = np.asarray(points, dtype=float)
    if len(points) == 0:
        return []
    no_worse = (points[None, :, :] <= points[:, None, :]).all(axis=-1)  # [i, j]: row j no worse than row i
    better = (points[None, :, :] < points[:, None, :]).any(axis=-1)
    return np.flatnonzero(~(no_worse & better).any(axis=1)).tolist()


def brute_volume(points: np.ndarray, reference: np.ndarray) -> int:
    """Integer points: count the unit cells [c, c + 1) some point is no worse than."""
    cells = itertools.product(*(range(int(r)) for r in reference))
    return sum(bool(((points <= np.array(c)).all(axis=1)).any()) for c in cells)


def test_front_is_the_non_dominated_rows():
    front = pareto_front(ROWS, [("loss", "min"), ("params", "min")])
    assert [r["id"] for r in front] == [3, 1, 0, 4]


def test_max_objectives_flip_the_direction():
    front = pareto_front(ROWS, parse_objectives("loss,speed:max"))
    assert {r["id"] for r in front} == {1, 2, 3}  # 2 beats 0 on both


def test_per_second_columns_default_to_max():
    assert parse_objectives("val_loss,tokens_per_s") == [("val_loss", "min"), ("tokens_per_s", "max")]


def test_unknown_column_and_direction_are_refused():
    with pytest.raises(ValueError, match="no objective 'nope'"):
        pareto_front(ROWS, [("nope", "min")])
    with pytest.raises(ValueError, match="min or max"):
        parse_objectives("loss:up")


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 4).flatmap(lambda k: st.tuples(
    st.lists(st.lists(st.integers(0, 5), min_size=k, max_size=k), max_size=30),
    st.lists(st.sampled_from(["min", "max"]), min_size=k, max_size=k))))
def test_front_and_hypervolume_agree_with_brute_force(case):
    """Small integers make ties and repeated rows common; equal rows share the front."""
    values, directions = case
    k = len(directions)
    points = np.array(values, dtype=float).reshape(len(values), k)
    signs = np.array([1 if d == "min" else -1 for d in directions])
    assert nondominated(points * signs).tolist() == brute_front(points * signs)
    front = pareto({f"o{j}": points[:, j] for j in range(k)}, [(f"o{j}", d) for j, d in enumerate(directions)])
    assert sorted(front.indices) == brute_front(points * signs)
    if k <= 3 and len(values):
        # Shift every objective so the reference sits at 6 in minimised units.
        shifted = points * signs + np.where(signs > 0, 0, 5)
        assert hypervolume(shifted[front.indices], np.full(k, 6.0)) == brute_volume(shifted, np.full(k, 6))


def near_a_surface(seed: int, rows: int, k: int, high: int, noise: int) -> np.ndarray:
    """``rows`` integer points on the plane where the objectives sum to ``(k - 1) * high``, each
    raised by up to ``noise``: many points near the front (so the prefilter's pivots dominate
    few of them) and many ties (so the sweeps' tie rules decide)."""
    rng = np.random.default_rng(seed)
    free = rng.integers(0, high + 1, size=(rows, k - 1))
    last = (k - 1) * high - free.sum(axis=1) + rng.integers(0, noise + 1, size=rows)
    return np.column_stack([free, last]).astype(float)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(50, 400), k=st.sampled_from([3, 4]),
       high=st.integers(6, 12), noise=st.integers(1, 4))
def test_fronts_of_large_tables_agree_with_brute_force(seed, rows, k, high, noise):
    """Past the 16-pivot prefilter: only tables where the sweep, not the prefilter, removes some
    dominated points are kept (nearly all of them), so the sweep's tie rule decides the front."""
    points = near_a_surface(seed, rows, k, high, noise)
    unique, _ = pareto_module._unique_rows(points)
    alive = unique[~pareto_module._dominated_by_pivots(unique)]
    assume(len(brute_front(alive)) < len(alive))
    front = nondominated(points)
    assert front.tolist() == brute_front(points)
    if k == 3:
        reference = points.max(axis=0) + 1
        assert hypervolume(points[front], reference) == brute_volume(points, reference)


@settings(max_examples=150, deadline=None)
@given(st.integers(3, 4).flatmap(lambda k: st.lists(st.lists(st.integers(0, 4), min_size=k, max_size=k),
                                                    min_size=1, max_size=60)))
def test_the_sweeps_alone_agree_with_brute_force(values):
    """The 3-objective staircase sweep and the n-objective sweep called directly, with no prefilter
    in front: on distinct rows in lexicographic order (what ``nondominated`` hands them)."""
    unique, _ = pareto_module._unique_rows(np.array(values, dtype=float))
    sweep = pareto_module._nondominated_3d if unique.shape[1] == 3 else pareto_module._nondominated_nd
    assert np.flatnonzero(sweep(unique)).tolist() == brute_front(unique)


def test_the_staircase_covers_a_point_it_ties():
    """A point equal to a staircase point on both objectives is covered (no worse on both)."""
    stairs = pareto_module._Staircase()
    stairs.insert(1.0, 3.0)
    stairs.insert(2.0, 2.0)
    assert stairs.covers(2.0, 2.0) and stairs.covers(1.0, 3.0) and stairs.covers(2.5, 2.0)
    assert not stairs.covers(0.5, 3.0) and not stairs.covers(1.5, 2.5)


def test_hypervolume_of_a_hand_drawn_staircase():
    # Points (1, 3), (2, 2), (3, 1) below the reference (4, 4): 3 + 2 + 1 unit columns.
    assert hypervolume(np.array([[1, 3], [2, 2], [3, 1]]), np.array([4, 4])) == 6
    front = pareto({"a": [1, 2, 3, 3], "b": [3, 2, 1, 3]}, "a,b", reference=[4, 4])
    assert front.hypervolume == 6 and front.indices == [0, 1, 2] and front.reference_rule == "given"
    # Default reference: the worst value of each objective plus 10% of its range.
    assert pareto({"a": [1, 2, 3], "b": [3, 2, 1]}, "a,b:max").reference == [pytest.approx(3.2), pytest.approx(0.8)]


def test_a_hundred_thousand_points_on_a_surface(tmp_path):
    """Every point of a 3-D simplex slice is on the front; nothing is lost or doubled."""
    rng = np.random.default_rng(0)
    x = rng.random((100_000, 2))
    points = np.column_stack([x, 2 - x.sum(axis=1)])
    assert len(nondominated(points)) == 100_000
    assert len(nondominated(np.vstack([points, points + 0.01]))) == 100_000


def test_matched_budgets_are_compared_at_their_target(tmp_path):
    """Two arms solved for one 1e6 budget; the transformer's solver landed 368
    parameters short. By target only the better loss is on the front."""
    trials = [dict(family="transformer", params=999_632, achieved=999_632.0, target=1e6, val_loss=2.6,
                   tokens_per_s=100.0),
              dict(family="mamba", params=1_000_000, achieved=1_000_000.0, target=1e6, val_loss=2.5,
                   tokens_per_s=100.0)]
    store = write_store(tmp_path / "s.duckdb", trials=trials)
    by_target = pareto_json("--store", str(store), "--objectives", "val_loss,params")
    assert [r["family"] for r in by_target["front"]] == ["mamba"]
    assert any("compared at their budget target" in n and "0.04%" in n for n in by_target["notes"])
    raw = pareto_json("--store", str(store), "--objectives", "val_loss,params", "--matched", "achieved")
    assert {r["family"] for r in raw["front"]} == {"mamba", "transformer"}


def pareto_json(*args: str) -> dict:
    return cli_json("pareto", *args)


def test_pareto_json_has_one_shape_with_objects_not_json_strings(tmp_path):
    out = pareto_json("--store", str(write_store(tmp_path / "s.duckdb")), "--objectives", "val_loss,tokens_per_s")
    row = out["front"][0]
    for name in ("spec", "recipe", "data", "axes"):
        assert isinstance(row[name], dict), name
    assert row["spec"]["family"] == row["family"] and isinstance(row["index"], int)
    assert out["objectives"] == [{"column": "val_loss", "direction": "min"},
                                 {"column": "tokens_per_s", "direction": "max"}]


def test_pareto_on_a_csv_lists_rows_by_index_with_the_hypervolume(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("name,loss,params,speed\n" + "\n".join(
        f"r{r['id']},{r['loss']},{r['params']},{r['speed']}" for r in ROWS) + "\n")
    out = pareto_json("--from-csv", str(path), "--objectives", "loss:min,params:min,speed:max")
    brute = brute_front(np.array([[r["loss"], r["params"], -r["speed"]] for r in ROWS]))
    assert sorted(r["index"] for r in out["front"]) == brute
    assert all(r["name"] == f"r{r['index']}" for r in out["front"])
    assert out["hypervolume"] > 0 and 0 < out["hypervolume_fraction"] <= 1
    assert "worst value" in out["reference_rule"]


@pytest.mark.parametrize("args, message", [
    (["--objectives", "family:max"], "objective 'family' is not numeric"),
    (["--objectives", "loss,nope"], "no objective 'nope'"),
    (["--objectives", "loss,params", "--reference", "1,x"], "--reference '1,x'"),
], ids=["text-column", "missing-column", "bad-reference"])
def test_mistakes_end_in_one_line(tmp_path, args, message):
    path = tmp_path / "runs.csv"
    path.write_text("family,loss,params\ntransformer,2.5,10\nmamba,2.4,20\n")
    assert message in one_line_error("pareto", "--from-csv", str(path), *args)


def test_text_objective_on_a_store_is_one_line(tmp_path):
    """Issue 8 item 9: this printed a traceback."""
    line = one_line_error("pareto", "--store", str(write_store(tmp_path / "s.duckdb")), "--objectives", "family:max")
    assert line.startswith("error: objective 'family' is not numeric")


def test_front_extrapolated_to_a_larger_scale(tmp_path):
    """At 1e9 parameters mamba's law (E 1.4) is below the transformer's (E 1.5):
    pooled over each family's two taper arms (one law by construction), and
    arm by arm by default, where an arm of 3 sizes has no fit and says so."""
    store = str(write_store(tmp_path / "s.duckdb"))
    arms = pareto_json("--store", store, "--objectives", "val_loss,tokens_per_s", "--extrapolate", "1e9",
                       "--bootstrap", "20")
    assert [r["arm"] for r in arms["front"]] == ["family=mamba, taper=cosine"]
    assert any("L(N) for family=mamba, taper=uniform: 3 points" in n for n in arms["notes"])
    out = pareto_json("--store", store, "--objectives", "val_loss,tokens_per_s", "--extrapolate", "1e9",
                      "--bootstrap", "20", "--pool-arms")
    (row,) = [r for r in out["front"] if r["family"] == "mamba"]
    assert row["params"] == 1e9 and row["extrapolated"]
    low, high = row["interval"]
    assert low < row["val_loss"] < high
    assert any("predicted at params=1e+09" in n for n in out["notes"])
    assert any("tokens_per_s taken from each family's largest trial" in n for n in out["notes"])


def test_python_access_over_store_tables(tmp_path):
    import archsearch as A

    with A.open_store(write_store(tmp_path / "s.duckdb"), read_only=True) as store:
        trials = store.trials()
        metrics = store.metrics()
    assert trials.to_pandas().shape[0] == trials.num_rows and metrics.num_rows == 0
    from_arrow = analysis.pareto(trials, "val_loss,params")
    from_pandas = analysis.pareto(trials.to_pandas(), "val_loss,params")
    assert from_arrow.indices == from_pandas.indices and from_arrow.hypervolume == from_pandas.hypervolume
    polars = pytest.importorskip("polars")
    assert analysis.pareto(polars.from_arrow(trials), "val_loss,params").indices == from_arrow.indices
