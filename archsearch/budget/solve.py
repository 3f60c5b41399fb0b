"""Pick widths so a model hits a parameter target.

Every family here is affine in its total MLP width at a fixed d_model, so the
solver tries the few head-dim multiples of d_model around the continuous
solution, and for each solves the total MLP width exactly (rounded to its
multiple). Of the candidates within tolerance it keeps the one whose mean MLP
width is closest to ``mlp_ratio * d_model``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from archsearch.arch.spec import ArchSpec
from archsearch.budget.count import count_params

MAX_D_MODEL = 1 << 16

SpecMaker = Callable[[int, int], ArchSpec]  # (d_model, total MLP width) -> spec


class BudgetError(ValueError):
    """No width reaches the target within tolerance; carries the closest value."""

    def __init__(self, message: str, *, closest: float | None = None, hint: str = ""):
        super().__init__(message)
        self.closest = closest
        self.hint = hint


@dataclass(frozen=True)
class Solution:
    spec: ArchSpec
    params: int
    match_error: float  # achieved / target - 1


def solve_params(*, target: float, make_spec: SpecMaker, num_layers: int, head_dim: int,
                 mlp_ratio: float, multiple_of: int, tolerance: float) -> Solution:
    """The spec nearest ``target`` non-embedding parameters; raises BudgetError."""
    min_width = num_layers * multiple_of

    def affine(d: int) -> tuple[float, float]:
        p1 = count_params(make_spec(d, min_width))
        p2 = count_params(make_spec(d, 2 * min_width))
        slope = (p2 - p1) / min_width
        return p1 - slope * min_width, slope

    def width_for(d: int) -> int:
        return max(min_width, round(mlp_ratio * d * num_layers / multiple_of) * multiple_of)

    smallest = count_params(make_spec(head_dim, min_width))
    if target < smallest:
        raise BudgetError(f"target {target:.4g} is below the smallest model ({smallest} params)",
                          closest=smallest, hint="raise the target, or lower num_layers or head_dim")
    lo, hi = 1, MAX_D_MODEL // head_dim
    if count_params(make_spec(hi * head_dim, width_for(hi * head_dim))) < target:
        raise BudgetError(f"target {target:.4g} needs d_model above {MAX_D_MODEL}",
                          hint="lower the target or raise num_layers")
    while lo < hi:  # largest k whose ratio-shaped model stays under target
        mid = (lo + hi + 1) // 2
        if count_params(make_spec(mid * head_dim, width_for(mid * head_dim))) <= target:
            lo = mid
        else:
            hi = mid - 1
    best, closest = None, None
    for k in range(max(1, lo - 2), lo + 4):
        d = k * head_dim
        base, slope = affine(d)
        width = max(min_width, round((target - base) / slope / multiple_of) * multiple_of)
        spec = make_spec(d, width)
        params = count_params(spec)
        error = params / target - 1
        if closest is None or abs(error) < abs(closest.match_error):
            closest = Solution(spec, params, error)
        if abs(error) <= tolerance:
            skew = abs(math.log(width / (num_layers * d * mlp_ratio)))
            if best is None or skew < best[0]:
                best = (skew, Solution(spec, params, error))
    if best is None:
        raise BudgetError(
            f"no width reaches target {target:.4g} within {tolerance:.2%}; closest is "
            f"{closest.params} ({closest.match_error:+.2%})", closest=closest.params,
            hint="lower multiple_of or head_dim, or raise budget.tolerance")
    return best[1]
