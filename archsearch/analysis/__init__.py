"""Analyses over result tables: scaling-law fits with intervals and Pareto fronts. Torch-free.

Every function takes an Arrow table (``A.open_store(path).trials()``), a
pandas or polars DataFrame, a list of row dicts or a dict of columns::

    import archsearch as A
    from archsearch import analysis

    with A.open_store("archsearch.duckdb", read_only=True) as store:
        trials = analysis.completed_trials(store)             # Arrow: .to_pandas(), polars.from_arrow
    fits = analysis.fit_scaling(trials, by="family")          # L(N), L(C), L(N, D) per arm of each family
    fits.get("mamba", "N").estimates["alpha"]                 # Estimate(value, low, high); a one-arm family's
    front = analysis.pareto(trials, "val_loss,params,tokens_per_s:max")
    front.indices, front.hypervolume
    diff = analysis.compare_arms(trials, baseline="transformer", by="family")  # over seeds
    diff.get("memory").difference, diff.get("memory").p_value
"""

from archsearch.analysis.compare import Comparison, Difference, compare_arms, varying_axes
from archsearch.analysis.fit import fit_law
from archsearch.analysis.laws import LAWS, Estimate, Law, Prediction, ScalingFit, compute_multiplier
from archsearch.analysis.pareto import Front, hypervolume, nondominated, pareto, pareto_front, parse_objectives
from archsearch.analysis.scaling import Fits, extrapolated_front, fit_scaling
from archsearch.analysis.tables import as_table, read_csv
from archsearch.analysis.trials import completed_trials, matched_values

__all__ = [
    "LAWS", "Comparison", "Difference", "Estimate", "Fits", "Front", "Law", "Prediction", "ScalingFit", "as_table",
    "compare_arms", "completed_trials", "compute_multiplier", "extrapolated_front", "fit_law", "fit_scaling",
    "hypervolume", "matched_values", "nondominated", "pareto", "pareto_front", "parse_objectives", "read_csv",
    "varying_axes",
]
