"""Pareto fronts over result rows. Torch-free."""

from __future__ import annotations

from collections.abc import Sequence


def parse_objectives(text: str) -> list[tuple[str, str]]:
    """``"val_loss,params"`` or ``"val_loss:min,tokens_per_s:max"`` -> [(column, min|max)].

    A bare column is minimised, except throughput-like ones ending in ``_per_s``.
    """
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        column, _, sense = part.partition(":")
        sense = sense or ("max" if column.endswith("_per_s") else "min")
        if sense not in ("min", "max"):
            raise ValueError(f"objective '{part}': direction must be min or max")
        out.append((column, sense))
    if len(out) < 1:
        raise ValueError("give at least one objective, e.g. --objectives val_loss,params")
    return out


def pareto_front(rows: Sequence[dict], objectives: Sequence[tuple[str, str]]) -> list[dict]:
    """The rows no other row dominates, sorted by the first objective.

    A row dominates another when it is no worse on every objective and better
    on at least one. Rows missing any objective value are left out.
    """
    for column, _ in objectives:
        if rows and column not in rows[0]:
            raise ValueError(f"no column '{column}'; have: {', '.join(rows[0])}")
    keyed = []
    for row in rows:
        values = [row.get(c) for c, _ in objectives]
        if any(v is None for v in values):
            continue
        keyed.append(([v if s == "min" else -v for v, (_, s) in zip(values, objectives)], row))
    front = [row for vec, row in keyed
             if not any(_dominates(other, vec) for other, _ in keyed)]
    return sorted(front, key=lambda r: r[objectives[0][0]])


def _dominates(a: list[float], b: list[float]) -> bool:
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))
