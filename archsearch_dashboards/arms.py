"""Which rows a view draws and how it names and colours their arms.

Shared by every figure (figures.py), the report and the live app: the arms of
a list of rows (the axes that vary, each row's label, each arm's best), one
colour per arm, the escaping of study-file text, and the fixed sample drawn
when a study has more trials than a figure can show. The answers for one list
of rows are kept (``per_rows``), so a redraw's views work them out once.
"""

from __future__ import annotations

import functools
import html
import itertools
import zlib
from collections import defaultdict

import plotly.colors

from archsearch.analysis.arms import (  # noqa: F401 (the views import these from here)
    PROTOCOLS,
    arm_axes,
    arm_labels,
    axis_text,
    baseline_text,
    decoded,
)
from archsearch.analysis.arms import arm_label as group_label  # noqa: F401

# A scatter or parallel-coordinates view draws at most this many trials: past
# it, the front, each arm's best and a fixed sample of the rest (see ``sample_rows``).
MAX_POINTS = 2_000

# How many lists of rows ``per_rows`` keeps answers for (a redraw's rows, the app's filtered and ranked ones).
KEPT_ROW_LISTS = 4


def per_rows(function):
    """Keep ``function(rows, ...)``'s answers for the last few lists of rows it
    was given, while a list and the other arguments stay the same.

    The views of one redraw are drawn from one list of rows (100,000 at the
    large end) and each works out the arms, their labels and a sample from
    it; this works each out once per redraw. Answers are keyed by the list's
    identity and length (the list is held, so its id is not reused), so rows
    are not to be changed in place between views (no view does).
    """
    kept: list[tuple] = []

    @functools.wraps(function)
    def once(rows, *args, **kwargs):
        for held, length, arguments, answer in kept:
            if held is rows and length == len(rows) and arguments == (args, kwargs):
                return answer
        answer = function(rows, *args, **kwargs)
        kept[:] = [(rows, len(rows), (args, kwargs), answer), *kept[:KEPT_ROW_LISTS - 1]]
        return answer

    return once


def _palette() -> list[str]:
    """Distinct colours for arms: the strong qualitative palettes first, deduplicated (104 colours)."""
    out: list[str] = []
    for name in ("Plotly", "D3", "Dark24", "Alphabet", "G10", "T10", "Light24"):
        for colour in getattr(plotly.colors.qualitative, name):
            if colour.lower() not in out:
                out.append(colour.lower())
    return out


PALETTE = _palette()


def text(value) -> str:
    """A value from a study file, safe to show in a figure or a page."""
    return html.escape(str(value), quote=True)


# the dashboards' arms are analysis's (``archsearch.analysis.arms``), worked out once per redraw
varying_axes = per_rows(arm_axes)
group_labels = per_rows(arm_labels)


def arm_colours(rows: list[dict]) -> dict[str, str]:
    """One colour per arm, in sorted arm order; distinct up to ``len(PALETTE)`` arms."""
    axes = varying_axes(rows)
    labels = sorted(set(group_labels(rows, axes)))
    return {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(labels)}


@per_rows
def sample_rows(rows: list[dict], limit: int = MAX_POINTS, keep: set[str] = frozenset()) -> list[dict]:
    """Every row up to ``limit``; past it the rows whose trial is in ``keep``
    (the front), each arm's best, then a sample of the rest up to ``limit``, in
    their original order. The sample ranks trials by a hash of their id, so it
    is the same on every redraw whatever order the rows come in."""
    if len(rows) <= limit:
        return rows
    chosen = {r["trial_id"] for r in rows if r["trial_id"] in keep}
    chosen |= {r["trial_id"] for r in arm_bests(rows).values()}
    rest = (t for t in _rank_order(rows) if t not in chosen)
    chosen.update(itertools.islice(rest, max(limit - len(chosen), 0)))
    return [r for r in rows if r["trial_id"] in chosen]


@per_rows
def arm_bests(rows: list[dict], y: str = "val_loss") -> dict[str, dict]:
    """Each arm's row of lowest ``y`` (the first of equals), by arm label, best first."""
    best: dict[str, dict] = {}
    for row, label in zip(rows, group_labels(rows, varying_axes(rows))):
        if label not in best or row[y] < best[label][y]:
            best[label] = row
    return dict(sorted(best.items(), key=lambda item: item[1][y]))


@per_rows
def _rank_order(rows: list[dict]) -> list[str]:
    """Every trial id, in the order of their hash rank (``_rank``)."""
    return sorted((r["trial_id"] for r in rows), key=_rank)


def _rank(trial_id) -> int:
    return zlib.crc32(str(trial_id).encode())


def _arms(rows: list[dict]) -> tuple[list[str], dict[str, list[dict]]]:
    axes = varying_axes(rows)
    groups: dict[str, list[dict]] = defaultdict(list)
    for row, label in zip(rows, group_labels(rows, axes)):
        groups[label].append(row)
    return axes, dict(sorted(groups.items()))
