"""Plotly figures over result rows: scaling, Pareto front, loss curves.

Rows are plain dicts as the store returns them (``trials().to_pylist()``),
with ``axes`` already decoded from JSON.
"""

from __future__ import annotations

from collections import defaultdict

import plotly.graph_objects as go

from archsearch.analysis import pareto_front


def varying_axes(rows: list[dict]) -> list[str]:
    """Axis names whose value differs between trials, in first-seen order.

    A swept learning rate is tuning, not an arm, so it never splits a line.
    """
    names: dict[str, set] = {}
    for row in rows:
        for name, value in row["axes"].items():
            if name == "lr":
                continue
            names.setdefault(name, set()).add(repr(value))
    return [name for name, values in names.items() if len(values) > 1]


def group_label(row: dict, axes: list[str]) -> str:
    return ", ".join(f"{a}={row['axes'].get(a)}" for a in axes) or row.get("family", "all")


def scaling_figure(rows: list[dict], *, x: str = "params", y: str = "val_loss") -> go.Figure:
    """``y`` against ``x`` on log-log axes, one line per combination of varying axes."""
    axes = varying_axes(rows)
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        groups[group_label(row, axes)].append(row)
    fig = go.Figure()
    for label, members in sorted(groups.items()):
        members.sort(key=lambda r: r[x])
        fig.add_trace(go.Scatter(
            x=[r[x] for r in members], y=[r[y] for r in members], mode="lines+markers", name=label,
            customdata=[[r["trial_id"], r["d_model"], r["num_layers"]] for r in members],
            hovertemplate=f"{x}=%{{x:,}}<br>{y}=%{{y:.4f}}<br>trial %{{customdata[0]}}"
                          "<br>d_model=%{customdata[1]} layers=%{customdata[2]}<extra>%{fullData.name}</extra>"))
    fig.update_xaxes(type="log", title=_title(x))
    fig.update_yaxes(type="log", title=_title(y))
    fig.update_layout(title=f"Scaling: {_title(y)} vs {_title(x)}", template="plotly_white", legend_title="arm")
    return fig


def pareto_figure(rows: list[dict], *, objectives: list[tuple[str, str]]) -> go.Figure:
    """Every trial as a point, the non-dominated ones joined as the front."""
    (x, _), (y, _) = objectives[1], objectives[0]
    front = pareto_front(rows, objectives)
    axes = varying_axes(rows)
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=[r[x] for r in rows], y=[r[y] for r in rows], mode="markers", name="trials",
        marker=dict(color="lightgray", size=9, line=dict(width=1, color="gray")),
        text=[group_label(r, axes) for r in rows],
        hovertemplate=f"{x}=%{{x:,}}<br>{y}=%{{y:.4f}}<br>%{{text}}<extra></extra>"))
    front = sorted(front, key=lambda r: r[x])
    fig.add_trace(go.Scatter(
        x=[r[x] for r in front], y=[r[y] for r in front], mode="lines+markers", name="Pareto front",
        line=dict(shape="hv", color="crimson"), marker=dict(size=11),
        text=[group_label(r, axes) for r in front],
        hovertemplate=f"{x}=%{{x:,}}<br>{y}=%{{y:.4f}}<br>%{{text}}<extra>front</extra>"))
    fig.update_xaxes(type="log", title=_title(x))
    fig.update_yaxes(title=_title(y))
    fig.update_layout(title=f"Pareto front: {_title(y)} vs {_title(x)}", template="plotly_white")
    return fig


def curves_figure(rows: list[dict], metrics: list[dict]) -> go.Figure:
    """Validation loss against tokens for every trial."""
    axes = varying_axes(rows)
    labels = {r["trial_id"]: f"{group_label(r, axes)}, {r['params']:,} params" for r in rows}
    by_trial: dict[str, list[dict]] = defaultdict(list)
    for m in metrics:
        if m["trial_id"] in labels:
            by_trial[m["trial_id"]].append(m)
    fig = go.Figure()
    for trial_id, points in by_trial.items():
        points.sort(key=lambda m: m["step"])
        fig.add_trace(go.Scatter(x=[m["tokens"] for m in points], y=[m["val_loss"] for m in points],
                                 mode="lines", name=labels[trial_id]))
    fig.update_xaxes(title="tokens seen")
    fig.update_yaxes(title="validation loss")
    fig.update_layout(title="Validation loss during training", template="plotly_white")
    return fig


def comparison_figure(rows: list[dict], *, y: str = "val_loss") -> go.Figure:
    """Every arm side by side: one bar per arm (combination of varying axes),
    one colour per budget target, best first."""
    axes = varying_axes(rows)
    targets = sorted({r["target"] for r in rows})
    labels = sorted({group_label(r, axes) for r in rows},
                    key=lambda label: min(r[y] for r in rows if group_label(r, axes) == label))
    fig = go.Figure()
    for target in targets:
        at = {group_label(r, axes): r for r in rows if r["target"] == target}
        fig.add_trace(go.Bar(x=labels, y=[at[label][y] if label in at else None for label in labels],
                             name=f"target {target:,.0f}",
                             customdata=[[at[label]["trial_id"], at[label]["params"]] if label in at else [None, None]
                                         for label in labels],
                             hovertemplate=f"%{{x}}<br>{y}=%{{y:.4f}}<br>trial %{{customdata[0]}}"
                                           "<br>params=%{customdata[1]:,}<extra></extra>"))
    fig.update_layout(title=f"Side by side: {_title(y)} per arm (best first)", template="plotly_white",
                      barmode="group", xaxis_tickangle=-30)
    fig.update_yaxes(title=_title(y))
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
            "flops_per_token": "training FLOPs per token"}.get(column, column)
