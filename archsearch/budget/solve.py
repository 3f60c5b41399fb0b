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

    def at(d: int, width: int) -> tuple[ArchSpec, float]:
        spec = make_spec(d, width)
        return spec, measure(spec)

    smallest = at(d_model or head_dim, min_width)[1]
    if target < smallest:
        raise BudgetError(f"target {target:.4g} is below the smallest model ({smallest:.4g})", closest=smallest,
                          hint="raise the target, or lower num_layers or head_dim")
    if solve_for == "mlp":
        if d_model is None:
            raise BudgetError("solve_for: mlp needs a fixed width", hint="set model.d_model in the space")
        candidates = [d_model]
    else:
        candidates = _d_candidates(target, lambda d: at(d, width_for(d))[1], head_dim)
    best: tuple[float, Solution] | None = None
    closest: Solution | None = None
    for d in candidates:
        base = at(d, min_width)[1]
        slope = (at(d, 2 * min_width)[1] - base) / min_width
        if slope > 0:
            width = max(min_width, round((min_width + (target - base) / slope) / multiple_of) * multiple_of)
        else:
            width = width_for(d)
        spec, achieved = at(d, width)
        solution = Solution(spec, achieved, achieved / target - 1)
        if closest is None or abs(solution.match_error) < abs(closest.match_error):
            closest = solution
        if abs(solution.match_error) <= tolerance:
            rank = (abs(math.log(width / (num_layers * d * mlp_ratio))) if solve_for == "d_model"
                    else abs(solution.match_error))
            if best is None or rank < best[0]:
                best = (rank, solution)
    if best is not None:
        return best[1]
    raise BudgetError(f"no width reaches target {target:.4g} within {tolerance:.2%}; closest is "
                      f"{closest.achieved:.6g} ({closest.match_error:+.2%})", closest=closest.achieved,
                      hint="lower multiple_of or head_dim, or raise budget.tolerance")


def _d_candidates(target: float, measure_at: Callable[[int], float], head_dim: int) -> list[int]:
    """Head-dim multiples of d_model around the one that reaches ``target``."""
    lo, hi = 1, MAX_D_MODEL // head_dim
    if measure_at(hi * head_dim) < target:
        raise BudgetError(f"target {target:.4g} needs d_model above {MAX_D_MODEL}",
                          hint="lower the target or raise num_layers")
    while lo < hi:  # largest k whose ratio-shaped model stays at or under target
        mid = (lo + hi + 1) // 2
        if measure_at(mid * head_dim) <= target:
            lo = mid
        else:
            hi = mid - 1
    return [k * head_dim for k in range(max(1, lo - 2), lo + 4)]
