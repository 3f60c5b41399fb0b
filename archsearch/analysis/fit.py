"""Scaling-law fits with bootstrap intervals. Torch-free; scipy is imported when a fit runs.

Three laws, each a sum of power laws above an irreducible loss E:

- ``N``:  L(N)    = E + A / N^alpha                    (N: non-embedding parameters)
- ``C``:  L(C)    = E + A / C^alpha                    (C: training FLOPs)
- ``ND``: L(N, D) = E + A / N^alpha + B / D^beta       (D: training tokens)

They are fitted as Hoffmann et al. (2022, https://arxiv.org/abs/2203.15556,
appendix D.2) did, and as Besiroglu et al. (2024,
https://arxiv.org/abs/2404.10102) redid at tolerances that converge: in logs,
log L = LSE(e, a - alpha log N, b - beta log D) with E = exp(e), A = exp(a),
B = exp(b); a Huber loss (delta 1e-3) between that and the log of the observed
loss, summed over points; L-BFGS from every point of a grid of starts, keeping
the best. The tolerances are tight on purpose: the summed Huber loss is about
1e-3, and scipy's default gradient tolerance (1e-5) stops such a fit early
(Besiroglu et al. trace Hoffmann et al.'s implausibly narrow intervals to this).

Intervals come from a pairs bootstrap: resample the points, refit from the
full-data optimum (at the same tolerances), and take percentiles of every
parameter, of predicted losses (confidence interval of the law) and of
predicted losses plus a resampled log residual (prediction interval).

The one-term laws take every start and every resample at once
(``batched.minimise``: the same objective, Newton steps over arrays, the same
ftol stopping rule) and, without the grid, start from a scan over alpha
(``batched.profile_starts``); together some 40x faster than L-BFGS from the
grid on the dashboard's fits (docs/performance.md), which lets it draw its
bands as it opens. L(N, D) goes through the same batch (five parameters),
started from a scan over (alpha, beta) (``batched.profile_starts_2d``)
instead of the 4,500 grid starts: on Chinchilla's points 0.3 s of CPU with
200 resamples against 28 s for L-BFGS from the grid, the estimates and
interval ends equal to 1e-8 (``benchmarks/bench_fit.py``). ``solver="lbfgs"``
is the reference the batch is tested against.
"""

from __future__ import annotations

import math

import functools
import itertools
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

HUBER_DELTA = 1e-3
# The grid of starts of Hoffmann et al. as Besiroglu et al. describe it:
# 5 x 6 x 6 x 5 x 5 = 4,500 starts for L(N, D), 150 for one-term laws.
GRID_LOG_E = (-1.0, -0.5, 0.0, 0.5, 1.0)
GRID_LOG_COEFFICIENT = (0.0, 5.0, 10.0, 15.0, 20.0, 25.0)
GRID_EXPONENT = (0.0, 0.5, 1.0, 1.5, 2.0)
# L-BFGS-B stopping rules: relative change of the objective and largest
# projected gradient component. See the module docstring for why so tight.
FTOL, GTOL, MAX_ITER = 1e-15, 1e-12, 10_000
# A gradient this small (largest component) is at rounding level for these objectives: a fit
# whose line search finds no lower point there has converged (``ScalingFit.converged``).
AT_REST = 1e-6
# The log of the largest float: exp of more overflows (see _exp).
LOG_MAX = float(np.log(np.finfo(float).max))
SOLVERS = ("auto", "lbfgs")
# Past this many points a batched fit bounds its work, which otherwise grows with points x starts x
# resamples (a 20,000-point arm took minutes a law): the starts race on an even subsample of this
# many points and only the best goes on to the full data, and each bootstrap resample draws this
# many points rather than all of them, its deviation from the optimum scaled by sqrt(m / n) (the
# m-out-of-n bootstrap, Bickel, Goetze & van Zwet 1997, valid for an estimator that is
# asymptotically normal, as this smooth M-estimator is). Fewer points fit exactly as before.
MAX_POINTS = 2_000


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


def fit_law(variables: dict[str, Any], loss: Any, law: str | Law = "ND", *, group: str = "all",
            bootstrap: int = 200, level: float = 0.95, seed: int = 0, grid: bool = True,
            solver: str = "auto") -> ScalingFit:
    """Fit ``law`` to positive ``variables`` (``{"N": ..., "D": ...}``) and ``loss`` (1-D arrays).

    ``grid=False`` starts once instead of from every grid point: L(N, D)
    from the middle of the grid (for quick looks; the published numbers need
    the grid), a one-term law from a scan over its exponent (``batched.
    profile_starts``, which finds the grid's optimum at a fraction of the cost).
    ``solver``: ``auto`` fits every law with every start and every bootstrap
    resample at once (``batched``: the same objective and stopping rule,
    L-BFGS finishing any fit it leaves unconverged), L(N, D) from its scan
    over (alpha, beta), grid or not; ``lbfgs`` fits every law with L-BFGS,
    one fit at a time, from the grid or the one start above.
    Raises a one-line ValueError when there are too few points or a variable
    does not vary enough to identify the law.
    """
    law = law_named(law) if isinstance(law, str) else law
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver '{solver}'; choose from {', '.join(SOLVERS)}")
    loss = np.asarray(loss, dtype=float)
    log_x = np.log(np.stack([np.asarray(variables[v], dtype=float) for v in law.variables]))
    _check_identifiable(law, group, log_x, loss)
    log_loss = np.log(loss)
    at_once = solver == "auto"
    points = len(loss)
    drawn = bounded_points(points) if at_once else points
    # the starts' search runs on an even subsample across the first variable's range
    subsample = np.argsort(log_x[0], kind="stable")[np.linspace(0, points - 1, drawn).round().astype(int)]
    starts = _starts(law, log_x[:, subsample], log_loss[subsample], grid=grid, at_once=at_once)
    rng = np.random.default_rng(seed)
    samples = np.array([rng.integers(0, points, drawn) for _ in range(bootstrap)], dtype=int)
    with _one_blas_thread(scipy=not at_once):
        if at_once:
            theta, value, converged, draws = _fits_batched(log_x, log_loss, starts, samples.reshape(bootstrap, drawn),
                                                           subsample)
        else:
            theta, value, converged, draws = _fits_lbfgs(log_x, log_loss, starts, samples.reshape(bootstrap, drawn))
    notes = []
    if drawn < points:
        draws = theta + math.sqrt(drawn / points) * (draws - theta)
        notes.append(f"{points:,} points: the starts searched on {drawn:,} of them, and each of the {bootstrap} "
                     f"resamples drew {drawn:,}, its spread scaled by sqrt({drawn:,} / {points:,}) "
                     "(an m-out-of-n bootstrap), to bound the work")
    residuals = log_loss - _log_loss(theta, log_x)
    ranges = {v: (float(np.exp(row.min())), float(np.exp(row.max()))) for v, row in zip(law.variables, log_x)}
    return ScalingFit(law=law, group=group, points=len(loss), theta=theta, draws=draws, residuals=residuals,
                      huber_loss=value, level=level, ranges=ranges, starts=len(starts), converged=converged,
                      notes=notes)


def bounded_points(points: int) -> int:
    """How many points a batched fit of ``points`` searches its starts on and draws per resample."""
    return min(points, MAX_POINTS)


def _fits_lbfgs(log_x: np.ndarray, log_loss: np.ndarray, starts: np.ndarray, samples: np.ndarray):
    """The best of L-BFGS from each start, and L-BFGS from it on each resample
    (rows of point indices): (theta, its loss, converged, draws [resamples, parameters])."""
    best = min((_minimise(_HuberObjective(log_x, log_loss), start) for start in starts), key=lambda r: r.fun)
    draws = np.array([_minimise(_HuberObjective(log_x[:, rows], log_loss[rows]), best.x).x for rows in samples])
    return best.x, float(best.fun), _converged(best), draws.reshape(len(samples), len(best.x))


def _fits_batched(log_x: np.ndarray, log_loss: np.ndarray, starts: np.ndarray, samples: np.ndarray,
                  subsample: np.ndarray):
    """What ``_fits_lbfgs`` returns: every start at once on the points ``subsample``
    indexes, the best of them on every point, then every resample at once;
    L-BFGS finishes the fits left unconverged."""
    from archsearch.analysis import batched

    def minimise(log_x_KP, log_loss_P, thetas):
        return batched.minimise(np.broadcast_to(log_x_KP, (len(thetas), *log_x_KP.shape)),
                                np.broadcast_to(log_loss_P, (len(thetas), log_loss_P.size)), thetas,
                                delta=HUBER_DELTA, ftol=FTOL)

    log_x_KP = log_x
    sub_x, sub_loss = log_x[:, subsample], log_loss[subsample]
    theta, value, converged = _best_start(sub_x, sub_loss, *minimise(sub_x, sub_loss, starts))
    if len(subsample) < log_loss.size:
        theta, value, converged = _best_start(log_x, log_loss, *minimise(log_x, log_loss, theta[None, :].copy()))
    draws, _, done = batched.minimise(log_x_KP[:, samples].transpose(1, 0, 2), log_loss[samples],
                                      np.tile(theta, (len(samples), 1)), delta=HUBER_DELTA, ftol=FTOL)
    if not done.all():
        with _one_blas_thread(scipy=True):
            for i in np.flatnonzero(~done):
                rows = samples[i]
                draws[i] = _minimise(_HuberObjective(log_x[:, rows], log_loss[rows]), draws[i]).x
    return theta, value, converged, draws


def _best_start(log_x: np.ndarray, log_loss: np.ndarray, thetas: np.ndarray, values: np.ndarray,
                done: np.ndarray) -> tuple[np.ndarray, float, bool]:
    """The best of the batched starts: L-BFGS finishes every unconverged start
    already below the best converged one (it could only go lower), and the lowest wins."""
    best_done = values[done].min() if done.any() else np.inf
    unfinished = np.flatnonzero(~done & (values < best_done))
    if len(unfinished):
        with _one_blas_thread(scipy=True):
            for i in unfinished:
                result = _minimise(_HuberObjective(log_x, log_loss), thetas[i])
                thetas[i], values[i], done[i] = result.x, result.fun, _converged(result)
    best = int(np.argmin(values))
    return thetas[best], float(values[best]), bool(done[best])


@contextmanager
def _one_blas_thread(*, scipy: bool):
    """BLAS on one thread: the fits work on 3x3 to 5x5 matrices, where a threaded
    BLAS only spins (30x slower on a busy machine). ``scipy``: load scipy first
    (a second of imports the batched fits do without), since the limit applies
    to the libraries loaded when it is set."""
    if scipy:
        import scipy.optimize  # noqa: F401
    with _blas_libraries("scipy.optimize" in sys.modules).limit(limits=1, user_api="blas"):
        yield


@functools.cache
def _blas_libraries(scipy_loaded: bool):
    """The loaded BLAS libraries, found once (a search of the process's shared
    libraries, 15 ms a fit on a busy machine otherwise); again once scipy has brought its own."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


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


class _HuberObjective:
    """Summed Huber loss between the law's log loss and the observed log loss, with its gradient."""

    def __init__(self, log_x: np.ndarray, log_loss: np.ndarray, delta: float = HUBER_DELTA):
        self.log_x, self.y, self.delta = log_x, log_loss, delta
        self.k = log_x.shape[0]

    def __call__(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        k = self.k
        terms = np.empty((k + 1, self.y.size))  # [terms, points]: e, then a_i - alpha_i log x_i
        terms[0] = theta[0]
        terms[1:] = theta[1:1 + k, None] - theta[1 + k:, None] * self.log_x
        top = terms.max(axis=0)
        weights = np.exp(terms - top)
        total = weights.sum(axis=0)
        residual = top + np.log(total) - self.y
        # Huber's slope is the residual clipped to +-delta, and with it the loss is
        # slope * (residual - slope / 2): r^2 / 2 inside, delta (|r| - delta / 2) outside.
        slope = np.clip(residual, -self.delta, self.delta)
        value = slope @ (residual - 0.5 * slope)
        weights /= total  # softmax: d LSE / d term
        grad = np.empty(1 + 2 * k)
        grad[:1 + k] = weights @ slope
        grad[1 + k:] = -(weights[1:] * self.log_x) @ slope
        return float(value), grad


def _minimise(objective: _HuberObjective, start: np.ndarray):
    from scipy.optimize import minimize

    return minimize(objective, np.asarray(start, dtype=float), jac=True, method="L-BFGS-B",
                    options={"ftol": FTOL, "gtol": GTOL, "maxiter": MAX_ITER, "maxfun": 2 * MAX_ITER})


def _converged(result) -> bool:
    """Whether L-BFGS-B stopped at a minimum: its own tests met, or its line search found no
    lower point (status 2) with the gradient at rounding level."""
    return bool(result.success) or (result.status == 2 and float(np.abs(result.jac).max()) <= AT_REST)


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


def _grid(law: Law):
    k = len(law.variables)
    for e, *rest in itertools.product(GRID_LOG_E, *[GRID_LOG_COEFFICIENT] * k, *[GRID_EXPONENT] * k):
        yield np.array([e, *rest])


def _starts(law: Law, log_x: np.ndarray, log_loss: np.ndarray, *, grid: bool, at_once: bool) -> np.ndarray:
    """Where the fits start [starts, parameters]: the grid (``grid``), else a
    one-term law's profile scan (the middle of the grid where it finds none),
    else L(N, D) from the middle of the grid. L(N, D) fitted at once starts,
    grid or not, from its profile scan over (alpha, beta) and the middle of the
    grid: the 4,500 grid starts would cost the batch some 20 s, and on the
    data the tests fit the scan lands on the grid's optimum."""
    if law.key == "ND" and at_once:
        from archsearch.analysis import batched

        return np.vstack([batched.profile_starts_2d(log_x, log_loss, delta=HUBER_DELTA), _grid_middle(law)])
    if grid:
        return np.array(list(_grid(law)))
    if len(law.variables) == 1:
        from archsearch.analysis import batched

        starts = batched.profile_starts(log_x[0], log_loss, delta=HUBER_DELTA)
        if len(starts):
            return starts
    return _grid_middle(law)[None, :]


def _grid_middle(law: Law) -> np.ndarray:
    k = len(law.variables)
    return np.array([0.0, *[10.0] * k, *[0.5] * k])


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


def _check_identifiable(law: Law, group: str, log_x: np.ndarray, loss: np.ndarray) -> None:
    where = f"{law.name} for {group}"
    need = len(law.parameters) + 1
    if loss.size < need:
        raise ValueError(f"{where}: {loss.size} points, need at least {need} ({len(law.parameters)} parameters)")
    if not (np.isfinite(log_x).all() and np.isfinite(loss).all() and (loss > 0).all()):
        raise ValueError(f"{where}: values must be positive and finite")
    for name, row in zip(law.variables, log_x):
        distinct = np.unique(row).size
        if distinct < 3:
            raise ValueError(f"{where}: {name} takes {distinct} distinct value{'s' * (distinct != 1)}; "
                             "the law needs at least 3")
    design = np.vstack([np.ones(loss.size), log_x])
    if np.linalg.matrix_rank(design.T) < design.shape[0]:
        raise ValueError(f"{where}: the variables move together ({' and '.join(law.variables)} in a fixed "
                         "ratio), so their exponents cannot be told apart")
