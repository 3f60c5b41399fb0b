"""The scaling figure: each arm's trials on log-log axes with its own fitted L(N) and band.

Its fits are kept while their points stay the same (the live app redraws every few seconds);
the other figures are in figures.py, whose escaping rule (``text``) holds here too.
"""

from __future__ import annotations

import heapq
import html
import math

import numpy as np
import plotly.graph_objects as go

from archsearch.analysis import fit_law
from archsearch_dashboards.arms import _arms, _rank, arm_colours, sample_rows, text
from archsearch_dashboards.figures import TEMPLATE, _drawn, _hover, _log_ticks, _title

# An arm's L(N) is fitted (with its bootstrap band) on at most this many of its trials.
MAX_FIT_POINTS = 200


def scaling_figure(rows: list[dict], *, x: str = "params", y: str = "val_loss", bootstrap: int = 100) -> go.Figure:
    """``y`` against ``x`` on log-log axes, one colour per arm, each arm with
    its own fitted L(N) = E + A / N^alpha line and 95% confidence band
    (bootstrap) out to twice its largest size.

    A fit is over one arm's trials only: arms of different families, axes or
    protocols follow different laws, and a line through several of them
    would be no scaling law at all. An arm too small to fit (L(N) has three
    parameters: 4 trials at 3 or more sizes) gets no line; the subtitle
    names it and says why.
    """
    _, groups = _arms(rows)
    colours = arm_colours(rows)
    fits, unfitted = _fits(groups, x=x, y=y, bootstrap=bootstrap)
    shown = {r["trial_id"] for r in sample_rows(rows)}
    fig = go.Figure()
    for label, members in groups.items():
        members = sorted((r for r in members if r["trial_id"] in shown), key=lambda r: r[x])
        fig.add_trace(go.Scatter(
            x=[r[x] for r in members], y=[r[y] for r in members], mode="markers", name=text(label),
            legendgroup=text(label), marker=dict(color=colours[label], size=9),
            text=[_hover(r, label) for r in members], hovertemplate="%{text}<extra></extra>"))
        if label in fits:
            # bands lighter as arms add up: eight at 0.18 each merge into one grey block
            _add_fit(fig, fits[label], name=text(label), colour=colours[label],
                     opacity=0.18 if len(groups) <= 4 else max(0.05, 0.72 / len(groups)))
    y_range = _log_range(fig)
    xs = [v for trace in fig.data if trace.fill is None for v in trace.x if v is not None and v > 0]
    fig.update_xaxes(type="log", title=_title(x), **(_log_ticks(min(xs), max(xs)) if xs else {}))
    fig.update_yaxes(type="log", title=_title(y), range=y_range,
                     **(_log_ticks(10 ** y_range[0], 10 ** y_range[1]) if y_range else {}))
    sampled = max(len(m) for m in groups.values()) > MAX_FIT_POINTS
    fitted = f", fitted on {MAX_FIT_POINTS} trials of each larger arm" if sampled else ""
    note = _unfitted_note(unfitted, len(groups))
    fig.update_layout(title=f"Scaling: {_title(y)} vs {_title(x)} (dotted: each arm's fitted L(N), band: 95% "
                            f"interval{fitted}){_drawn(len(shown), len(rows), front=False)}"
                            + (f"<br><sup>{note}</sup>" if note else ""),
                      template=TEMPLATE, legend_title="arm")
    return fig


def _log_range(fig: go.Figure) -> list[float] | None:
    """The y range (log10) of the points and fitted lines, with a margin: a band of a fit on few
    sizes can span decades at its ends, and left to autorange it would flatten every point
    into one line (the band is clipped at the plot's edge instead)."""
    ys = [v for trace in fig.data if trace.fill is None and trace.y is not None
          for v in trace.y if v is not None and v > 0 and np.isfinite(v)]
    if not ys:
        return None
    low, high = np.log10(min(ys)), np.log10(max(ys))
    margin = max(0.08 * (high - low), 0.01)
    return [low - margin, high + margin]


# The arms a scaling plot's subtitle names when some have no fit (the rest are counted).
MAX_NAMED_UNFITTED = 3


def _unfitted_note(unfitted: dict[str, tuple[int, int] | str], arms: int) -> str:
    """The subtitle on arms without a fitted line (escaped): how many are too
    small for L(N) and why, naming a few; and each fit that failed, with its reason."""
    small = {label: why for label, why in unfitted.items() if isinstance(why, tuple)}
    failed = {label: why for label, why in unfitted.items() if isinstance(why, str)}
    parts = []
    if small:
        part = f"no fit for {len(small)} of {arms} arms: L(N) needs 4 trials at 3 or more sizes"
        if len(small) <= MAX_NAMED_UNFITTED:
            part += "; " + ", ".join(f"{text(label)} has {_count(n, 'trial')} at {_count(sizes, 'size')}"
                                     for label, (n, sizes) in small.items())
        else:
            part += f" (these have at most {_count(max(sizes for _, sizes in small.values()), 'size')})"
        parts.append(part)
    for label, why in list(failed.items())[:MAX_NAMED_UNFITTED]:
        parts.append(f"no fit for {text(label)}: {text(why)}")
    if len(failed) > MAX_NAMED_UNFITTED:
        parts.append(f"and {len(failed) - MAX_NAMED_UNFITTED} more fits failed")
    return "; ".join(parts)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _add_fit(fig: go.Figure, fit, *, name: str, colour: str, opacity: float = 0.18) -> None:
    """A fitted law's line and confidence band, in ``colour``, grouped with arm ``name`` in the legend."""
    grid, (value, low, high) = _band(fit)
    alpha = fit.estimates["alpha"]
    if low is not None:  # no band without a bootstrap
        fig.add_trace(go.Scatter(x=[*grid, *grid[::-1]], y=[*high, *low[::-1]], fill="toself", mode="lines",
                                 line=dict(width=0), fillcolor=colour, opacity=opacity, legendgroup=name,
                                 showlegend=False, hoverinfo="skip", name=f"{name} band"))
    # a fit not to be trusted says why where it is read (analysis.trust); hover text is not markup
    caution = "".join(f"<br>caution: {html.escape(reason)}" for reason in fit.cautions)
    fig.add_trace(go.Scatter(
        x=grid, y=value, mode="lines", line=dict(color=colour, dash="dot"),
        legendgroup=name, showlegend=False, name=f"{name} fit",
        hovertemplate=f"{name}<br>E + A/N^α: α={alpha.value:.3f}, E={fit.estimates['E'].value:.3g}"
                      f"{caution}<br>N=%{{x:,.0f}}: %{{y:.4f}}<extra></extra>"))


# The app redraws every few seconds, so each arm's fit is kept for as long as
# its points stay the same; a long-running app keeps the latest MAX_KEPT_FITS
# (each trial that finishes changes its arm's points).
_FIT_CACHE: dict[tuple, object] = {}
MAX_KEPT_FITS = 500


def _keep(cache: dict, key, value) -> None:
    """``cache[key] = value``, dropping the oldest entries past ``MAX_KEPT_FITS``."""
    cache[key] = value
    while len(cache) > MAX_KEPT_FITS:
        del cache[next(iter(cache))]


def _band(fit) -> tuple[np.ndarray, tuple]:
    """The grid a fit is drawn on and its loss there with the bootstrap
    interval's ends (``ScalingFit.band``), kept as long as the fit is."""
    if id(fit) not in _BANDS or _BANDS[id(fit)][0] is not fit:
        low, high = fit.ranges["N"]
        grid = np.geomspace(low, 2 * high, 30)
        _keep(_BANDS, id(fit), (fit, grid, fit.band(grid)))
    return _BANDS[id(fit)][1:]


_BANDS: dict[int, tuple] = {}


def _fits(groups: dict[str, list[dict]], *, x: str, y: str, bootstrap: int) -> tuple[dict, dict]:
    """Each arm's L(N) fit by label, and why each arm without one has none:
    its (trials, sizes) when too few for the law, else the fit's error."""
    out, unfitted = {}, {}
    for label, members in groups.items():
        # as fit_scaling does: trials without a finite loss are left out
        members = [r for r in members if r.get(y) is not None and math.isfinite(r[y]) and math.isfinite(r[x])]
        if len(members) > MAX_FIT_POINTS:  # a fixed sample, as in ``sample_rows``
            members = heapq.nsmallest(MAX_FIT_POINTS, members, key=lambda r: _rank(r["trial_id"]))
        points = tuple(sorted((float(r[x]), float(r[y])) for r in members))
        sizes = len({n for n, _ in points})
        if len(points) < 4 or sizes < 3:  # L(N) has 3 parameters
            unfitted[label] = (len(points), sizes)
            continue
        key = (points, bootstrap)
        if key not in _FIT_CACHE:
            try:
                # grid=False: a scan over alpha finds the grid's optimum, some 40x faster (docs/performance.md)
                sizes_P, losses_P = np.array(points).T
                fit = fit_law({"N": sizes_P}, losses_P, "N", bootstrap=bootstrap, grid=False)
            except ValueError as err:  # sizes that do not identify the law
                fit = str(err)
            _keep(_FIT_CACHE, key, fit)
        if isinstance(_FIT_CACHE[key], str):
            unfitted[label] = _FIT_CACHE[key]
        else:
            out[label] = _FIT_CACHE[key]
    return out, unfitted
