"""The analysis commands print their results and nothing else: no numpy
RuntimeWarning from a bootstrap draw whose fit ran far out (a log coefficient
past 709, where exp overflows). Every check runs with warnings as errors;
before ``fit._exp`` the L(N, D) and multiplier cases raised
``RuntimeWarning: overflow encountered in exp``."""

from __future__ import annotations

import dataclasses

import duckdb
import numpy as np
import pytest
from typer.testing import CliRunner

from archsearch.analysis import fit as F
from archsearch.analysis import laws
from archsearch.cli import app
from tests.analysis_support import write_store

pytestmark = pytest.mark.filterwarnings("error")

N = np.geomspace(2e5, 2e7, 6)


def tokens_and_loss(seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Six points whose loss follows L(N) alone, with tokens spread 0.5x to 2x
    of 20 per parameter: some resamples leave D without a trend, so B runs away."""
    rng = np.random.default_rng(seed)
    tokens = 20 * N * rng.uniform(0.5, 2, N.size)
    return tokens, (1.5 + 40 * N**-0.3) * (1 + 0.01 * rng.standard_normal(N.size))


def runaway_fit():
    """The first of these data sets whose bootstrap has a draw past exp's range: which seed gives
    one depends on the BLAS's last bits (the fits run down a flat direction), so it is searched for.
    L-BFGS walks that direction furthest (the batched Newton stops earlier on it)."""
    for seed in range(1, 40):
        tokens, loss = tokens_and_loss(seed)
        fit = F.fit_law({"N": N, "D": tokens}, loss, "ND", bootstrap=40, seed=0, grid=False, solver="lbfgs")
        if fit.draws[:, 1:3].max() > laws.LOG_MAX:  # the case: exp of it overflows
            return fit
    raise AssertionError("no data set gave a runaway bootstrap draw")


def test_a_runaway_bootstrap_draw_reads_as_unbounded_without_a_warning():
    fit = runaway_fit()
    out = fit.to_dict()["estimates"]
    runaway = [name for name, column in (("A", 1), ("B", 2)) if fit.draws[:, column].max() > laws.LOG_MAX]
    for name, parts in out.items():  # every estimate a number; every interval end a number or unbounded
        assert parts["value"] is not None and np.isfinite(parts["value"]), name
        assert all(end is None or np.isfinite(end) for end in (parts["low"], parts["high"])), name
    assert any(out[name]["high"] is None for name in runaway)  # past exp's range: unbounded, not 1e308
    prediction = fit.predict(N=1e9, D=2e10).to_dict()
    assert prediction["loss"]["value"] is not None and prediction["prediction_interval"][0] is not None


def test_exp_is_exp_below_the_cap_and_the_largest_float_above_it():
    x = np.array([-800.0, 0.0, 1.5, 709.0, laws.LOG_MAX, 710.0, 1e6, np.inf])
    with np.errstate(over="ignore"):
        expected = np.nan_to_num(np.exp(x), posinf=np.finfo(float).max)  # what _interval made of inf
    assert np.array_equal(laws._exp(x), expected)
    assert np.isnan(laws._exp(np.nan))


def test_a_multiplier_past_every_float_is_unbounded_without_a_warning():
    c = np.geomspace(1e15, 1e19, 5)
    base = F.fit_law({"C": c}, 1.7 + 30 * c**-0.1, "C", bootstrap=4)
    other = F.fit_law({"C": c}, 1.6 + 40 * c**-0.12, "C", bootstrap=4)
    finite = laws.compute_multiplier(base, other, 1e21)["multiplier"]
    # A draw with a tiny exponent: the compute it needs is exp(several thousand).
    slow = base.draws.copy()
    slow[:, 2] = 1e-3
    runaway = laws.compute_multiplier(dataclasses.replace(base, draws=slow), other, 1e21)["multiplier"]
    assert runaway["value"] == finite["value"] and runaway["high"] is None


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Two families of six trials each, tokens spread around 20 per parameter."""
    path = write_store(tmp_path_factory.mktemp("quiet") / "s.duckdb")
    con = duckdb.connect(str(path))
    con.execute("UPDATE trials SET tokens = tokens * (0.5 + (hash(trial_id) % 1000) / 666.0)")
    con.close()
    return path


# L(N, D) from the grid takes a minute here: the runaway case above covers it.
@pytest.mark.parametrize("args", [["fit", "--law", "N,C"],
                                  ["fit", "--law", "N,C", "--at", "N=1e9,C=1e21", "--compare",
                                   "family=transformer, taper=uniform,family=mamba, taper=cosine"],
                                  ["pareto"], ["pareto", "--extrapolate", "1e9"],
                                  ["compare", "--baseline", "transformer", "--by", "family", "--pool"], ["status"]],
                         ids=["fit", "fit-at-compare", "pareto", "pareto-extrapolate", "compare", "status"])
def test_the_analysis_commands_print_no_warning(args, store):
    result = CliRunner().invoke(app, [*args, "--store", str(store)])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 0, result.output
    assert "Warning" not in result.output


def test_an_interval_end_next_to_an_unbounded_draw_is_unbounded_not_a_huge_number():
    """The 97.5% quantile of 40 draws falls between the 39th and the 40th; with the 40th
    unbounded, the end is unbounded (reported as None), not an interpolated 4e306. Ends whose
    neighbours are finite are the plain linear quantiles, as before."""
    draws = np.concatenate([np.linspace(1.0, 2.0, 39), [np.inf]])
    low, high = laws._interval(draws, 0.95)
    assert high == np.finfo(float).max and laws._finite(high) is None
    assert low == np.quantile(draws[:-1].tolist() + [np.finfo(float).max], 0.025)
    finite = np.linspace(1.0, 2.0, 40)
    assert laws._interval(finite, 0.95) == tuple(float(v) for v in np.quantile(finite, [0.025, 0.975]))
