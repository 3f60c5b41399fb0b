"""A fit of many points does bounded work and says so: its starts race on a subsample, its
bootstrap resamples draw ``MAX_POINTS`` points (an m-out-of-n bootstrap), and its optimum is
still the full data's. ``MAX_POINTS`` is lowered here so the tables stay small."""

from __future__ import annotations

import numpy as np
import pytest

from archsearch import analysis
from archsearch.analysis import batched
from archsearch.analysis import fit as fit_module

from tests.test_fit_batched import planted

BOUND = 150


@pytest.fixture
def calls(monkeypatch):
    """Each batched minimise call's (fits, points)."""
    seen, minimise = [], batched.minimise

    def recorded(log_x, log_loss, theta, **kw):
        seen.append((len(theta), log_loss.shape[-1]))
        return minimise(log_x, log_loss, theta, **kw)

    monkeypatch.setattr(batched, "minimise", recorded)
    return seen


def many_points(count: int = 6 * BOUND):
    e, a, alpha = 1.7, 400.0, 0.34
    rng = np.random.default_rng(3)
    sizes = np.exp(rng.uniform(np.log(1e7), np.log(1e10), count))
    return sizes, (e + a * sizes**-alpha) * np.exp(0.01 * rng.standard_normal(count)), {"E": e, "A": a, "alpha": alpha}


def test_a_fit_of_many_points_works_on_bounded_samples_and_keeps_the_full_optimum(monkeypatch, calls):
    """Only the one refit of the best start sees every point; the estimates equal the unbounded
    fit's, the intervals keep their width within a third, cover the planted law, and a note says how."""
    sizes, loss, truth = many_points()
    full = analysis.fit_law({"N": sizes}, loss, "N", bootstrap=60, grid=False)
    assert not full.notes
    calls.clear()
    monkeypatch.setattr(fit_module, "MAX_POINTS", BOUND)
    bounded = analysis.fit_law({"N": sizes}, loss, "N", bootstrap=60, grid=False)
    assert all(points <= BOUND or fits == 1 for fits, points in calls), calls
    assert (60, BOUND) in calls and (1, len(loss)) in calls
    assert bounded.points == len(loss) and len(bounded.draws) == 60
    assert bounded.notes and f"{len(loss):,} points" in bounded.notes[0] and "m-out-of-n" in bounded.notes[0]
    for name, estimate in full.estimates.items():
        other = bounded.estimates[name]
        assert other.value == pytest.approx(estimate.value, rel=1e-6), name
        width, bounded_width = estimate.high - estimate.low, other.high - other.low
        assert bounded_width == pytest.approx(width, rel=1 / 3), name
        assert other.low <= truth[name] <= other.high, name


def test_a_table_of_big_arms_says_what_each_fit_does(monkeypatch, calls):
    """The progress line of an arm past the bound names the resample size; a small arm's does not."""
    monkeypatch.setattr(fit_module, "MAX_POINTS", BOUND)
    big, big_loss, _ = many_points(3 * BOUND)
    small, small_loss, _ = planted("chinchilla-like")
    table = {"arm": ["big"] * len(big) + ["small"] * len(small), "params": [*big, *small],
             "val_loss": [*big_loss, *small_loss]}
    told = []
    fits = analysis.fit_scaling(table, laws=("N",), by="arm", d_col=None, bootstrap=20, grid=False,
                                progress=told.append)
    assert told == [f"fitting L(N) to big (1 of 2): {3 * BOUND} points, 20 resamples of {BOUND} points, "
                    f"the starts searched on {BOUND}",
                    f"fitting L(N) to small (2 of 2): {len(small)} points, 20 resamples"]
    assert max(points for fits_, points in calls if fits_ > 1) <= BOUND
    assert fits.get("big", "N").notes and not fits.get("small", "N").notes
