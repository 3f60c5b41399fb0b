"""A self-contained HTML report of a study: opens offline, no server.

plotly.js is inlined once; every figure is interactive (zoom, hover, toggle).
"""

from __future__ import annotations

import heapq
import html
import json
from datetime import datetime, timezone
from pathlib import Path

import plotly.graph_objects as go
from archsearch_dashboards.arms import arm_bests, axis_text, decoded, group_labels, varying_axes
from archsearch_dashboards.figures import (
    MAX_CURVE_POINTS,
    comparison_figure,
    history_figure,
    importance_figure,
    curves_figure,
    parallel_figure,
    pareto_figure,
    plan_figure,
    profile_figures,
)
from archsearch_dashboards.scaling import scaling_figure

from archsearch_dashboards.training import training_figure

from archsearch.analysis import completed_trials, pareto_front
from archsearch.store import Store
from archsearch.store.values import thinned_query

DEFAULT_OBJECTIVES = [("val_loss", "min"), ("params", "min")]
# Learning curves drawn at most (one trace each); beyond it the best of each arm come first.
MAX_CURVES = 60
# The trials table lists the front and at most this many of each arm's best; a line counts the rest.
MAX_TABLE_PER_ARM = 20
# Pixel size of an exported PNG: the report's figure box (1100 px page, 520 px high).
PNG_WIDTH, PNG_HEIGHT = 1000, 520
# Columns the views never read, left in the store (each would be 100,000 dict
# entries per redraw at the large end).
UNREAD = ("recipe", "data", "created_at", "finished_at", "seed", "train_loss", "val_accuracy", "steps", "tokens",
          "wall_time_s", "attempts", "error", "code_version", "status", "sweep_group", "sweep_best")


def completed_rows(store: Store, study: str | None) -> list[dict]:
    """Completed trials of ``study`` (or all), with ``axes`` decoded; of a
    learning-rate sweep only each arm's best run. ``spec`` stays JSON text
    until a view needs it (``arms.decoded``): most rows never do."""
    table = completed_trials(store, study)
    rows = table.drop_columns([c for c in UNREAD if c in table.column_names]).to_pylist()
    axes: dict[str, dict] = {}  # arms repeat their axes: decode each text once
    for row in rows:
        text = row["axes"]
        if text not in axes:
            axes[text] = json.loads(text)
        row["axes"] = axes[text]
    return rows


def profile_rows(store: Store, trial_ids: set[str]) -> list[dict]:
    """The stored analyses (``archsearch analyze``) of these trials, ``setting`` decoded."""
    rows = [r for r in store.layer_profiles().to_pylist() if r["trial_id"] in trial_ids]
    for row in rows:
        row["setting"] = json.loads(row["setting"])
    return rows


def curve_trials(rows: list[dict], limit: int = MAX_CURVES) -> list[str]:
    """The trials whose learning curves are drawn: every one up to ``limit``,
    else the best of each arm first, then the next best overall."""
    if len(rows) <= limit:
        return [r["trial_id"] for r in rows]
    chosen = [r["trial_id"] for r in arm_bests(rows).values()][:limit]
    ranked = heapq.nsmallest(limit, rows, key=lambda r: r["val_loss"])  # sorted(...)[:limit], in one pass
    rest = [r["trial_id"] for r in ranked if r["trial_id"] not in set(chosen)]
    return chosen + rest[:limit - len(chosen)]


def curve_metrics(store: Store, trial_ids: list[str], points: int = MAX_CURVE_POINTS) -> list[dict]:
    """The metric rows of ``trial_ids``, thinned in the store to about ``points``
    per trial (first and last kept), so a study of millions of points loads quickly."""
    if not trial_ids:
        return []
    return store.sql(thinned_query("metrics", ["trial_id", "step", "tokens", "val_loss"]),
                     [trial_ids, points, points]).to_pylist()


def views(rows: list[dict], metrics: list[dict], train: list[dict] = ()) -> dict[str, go.Figure]:
    """Every view of the report and the app, by name; the plan is the best trial's. ``metrics``
    and ``train`` are the drawn trials' evaluation and training-loss points (``curve_points``)."""
    best = min(rows, key=lambda r: r["val_loss"])
    return {"scaling": scaling_figure(rows), "comparison": comparison_figure(rows),
            "pareto": pareto_figure(rows, objectives=DEFAULT_OBJECTIVES), "parallel": parallel_figure(rows),
            "curves": curves_figure(rows, metrics), "training": training_figure(rows, list(train)),
            "plan": plan_figure(best)}


def curve_points(store: Store, trial_ids: list[str]) -> tuple[list[dict], list[dict]]:
    """The evaluation and training-loss points of ``trial_ids``, each thinned in the store."""
    return curve_metrics(store, trial_ids), store.train_points(trial_ids, points=MAX_CURVE_POINTS)


def report_figures(store: Store, study: str | None, rows: list[dict] | None = None) -> dict[str, go.Figure]:
    """Every figure of the report by name: the views, then ``profile-I`` per stored analysis."""
    rows = rows if rows is not None else _rows(store, study)
    figures = {**views(rows, *curve_points(store, curve_trials(rows))), **search_figures(store, study)}
    for i, fig in enumerate(profile_figures(profile_rows(store, {r["trial_id"] for r in rows}))):
        figures[f"profile-{i}"] = fig
    return figures


def search_figures(store: Store, study: str | None) -> dict[str, go.Figure]:
    """A sampled search's history and its axes' importance (what optuna-dashboard shows), for
    each study of the report that sampled; none for a grid."""
    from archsearch.search.history import history, importance

    figures = {}
    studies = [study] if study else store.studies().column("name").to_pylist()
    for i, name in enumerate(studies):
        proposals = store.proposals(name).to_pylist()
        suffix = "" if len(studies) == 1 else f"-{i}"  # a figure's name is an HTML id: no study name in it
        past, found = history(proposals), importance(proposals)
        if past:
            figures[f"history{suffix}"] = history_figure(past)
        if found:
            figures[f"importance{suffix}"] = importance_figure(found)
    return figures


def _rows(store: Store, study: str | None) -> list[dict]:
    rows = completed_rows(store, study)
    if not rows:
        raise ValueError(f"no completed trials{f' in study {study}' if study else ''} to report")
    return rows


def write_report(store: Store, path: str | Path, *, study: str | None = None) -> Path:
    """Write the report of ``study`` (all studies if None) to ``path``; returns it."""
    rows = _rows(store, study)
    from plotly.offline import get_plotlyjs

    parts = [f"<script>{get_plotlyjs()}</script>"]
    parts += [_figure_html(name, fig) for name, fig in report_figures(store, study, rows).items()]
    title = f"archsearch report: {study or 'all studies'}"
    page = _PAGE.format(title=html.escape(title), when=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                        count=len(rows), figures="\n".join(f"<section>{p}</section>" for p in parts),
                        table=_table(rows))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


def write_pngs(store: Store, folder: str | Path, *, study: str | None = None,
               width: int = PNG_WIDTH, height: int = PNG_HEIGHT) -> list[Path]:
    """Write every figure of the report as ``folder/NAME.png`` (the same Plotly
    figures, drawn by kaleido in headless Chrome or Chromium); returns the paths.

    Needs the ``png`` extra (kaleido) and a Chrome or Chromium that kaleido
    finds (``BROWSER_PATH`` names one); either missing is one ValueError
    that says how to fix it.
    """
    try:
        import kaleido  # noqa: F401  (plotly draws through it; checked first for a clear message)
    except ImportError:
        raise ValueError("PNG export needs kaleido: pip install 'archsearch[png]'") from None
    figures = report_figures(store, study)
    import plotly.io as pio

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{name}.png" for name in figures]
    try:
        pio.write_images(list(figures.values()), paths, format="png", width=width, height=height)
    except RuntimeError as err:
        if "Chrome" not in str(err):
            raise
        raise ValueError("PNG export needs Chrome or Chromium: apt-get install chromium, "
                         "or set BROWSER_PATH=/path/to/chrome") from None
    return paths


def _figure_html(name: str, fig: go.Figure) -> str:
    """One interactive figure as a div and the script that draws it.

    The figure's JSON sits inside a <script> element, where a ``</script>``
    in any string would end it early; ``<``, ``>`` and ``&`` are written as
    JSON escapes, which mean the same characters to the script (plotly's
    encoder escapes the first two today; this does not depend on it).
    """
    spec = fig.to_json().replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return (f'<div id="view-{name}" class="plotly-graph-div" style="height:520px; width:100%;"></div>\n'
            f'<script>(function () {{ const fig = {spec};\n'
            f'Plotly.newPlot("view-{name}", fig.data, fig.layout, {{responsive: true}}); }})();</script>')


def table_rows(rows: list[dict], front: set[str], per_arm: int = MAX_TABLE_PER_ARM) -> list[dict]:
    """The rows the trials table lists, best first: those on the front and the
    ``per_arm`` best of each arm."""
    axes = varying_axes(rows)
    taken: dict[str, int] = {}
    out = []
    ranked = sorted(rows, key=lambda r: r["val_loss"])
    for row, label in zip(ranked, group_labels(ranked, axes)):
        taken[label] = taken.get(label, 0) + 1
        if taken[label] <= per_arm or row["trial_id"] in front:
            out.append(row)
    return out


def _table(rows: list[dict]) -> str:
    axes = varying_axes(rows) or list(rows[0]["axes"])
    front = {r["trial_id"] for r in pareto_front(rows, DEFAULT_OBJECTIVES)}
    head = ["trial", *axes, "params", "match error", "d_model", "MLP widths", "val loss", "tokens/s", "front"]
    lines = ["<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]
    listed = table_rows(rows, front)
    for r in listed:
        widths = [layer["mlp_width"] for layer in decoded(r["spec"])["layers"]]
        cells = [r["trial_id"], *(axis_text(r, a) for a in axes), f"{r['params']:,}",
                 f"{r['match_error']:+.2%}", r["d_model"], widths, f"{r['val_loss']:.4f}",
                 f"{r['tokens_per_s']:,.0f}", "yes" if r["trial_id"] in front else ""]
        lines.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    left = len(rows) - len(listed)
    note = (f'<p class="left-out">{left:,} more trials left out: listed are the front and the {MAX_TABLE_PER_ARM} '
            f"best of each arm.</p>") if left else ""
    return "<table>" + "\n".join(lines) + "</table>" + note


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.85rem; margin-top: 1rem; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 4px 8px; text-align: right; }}
th {{ background: #f4f4f4; }}
section {{ margin: 1.5rem 0; }}
</style></head>
<body>
<h1>{title}</h1>
<p>{count} completed trials. Generated {when}.</p>
{figures}
<h2>Trials (best first)</h2>
{table}
</body></html>
"""
