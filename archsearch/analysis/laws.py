"""Scaling laws and what a fit of one gives back: the three laws (``N``, ``C``, ``ND``), an
estimate with its bootstrap interval, a prediction, the fitted law (``ScalingFit``) with its
bootstrap draws, and the compute multiplier between two L(C) fits. A law is held in log form,
theta = (e, log coefficients, exponents), and evaluated as a log-sum-exp (see ``fit``, which
finds theta). Torch-free, numpy only."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# The log of the largest float: exp of more overflows (see _exp).
LOG_MAX = float(np.log(np.finfo(float).max))


@dataclass(frozen=True, kw_only=True)
class Law:
    """One scaling law: its variables and the names of its parameters."""

    key: str
    name: str
    formula: str
    variables: tuple[str, ...]
    coefficients: tuple[str, ...]
    exponents: tuple[str, ...]

    @property
    def parameters(self) -> tuple[str, ...]:
        return ("E", *self.coefficients, *self.exponents)


LAWS = {
    "N": Law(key="N", name="L(N)", formula="E + A / N^alpha", variables=("N",), coefficients=("A",),
             exponents=("alpha",)),
    "C": Law(key="C", name="L(C)", formula="E + A / C^alpha", variables=("C",), coefficients=("A",),
             exponents=("alpha",)),
    "ND": Law(key="ND", name="L(N,D)", formula="E + A / N^alpha + B / D^beta", variables=("N", "D"),
              coefficients=("A", "B"), exponents=("alpha", "beta")),
}


def law_named(key: str) -> Law:
    """The law for ``N``, ``C`` or ``ND`` (case-insensitive)."""
    law = LAWS.get(key.strip().upper())
    if law is None:
        raise ValueError(f"unknown law '{key}'; choose from {', '.join(LAWS)}")
    return law


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """A value with its bootstrap interval (None without a bootstrap)."""

    value: float
    low: float | None = None
    high: float | None = None

    def to_dict(self) -> dict:
        return {"value": _finite(self.value), "low": _finite(self.low), "high": _finite(self.high)}


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """The law's loss at one point, with the confidence interval of the law
    (``loss``) and the prediction interval of a new observation there."""

    at: dict[str, float]
    loss: Estimate
    prediction_low: float | None
    prediction_high: float | None
    extrapolated: bool

    def to_dict(self) -> dict:
        return {"at": self.at, "loss": self.loss.to_dict(), "prediction_interval":
                [_finite(self.prediction_low), _finite(self.prediction_high)], "extrapolated": self.extrapolated}


@dataclass(frozen=True, kw_only=True, eq=False)
class ScalingFit:
    """One law fitted to one group of points.

    ``theta`` is the optimum in log form (e, log coefficients, exponents);
    ``draws`` [bootstrap, parameters] the bootstrap optima in the same form;
    ``residuals`` the log residuals of the full fit; ``ranges`` each
    variable's (min, max) in the data. ``converged``: the fit stopped at a
    minimum, by its stopping rule (the relative fall of the loss below
    ``FTOL``, or a gradient below ``GTOL``), or because no step along its
    search direction lowered the loss while the gradient was already at
    rounding level (``AT_REST``): L-BFGS-B reports that last case as an
    abnormal line search, which an ``FTOL`` of 1e-15 meets at many optima.
    """

    law: Law
    group: str
    points: int
    theta: np.ndarray
    draws: np.ndarray
    residuals: np.ndarray
    huber_loss: float
    level: float
    ranges: dict[str, tuple[float, float]]
    starts: int
    converged: bool
    notes: list[str] = field(default_factory=list)

    @property
    def estimates(self) -> dict[str, Estimate]:
        """E, A (B), alpha (beta) by name, each with its interval."""
        values = _natural(self.theta[None, :])[0]
        draws = _natural(self.draws) if len(self.draws) else None
        out = {}
        for i, name in enumerate(self.law.parameters):
            low, high = _interval(draws[:, i], self.level) if draws is not None else (None, None)
            out[name] = Estimate(value=float(values[i]), low=low, high=high)
        return out

    def predict(self, **at: float) -> Prediction:
        """The loss at ``at`` (N=..., D=... or C=...; for L(N,D), C with N gives D = C / 6N)."""
        at = _complete_point(self.law, at)
        log_x = np.log([[at[v]] for v in self.law.variables])  # [variables, 1]
        value = float(np.exp(_log_loss(self.theta, log_x))[0])
        extrapolated = any(not lo <= at[v] <= hi for v, (lo, hi) in self.ranges.items())
        if not len(self.draws):
            return Prediction(at=at, loss=Estimate(value=value), prediction_low=None, prediction_high=None,
                              extrapolated=extrapolated)
        log_draws = _log_loss_of_draws(self.draws, log_x)[:, 0]
        noise = np.random.default_rng(0).choice(self.residuals, size=len(log_draws))
        low, high = _interval(_exp(log_draws), self.level)
        prediction_low, prediction_high = _interval(_exp(log_draws + noise), self.level)
        return Prediction(at=at, loss=Estimate(value=value, low=low, high=high), prediction_low=prediction_low,
                          prediction_high=prediction_high, extrapolated=extrapolated)

    def band(self, points: Any) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """A one-variable law (L(N), L(C)) at each of ``points``: the loss and
        its confidence interval's low and high ends, [points] each (None
        without a bootstrap); what ``predict`` gives at each point, at once."""
        if len(self.law.variables) != 1:
            raise ValueError(f"{self.law.name} has {len(self.law.variables)} variables; predict it point by point")
        log_x = np.log(np.asarray(points, dtype=float))[None, :]  # [variables, points]
        value = np.exp(_log_loss(self.theta, log_x))
        if not len(self.draws):
            return value, None, None
        losses = np.nan_to_num(_exp(_log_loss_of_draws(self.draws, log_x)), nan=np.inf,
                               posinf=np.finfo(float).max)  # as in _interval
        low, high = np.quantile(losses, [(1 - self.level) / 2, (1 + self.level) / 2], axis=0)
        return value, low, high

    def to_dict(self) -> dict:
        return {"group": self.group, "law": self.law.name, "formula": self.law.formula, "points": self.points,
                "estimates": {k: v.to_dict() for k, v in self.estimates.items()}, "level": self.level,
                "bootstrap": len(self.draws), "huber_loss": self.huber_loss, "starts": self.starts,
                "converged": self.converged, "ranges": {k: list(v) for k, v in self.ranges.items()},
                "notes": self.notes, "cautions": self.cautions}

    @property
    def cautions(self) -> list[str]:
        """Why this fit is not to be trusted (``analysis.trust``); empty when nothing says so."""
        from archsearch.analysis.trust import cautions

        return cautions(self)


def compute_multiplier(baseline: ScalingFit, other: ScalingFit, compute: float) -> dict:
    """How many times ``compute`` the ``baseline`` family needs to reach the
    loss ``other`` reaches with ``compute``, from two L(C) fits; above 1 means
    ``other`` is more compute-efficient. The interval pairs bootstrap draws;
    None where the baseline never reaches that loss (below its E)."""
    for fit in (baseline, other):
        if fit.law.key != "C":
            raise ValueError(f"the compute multiplier needs L(C) fits, got {fit.law.name} for {fit.group}")

    def multiplier(base_theta: np.ndarray, other_theta: np.ndarray) -> float:
        # In logs up to the last step: a bootstrap draw's law can be far out
        # (a loss or a multiplier past the largest float), where exp overflows.
        log_target = float(_log_loss(other_theta, np.log([[compute]]))[0])
        e, log_a, alpha = base_theta
        if not alpha > 0 or e >= log_target:  # the baseline never gets down to that loss
            return np.inf
        if log_target > LOG_MAX:  # a loss past every float: the baseline is below it with any compute
            return 0.0
        gap = np.exp(log_target) - np.exp(e)
        exponent = (log_a - np.log(gap)) / alpha if gap > 0 else np.inf
        return float(np.exp(exponent) / compute) if exponent <= LOG_MAX else np.inf

    value = multiplier(baseline.theta, other.theta)
    count = min(len(baseline.draws), len(other.draws))
    low = high = None
    if count:
        draws = np.array([multiplier(b, o) for b, o in zip(baseline.draws[:count], other.draws[:count])])
        low, high = _interval(draws, min(baseline.level, other.level))
    return {"baseline": baseline.group, "other": other.group, "compute": compute,
            "multiplier": Estimate(value=value, low=low, high=high).to_dict(),
            "meaning": f"{baseline.group} needs this many times the compute to reach the loss {other.group} "
                       "reaches with it (above 1: the other is more compute-efficient)"}


def _log_loss(theta: np.ndarray, log_x: np.ndarray) -> np.ndarray:
    k = log_x.shape[0]
    terms = np.vstack([np.full((1, log_x.shape[1]), theta[0]), theta[1:1 + k, None] - theta[1 + k:, None] * log_x])
    top = terms.max(axis=0)
    return top + np.log(np.exp(terms - top).sum(axis=0))


def _log_loss_of_draws(thetas: np.ndarray, log_x: np.ndarray) -> np.ndarray:
    """``_log_loss`` of each row of ``thetas`` [draws, parameters] at ``log_x`` [variables, points]: [draws, points]."""
    k = log_x.shape[0]
    terms = np.concatenate([np.broadcast_to(thetas[:, None, :1], (len(thetas), log_x.shape[1], 1)),
                            (thetas[:, None, 1:1 + k] - thetas[:, None, 1 + k:] * log_x.T[None])], axis=2)
    top = terms.max(axis=2)  # [draws, points]; terms [draws, points, terms]
    return top + np.log(np.exp(terms - top[..., None]).sum(axis=2))


def _natural(thetas: np.ndarray) -> np.ndarray:
    """Log form (e, log coefficients, exponents) -> (E, coefficients, exponents)."""
    k = (thetas.shape[1] - 1) // 2
    out = thetas.copy()
    out[:, :1 + k] = _exp(thetas[:, :1 + k])
    return out


def _exp(x: Any) -> np.ndarray:
    """exp, the largest float where it would overflow to inf (with numpy's
    warning). A bootstrap resample that leaves a variable too few distinct
    values has no finite optimum, and its fit walks far along the free
    direction (a log coefficient above 709); intervals already read inf as
    the largest float and estimates that large as unbounded (``_interval``,
    ``_finite``), so no result changes, and below the cap this is exp."""
    x = np.asarray(x, dtype=float)
    return np.where(x > LOG_MAX, np.finfo(float).max, np.exp(np.minimum(x, LOG_MAX)))


def _interval(draws: np.ndarray, level: float) -> tuple[float, float]:
    # Unreachable multipliers are infinite; cap them so interpolation stays finite, then report None.
    # An end whose quantile falls between a finite draw and a capped one is unbounded too (it
    # would otherwise interpolate to some 1e306, a number that means nothing).
    cap = np.finfo(float).max
    draws = np.nan_to_num(np.asarray(draws, dtype=float), nan=np.inf, posinf=cap, neginf=-cap)
    ends = []
    for q in ((1 - level) / 2, (1 + level) / 2):
        below, above = np.quantile(draws, q, method="lower"), np.quantile(draws, q, method="higher")
        capped = next((x for x in (below, above) if abs(x) == cap), None)
        ends.append(float(capped) if capped is not None else float(np.quantile(draws, q)))
    return ends[0], ends[1]


def _finite(value: float | None) -> float | None:
    return None if value is None or not np.isfinite(value) or abs(value) >= np.finfo(float).max / 2 else value


def _complete_point(law: Law, at: dict[str, float]) -> dict[str, float]:
    at = {k: float(v) for k, v in at.items()}
    if law.key == "ND" and "D" not in at and {"N", "C"} <= set(at):
        at["D"] = at["C"] / (6 * at["N"])
    missing = [v for v in law.variables if v not in at]
    if missing:
        raise ValueError(f"{law.name} needs {', '.join(missing)} to predict (give e.g. "
                         f"{', '.join(f'{v}=1e9' for v in law.variables)})")
    bad = [f"{v}={at[v]:g}" for v in law.variables if not (at[v] > 0 and math.isfinite(at[v]))]
    if bad:
        raise ValueError(f"{law.name}: {', '.join(bad)}: must be positive and finite")
    return at
