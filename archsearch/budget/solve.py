"""Pick widths so a model hits its target on the budget's measure.

Most families are affine in their total MLP width at a fixed d_model (in
parameters and in FLOPs), so the solver tries the few head-dim multiples of
d_model around the continuous solution and, for each, steps the total MLP
width (a multiple of ``multiple_of``) along the measure's line to the target.
Every step is checked on the exact measure of the rounded spec, and where that
is not on the line (a tapered HRM's FLOPs) the neighbouring widths are walked
to the nearest (widening the search over d_model when none fits). Of the
candidates whose exact value is within tolerance it keeps, for
``solve_for="d_model"``, the one whose mean MLP width is closest to
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
    """The spec whose ``measure`` is nearest ``target``; raises BudgetError.

    Every error here is the exact measure of the rounded spec: the affine line
    only proposes widths, and where the measure is not affine in the total
    width (HRM's FLOPs weight the wider, tapered fast layers T times) the
    width is refined on the exact measure before it is judged.
    """
    min_width = num_layers * multiple_of
    exact_at: dict[tuple[int, int], float] = {}

    def exact(d: int, width: int) -> float:
        if (d, width) not in exact_at:
            exact_at[d, width] = measure(make_spec(d, width))
        return exact_at[d, width]

    def width_for(d: int) -> int:
        return max(min_width, round(mlp_ratio * d * num_layers / multiple_of) * multiple_of)

    def slope(d: int) -> float:
        """The measure's slope in total width at d, over a span above the MLP-ratio width (not at the
        smallest widths, where every layer holds one multiple and a taper is flattened)."""
        low = width_for(d)
        high = low + max(min_width, round(low / 2 / multiple_of) * multiple_of)
        return (exact(d, high) - exact(d, low)) / (high - low)

    smallest = exact(d_model or head_dim, min_width)
    if target < smallest:
        raise BudgetError(f"target {target:.4g} is below the smallest model ({smallest:.4g})", closest=smallest,
                          hint="raise the target, or lower num_layers or head_dim")
    if solve_for == "mlp":
        if d_model is None:
            raise BudgetError("solve_for: mlp needs a fixed width", hint="set model.d_model in the space")
        candidates = [d_model]
    else:
        candidates = _d_candidates(target, lambda d: exact(d, width_for(d)), head_dim)
    best: tuple[float, int, int] | None = None
    closest: tuple[float, int, int] | None = None
    # the near widths first; further ones, nearest first, only while none of them fits
    further = [] if solve_for == "mlp" else _further(candidates, head_dim)
    for d in candidates + further:
        if best is not None and d in further:
            break
        width = _nearest_width(target, lambda w, d=d: exact(d, w), start=width_for(d), slope=slope(d),
                               min_width=min_width, step=multiple_of)
        error = exact(d, width) / target - 1
        if closest is None or abs(error) < abs(closest[0]):
            closest = (error, d, width)
        if abs(error) <= tolerance:
            rank = abs(math.log(width / (num_layers * d * mlp_ratio))) if solve_for == "d_model" else abs(error)
            if best is None or rank < best[0]:
                best = (rank, d, width)
    if best is not None:
        _, d, width = best
        return Solution(make_spec(d, width), exact(d, width), exact(d, width) / target - 1)
    error, d, width = closest
    achieved = exact(d, width)
    raise BudgetError(f"no width reaches target {target:.4g} within {tolerance:.2%}; closest is "
                      f"{achieved:.6g} ({error:+.2%})", closest=achieved,
                      hint="lower multiple_of or head_dim, or raise budget.tolerance")


def _nearest_width(target: float, value: Callable[[int], float], *, start: int, slope: float, min_width: int,
                   step: int) -> int:
    """The total width (a multiple of ``step``, at least ``min_width``) whose exact ``value`` is nearest
    ``target``, for a measure that grows with width.

    Secant steps from ``start`` on the exact values; where the last step's
    value is not what the line foretold (the measure is not affine there),
    neighbouring widths are walked until neither is nearer.
    """
    if slope <= 0:  # the measure does not depend on MLP width (state): keep the MLP ratio
        return start
    width, current = start, value(start)
    affine = True
    for _ in range(16):
        move = round((target - current) / slope / step) * step
        nxt = max(min_width, width + move)
        if nxt == width:
            break
        foretold, now = current + slope * (nxt - width), value(nxt)
        affine = math.isclose(now, foretold, rel_tol=1e-9)
        secant = (now - current) / (nxt - width)
        if secant > 0:  # the local slope, kept from collapsing on a flat rounding step
            slope = max(slope / 4, secant)
        width, current = nxt, now
    if affine:
        return width
    while True:
        around = [w for w in (width - step, width + step) if w >= min_width]
        nearer = min(around, key=lambda w: abs(value(w) - target), default=width)
        if abs(value(nearer) - target) >= abs(current - target):
            return width
        width, current = nearer, value(nearer)


def _further(near: list[int], head_dim: int, rings: int = 6) -> list[int]:
    """Head-dim multiples beyond ``near``, alternately below and above, for targets whose width
    steps are coarse (one layer, a large multiple_of) so no near d_model lands within tolerance."""
    low, high = near[0] // head_dim, near[-1] // head_dim
    out = []
    for ring in range(1, rings + 1):
        if low - ring >= 1:
            out.append((low - ring) * head_dim)
        if (high + ring) * head_dim <= MAX_D_MODEL:
            out.append((high + ring) * head_dim)
    return out


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
