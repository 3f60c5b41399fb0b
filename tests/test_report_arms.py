"""Arms a reader can tell apart, and scaling laws fitted one arm at a time.

A looped point run under both protocols into one store has two baselines
with the same axes (``arm: baseline``): every view names them by protocol
and model, from the ``match`` and spec the store keeps. A scaling fit never
runs through several arms: an arm too small for L(N) gets no line and the
plot says so. No torch, no Ray: stores and rows written by hand.
"""

from __future__ import annotations

import json
import math

import pytest
from archsearch_dashboards.app import refresh
from archsearch_dashboards.arms import arm_colours, group_labels, varying_axes
from archsearch_dashboards.figures import parallel_figure
from archsearch_dashboards.scaling import scaling_figure
from archsearch_dashboards.report import completed_rows, write_report
from tests.dashboard_support import result, spec, trial
from tests.report_rows import rows_of

import archsearch as A

ISO_PARAM = "arm=baseline (iso-param: 2-layer stack)"
ISO_FLOP = "arm=baseline (iso-FLOP: 4-layer stack)"


def protocol_store(path) -> None:
    """One looped point (2 layers looped twice) with its looped arm and both
    protocols' baselines (the same 2 layers once; 2 x 2 distinct layers), as
    two runs of one study with budget.protocol iso_param and iso_flop store
    them, at 3 seeds each."""
    axes = {"loops": 2, "arm": "baseline"}
    arms = [("looped", dict(axes, arm="looped"), "params", spec("hybrid", [32, 32], loops=2), 2.5),
            ("param", axes, "iso_param", spec("hybrid", [40, 40]), 2.7),
            ("flop", axes, "iso_flop", spec("hybrid", [24, 24, 24, 24]), 2.4)]
    planned, losses = [], {}
    for name, arm_axes, match, arm_spec, loss in arms:
        for seed in range(3):
            row = trial(f"{name}-{seed}", family="looped", axes=arm_axes, params=20_000 + seed)
            row.update(match=match, seed=seed, spec=arm_spec)
            planned.append(row)
            losses[row["trial_id"]] = loss + seed / 100
    with A.open_store(path) as store:
        store.add_study(name="loop", path="loop.yaml", config={})
        store.add_trials("loop", planned)
        for trial_id, loss in losses.items():
            store.finish(trial_id, result(loss))


def test_iso_param_and_iso_flop_baselines_are_two_arms_in_every_view(tmp_path):
    """The two baselines of one point get two labels, colours, legend entries,
    bars and table cells that say which protocol and what model; filtered to
    the baselines alone (``arm`` no longer varies) they still differ. Fails
    on the old labels, which named both ``arm=baseline`` (and, filtered, both ``looped``)."""
    path = tmp_path / "p.duckdb"
    protocol_store(path)
    with A.open_store(path, read_only=True) as db:
        rows = completed_rows(db, None)
        page = write_report(db, tmp_path / "p.html").read_text()
    labels = set(group_labels(rows, varying_axes(rows)))
    assert labels == {"arm=looped", ISO_PARAM, ISO_FLOP}
    assert len(set(arm_colours(rows).values())) == 3

    figures = refresh(path)["figures"]
    for name in ("scaling", "pareto"):
        assert {d.name for d in figures[name].data} - {"Pareto front"} == labels, name
    assert {d.name for d in figures["curves"].data} == labels
    assert set(figures["comparison"].data[0].x) == labels
    arm_axis = next(d for d in parallel_figure(rows).data[0].dimensions if d.label == "arm")
    assert set(arm_axis.ticktext) == {"looped", "baseline (iso-param: 2-layer stack)",
                                      "baseline (iso-FLOP: 4-layer stack)"}
    assert "<td>baseline (iso-param: 2-layer stack)</td>" in page
    assert "<td>baseline (iso-FLOP: 4-layer stack)</td>" in page

    baselines = refresh(path, axis="arm", values=["baseline"])["figures"]["pareto"]
    assert {d.name for d in baselines.data} - {"Pareto front"} == {"baseline (iso-param: 2-layer stack)",
                                                                    "baseline (iso-FLOP: 4-layer stack)"}


def test_the_app_filter_picks_the_iso_param_or_the_iso_flop_baseline_alone(tmp_path):
    """The axis filter offers each baseline as the views name it, and picking
    one shows that arm only: its 3 trials, not the other protocol's. Fails on
    the old filter, whose only baseline value was ``baseline`` (both)."""
    path = tmp_path / "p.duckdb"
    protocol_store(path)
    offered = refresh(path, axis="arm")["values"]
    assert offered == ["baseline (iso-FLOP: 4-layer stack)", "baseline (iso-param: 2-layer stack)", "looped"]
    view = refresh(path, axis="arm", values=["baseline (iso-FLOP: 4-layer stack)"])
    assert view["summary"].startswith("3 of 9 completed trials shown")
    assert {d.name for d in view["figures"]["pareto"].data} - {"Pareto front"} == {
        "baseline (iso-FLOP: 4-layer stack)"}


def test_a_universal_baseline_says_its_steps_and_arms_alike_but_for_their_match_are_told_apart():
    """HRM's baseline is a Universal Transformer over N x T steps; two
    transformers with one axes dict, matched on parameters and on FLOPs
    (two runs of a study into one store), are two arms."""
    universal = json.dumps({"family": "universal", "structure": "universal", "options": {"steps": 8},
                            "layers": [{"mlp_width": 32}] * 4})
    hrm_axes = {"family": "hrm", "arm": "baseline"}
    rows = [dict(trial_id="ut", family="universal", axes=hrm_axes, match="iso_flop", spec=universal),
            dict(trial_id="hrm", family="hrm", axes=dict(hrm_axes, arm="hrm"), match="params", spec="{}")]
    assert set(group_labels(rows, varying_axes(rows))) == {
        "arm=baseline (iso-FLOP: Universal Transformer, 4 layers x 8 steps)", "arm=hrm"}

    axes = {"family": "transformer", "num_layers": 4}
    rows = [dict(trial_id=m, family="transformer", axes=axes, match=m, spec="{}") for m in ("params", "flops")]
    assert group_labels(rows, varying_axes(rows)) == ["transformer (matched on params)",
                                                      "transformer (matched on flops)"]


def test_a_scaling_fit_is_one_arms_never_a_pool_of_arms():
    """Two arms of one family at 2 sizes each: together 4 sizes, enough for
    L(N), but no line is drawn through them and the title says why. With 4
    sizes each, each arm gets its own line, over its own sizes, through its
    own losses. Fails on the old figure, which fitted a family's unfitted arms together."""
    small = scaling_figure(rows_of({"uniform": ([1_000, 2_000], 3.0), "cosine": ([8_000, 16_000], 6.0)}),
                           bootstrap=5)
    assert all(d.mode == "markers" for d in small.data)
    assert ("no fit for 2 of 2 arms: L(N) needs 4 trials at 3 or more sizes; taper.shape=cosine has 4 trials "
            "at 2 sizes, taper.shape=uniform has 4 trials at 2 sizes") in small.layout.title.text

    arms = {"uniform": ([1_000, 2_000, 4_000, 8_000], 3.0), "cosine": ([16_000, 32_000, 64_000, 128_000], 6.0)}
    fitted = scaling_figure(rows_of(arms), bootstrap=5)
    lines = {d.name: d for d in fitted.data if d.mode == "lines" and d.name.endswith(" fit")}
    assert set(lines) == {"taper.shape=uniform fit", "taper.shape=cosine fit"}
    assert "no fit" not in fitted.layout.title.text
    for shape, (sizes, scale) in arms.items():
        line = lines[f"taper.shape={shape} fit"]
        assert line.x[0] == pytest.approx(sizes[0]) and line.x[-1] == pytest.approx(2 * sizes[-1])
        assert line.y[0] == pytest.approx(2 + scale * sizes[0] ** -0.3, rel=0.01)


def test_a_wide_band_does_not_set_the_scaling_plots_y_range():
    """A fit on four noisy sizes has a band spanning decades at its ends; the y axis keeps to the
    points and lines (log10, a small margin), so the points stay apart. Fails on autorange,
    which let the quickstart's bands flatten every point into one line."""
    rows = rows_of({"uniform": ([1_000, 2_000, 4_000, 8_000], 3.0)}, seeds=1)
    for row, wobble in zip(rows, (0.3, -0.2, 0.25, -0.3)):  # far off the law: a loose fit
        row["val_loss"] += wobble
    fig = scaling_figure(rows, bootstrap=20)
    low, high = fig.layout.yaxis.range
    ys = [v for d in fig.data if d.fill is None for v in d.y]
    assert low < math.log10(min(ys)) and math.log10(max(ys)) < high
    assert high - low < 1.5 * (math.log10(max(ys)) - math.log10(min(ys))) + 0.03
    band = next(d for d in fig.data if d.fill == "toself")
    assert max(band.y) > 10 ** high or min(band.y) < 10 ** low  # the band is wider, and clipped


def test_archsearch_fit_says_when_a_family_fit_runs_over_several_arms():
    """``fit`` by family over two taper schedules, told to pool them, fits one
    law and says it pools 2 arms; by the axis that tells them apart, each
    arm's own, no note; by family as told by default, each arm's own too."""
    from archsearch.analysis import fit_scaling

    rows = rows_of({"uniform": ([1_000, 2_000, 4_000, 8_000], 3.0), "cosine": ([1_000, 2_000, 4_000, 8_000], 6.0)})
    pooled = fit_scaling(rows, laws=("N",), by="family", pool_arms=True, d_col=None, bootstrap=5)
    assert [f.group for f in pooled.fits] == ["transformer"]
    assert any(n.startswith("transformer: one fit over 2 arms (they differ in taper.shape)") for n in pooled.notes)
    apart = fit_scaling(rows, laws=("N",), by="taper.shape", d_col=None, bootstrap=5)
    assert sorted(f.group for f in apart.fits) == ["cosine", "uniform"] and not apart.notes
    default = fit_scaling(rows, laws=("N",), d_col=None, bootstrap=5)
    assert sorted(f.group for f in default.fits) == ["taper.shape=cosine", "taper.shape=uniform"]
    assert not default.notes


def test_many_arms_lie_down_as_rows_every_one_named_best_on_top():
    """Twelve arms' names would overlap under upright bars: the comparison turns horizontal,
    names every arm on its y axis (none skipped for room) and puts the best arm first, at the
    top; three arms stay upright."""
    from archsearch_dashboards.figures import comparison_figure

    shapes = {f"shape{i:02d}": ([1_000], 1.0 + i / 10) for i in range(12)}
    fig = comparison_figure(rows_of(shapes, seeds=1))
    bar = fig.data[0]
    assert bar.orientation == "h" and list(fig.layout.yaxis.tickvals) == list(bar.y)
    assert len(bar.y) == 12 and bar.y[0] == "taper.shape=shape00" and fig.layout.yaxis.autorange == "reversed"
    assert fig.layout.xaxis.range[0] < min(bar.x)
    few = comparison_figure(rows_of({k: shapes[k] for k in list(shapes)[:3]}, seeds=1))
    assert few.data[0].orientation == "v" and len(few.data[0].x) == 3
