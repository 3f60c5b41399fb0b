"""Pick widths so a model hits its target on the budget's measure.

Every family here is affine in its total MLP width at a fixed d_model (in
parameters and in FLOPs), so the solver tries the few head-dim multiples of
d_model around the continuous solution and, for each, solves the total MLP
width exactly (rounded to its multiple). Of the candidates within tolerance it
keeps, for ``solve_for="d_model"``, the one whose mean MLP width is closest to
``mlp_ratio * d_model``; otherwise the one closest to the target. A measure
that does not depend on MLP width (state size) is matched through d_model
alone, with the MLP ratio kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from archsearch.arch.spec import ArchSpec

MAX_D_MODEL = 1 << 16

SpecMaker = Callable[[int, int], ArchSpec]  # (d_model, total MLP width) -> spec
Measure = Callable[[ArchSpec], float]


class BudgetError(ValueError):
    """No width reaches the target within tolerance; carries the closest value."""

    def __init__(self, message: str, *, closest: float | None = None, hint: str = ""):
        super().__init__(message)
        self.closest = closest
        self.hint = hint


@dataclass(frozen=True)
class Solution:
    spec: ArchSpec
    achieved: float
    match_error: float  # achieved / target - 1


def solve(*, target: float, make_spec: SpecMaker, measure: Measure, num_layers: int, head_dim: int,
          mlp_ratio: float, multiple_of: int, tolerance: float,
          solve_for: Literal["d_model", "mlp", "both"] = "d_model", d_model: int | None = None) -> Solution:
    """The spec whose ``measure`` is nearest ``target``; raises BudgetError."""
    min_width = num_layers * multiple_of

    def width_for(d: int) -> int:
        return max(min_width, round(mlp_ratio * d * num_layers / multiple_of) * multiple_of)

    lines: dict[int, tuple[float, float]] = {}

    def line(d: int) -> tuple[float, float]:
        """The measure at d as base + slope * (width - min_width): two counts per d."""
        if d not in lines:
            base = measure(make_spec(d, min_width))
            lines[d] = base, (measure(make_spec(d, 2 * min_width)) - base) / min_width
        return lines[d]

    def value(d: int, width: int) -> float:
        base, slope = line(d)
        return base + slope * (width - min_width)

    smallest = value(d_model or head_dim, min_width)
    if target < smallest:
        raise BudgetError(f"target {target:.4g} is below the smallest model ({smallest:.4g})", closest=smallest,
                          hint="raise the target, or lower num_layers or head_dim")
    if solve_for == "mlp":
        if d_model is None:
            raise BudgetError("solve_for: mlp needs a fixed width", hint="set model.d_model in the space")
        candidates = [d_model]
    else:
        candidates = _d_candidates(target, lambda d: value(d, width_for(d)), head_dim)
    best: tuple[float, int, int] | None = None
    closest: tuple[float, int, int] | None = None
    for d in candidates:
        base, slope = line(d)
        if slope > 0:
            width = max(min_width, round((min_width + (target - base) / slope) / multiple_of) * multiple_of)
        else:
            width = width_for(d)
        error = value(d, width) / target - 1
        if closest is None or abs(error) < abs(closest[0]):
            closest = (error, d, width)
        if abs(error) <= tolerance:
            rank = abs(math.log(width / (num_layers * d * mlp_ratio))) if solve_for == "d_model" else abs(error)
            if best is None or rank < best[0]:
                best = (rank, d, width)
    if best is not None:
        spec = make_spec(best[1], best[2])
        achieved = measure(spec)
        return Solution(spec, achieved, achieved / target - 1)
    error, d, width = closest
    achieved = target * (1 + error)
    raise BudgetError(f"no width reaches target {target:.4g} within {tolerance:.2%}; closest is "
                      f"{achieved:.6g} ({error:+.2%})", closest=achieved,
                      hint="lower multiple_of or head_dim, or raise budget.tolerance")


def _d_candidates(target: float, measure_at: Callable[[int], float], head_dim: int) -> list[int]:
    """Head-dim multiples of d_model around the one that reaches ``target``.

    The measure grows about as d^p for some p in [1, 2]; a few secant steps on
    log k find the crossing in far fewer counts than bisection.
    """
    top = MAX_D_MODEL // head_dim
    if measure_at(top * head_dim) < target:
        raise BudgetError(f"target {target:.4g} needs d_model above {MAX_D_MODEL}",
                          hint="lower the target or raise num_layers")
    k, seen = 8, {}
    for _ in range(8):
        k = min(max(1, k), top)
        if k in seen:
            break
        seen[k] = measure_at(k * head_dim)
        lower = max((j for j in seen if j < k), default=None)
        upper = min((j for j in seen if j > k), default=None)
        ref = lower if lower is not None else upper
        if ref is None or seen[ref] == seen[k]:
            k = round(k * math.sqrt(target / seen[k]))
            continue
        power = math.log(seen[k] / seen[ref]) / math.log(k / ref)
        k = round(k * (target / seen[k]) ** (1 / max(power, 0.5)))
    k = min(max(1, k), top)
    while k > 1 and measure_at(k * head_dim) > target:
        k -= 1
    while k < top and measure_at((k + 1) * head_dim) <= target:
        k += 1
    return [j * head_dim for j in range(max(1, k - 1), min(top, k + 2) + 1)]
