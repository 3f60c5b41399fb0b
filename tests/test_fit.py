"""Scaling-law fits: the published Chinchilla result, intervals that cover, multipliers, clean errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import archsearch as A
from archsearch import analysis
from archsearch.analysis import fit as fit_module
from tests.analysis_support import LAWS, SIZES, cli_json, law_loss, one_line_error, write_store

CHINCHILLA = Path(__file__).parent / "data" / "chinchilla_svg_extracted_data.csv"
# Besiroglu et al. (2024), table 1, fitted to the same extracted points less the 5 highest losses.
PUBLISHED = {"E": 1.82, "A": 478.0, "B": 2140.0, "alpha": 0.347, "beta": 0.367}


def fit_json(*args: str) -> dict:
    return cli_json("fit", *args)


@pytest.mark.slow
def test_chinchilla_refit_matches_the_published_estimates():
    """The batched fit (what ``fit`` runs) and, in test_fit_batched, L-BFGS from
    the full 4,500-start grid at tight tolerances. Planted mutation: with
    scipy's default tolerances (FTOL 2.2e-9, GTOL 1e-5) the best of the grid
    still lands on the estimates, but the bootstrap refits stop at once and
    alpha's interval shrinks from about [0.32, 0.37] to [0.346, 0.349], which fails here."""
    out = fit_json("--from-csv", str(CHINCHILLA), "--n-col", "Model Size", "--flops-col", "Training FLOP",
                   "--loss-col", "loss", "--drop-highest", "5", "--law", "ND", "--bootstrap", "20")
    (fit,) = out["fits"]
    assert fit["points"] == 240
    estimates = fit["estimates"]
    for name in ("E", "alpha", "beta"):
        assert estimates[name]["value"] == pytest.approx(PUBLISHED[name], rel=0.02), name
    for name in ("A", "B"):
        assert estimates[name]["value"] == pytest.approx(PUBLISHED[name], rel=0.05), name
    for name, e in estimates.items():
        assert e["low"] < e["value"] < e["high"], name
    assert estimates["alpha"]["high"] - estimates["alpha"]["low"] > 0.02
    assert "tokens D = Training FLOP / (6 Model Size)" in out["notes"]


def synthetic(law: str, *, noise: float = 0.01, seed: int = 0, n: int = 40) -> tuple[dict, np.ndarray, dict]:
    rng = np.random.default_rng(seed)
    truth = {"E": 1.7, "A": 400.0, "B": 1500.0, "alpha": 0.34, "beta": 0.28}
    size = np.exp(rng.uniform(np.log(1e7), np.log(1e10), n))
    tokens = np.exp(rng.uniform(np.log(1e9), np.log(1e11), n))
    if law == "N":
        loss = truth["E"] + truth["A"] / size ** truth["alpha"]
        variables = {"N": size}
    else:
        loss = truth["E"] + truth["A"] / size ** truth["alpha"] + truth["B"] / tokens ** truth["beta"]
        variables = {"N": size, "D": tokens}
    return variables, loss * np.exp(noise * rng.standard_normal(n)), truth


def test_one_term_law_recovers_its_parameters_and_the_intervals_cover_them():
    variables, loss, truth = synthetic("N", noise=0.005)
    fit = analysis.fit_law(variables, loss, "N", bootstrap=100)
    estimates = fit.estimates
    assert set(estimates) == {"E", "A", "alpha"} and fit.starts == 150 and fit.converged
    for name in ("E", "A", "alpha"):
        e = estimates[name]
        assert e.low <= truth[name] <= e.high, (name, e)
    assert estimates["alpha"].value == pytest.approx(truth["alpha"], rel=0.1)


def test_tight_tolerances_matter_for_the_intervals():
    """A bootstrap refit with scipy's default tolerances barely leaves its
    start, so its intervals come out far too narrow (Besiroglu et al.)."""
    variables, loss, _ = synthetic("N", noise=0.01, seed=3)
    tight = analysis.fit_law(variables, loss, "N", bootstrap=60, solver="lbfgs").estimates["alpha"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fit_module, "GTOL", 1e-5)
        patch.setattr(fit_module, "FTOL", 2.2e-9)
        loose = analysis.fit_law(variables, loss, "N", bootstrap=60, solver="lbfgs").estimates["alpha"]
    assert (loose.high - loose.low) < 0.75 * (tight.high - tight.low)


def test_prediction_intervals_widen_away_from_the_data():
    variables, loss, _ = synthetic("ND", noise=0.01)
    fit = analysis.fit_law(variables, loss, "ND", bootstrap=40, grid=False)
    inside = fit.predict(N=1e9, D=1e10)
    outside = fit.predict(N=1e12, D=1e13)
    assert not inside.extrapolated and outside.extrapolated
    assert inside.loss.low < inside.loss.value < inside.loss.high
    # A new observation scatters about the law: its interval is wider than the law's own.
    assert inside.prediction_low < inside.loss.low and inside.prediction_high > inside.loss.high
    width = lambda p: np.log(p.loss.high / p.loss.low)  # noqa: E731
    assert width(outside) > 2 * width(inside)
    assert fit.predict(N=1e9, C=6e19).at["D"] == pytest.approx(1e10)


def test_compute_multiplier_recovers_a_planted_efficiency_gain():
    """Family b is family a given 4x the compute: L_b(C) = L_a(4 C)."""
    compute = np.geomspace(1e15, 1e19, 12)
    rng = np.random.default_rng(1)
    curve = lambda c: 1.8 + 30.0 * c ** -0.12  # noqa: E731
    rows = {"C": np.concatenate([compute, compute]), "loss": np.concatenate([curve(compute), curve(4 * compute)])
            * np.exp(0.002 * rng.standard_normal(24)), "family": ["a"] * 12 + ["b"] * 12}
    fits = analysis.fit_scaling(rows, laws=["C"], by="family", loss_col="loss", n_col=None, d_col=None, c_col="C",
                                bootstrap=60)
    result = fits.compute_multiplier("a", "b", compute=1e18)
    m = result["multiplier"]
    assert m["value"] == pytest.approx(4.0, rel=0.25)
    assert m["low"] <= 4.0 <= m["high"]
    assert fits.compute_multiplier("b", "a", compute=1e18)["multiplier"]["value"] < 1


def test_fit_on_a_store_groups_by_family_and_says_which_laws_it_could_not_fit(tmp_path):
    """The store's two taper arms of a family follow the family's one law by
    construction, so ``--pool-arms`` fits it per family (and a note says it pools)."""
    store = write_store(tmp_path / "s.duckdb")
    out = fit_json("--store", str(store), "--bootstrap", "30", "--at", "N=1e9", "--compare", "transformer,mamba",
                   "--pool-arms")
    assert all("one fit over 2 arms (they differ in taper)" in n for n in out["notes"][-2:])
    fitted = {(f["group"], f["law"]) for f in out["fits"]}
    assert fitted == {(f, law) for f in LAWS for law in ("L(N)", "L(C)")}
    # Every trial trains on 20 tokens per parameter: N and D move together, so L(N, D) is not identifiable.
    assert {s["law"] for s in out["skipped"]} == {"L(N,D)"}
    assert all("move together" in s["reason"] for s in out["skipped"])
    for fit in out["fits"]:
        if fit["law"] == "L(N)":
            e, a, alpha = LAWS[fit["group"]]
            assert fit["estimates"]["alpha"]["low"] < alpha < fit["estimates"]["alpha"]["high"]
    predictions = {p["group"]: p for p in out["predictions"]}
    assert set(predictions) == set(LAWS) and all(p["law"] == "L(N)" for p in predictions.values())
    assert predictions["mamba"]["loss"]["value"] == pytest.approx(law_loss("mamba", 1e9), rel=0.03)
    assert predictions["mamba"]["extrapolated"]
    assert out["multipliers"][0]["multiplier"]["value"] > 1  # mamba's law is below transformer's here


def test_fit_groups_by_a_store_axis(tmp_path):
    with A.open_store(write_store(tmp_path / "s.duckdb"), read_only=True) as store:
        trials = analysis.completed_trials(store)
    assert trials.num_rows == len(LAWS) * len(SIZES)
    fits = analysis.fit_scaling(trials.to_pandas(), laws=["N"], by="taper", pool_arms=True, bootstrap=0)
    assert {f.group for f in fits.fits} == {"cosine", "uniform"}
    # each taper holds both families' arms: unless pooled, each its own (4 or 3 sizes: 3 are too few)
    apart = analysis.fit_scaling(trials.to_pandas(), laws=["N"], by="taper", bootstrap=0)
    assert {f.group for f in apart.fits} == {"family=transformer, taper=uniform", "family=mamba, taper=cosine"}
    assert [s["reason"] for s in apart.skipped] == [
        "L(N) for family=mamba, taper=uniform: 3 points, need at least 4 (3 parameters)",
        "L(N) for family=transformer, taper=cosine: 3 points, need at least 4 (3 parameters)"]
    assert fits.get("cosine", "N").estimates["alpha"].low is None  # no bootstrap, no interval


@pytest.mark.parametrize("args, message", [
    (["--n-col", "size"], "no column 'size'; have: Model Size, Training FLOP, loss"),
    (["--n-col", "Model Size", "--loss-col", "loss", "--law", "ND"], "L(N,D) needs parameter counts and tokens"),
    (["--n-col", "Model Size", "--loss-col", "loss", "--law", "XY"], "unknown law 'XY'"),
    (["--n-col", "Model Size", "--loss-col", "loss", "--at", "N=big"], "write NAME=NUMBER pairs"),
], ids=["missing-column", "no-tokens", "unknown-law", "bad-point"])
def test_mistakes_end_in_one_line(tmp_path, args, message):
    path = tmp_path / "d.csv"
    path.write_text("Model Size,Training FLOP,loss\n1e6,1e15,3.0\n2e6,4e15,2.8\n4e6,1.6e16,2.7\n8e6,6e16,2.6\n")
    assert message in one_line_error("fit", "--from-csv", str(path), *args)


def test_too_few_points_is_one_line(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("N,loss\n1e6,3.0\n2e6,2.8\n4e6,2.7\n")
    line = one_line_error("fit", "--from-csv", str(path), "--n-col", "N", "--loss-col", "loss", "--law", "N")
    assert line == "error: nothing to fit: L(N) for all: 3 points, need at least 4 (3 parameters)"


def test_the_objective_gradient_matches_finite_differences():
    variables, loss, _ = synthetic("ND", noise=0.05)
    objective = fit_module._HuberObjective(np.log(np.stack([variables["N"], variables["D"]])), np.log(loss))
    theta = np.array([0.4, 6.0, 7.5, 0.35, 0.3])
    value, grad = objective(theta)
    step = 1e-7
    numeric = [(objective(theta + step * e)[0] - objective(theta - step * e)[0]) / (2 * step) for e in np.eye(5)]
    assert grad == pytest.approx(numeric, rel=1e-4, abs=1e-9)


def test_a_looped_study_is_fitted_arm_by_arm_and_an_arm_of_too_few_sizes_says_so(tmp_path):
    """A looped arm and its iso-param and iso-FLOP baselines (one family, three
    laws, the baselines sharing their axes): by default one fit per arm, named
    as the report names it, each recovering its own exponent; ``--by arm``
    (the study's axis) still fits the two baselines apart; ``--pool-arms``
    fits one law over all 15 points and says so. At 2 sizes no arm is fitted
    and the error says why. Fails on the old default, one fit per family
    (``looped``, through all three arms)."""
    from tests.analysis_support import PROTOCOL_ARMS, protocol_store

    store = str(protocol_store(tmp_path / "p.duckdb", sizes=(1e4, 3e4, 1e5, 3e5, 1e6), seeds=(0,)))
    names = {"looped": "arm=looped", "param": "arm=baseline (iso-param: 2-layer stack)",
             "flop": "arm=baseline (iso-FLOP: 4-layer stack)"}
    fits = {f["group"]: f for f in fit_json("--store", store, "--law", "N", "--bootstrap", "5")["fits"]}
    assert set(fits) == set(names.values())
    for arm, name in names.items():
        assert fits[name]["points"] == 5
        assert fits[name]["estimates"]["alpha"]["value"] == pytest.approx(PROTOCOL_ARMS[arm][3][2], abs=0.02)
    by_arm = fit_json("--store", store, "--law", "N", "--bootstrap", "5", "--by", "arm")
    assert {f["group"] for f in by_arm["fits"]} == {"looped", names["param"], names["flop"]}
    pooled = fit_json("--store", store, "--law", "N", "--bootstrap", "5", "--pool-arms")
    assert [(f["group"], f["points"]) for f in pooled["fits"]] == [("looped", 15)]
    assert any(n.startswith("looped: one fit over 3 arms (they differ in arm, match)") for n in pooled["notes"])

    small = str(protocol_store(tmp_path / "s.duckdb", sizes=(1e4, 3e4)))
    line = one_line_error("fit", "--store", small, "--law", "N")
    assert line.startswith("error: nothing to fit: L(N) for arm=baseline (iso-FLOP: 4-layer stack): N takes 2 "
                           "distinct values; the law needs at least 3")


def test_fit_says_which_fit_it_is_on_for_a_large_table(tmp_path, monkeypatch):
    """Each fit is announced, with its count and points, before it runs (a table of 10^6 rows
    takes minutes); tables below ``FIT_PROGRESS_ROWS`` stay quiet, so their output is only the result."""
    from typer.testing import CliRunner

    from archsearch import cli, cli_results

    variables, loss, _ = synthetic("ND", noise=0.01, n=30)
    rows = ["arm,params,tokens,loss", *(f"{arm},{n},{d},{l}" for arm in ("a", "b")
                                       for n, d, l in zip(variables["N"], variables["D"], loss))]
    csv = tmp_path / "runs.csv"
    csv.write_text("\n".join(rows) + "\n")
    args = ["fit", "--from-csv", str(csv), "--by", "arm", "--n-col", "params", "--d-col", "tokens",
            "--loss-col", "loss", "--law", "N,ND", "--bootstrap", "10"]
    quiet = CliRunner().invoke(cli.app, args)
    assert quiet.exit_code == 0 and "fitting" not in quiet.output
    monkeypatch.setattr(cli_results, "FIT_PROGRESS_ROWS", 1)
    told = CliRunner().invoke(cli.app, args)
    assert told.exit_code == 0, told.output
    for line in ("fitting L(N) to a (1 of 4): 30 points, 10 resamples",
                 "fitting L(N,D) to b (4 of 4): 30 points, 10 resamples"):
        assert line in told.output


@pytest.mark.parametrize("stop_early", [False, True])
def test_converged_means_at_a_minimum_even_when_the_line_search_reports_abnormal(monkeypatch, stop_early):
    """L-BFGS-B with ftol 1e-15 often ends in ABNORMAL_TERMINATION_IN_LNSRCH at the optimum (no
    step lowers the loss any more); that fit has converged. One stopped after a step, with the
    same status but a gradient far from zero, has not."""
    import scipy.optimize

    real = scipy.optimize.minimize

    def abnormal(*args, **kwargs):
        if stop_early:
            kwargs["options"] = dict(kwargs["options"], maxiter=1)
        result = real(*args, **kwargs)
        result.status, result.success = 2, False
        return result

    monkeypatch.setattr(scipy.optimize, "minimize", abnormal)
    variables, loss, _ = synthetic("N", noise=0.005)
    fit = analysis.fit_law(variables, loss, "N", bootstrap=0, solver="lbfgs", grid=False)
    assert fit.converged is (not stop_early)
    assert fit.to_dict()["converged"] is (not stop_early)
