"""The live dashboard's callbacks as plain functions, and the figures people read:
every view drawn with its traces, filters that change them, a redraw that sees
a trial finish, one colour per arm, bars that do not start at zero, arm labels
without axes that do not apply, and strings from study files escaped in the
report and the app. No browser (see test_browser.py)."""

from __future__ import annotations

import json

import pytest
from archsearch_dashboards.app import SEARCH_VIEWS, VIEWS, refresh
from archsearch_dashboards.arms import PALETTE, arm_colours, group_label, varying_axes
from archsearch_dashboards.figures import comparison_figure, curves_figure, thin
from archsearch_dashboards.report import write_report
from tests.dashboard_support import HOSTILE, SIZES, result, write_store
from typer.testing import CliRunner

import archsearch as A
from archsearch.cli import app


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("dash") / "s.duckdb"
    write_store(path)
    return path


def test_every_view_is_drawn_with_fits_and_a_filter_by_family_changes_them(store):
    """All 15 trials in every view; the scaling plot draws no line through
    arms of 3 trials each (never one pooled over a family's arms) and says
    why; choosing the hybrid family leaves only its 2 arms and its 6 curves,
    labelled by the one axis that still varies. Fails if the family filter is ignored in ``filter_rows``."""
    view = refresh(store)
    assert view["summary"].startswith("15 of 15") and view["families"] == ["hybrid", "transformer"]
    assert set(view["figures"]) == set(VIEWS)
    assert all(view["figures"][name].data for name in VIEWS if name not in SEARCH_VIEWS)
    # a grid's study: the search views say why they are empty
    assert all("did not sample" in view["figures"][name].layout.annotations[0].text for name in SEARCH_VIEWS)
    scaling = view["figures"]["scaling"]
    assert all(d.mode == "markers" for d in scaling.data) and len(scaling.data) == 5
    assert "no fit for 5 of 5 arms: L(N) needs 4 trials at 3 or more sizes" in scaling.layout.title.text
    assert len(view["figures"]["curves"].data) == 15

    hybrid = refresh(store, families=["hybrid"])
    assert hybrid["summary"].startswith("6 of 15")
    assert len(hybrid["figures"]["curves"].data) == 6
    arms = {d.name for d in hybrid["figures"]["pareto"].data} - {"Pareto front"}
    assert arms == {"loops=2", "loops=4"}  # within one family only the loop count still varies


def test_the_training_view_draws_a_running_trial_before_anything_finishes(tmp_path):
    """Nothing has finished, one trial trains: the training view draws its stored training-loss
    points and says where it is; once it finishes it is drawn among its arm's curves."""
    from tests.dashboard_support import train_points

    path = tmp_path / "running.duckdb"
    ids = write_store(path, finish=False)
    with A.open_store(path) as db:
        db.mark_running(ids[0])
        db.add_train_points(train_points(ids[0], 3.0, steps=30, every=10))
        db.record_progress({ids[0]: dict(step=30, total_steps=100, tokens=1920, total_tokens=6400, train_loss=3.2,
                                         tokens_per_s=640.0, elapsed_s=3.0)})
    from archsearch.store import RunLock

    with RunLock(path, study="s"):  # its run is alive
        view = refresh(path)
    assert view["summary"] == "no completed trials yet; 1 training now"
    (trace,) = view["figures"]["training"].data
    assert list(trace.x) == [640, 1280, 1920] and list(trace.y) == pytest.approx([3.5, 3.25, 3 + 5 / 30])
    assert trace.name.startswith(ids[0][:8]) and "running, step 30/100" in trace.name
    with A.open_store(path) as db:
        db.forget_progress([ids[0]])
        db.finish(ids[0], result(3.0))
    (trace,) = refresh(path)["figures"]["training"].data
    assert "running" not in trace.name and len(trace.x) == 3


def test_a_filter_by_axis_value_and_the_chosen_trials_plan(store):
    """Filtering loops to 4 leaves its 3 trials; the plan of a looped trial
    draws its mixers by layer and says it loops."""
    view = refresh(store, axis="loops", values=["4"])
    assert "loops" in view["axes"] and view["values"] == ["2", "4"]
    assert view["summary"].startswith("3 of 15")
    trial = view["trials"][0]["value"]
    plan = refresh(store, axis="loops", values=["4"], trial=trial)["figures"]["plan"]
    assert trial in plan.layout.title.text and "run 4 times" in plan.layout.title.text
    assert {d.name for d in plan.data if d.showlegend is not False} == {"mamba", "attention"}
    widths = sorted(w for d in plan.data if d.yaxis == "y" for w in d.y)
    assert widths == [16, 32, 48]


def test_a_redraw_sees_a_trial_finish(tmp_path):
    """Trials planned but not finished show nothing; each one finished appears at the next redraw."""
    path = tmp_path / "live.duckdb"
    ids = write_store(path, finish=False)
    assert refresh(path)["summary"] == "no completed trials yet"
    with A.open_store(path) as db:
        db.finish(ids[0], result(3.0))
    assert refresh(path)["summary"].startswith("1 of 1")
    with A.open_store(path) as db:
        db.finish(ids[1], result(2.9))
    view = refresh(path)
    assert view["summary"].startswith("2 of 2") and len(view["figures"]["curves"].data) == 2


def test_arm_labels_leave_out_axes_that_do_not_apply(store):
    """A transformer has no loop count: its label never says loops=None."""
    rows = refresh(store)["figures"]  # warm path; rows below from the store itself
    with A.open_store(store, read_only=True) as db:
        from archsearch_dashboards.report import completed_rows

        rows = completed_rows(db, None)
    axes = varying_axes(rows)
    labels = {group_label(r, axes) for r in rows}
    assert "family=transformer, taper.shape=uniform" in labels
    assert not any("None" in label for label in labels)


def test_every_arm_gets_its_own_colour():
    """Sixty arms, sixty colours (the old figures reused ten)."""
    rows = [dict(trial_id=f"t{i}", family="transformer", axes={"seed_arm": i}) for i in range(60)]
    colours = arm_colours(rows)
    assert len(set(colours.values())) == 60 and len(PALETTE) >= 100


def test_bars_start_near_the_values_not_at_zero(store):
    """Losses 2.1-2.4 get an axis around them, not 0-2.4; hover gives each bar's gap to the best."""
    with A.open_store(store, read_only=True) as db:
        from archsearch_dashboards.report import completed_rows

        rows = completed_rows(db, None)
    figure = comparison_figure(rows)
    # the value axis: y under upright bars, x when many arms lie down as rows
    low, high = (figure.layout.xaxis if figure.data[0].orientation == "h" else figure.layout.yaxis).range
    values = [r["val_loss"] for r in rows]
    assert min(values) - 0.2 * (max(values) - min(values)) < low < min(values) and high > max(values)
    gaps = [c[1] for bar in figure.data for c in bar.customdata if c[1] is not None]
    assert min(gaps) == 0 and max(gaps) > 0


def test_long_curves_are_thinned_keeping_both_ends():
    points = [dict(step=i) for i in range(10_000)]
    kept = thin(points)
    assert len(kept) <= 200 and kept[0]["step"] == 0 and kept[-1]["step"] == 9_999
    rows = [dict(trial_id="t", family="f", axes={}, params=10)]
    metrics = [dict(trial_id="t", step=i, tokens=i, val_loss=1.0) for i in range(5_000)]
    assert len(curves_figure(rows, metrics).data[0].x) <= 200


def test_strings_from_study_files_are_escaped_in_the_report_and_the_app(tmp_path):
    """An axis value and a study name that are HTML reach neither page as
    markup: the report holds no raw tag (in its table or in any figure's
    JSON), and no figure the app sends does. Fails if ``arms.text`` returns
    its argument unescaped."""
    path = tmp_path / "h.duckdb"
    write_store(path, study=HOSTILE, shapes=(HOSTILE, "cosine", "reverse"))
    with A.open_store(path, read_only=True) as db:
        page = write_report(db, tmp_path / "h.html", study=HOSTILE).read_text()
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    view = refresh(path, study=HOSTILE, axis="taper.shape", values=[HOSTILE])
    assert view["summary"].startswith(f"{len(SIZES)} of 15")
    for name in VIEWS:
        # plain json.dumps: plotly's own to_json writes < as \u003c, which would hide raw markup
        figure = view["figures"][name].to_plotly_json()
        if name == "parallel":
            # parcoords tick labels are drawn as plain SVG text, so they hold the raw value
            # (test_browser checks no script runs); its axis labels are escaped like the rest
            ticks = [t for d in figure["data"][0]["dimensions"] for t in d.get("ticktext", ())]
            assert HOSTILE in ticks
            for dimension in figure["data"][0]["dimensions"]:
                dimension.pop("ticktext", None)
        assert "<img" not in json.dumps(figure, default=str), name
    # Dash renders option labels as text; the raw value is what the filter matches on
    assert HOSTILE in view["values"]


def test_dashboard_without_a_store_is_one_line(tmp_path):
    out = CliRunner().invoke(app, ["dashboard", "--store", str(tmp_path / "none.duckdb")])
    assert out.exit_code == 2 and out.output.count("\n") == 1 and "no store at" in out.output


def test_report_json_views_are_the_apps(store, tmp_path):
    """The report carries every view the app shows, each with its traces (a grid's study: no search views)."""
    with A.open_store(store, read_only=True) as db:
        page = write_report(db, tmp_path / "r.html").read_text()
    for name in VIEWS:
        assert (f'id="view-{name}"' in page) == (name not in SEARCH_VIEWS)
    assert "no fit for 5 of 5 arms" in page


def test_curves_are_thinned_in_the_store_and_capped_to_the_best_of_each_arm(tmp_path):
    """A 1,000-point curve comes back as about 200 points with both ends;
    with room for 5 curves of 15 trials, each of the 5 arms gets its best one."""
    from archsearch_dashboards.report import completed_rows, curve_metrics, curve_trials

    path = tmp_path / "long.duckdb"
    ids = write_store(path)
    with A.open_store(path) as db:
        db.finish(ids[0], result(2.0, points=1_000))
        points = curve_metrics(db, [ids[0]])
        rows = completed_rows(db, None)
    steps = [p["step"] for p in points]
    assert 150 <= len(steps) <= 201 and steps[0] == 10 and steps[-1] == 10_000 and steps == sorted(steps)
    chosen = curve_trials(rows, limit=5)
    axes = varying_axes(rows)
    by_id = {r["trial_id"]: r for r in rows}
    assert len({group_label(by_id[t], axes) for t in chosen}) == 5
    for trial_id in chosen:
        arm = group_label(by_id[trial_id], axes)
        assert by_id[trial_id]["val_loss"] == min(r["val_loss"] for r in rows if group_label(r, axes) == arm)
