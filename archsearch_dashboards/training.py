"""The training view: training loss against tokens, as trials train.

The store keeps a training-loss point every ``recipe.log_every`` steps (the
mean loss of the steps since the last), so this view shows a running trial
long before its first evaluation. Running trials are drawn bold with markers,
each named with where it is; finished trials thin, as the curves view colours
them, by arm.
"""

from __future__ import annotations

from collections import defaultdict

import plotly.graph_objects as go

from archsearch.units import axes_text
from archsearch_dashboards.arms import PALETTE, arm_colours, group_labels, text, varying_axes
from archsearch_dashboards.figures import TEMPLATE, thin

def running_label(trial: dict) -> str:
    """A running trial in a few words: its short id, family and axes."""
    axes = axes_text(dict(sorted(trial["axes"].items())), leave_out=("family",))
    return f"{trial['trial_id'][:8]} {trial['family']} {axes}".strip()


def training_figure(rows: list[dict], points: list[dict], running: list[dict] = ()) -> go.Figure:
    """Training loss against tokens: ``rows`` are finished trials (coloured by arm), ``running``
    trials that train now (``trial_id``, ``family``, ``axes`` and ``progress``, their latest
    report, or None), ``points`` the stored training-loss rows of both (thinned, see ``thin``)."""
    by_trial: dict[str, list[dict]] = defaultdict(list)
    for point in points:
        if point.get("train_loss") is not None:
            by_trial[point["trial_id"]].append(point)
    fig = go.Figure()
    done = {r["trial_id"]: r for r in rows}
    colours = arm_colours(rows) if rows else {}
    label_of = dict(zip(done, group_labels(rows, varying_axes(rows)))) if rows else {}
    shown: set[str] = set()
    for trial_id in sorted(t for t in by_trial if t in done):
        label, curve = label_of[trial_id], thin(sorted(by_trial[trial_id], key=lambda p: p["step"]))
        fig.add_trace(go.Scatter(
            x=[p["tokens"] for p in curve], y=[p["train_loss"] for p in curve], mode="lines", name=text(label),
            legendgroup=text(label), showlegend=label not in shown, opacity=0.6,
            line=dict(color=colours[label], width=1.2),
            hovertemplate=f"{text(trial_id)}<br>{text(label)}<br>tokens %{{x:,}}<br>train loss %{{y:.4f}}<extra></extra>"))
        shown.add(label)
    for index, trial in enumerate(running):
        curve = thin(sorted(by_trial.get(trial["trial_id"], []), key=lambda p: p["step"]))
        at = trial.get("progress")
        where = f" (running, step {at['step']:,}/{at['total_steps']:,})" if at else " (running)"
        fig.add_trace(go.Scatter(
            x=[p["tokens"] for p in curve], y=[p["train_loss"] for p in curve], mode="lines+markers",
            name=text(running_label(trial) + where), line=dict(color=PALETTE[index % len(PALETTE)], width=3),
            marker=dict(size=5),
            hovertemplate=f"{text(trial['trial_id'])} (running)<br>tokens %{{x:,}}<br>train loss %{{y:.4f}}"
                          "<extra></extra>"))
    fig.update_xaxes(title="tokens seen")
    fig.update_yaxes(title="training loss (mean since the previous point)")
    now = f", {len(running)} running (bold)" if running else ""
    fig.update_layout(title=f"Training loss as trials train{now}", template=TEMPLATE, legend_title="arm or trial")
    return fig
