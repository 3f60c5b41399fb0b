"""How the views and the report thin a large study, on generated rows (no
store, no fits worth the name): which trials a scatter draws, which rows the
trials table lists, and what the titles and the page say about the rest."""

from __future__ import annotations

import json
import random

from archsearch_dashboards.arms import group_label, sample_rows, varying_axes
from archsearch_dashboards.figures import pareto_figure, parallel_figure
from archsearch_dashboards.scaling import MAX_FIT_POINTS, scaling_figure
from archsearch_dashboards.report import DEFAULT_OBJECTIVES, MAX_TABLE_PER_ARM, _table, table_rows
from tests.test_report import on_front_by_hand, trials_table

SHAPES = ("uniform", "cosine", "reverse")
SPEC = json.dumps({"family": "transformer", "layers": [{"mixer": "attention", "mlp_width": 32}]})


def generated(count: int, *, seed: int = 0) -> list[dict]:
    """``count`` completed trials in 6 arms (2 families x 3 shapes), as ``completed_rows`` returns them."""
    draw = random.Random(seed)
    axes = {(f, s): {"family": f, "taper.shape": s} for f in ("transformer", "mamba") for s in SHAPES}
    rows = []
    for i in range(count):
        family, shape = ("transformer", "mamba")[i % 2], SHAPES[(i // 2) % 3]
        params = int(1000 * 1000 ** draw.random())
        rows.append(dict(trial_id=f"t{i}", family=family, axes=axes[family, shape], params=params, target=params,
                         match="params", achieved=params, match_error=0.0, d_model=64, num_layers=3,
                         val_loss=2 + 3 * params ** -0.3 * (1 + i % 6 / 20) + draw.random() / 100,
                         tokens_per_s=1000.0, spec=SPEC))
    return rows


def _ids(rows) -> set[str]:
    return {r["trial_id"] for r in rows}


def _drawn_markers(fig) -> set[str]:
    return {t.split("</b>")[0].removeprefix("<b>") for trace in fig.data if trace.mode == "markers"
            for t in trace.text}


def test_a_small_study_is_drawn_whole():
    rows = generated(50)
    assert sample_rows(rows, limit=50) is rows
    fig = pareto_figure(rows, objectives=DEFAULT_OBJECTIVES)
    assert _drawn_markers(fig) == _ids(rows) and "drawn" not in fig.layout.title.text


def test_a_large_study_keeps_the_front_each_arms_best_and_a_fixed_sample():
    """Fails on the mutations that leave ``keep`` (the front) or each arm's best
    out of ``sample_rows``, or that sample the first trials instead of by the hash."""
    rows = generated(3000)
    front = on_front_by_hand(rows)
    chosen = sample_rows(rows, limit=300, keep=front)
    assert len(chosen) == 300 and front <= _ids(chosen)
    axes = varying_axes(rows)
    bests = set()
    for label in {group_label(r, axes) for r in rows}:
        best = min((r for r in rows if group_label(r, axes) == label), key=lambda r: r["val_loss"])
        assert best["trial_id"] in _ids(chosen)
        bests.add(best["trial_id"])
    assert [r["trial_id"] for r in chosen] == [r["trial_id"] for r in rows if r["trial_id"] in _ids(chosen)]
    shuffled = rows[:]
    random.Random(1).shuffle(shuffled)
    assert _ids(sample_rows(shuffled, limit=300, keep=front)) == _ids(chosen)  # the same on every redraw
    sampled = _ids(chosen) - front - bests
    late = sampled & _ids(rows[-len(rows) // 3:])
    assert len(late) > len(sampled) // 5, "the sample spreads over the whole study, not its first rows"


def test_the_scatter_views_draw_a_sample_and_say_so():
    rows = generated(3000)
    fig = pareto_figure(rows, objectives=DEFAULT_OBJECTIVES)
    drawn = _drawn_markers(fig)
    assert len(drawn) == 2000 and on_front_by_hand(rows) <= drawn
    assert "2,000 of 3,000 trials drawn" in fig.layout.title.text
    line = next(t for t in fig.data if t.name == "Pareto front")
    assert len(line.x) == len(on_front_by_hand(rows))  # the front is worked out on every trial
    fig = scaling_figure(rows, bootstrap=2)
    assert len(_drawn_markers(fig)) == 2000 and "2,000 of 3,000 trials drawn" in fig.layout.title.text
    assert f"fitted on {MAX_FIT_POINTS} trials of each larger arm" in fig.layout.title.text
    fig = parallel_figure(rows)
    assert all(len(d.values) == 2000 for d in fig.data[0].dimensions)
    assert "2,000 of 3,000 trials drawn" in fig.layout.title.text


def test_the_trials_table_lists_the_front_and_each_arms_best_and_counts_the_rest():
    """Fails on the mutation that drops ``or row["trial_id"] in front`` from ``table_rows``."""
    rows = generated(600)
    front = on_front_by_hand(rows)
    listed = table_rows(rows, front)
    axes = varying_axes(rows)
    for label in {group_label(r, axes) for r in rows}:
        arm = sorted((r for r in rows if group_label(r, axes) == label), key=lambda r: r["val_loss"])
        assert _ids(arm[:MAX_TABLE_PER_ARM]) <= _ids(listed)
        assert _ids(arm[MAX_TABLE_PER_ARM:]) & _ids(listed) <= front
    assert front <= _ids(listed) and len(listed) < len(rows)
    page = _table(rows)
    table = trials_table(page)
    assert [r["trial"] for r in table] == [r["trial_id"] for r in listed]
    assert f"{len(rows) - len(listed):,} more trials left out" in page
    assert "left out" not in _table(generated(30))


def test_one_redraw_works_each_arm_out_once(monkeypatch):
    """Every view of a redraw reads the arms of one list of rows: their labels
    are worked out once for it (``arms.per_rows``), not once per view, and
    each arm's fit once per app (kept while its points stay the same).
    Fails on the mutation that makes ``per_rows`` return ``function`` unwrapped."""
    from archsearch_dashboards import scaling
    from archsearch_dashboards.report import views

    from archsearch.analysis import arms as analysis_arms

    monkeypatch.setattr(scaling, "_FIT_CACHE", {})
    rows = generated(3000, seed=4)
    labels, fits = [], []
    label_of, fit_law = analysis_arms.arm_label, scaling.fit_law
    monkeypatch.setattr(analysis_arms, "arm_label", lambda row, axes, **k: labels.append(1) or label_of(row, axes, **k))
    monkeypatch.setattr(scaling, "fit_law", lambda *a, **k: fits.append(1) or fit_law(*a, **k))
    views(rows, [])
    arms = len({group_label(r, varying_axes(rows)) for r in rows})
    assert len(labels) <= 2 * arms and len(fits) == arms
    labels.clear()
    fits.clear()
    views(rows[:], [])  # the next redraw: a new list, the same trials
    assert len(labels) <= 2 * arms and not fits


def test_a_list_of_rows_that_grows_is_worked_out_again():
    rows = generated(20)
    assert varying_axes(rows) == ["family", "taper.shape"]
    one_family = [r for r in rows if r["family"] == "mamba"]
    assert varying_axes(one_family) == ["taper.shape"]
    one_family.append(next(r for r in rows if r["family"] == "transformer"))
    assert varying_axes(one_family) == ["family", "taper.shape"]


def test_a_long_running_app_keeps_only_the_latest_fits(monkeypatch):
    """Each trial that finishes changes its arm's points and so its fit; the
    app keeps the latest ``MAX_KEPT_FITS`` fits and their bands, not every one."""
    from archsearch_dashboards import scaling

    monkeypatch.setattr(scaling, "_FIT_CACHE", {})
    monkeypatch.setattr(scaling, "_BANDS", {})
    monkeypatch.setattr(scaling, "MAX_KEPT_FITS", 3)
    rows = generated(60, seed=5)
    for count in range(40, 60, 2):  # a study that grows, redrawn after each new pair of trials
        scaling_figure(rows[:count], bootstrap=5)
    assert len(scaling._FIT_CACHE) == 3 and len(scaling._BANDS) == 3
    latest = scaling_figure(rows, bootstrap=5)
    assert any(trace.name.endswith(" band") for trace in latest.data)
