"""When a scaling-law fit is not to be trusted, and why. Torch-free.

A fit can converge and still say little: a floor E run off to zero (the points show no floor),
an interval of zero width (every resample ran to the same bound) or one spanning many decades
(the data do not pin the constant), sizes too close together to tell an exponent from noise, or
points that scatter about the law more than the law bends over them. `cautions` names each
such sign with its likely reason; `fit`, its JSON and the report show them beside the fit.
"""

from __future__ import annotations

import math

import numpy as np

# thresholds, each a judgement: what follows a scaling study of a few sizes
FLOOR_TINY = 1e-3  # E below this share of the smallest loss: no floor to speak of (run toward zero)
DECADES = 3.0  # an interval of a constant wider than this many decades
SPREAD = 10.0  # each variable should span at least a factor of ten
SCATTER = 0.05  # log residuals' spread (about 5% of the loss) beside a law that bends less


def cautions(fit) -> list[str]:
    """The reasons not to trust ``fit`` (an ``analysis.laws.ScalingFit``), empty when none."""
    out = []
    estimates = fit.estimates
    for variable, (low, high) in fit.ranges.items():
        if low > 0 and high / low < SPREAD * (1 - 1e-9):
            out.append(f"{variable} spans only {high / low:.3g}x (too little spread to pin an exponent: "
                       f"{SPREAD:g}x or more)")
    if fit.points < 2 * len(fit.law.parameters):
        out.append(f"{fit.points} points for {len(fit.law.parameters)} constants (too few sizes)")
    floor = estimates.get("E")
    if floor is not None and floor.value < FLOOR_TINY * _smallest_loss(fit):
        out.append(f"E ran to zero ({floor.value:.3g}): these points show no floor")
    for name, estimate in estimates.items():
        if estimate.low is None or estimate.high is None:
            if len(fit.draws):
                out.append(f"{name}'s interval is unbounded (some resamples ran off without an optimum)")
            continue
        if estimate.low == estimate.high and len(fit.draws) > 1:
            out.append(f"{name}'s interval has zero width (every resample ran to the same bound)")
        elif name in ("alpha", "beta"):
            if estimate.high - estimate.low > 2 * max(abs(estimate.value), 0.1):
                out.append(f"{name}'s interval [{estimate.low:.3g}, {estimate.high:.3g}] is wider than twice the "
                           "exponent (the data do not pin it)")
        elif estimate.low > 0 and math.log10(estimate.high / estimate.low) > DECADES:
            out.append(f"{name}'s interval spans {math.log10(estimate.high / estimate.low):.0f} decades "
                       "(the data do not pin it)")
    scatter = float(np.std(fit.residuals)) if len(fit.residuals) else 0.0
    if scatter > SCATTER:
        out.append(f"the points scatter {scatter:.1%} about the law (noise)")
    return out


def _smallest_loss(fit) -> float:
    """The smallest loss the law predicts at the data's corner (the floor's scale)."""
    at = {variable: high for variable, (_, high) in fit.ranges.items()}
    try:
        return fit.predict(**at).loss.value
    except (ValueError, KeyError):
        return 1.0


__all__ = ["cautions"]
