"""How long a plan will train, from what a store measured. Torch-free.

A completed trial's throughput in FLOPs per second (tokens/s x training FLOPs per token) is
much the same across the sizes of one family on one machine, where tokens/s alone is not: so a
planned trial is taken to train at the median FLOP/s its family reached in the store, and to
take its training FLOPs over that. Evaluation, start-up and kernel builds are not counted; a
family the store has never trained gets no estimate (and is said to be left out).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from archsearch.units import duration


@dataclass(frozen=True, kw_only=True)
class WallTime:
    """``wall_s``: the plan's training time with ``at_once`` trials at a time; ``covered`` of
    ``trials`` planned trials have a measured family, from ``measured`` completed trials."""

    wall_s: float
    at_once: int
    covered: int
    trials: int
    measured: int


def estimate(planned: list[dict], completed: list[dict], *, at_once: int) -> WallTime | None:
    """``planned``: trials with ``family`` and ``train_flops``; ``completed``: store rows with
    ``family``, ``tokens_per_s`` and ``flops_per_token``. None when no planned family was measured."""
    rates: dict[str, list[float]] = {}
    for row in completed:
        rate = (row.get("tokens_per_s") or 0) * (row.get("flops_per_token") or 0)
        if rate > 0 and math.isfinite(rate):
            rates.setdefault(row["family"], []).append(rate)
    medians = {family: statistics.median(values) for family, values in rates.items()}
    times = [t["train_flops"] / medians[t["family"]] for t in planned if t["family"] in medians]
    if not times:
        return None
    at_once = max(1, min(at_once, len(times)))
    # trials at a time share the work; never less than the longest trial
    wall = max(sum(times) / at_once, max(times))
    used = sum(len(rates[f]) for f in {t["family"] for t in planned} if f in rates)
    return WallTime(wall_s=wall, at_once=at_once, covered=len(times), trials=len(planned), measured=used)


__all__ = ["WallTime", "duration", "estimate"]
