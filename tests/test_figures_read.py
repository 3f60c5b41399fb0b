"""The report's pictures read with many arms and seeds: side-by-side bars are means over seeds
with their 95% interval, log axes are labelled with whole numbers (200k, not a bare 2 beside
100k), bands grow lighter as arms add up, and an arm's learning curves tell its sizes apart."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from archsearch_dashboards.figures import _log_ticks, comparison_figure, curves_figure
from archsearch_dashboards.scaling import scaling_figure
from tests.report_rows import rows_of

SIZES = [40_000, 80_000, 180_000, 400_000]


def test_bars_are_means_over_seeds_with_their_t_interval():
    rows = rows_of({"uniform": (SIZES, 3.0), "cosine": (SIZES, 3.2)}, seeds=3)
    for row in rows:  # spread the seeds: 0, +0.01, +0.02
        row["val_loss"] += 0.01 * int(row["trial_id"].rsplit("-", 1)[1])
    fig = comparison_figure(rows)
    bar = fig.data[0]  # the first target, 40,000
    at = [r["val_loss"] for r in rows if r["target"] == 40_000 and "uniform" in r["trial_id"]]
    index = list(bar.x).index("taper.shape=uniform")
    assert bar.y[index] == pytest.approx(np.mean(at))
    half = stats.t.ppf(0.975, 2) * np.std(at, ddof=1) / np.sqrt(3)
    assert bar.error_y.array[index] == pytest.approx(half) and bar.customdata[index][0] == 3
    one = comparison_figure(rows_of({"uniform": (SIZES, 3.0), "cosine": (SIZES, 3.2)}, seeds=1))
    assert set(one.data[0].error_y.array) == {0}  # one seed: no interval to draw


def test_log_axes_label_every_tick_with_its_number():
    ticks = _log_ticks(35_000, 450_000)
    assert ticks["tickvals"] == [50_000, 100_000, 200_000]
    assert ticks["ticktext"] == ["50k", "100k", "200k"]
    assert _log_ticks(1.7, 1.95) == {}  # inside a decade Plotly's own ticks are numbers already
    fig = scaling_figure(rows_of({"uniform": (SIZES, 3.0)}, seeds=1), bootstrap=5)
    assert list(fig.layout.xaxis.ticktext) == ["50k", "100k", "200k", "500k"]  # the lines run to twice the largest


def test_bands_grow_lighter_with_many_arms():
    def opacity(arms: int) -> float:
        rows = rows_of({f"s{i}": (SIZES, 3.0 + i / 10) for i in range(arms)}, seeds=1)
        bands = [t for t in scaling_figure(rows, bootstrap=5).data if t.fill == "toself"]
        assert len(bands) == arms
        return bands[0].opacity

    assert opacity(8) <= opacity(2) / 2


def test_an_arms_curves_are_told_apart_by_size():
    rows = rows_of({"uniform": (SIZES, 3.0)}, seeds=1)
    metrics = [dict(trial_id=r["trial_id"], step=s, tokens=100 * s, val_loss=3.0 - s / 100) for r in rows
               for s in (1, 2, 3)]
    widths = [trace.line.width for trace in curves_figure(rows, metrics).data]
    assert widths == sorted(widths) and len(set(widths)) == len(SIZES)  # thin for the smallest, thick for the largest
