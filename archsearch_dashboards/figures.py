"""Plotly figures over result rows, shared by the HTML report and the live app.

Rows are plain dicts as the store returns them (``trials().to_pylist()``),
with ``axes`` and ``spec`` already decoded from JSON (see ``arms.decoded``).

Every string that comes from a study file (axis names and values, family and
trial names) passes through ``text`` before it reaches a figure: plotly.js
draws a small set of HTML tags in labels, and the report embeds figure JSON
inside a <script> element, so a raw ``</script>`` or ``<img onerror=...>``
would otherwise run in the reader's browser. plotly.js turns the entities
back into the characters on screen.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from archsearch.analysis import pareto
from archsearch.units import si
from archsearch_dashboards.arms import (
    arm_bests,
    arm_colours,
    _arms,
    axis_text,
    decoded,
    group_labels,
    PALETTE,
    sample_rows,
    text,
    varying_axes,
)

# Columns a figure reads besides the axes.
TEMPLATE = "plotly_white"
# Curves are thinned to this many points each (first and last kept), so a
# report of a large study stays small and the app stays quick.
MAX_CURVE_POINTS = 200
# Side-by-side bars: one per budget target up to this many targets, else each arm's best.
MAX_TARGETS = 8


def _drawn(shown: int, total: int, *, front: bool = True) -> str:
    """The title's note on thinning: empty when every trial is drawn."""
    if shown >= total:
        return ""
    return f" ({shown:,} of {total:,} trials drawn: {'the front, ' if front else ''}each arm's best, a fixed sample)"


def _hover(row: dict, label: str) -> str:
    """Hover details of one trial, every part escaped."""
    lines = [f"<b>{text(row['trial_id'])}</b>", text(label), f"params {row['params']:,}",
             f"val_loss {row['val_loss']:.4f}", f"d_model {row['d_model']}, {row['num_layers']} layers"]
    if row.get("tokens_per_s") is not None:
        lines.append(f"{row['tokens_per_s']:,.0f} tokens/s")
    return "<br>".join(lines)


def _log_ticks(low: float, high: float) -> dict:
    """Tick values and labels for a log axis over [low, high]: 1, 2 and 5 of each decade (every
    digit where that leaves fewer than three), each labelled as a whole number (200k, not a bare
    2 beside 100k). Within less than a decade Plotly's own ticks read well: nothing is set."""
    decades = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
    for digits in ((1, 2, 5), tuple(range(1, 10))):
        values = [d * 10.0 ** k for k in decades for d in digits if low <= d * 10.0 ** k <= high]
        if len(values) >= 3:
            return dict(tickmode="array", tickvals=values, ticktext=[si(v) for v in values])
    return {}


def pareto_figure(rows: list[dict], *, objectives: list[tuple[str, str]]) -> go.Figure:
    """Every trial as a point coloured by arm, the non-dominated ones joined as
    the front; hover gives each trial's details, the subtitle how values were compared."""
    (y, _), (x, _) = objectives[0], objectives[1]
    front = pareto(rows, objectives)
    _, groups = _arms(rows)
    colours = arm_colours(rows)
    shown = {r["trial_id"] for r in sample_rows(rows, keep={r["trial_id"] for r in front.rows})}
    fig = go.Figure()
    for label, members in groups.items():
        members = [r for r in members if r["trial_id"] in shown]
        fig.add_trace(go.Scatter(
            x=[r[x] for r in members], y=[r[y] for r in members], mode="markers", name=text(label),
            marker=dict(color=colours[label], size=9, line=dict(width=1, color="white")),
            text=[_hover(r, label) for r in members], hovertemplate="%{text}<extra></extra>"))
    on_front = sorted(front.rows, key=lambda r: r[x])
    fig.add_trace(go.Scatter(
        x=[r[x] for r in on_front], y=[r[y] for r in on_front], mode="lines", name="Pareto front",
        line=dict(shape="hv", color="black", width=1.5), hoverinfo="skip"))
    xs = [v for trace in fig.data for v in (trace.x or ()) if v is not None and v > 0]
    fig.update_xaxes(type="log", title=_title(x), **(_log_ticks(min(xs), max(xs)) if xs else {}))
    fig.update_yaxes(title=_title(y))
    notes = "; ".join(front.notes)
    subtitle = f"<br><sup>{text(notes)}</sup>" if notes else ""
    fig.update_layout(title=f"Pareto front: {_title(y)} vs {_title(x)} ({len(on_front)} of {len(rows)} "
                            f"trials){_drawn(len(shown), len(rows))}{subtitle}", template=TEMPLATE, legend_title="arm")
    return fig


def parallel_figure(rows: list[dict]) -> go.Figure:
    """Parallel coordinates over the axes that vary, then params and loss;
    lines coloured by loss. Text axes become numbered ticks with their values as labels.
    Past ``MAX_POINTS`` trials, each arm's best and a fixed sample (``sample_rows``)."""
    axes = varying_axes(rows) or [a for a in rows[0]["axes"] if a != "lr"]
    total, rows = len(rows), sample_rows(rows)
    dimensions = []
    for axis in axes:
        values = [r["axes"].get(axis) for r in rows]
        if axis == "arm":  # a protocol's baselines: which protocol (``arms.axis_text``)
            values = [None if v is None else axis_text(r, axis) for r, v in zip(rows, values)]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            dimensions.append(dict(label=text(axis), values=values))
            continue
        values = ["n/a" if v is None else str(v) for v in values]  # the axis does not apply to that trial
        levels = sorted(set(values))
        # parcoords draws tick labels as plain SVG text (no markup, no entities), so they stay raw
        dimensions.append(dict(label=text(axis), values=[levels.index(v) for v in values],
                               tickvals=list(range(len(levels))), ticktext=levels))
    dimensions += [dict(label="params", values=[r["params"] for r in rows]),
                   dict(label="val_loss", values=[r["val_loss"] for r in rows])]
    losses = [r["val_loss"] for r in rows]
    fig = go.Figure(go.Parcoords(dimensions=dimensions, line=dict(
        color=losses, colorscale="Viridis_r", showscale=True, colorbar=dict(title="val_loss"))))
    fig.update_layout(title=f"Parallel coordinates over the axes (colour: validation loss){_drawn(len(rows), total, front=False)}",
                      template=TEMPLATE)
    return fig


def thin(points: list[dict], limit: int = MAX_CURVE_POINTS) -> list[dict]:
    """At most ``limit`` evenly spaced points of a curve, its first and last kept."""
    if len(points) <= limit:
        return points
    keep = np.unique(np.linspace(0, len(points) - 1, limit).round().astype(int))
    return [points[i] for i in keep]


def curves_figure(rows: list[dict], metrics: list[dict]) -> go.Figure:
    """Validation loss against tokens for every trial, coloured by arm (curves thinned, see ``thin``)."""
    colours = arm_colours(rows)
    by_id = {r["trial_id"]: r for r in rows}
    label_of = dict(zip(by_id, group_labels(rows, varying_axes(rows))))
    by_trial: dict[str, list[dict]] = defaultdict(list)
    for m in metrics:
        if m["trial_id"] in by_id and m.get("val_loss") is not None:
            by_trial[m["trial_id"]].append(m)
    # an arm's sizes told apart: its smallest model's curve thin, its largest thick
    sizes: dict[str, list[int]] = defaultdict(list)
    for trial_id in by_trial:
        sizes[label_of[trial_id]].append(by_id[trial_id]["params"])
    rank = {label: sorted(set(found)) for label, found in sizes.items()}
    fig = go.Figure()
    shown: set[str] = set()
    for trial_id in sorted(by_trial, key=lambda t: (label_of[t], by_id[t]["params"])):
        row, label = by_id[trial_id], label_of[trial_id]
        points = thin(sorted(by_trial[trial_id], key=lambda m: m["step"]))
        order = rank[label]
        width = 1.0 + 3.0 * order.index(row["params"]) / max(1, len(order) - 1)
        fig.add_trace(go.Scatter(
            x=[m["tokens"] for m in points], y=[m["val_loss"] for m in points], mode="lines",
            name=text(label), legendgroup=text(label), showlegend=label not in shown,
            line=dict(color=colours[label], width=width),
            hovertemplate=f"{text(trial_id)}<br>{text(label)}, {row['params']:,} params<br>"
                          "tokens %{x:,}<br>val_loss %{y:.4f}<extra></extra>"))
        shown.add(label)
    fig.update_xaxes(title="tokens seen")
    fig.update_yaxes(title="validation loss")
    drawn = f" ({len(by_trial)} of {len(rows)} trials: the best of each arm first)" if len(by_trial) < len(rows) else ""
    fig.update_layout(title=f"Learning curves: validation loss during training{drawn} (thicker: a larger model "
                            "of the arm)", template=TEMPLATE, legend_title="arm")
    return fig


# Beyond these the comparison's bars lie down: upright, the arms' names would overlap.
MAX_UPRIGHT_ARMS, MAX_UPRIGHT_CHARS = 8, 160


def comparison_figure(rows: list[dict], *, y: str = "val_loss") -> go.Figure:
    """Every arm side by side, best first: one bar per arm and budget target, the mean over its
    seeds with the 95% t interval of that mean as an error bar (none with one seed).

    The value axis spans the values (not from zero), since arms often differ by a few percent;
    hover gives each bar's seeds, interval and difference from the best arm's mean at its target.
    """
    labels = list(arm_bests(rows, y))
    targets = sorted({r["target"] for r in rows})
    # Budgets on a ladder get a bar each; a sampled study (a budget per trial) gets one bar an arm.
    ladder = len(targets) <= MAX_TARGETS
    values: dict[float | None, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row, label in zip(rows, group_labels(rows, varying_axes(rows))):
        values[row["target"] if ladder else None][label].append(row[y])
    # many arms, or long names, read only as rows: horizontal bars, names at the left, best on top
    across = len(labels) > MAX_UPRIGHT_ARMS or sum(len(label) for label in labels) > MAX_UPRIGHT_CHARS
    names = [text(label) for label in labels]
    fig = go.Figure()
    ends = []
    for i, target in enumerate(targets if ladder else [None]):
        stats = {label: _mean_interval(seen) for label, seen in values[target].items()}
        best = min(mean for mean, _, _ in stats.values())
        means = [stats[label][0] if label in stats else None for label in labels]
        halves = [stats[label][1] if label in stats else None for label in labels]
        ends += [m + (h or 0) for m, h in zip(means, halves) if m is not None]
        ends += [m - (h or 0) for m, h in zip(means, halves) if m is not None]
        value_at, name_at = ("x", "y") if across else ("y", "x")
        fig.add_trace(go.Bar(
            **{name_at: names, value_at: means}, orientation="h" if across else "v",
            **{f"error_{value_at}": dict(type="data", array=[h or 0 for h in halves], visible=True,
                                         thickness=1.2, width=3)},
            name=f"target {target:,.0f}" if ladder else "each arm", marker_color=PALETTE[i % len(PALETTE)],
            customdata=[[stats[label][2], stats[label][0] - best, stats[label][1]] if label in stats
                        else [None, None, None] for label in labels],
            hovertemplate=f"%{{{name_at}}}<br>{y}: mean %{{{value_at}:.4f}} over %{{customdata[0]}} seeds "
                          "(± %{customdata[2]:.4f}, 95%)<br>%{customdata[1]:+.4f} vs the best arm's mean"
                          "<extra></extra>"))
    low, high = min(ends), max(ends)
    pad = 0.15 * (high - low) or 0.05 * abs(high) or 1.0
    fig.update_layout(title=f"Side by side: {_title(y)} per arm, mean over seeds with its 95% interval "
                            "(best first; axis not from zero)", template=TEMPLATE, barmode="group",
                      legend_title="budget")
    if across:
        bars = len(labels) * (len(targets) if ladder else 1)
        fig.update_layout(height=max(450, 160 + 16 * bars))
        fig.update_xaxes(title=_title(y), range=[low - pad, high + pad])
        fig.update_yaxes(autorange="reversed", automargin=True, tickmode="array", tickvals=names, ticktext=names,
                         tickfont=dict(size=10))  # every arm named, however many
    else:
        fig.update_layout(xaxis_tickangle=-30)
        fig.update_yaxes(title=_title(y), range=[low - pad, high + pad])
    return fig


def _mean_interval(values: list[float]) -> tuple[float, float | None, int]:
    """The mean of ``values``, the half-width of its 95% t interval (None for one value), how many."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None, n
    from scipy import stats

    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, float(stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)), n


def history_figure(history: dict[str, dict[str, list]]) -> go.Figure:
    """A sampled search's optimisation history: each finished proposal's value of the first
    objective in the order it was asked, and the best so far (``search.history.history``)."""
    label, first = next(iter(history.items()))
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=first["number"], y=first["value"], mode="markers", name="proposal",
                             marker=dict(color=PALETTE[0], size=7),
                             hovertemplate="proposal %{x}<br>%{y:.4f}<extra></extra>"))
    fig.add_trace(go.Scatter(x=first["number"], y=first["best"], mode="lines", name="best so far",
                             line=dict(color="black", shape="hv"), hoverinfo="skip"))
    others = [name for name in history if name != label]
    more = f"; also searched: {', '.join(others)}" if others else ""
    fig.update_xaxes(title="proposal (in the order asked)")
    fig.update_yaxes(title=text(label))
    fig.update_layout(title=f"Search history: {text(label)} of each proposal and the best so far{text(more)}",
                      template=TEMPLATE)
    return fig


def importance_figure(importance: dict[str, dict[str, float]]) -> go.Figure:
    """Each axis' importance to each objective (PED-ANOVA, ``search.history.importance``), most
    important on top."""
    order = sorted({a for values in importance.values() for a in values},
                   key=lambda a: -max(values.get(a, 0.0) for values in importance.values()))
    fig = go.Figure()
    for i, (label, values) in enumerate(importance.items()):
        fig.add_trace(go.Bar(y=[text(a) for a in order], x=[values.get(a, 0.0) for a in order], orientation="h",
                             name=text(label), marker_color=PALETTE[i % len(PALETTE)],
                             hovertemplate="%{y}: %{x:.2f}<extra></extra>"))
    fig.update_xaxes(title="importance (PED-ANOVA; sums to 1 over the axes)", range=[0, 1])
    fig.update_yaxes(autorange="reversed", automargin=True)
    fig.update_layout(title="Axis importance: how much each axis sets the best proposals apart", template=TEMPLATE,
                      barmode="group", legend_title="objective")
    return fig


def plan_figure(row: dict) -> go.Figure:
    """The per-layer plan of one trial: MLP width by layer (bars coloured by
    mixer) above a strip of its layers, with its loops and memory drawn on it."""
    spec = decoded(row["spec"])
    # stored specs carry every field; LayerSpec's defaults fill a hand-written one
    layers = [{"mixer": "attention", "mlp_width": 0, **layer} for layer in spec["layers"]]
    mixers = sorted({layer["mixer"] for layer in layers})
    colours = {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(mixers)}
    numbers = list(range(1, len(layers) + 1))
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.78, 0.22], vertical_spacing=0.06)
    for mixer in mixers:
        at = [i for i, layer in enumerate(layers) if layer["mixer"] == mixer]
        fig.add_trace(go.Bar(x=[numbers[i] for i in at], y=[layers[i]["mlp_width"] for i in at], name=text(mixer),
                             marker_color=colours[mixer], legendgroup=text(mixer),
                             hovertemplate=f"layer %{{x}}: {text(mixer)}<br>MLP width %{{y}}<extra></extra>"),
                      row=1, col=1)
        fig.add_trace(go.Bar(x=[numbers[i] for i in at], y=[1] * len(at), marker_color=colours[mixer],
                             text=[text(mixer)] * len(at), textposition="inside", showlegend=False,
                             legendgroup=text(mixer), hovertemplate=f"layer %{{x}}: {text(mixer)}<extra></extra>"),
                      row=2, col=1)
    options, structure = spec.get("options") or {}, spec.get("structure", "stack")
    loops = options.get("loops") or options.get("steps")
    notes = [f"structure {text(structure)}"]
    if loops:
        notes.append(f"layers 1-{len(layers)} run {int(loops)} times")
        fig.add_shape(type="rect", x0=0.5, x1=len(layers) + 0.5, y0=-0.15, y1=1.15, row=2, col=1,
                      line=dict(color="black", dash="dash"), fillcolor="rgba(0,0,0,0)")
    if "placement" in options:
        at = int(options["placement"])
        fig.add_vline(x=at + 0.5, line=dict(color="crimson", width=3), row=2, col=1)
        notes.append(f"memory after layer {at} ({text(options.get('slots', '?'))} slots)")
    fig.update_yaxes(title="MLP width", row=1, col=1)
    fig.update_yaxes(visible=False, range=[-0.3, 1.3], row=2, col=1)
    fig.update_xaxes(title="layer", dtick=1, row=2, col=1)
    fig.update_layout(title=f"Per-layer plan of {text(row['trial_id'])} ({text(row.get('family', ''))}): "
                            f"{'; '.join(notes)}", template=TEMPLATE, bargap=0.1, legend_title="mixer")
    return fig


def profile_figures(profiles: list[dict]) -> list[go.Figure]:
    """From stored analyses of trained trials (``layer_profiles`` rows, ``setting``
    decoded): rho per layer, and perplexity against layers removed; only those
    the rows hold."""
    figures = []
    rho = [p for p in profiles if p["analysis"] == "rho" and p["metric"] == "rho"]
    if rho:
        figures.append(_lines(rho, x=lambda p: p["layer"], label=lambda p: f"{p['trial_id']}, {p['setting']['mode']}",
                              title="Error contraction: rho per layer", x_title="layer", y_title="rho"))
    removed = [p for p in profiles if p["analysis"] == "prune" and p["metric"] == "perplexity"]
    if removed:
        figures.append(_lines(removed, x=lambda p: p["setting"]["removed"],
                              label=lambda p: f"{p['trial_id']}, by {p['setting']['ranking']}",
                              title="Depth pruning: perplexity vs layers removed", x_title="layers removed",
                              y_title="perplexity"))
    return figures


def _lines(points: list[dict], *, x, label, title: str, x_title: str, y_title: str) -> go.Figure:
    groups: dict[str, list[dict]] = defaultdict(list)
    for point in points:
        groups[label(point)].append(point)
    fig = go.Figure()
    for name, members in sorted(groups.items()):
        members.sort(key=x)
        fig.add_trace(go.Scatter(x=[x(p) for p in members], y=[p["value"] for p in members], mode="lines+markers",
                                 name=name))
    fig.update_xaxes(title=x_title, dtick=1)
    fig.update_yaxes(title=y_title)
    fig.update_layout(title=title, template="plotly_white")
    return fig


def _title(column: str) -> str:
    return {"params": "non-embedding parameters", "val_loss": "validation loss",
            "flops_per_token": "training FLOPs per token"}.get(column, text(column))
