"""Fitting a scaling law with bootstrap intervals: the objective, the starts, L-BFGS and the
batched solver. Torch-free; scipy is imported when a fit runs. The laws and the fitted
result (``ScalingFit``, its estimates and predictions) are in ``laws``.

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

import functools
import itertools
import math
import sys
from contextlib import contextmanager
from typing import Any

import numpy as np

from archsearch.analysis.laws import Law, ScalingFit, _log_loss, law_named

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
SOLVERS = ("auto", "lbfgs")
# Past this many points a batched fit bounds its work, which otherwise grows with points x starts x
# resamples (a 20,000-point arm took minutes a law): the starts race on an even subsample of this
# many points and only the best goes on to the full data, and each bootstrap resample draws this
# many points rather than all of them, its deviation from the optimum scaled by sqrt(m / n) (the
# m-out-of-n bootstrap, Bickel, Goetze & van Zwet 1997, valid for an estimator that is
# asymptotically normal, as this smooth M-estimator is). Fewer points fit exactly as before.
MAX_POINTS = 2_000


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
