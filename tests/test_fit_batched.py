"""The one-term laws' fast path (``analysis.batched``) gives the fits L-BFGS gives.

Every comparison is against ``solver="lbfgs"`` from the full grid of starts,
the procedure ``fit.py`` describes, on the same points and resamples.
Planted mutations these fail on: stopping each batched fit after a fixed
loose decrease (``done = old - new <= 1e-6``), fitting a different Huber
delta, a profile scan that keeps only its first exponent, and a bootstrap
that sends every resample to L-BFGS.
"""

from __future__ import annotations

import numpy as np
import pytest

from archsearch import analysis
from archsearch.analysis import batched
from archsearch.analysis import fit as fit_module

# (E, A, alpha, noise, points, sizes from, sizes to): L(N) = E + A / N^alpha with multiplicative noise
PLANTED = {
    "chinchilla-like": (1.7, 400.0, 0.34, 0.005, 30, 1e7, 1e10),
    "small-models": (2.0, 3.0, 0.30, 0.003, 60, 1e3, 1e6),
    "steep": (1.2, 2e3, 0.8, 0.01, 20, 1e5, 1e8),
    # a shallow exponent over sizes wide enough that every resample keeps a floor: where E has
    # none, the fits run down a flat ridge whose end depends on the BLAS's last bits (the
    # no-floor test below compares those by the law they draw)
    "shallow": (2.0, 5.0, 0.05, 0.003, 40, 1e3, 1e10),
}


def planted(name: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray, dict]:
    e, a, alpha, noise, count, low, high = PLANTED[name]
    rng = np.random.default_rng(seed)
    sizes = np.exp(rng.uniform(np.log(low), np.log(high), count))
    loss = (e + a * sizes**-alpha) * np.exp(noise * rng.standard_normal(count))
    return sizes, loss, {"E": e, "A": a, "alpha": alpha}


def _agree(fast, slow, rel: float) -> None:
    """Estimates and interval ends equal to ``rel`` of each estimate's value (an
    interval end near zero, E on a resample without a floor, is compared at that scale)."""
    for name, estimate in slow.estimates.items():
        other = fast.estimates[name]
        for part in ("value", "low", "high"):
            assert getattr(other, part) == pytest.approx(getattr(estimate, part), rel=rel,
                                                         abs=rel * abs(estimate.value)), (name, part)


@pytest.mark.parametrize("name", list(PLANTED))
def test_the_fast_fit_equals_lbfgs_from_the_grid(name):
    """The dashboard's fit (a scan over alpha, batched Newton, batched
    bootstrap) and the batched grid each equal L-BFGS from all 150 starts:
    estimates and interval ends to 1e-5, the optimum's loss to rounding,
    and every bootstrap refit as low as L-BFGS's on its resample."""
    sizes, loss, _ = planted(name)
    slow = analysis.fit_law({"N": sizes}, loss, "N", bootstrap=30, solver="lbfgs")
    for fast in (analysis.fit_law({"N": sizes}, loss, "N", bootstrap=30, grid=False),
                 analysis.fit_law({"N": sizes}, loss, "N", bootstrap=30)):
        assert fast.converged and fast.huber_loss == pytest.approx(slow.huber_loss, rel=1e-9)
        _agree(fast, slow, rel=1e-5)
        rows = np.array([np.random.default_rng(0).integers(0, len(loss), len(loss))])  # the first resample
        log_x, log_loss = np.log(sizes)[rows], np.log(loss)[rows]
        ours = batched.huber_loss(fast.draws[:1], log_x, log_loss, fit_module.HUBER_DELTA)
        theirs = batched.huber_loss(slow.draws[:1], log_x, log_loss, fit_module.HUBER_DELTA)
        assert ours <= theirs + 1e-12


def test_the_batched_loss_is_the_lbfgs_objective():
    sizes, loss, _ = planted("steep")
    objective = fit_module._HuberObjective(np.log(sizes)[None], np.log(loss))
    thetas = np.array([[0.2, 7.0, 0.8], [0.5, 3.0, 0.4], [-1.0, 10.0, 1.5]])
    ours = batched.huber_loss(thetas, np.tile(np.log(sizes), (3, 1)), np.tile(np.log(loss), (3, 1)),
                              fit_module.HUBER_DELTA)
    assert ours == pytest.approx([objective(theta)[0] for theta in thetas], rel=1e-12)


@pytest.mark.parametrize("name", ["chinchilla-like", "small-models"])
def test_the_fast_intervals_cover_the_planted_law(name):
    """95% intervals over 20 noise draws: most cover each planted parameter
    (a bootstrap that barely moved from its start would cover few)."""
    covered = []
    for seed in range(20):
        sizes, loss, truth = planted(name, seed=seed)
        fit = analysis.fit_law({"N": sizes}, loss, "N", bootstrap=100, grid=False)
        covered += [fit.estimates[p].low <= value <= fit.estimates[p].high for p, value in truth.items()]
    assert np.mean(covered) >= 0.8


def test_a_law_without_a_floor_is_fitted_as_lbfgs_fits_it():
    """Planted E = 0: E runs off towards zero along a flat ridge, where the
    two solvers stop at different tiny E; the law they draw is the same."""
    rng = np.random.default_rng(2)
    sizes = np.exp(rng.uniform(np.log(1e6), np.log(1e10), 30))
    loss = 50.0 * sizes**-0.1 * np.exp(0.01 * rng.standard_normal(30))
    slow = analysis.fit_law({"N": sizes}, loss, "N", bootstrap=30, solver="lbfgs")
    fast = analysis.fit_law({"N": sizes}, loss, "N", bootstrap=30, grid=False)
    assert fast.huber_loss == pytest.approx(slow.huber_loss, rel=1e-6)
    for size in (1e6, 1e8, 1e10, 1e11):
        a, b = slow.predict(N=size), fast.predict(N=size)
        assert b.loss.value == pytest.approx(a.loss.value, rel=1e-6)
        assert b.loss.low == pytest.approx(a.loss.low, rel=1e-3) and b.loss.high == pytest.approx(a.loss.high, rel=1e-3)


def test_a_bootstrap_of_many_resamples_calls_lbfgs_a_bounded_number_of_times(monkeypatch):
    """The point of the fast path: 200 resamples do not become 200 L-BFGS runs
    (only resamples the batch leaves unconverged go to L-BFGS; here none)."""
    calls = []
    minimise = fit_module._minimise
    monkeypatch.setattr(fit_module, "_minimise", lambda *args: calls.append(1) or minimise(*args))
    sizes, loss, _ = planted("small-models")
    fit = analysis.fit_law({"N": sizes}, loss, "N", bootstrap=200, grid=False)
    assert len(fit.draws) == 200 and len(calls) <= 5
    calls.clear()
    analysis.fit_law({"N": sizes}, loss, "N", bootstrap=20, grid=False, solver="lbfgs")
    assert len(calls) == 21  # the slow path, for contrast: one run per start and per resample


def test_unconverged_batched_fits_are_finished_by_lbfgs(monkeypatch):
    """With the batch cut to one step, L-BFGS finishes every fit and the result is unchanged."""
    sizes, loss, _ = planted("chinchilla-like")
    full = analysis.fit_law({"N": sizes}, loss, "N", bootstrap=20, grid=False)
    monkeypatch.setattr(batched, "MAX_STEPS", 1)
    cut = analysis.fit_law({"N": sizes}, loss, "N", bootstrap=20, grid=False)
    assert cut.converged
    _agree(cut, full, rel=1e-5)


def test_the_band_is_predict_at_every_point():
    """``band`` (what the dashboard draws) gives ``predict``'s loss and interval at each point."""
    sizes, loss, _ = planted("small-models")
    fit = analysis.fit_law({"N": sizes}, loss, "N", bootstrap=50, grid=False)
    points = np.geomspace(1e2, 1e7, 7)
    value, low, high = fit.band(points)
    for i, size in enumerate(points):
        one = fit.predict(N=size).loss
        assert (value[i], low[i], high[i]) == pytest.approx((one.value, one.low, one.high), rel=1e-12)
    assert np.all(low < value) and np.all(value < high)
    bare = analysis.fit_law({"N": sizes}, loss, "N", bootstrap=0, grid=False)
    assert bare.band(points)[1] is None


def test_an_unknown_solver_is_one_line():
    sizes, loss, _ = planted("steep")
    with pytest.raises(ValueError, match="unknown solver 'newton'; choose from auto, lbfgs"):
        analysis.fit_law({"N": sizes}, loss, "N", solver="newton")
