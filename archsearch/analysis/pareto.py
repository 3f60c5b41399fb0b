"""Pareto fronts and their hypervolume over result tables. Torch-free.

Objectives are columns with a direction (min or max). Internally every
objective is turned into one to minimise (max columns are negated), identical
objective vectors are merged, and the non-dominated set is found by a sweep:

- 2 objectives: sort, then a running minimum of the second (O(n log n));
- 3 objectives: sort by the first, then keep the 2-D staircase of the other two
  (bisection per point; O(n log n) unless the front itself is huge);
- more: sort, then compare each point against the front found so far (numpy).

A row dominates another when it is no worse on every objective and better on
at least one; rows with equal objective vectors are on the front together.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from archsearch.analysis.tables import as_table, decoded_rows, numeric_column
from archsearch.analysis.trials import matched_values

# Default reference point: each objective's worst value among the input rows,
# pushed out by this fraction of its range, so the extreme points of the front
# still add volume.
REFERENCE_MARGIN = 0.1


def parse_objectives(text: str) -> list[tuple[str, str]]:
    """``"val_loss,params"`` or ``"val_loss:min,tokens_per_s:max"`` -> [(column, min|max)].

    A bare column is minimised, except throughput-like ones ending in ``_per_s``.
    """
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        column, _, sense = part.rpartition(":") if ":" in part else (part, "", "")
        sense = sense.strip() or ("max" if column.endswith("_per_s") else "min")
        if sense not in ("min", "max"):
            raise ValueError(f"objective '{part}': direction must be min or max")
        out.append((column.strip(), sense))
    if not out:
        raise ValueError("give at least one objective, e.g. --objectives val_loss,params")
    return out


@dataclass(frozen=True, kw_only=True)
class Front:
    """The non-dominated rows of a table.

    ``indices`` are 0-based row numbers in the input, sorted by the first
    objective; ``rows`` the matching rows (JSON columns decoded);
    ``hypervolume`` the volume the front dominates up to ``reference`` (None
    above 3 objectives), ``hypervolume_fraction`` that volume over the box
    from the front's best values to the reference; ``notes`` say how values
    were compared.
    """

    objectives: list[tuple[str, str]]
    indices: list[int]
    rows: list[dict]
    reference: list[float]
    hypervolume: float | None
    hypervolume_fraction: float | None
    considered: int
    reference_rule: str
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "objectives": [{"column": c, "direction": d} for c, d in self.objectives],
            "considered": self.considered,
            "reference": [v if np.isfinite(v) else None for v in self.reference],
            "reference_rule": self.reference_rule,
            "hypervolume": self.hypervolume,
            "hypervolume_fraction": self.hypervolume_fraction,
            "notes": self.notes,
            # The row number comes first and wins over an input column of the same name.
            "front": [{"index": i, **{k: v for k, v in row.items() if k != "index"}}
                      for i, row in zip(self.indices, self.rows)],
        }


def pareto(data: Any, objectives: str | Sequence[tuple[str, str]], *, reference: Sequence[float] | None = None,
           matched: str = "target") -> Front:
    """The Pareto front of ``data`` (any table, see ``as_table``, or row dicts) over ``objectives``.

    ``matched="target"`` (the default) compares a measure that trials were
    matched on (params, FLOPs, state) at each trial's budget target rather
    than the solver's rounded result (see ``trials.matched_values``), and
    says so in ``notes``; ``"achieved"`` compares the raw values.
    ``reference``, one value per objective in its own units, defaults to the
    rule in ``REFERENCE_MARGIN``. Rows missing any objective value are left out.
    """
    if isinstance(objectives, str):
        objectives = parse_objectives(objectives)
    objectives = list(objectives)
    if matched not in ("target", "achieved"):
        raise ValueError(f"matched '{matched}': choose target or achieved")
    rows_in = list(data) if _is_rows(data) else None
    table = _objective_table(rows_in, objectives) if rows_in is not None else as_table(data)
    names = [c for c, _ in objectives]
    columns = [numeric_column(table, c, what="objective") for c in names]
    replaced, notes = matched_values(table, names) if matched == "target" else ({}, [])
    columns = [replaced.get(c, values) for c, values in zip(names, columns)]
    signs = np.array([1.0 if d == "min" else -1.0 for _, d in objectives])
    points = np.column_stack(columns).reshape(table.num_rows, len(names)) * signs  # [n, k], all to minimise
    valid = np.flatnonzero(np.isfinite(points).all(axis=1))
    if len(valid) < len(points):
        left_out = len(points) - len(valid)
        notes.append(f"{left_out} row{'s' * (left_out != 1)} without a value for every objective left out")
    front = valid[nondominated(points[valid])]
    front = front[np.lexsort(points[front].T[::-1])]
    ref = _reference(points[valid], reference, signs)
    volume = hypervolume(points[front], ref) if len(objectives) <= 3 and len(valid) else None
    if volume is None:
        notes.append("hypervolume is computed for up to 3 objectives")
    box = np.prod(ref - points[front].min(axis=0)) if len(front) else 0.0
    fraction = float(volume / box) if volume is not None and box > 0 else None
    if rows_in is not None:
        rows = [rows_in[i] for i in front]
    else:
        rows = decoded_rows(table.take(pa.array(front, type=pa.int64())))
    rule = "given" if reference is not None else (
        f"each objective's worst value among the considered rows, moved out by {REFERENCE_MARGIN:.0%} of its range")
    return Front(objectives=objectives, indices=[int(i) for i in front], rows=rows,
                 reference=[float(v) for v in ref * signs], hypervolume=volume, hypervolume_fraction=fraction,
                 considered=len(valid), reference_rule=rule, notes=notes)


def pareto_front(rows: Sequence[dict], objectives: Sequence[tuple[str, str]]) -> list[dict]:
    """The rows no other row dominates, sorted by the first objective (see ``pareto``)."""
    return pareto(list(rows), objectives).rows


def _is_rows(data: Any) -> bool:
    return isinstance(data, Sequence) and not isinstance(data, (str, bytes)) and all(
        isinstance(r, dict) for r in data)


def _objective_table(rows: list[dict], objectives: Sequence[tuple[str, str]]) -> pa.Table:
    """The objective columns of row dicts (and what they were matched on), so
    rows with nested values need not fit one Arrow schema."""
    names = [c for c, _ in objectives]
    for column in names:
        if rows and column not in rows[0]:
            raise ValueError(f"no objective '{column}'; have: {', '.join(rows[0])}")
    extra = [c for c in ("match", "target", "achieved") if rows and c in rows[0] and c not in names]
    columns = {}
    for column in [*names, *extra]:
        values = [r.get(column) for r in rows]
        try:
            columns[column] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            columns[column] = pa.array([None if v is None else str(v) for v in values])
    return pa.table(columns)


def nondominated(points: np.ndarray) -> np.ndarray:
    """Indices (ascending) of the rows of ``points`` [n, k] that no other row
    dominates, every column minimised. Equal rows are kept together."""
    points = np.asarray(points, dtype=float)
    if len(points) == 0:
        return np.zeros(0, dtype=np.int64)
    unique, inverse = _unique_rows(points)
    k = unique.shape[1]
    if k == 1:
        keep = np.zeros(len(unique), dtype=bool)
        keep[0] = True
    elif k == 2:
        # Sorted by the first objective, a point survives when its second beats every earlier one.
        before = np.concatenate([[np.inf], np.minimum.accumulate(unique[:-1, 1])])
        keep = unique[:, 1] < before
    else:
        keep = np.zeros(len(unique), dtype=bool)
        alive = np.flatnonzero(~_dominated_by_pivots(unique))
        sweep = _nondominated_3d if k == 3 else _nondominated_nd
        keep[alive] = sweep(unique[alive])
    return np.flatnonzero(keep[inverse])


def _unique_rows(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows in lexicographic order, and each input row's place among them."""
    order = np.lexsort(points.T[::-1])
    ordered = points[order]
    starts = np.concatenate([[True], (ordered[1:] != ordered[:-1]).any(axis=1)])
    inverse = np.empty(len(points), dtype=np.int64)
    inverse[order] = np.cumsum(starts) - 1
    return ordered[starts], inverse


def _dominated_by_pivots(unique: np.ndarray, count: int = 16) -> np.ndarray:
    """Distinct points some pivot dominates: a cheap vectorised first pass. The
    pivots are the points best on the sum of rank-scaled objectives, which in
    most data dominate nearly everything off the front. Dominance is
    transitive, so removing these first does not change the front."""
    scaled = (unique - unique.min(axis=0)) / np.maximum(np.ptp(unique, axis=0), 1e-300)
    pivots = unique[np.argsort(scaled.sum(axis=1), kind="stable")[:count]]
    dominated = np.zeros(len(unique), dtype=bool)
    for pivot in pivots:
        dominated |= (pivot <= unique).all(axis=1) & (pivot < unique).any(axis=1)
    return dominated


def _nondominated_3d(unique: np.ndarray) -> np.ndarray:
    """Lexicographically sorted distinct points: every earlier point is no
    worse on the first objective, so a point is dominated exactly when an
    earlier point on the front is no worse on the other two."""
    stairs = _Staircase()
    keep = np.zeros(len(unique), dtype=bool)
    for i, (y, z) in enumerate(unique[:, 1:].tolist()):
        if not stairs.covers(y, z):
            keep[i] = True
            stairs.insert(y, z)
    return keep


def _nondominated_nd(unique: np.ndarray) -> np.ndarray:
    front = np.empty_like(unique)
    size = 0
    keep = np.zeros(len(unique), dtype=bool)
    for i, point in enumerate(unique):
        if size == 0 or not (front[:size] <= point).all(axis=1).any():
            front[size] = point
            size += 1
            keep[i] = True
    return keep


class _Staircase:
    """A 2-D front of minimised points: x strictly rising, y strictly falling;
    given a reference (rx, ry), it also keeps the area it dominates."""

    def __init__(self, rx: float | None = None, ry: float | None = None):
        self.xs: list[float] = []
        self.ys: list[float] = []
        self.rx, self.ry = rx, ry
        self.area = 0.0

    def covers(self, x: float, y: float) -> bool:
        """Whether some point on the staircase is no worse than (x, y) on both."""
        i = bisect_right(self.xs, x) - 1
        return i >= 0 and self.ys[i] <= y

    def insert(self, x: float, y: float) -> None:
        """Add a point the staircase does not cover; drop the points it covers."""
        j = bisect_left(self.xs, x)
        end = j
        while end < len(self.xs) and self.ys[end] >= y:
            end += 1
        if self.rx is not None:
            self._add_area(x, y, j, end)
        self.xs[j:end] = [x]
        self.ys[j:end] = [y]

    def _add_area(self, x: float, y: float, j: int, end: int) -> None:
        # The new area: above (x, y), below the old staircase, strip by strip.
        height, start = (self.ys[j - 1] if j else self.ry), x
        for k in range(j, end):
            self.area += (self.xs[k] - start) * (height - y)
            start, height = self.xs[k], self.ys[k]
        stop = self.xs[end] if end < len(self.xs) else self.rx
        self.area += (stop - start) * (height - y)


def hypervolume(points: np.ndarray, reference: np.ndarray) -> float:
    """The volume dominated by ``points`` [n, k] (k <= 3, minimised) and bounded
    by ``reference``; points not better than the reference everywhere add nothing."""
    points = np.asarray(points, dtype=float)
    reference = np.asarray(reference, dtype=float)
    points = points[(points < reference).all(axis=1)]
    if len(points) == 0:
        return 0.0
    k = points.shape[1]
    if k == 1:
        return float(reference[0] - points[:, 0].min())
    if k == 2:
        points = points[np.lexsort((points[:, 1], points[:, 0]))]
        best_y = np.minimum.accumulate(points[:, 1])
        widths = np.diff(np.append(points[:, 0], reference[0]))
        return float(np.sum(widths * (reference[1] - best_y)))
    if k == 3:
        # Sweep up the third objective; between two heights the slice is the
        # staircase area of the points below.
        order = np.argsort(points[:, 2], kind="stable")
        stairs = _Staircase(reference[0], reference[1])
        volume = 0.0
        heights = np.append(points[order, 2], reference[2]).tolist()
        for n, i in enumerate(order.tolist()):
            x, y = points[i, 0], points[i, 1]
            if not stairs.covers(x, y):
                stairs.insert(x, y)
            volume += stairs.area * (heights[n + 1] - heights[n])
        return float(volume)
    raise ValueError(f"hypervolume is computed for up to 3 objectives, not {k}")


def _reference(points: np.ndarray, given: Sequence[float] | None, signs: np.ndarray) -> np.ndarray:
    """The reference point in minimised units (see ``REFERENCE_MARGIN``)."""
    if given is not None:
        if len(given) != len(signs):
            raise ValueError(f"reference has {len(given)} values for {len(signs)} objectives")
        if not np.isfinite(np.asarray(given, dtype=float)).all():
            raise ValueError(f"reference {', '.join(map(str, given))}: every value must be a finite number")
        return np.asarray(given, dtype=float) * signs
    if len(points) == 0:
        return np.full(len(signs), np.nan)
    worst, best = points.max(axis=0), points.min(axis=0)
    span = np.where(worst > best, worst - best, np.maximum(np.abs(worst), 1.0))
    return worst + REFERENCE_MARGIN * span
