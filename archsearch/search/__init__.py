"""Which trials a study trains, and in what order.

A grid search trains every planned trial; a sampled search (random, TPE,
NSGA-II, CMA-ES, GP) asks an Optuna sampler for one point at a time and tells
it each result as it lands, so parallel trials keep the sampler informed.
The driver sees one narrow protocol (``Searcher``) either way. optuna is
imported only here, and only when a sampled search starts.
"""

from archsearch.search._base import Job, Searcher
from archsearch.search.grid import GridSearch
from archsearch.search.halving import HalvingSearch, rank_order
from archsearch.search.ladder import ProbeSearch, spearman_interval
from archsearch.search.objectives import Objective, objective_values, parse_objectives
from archsearch.search.sampled import SampledSearch, search_journal


def out_of_attempts(row: dict | None, max_attempts: int) -> bool:
    """Whether a stored trial ended failed or diverged and has had ``max_attempts`` attempts:
    a failure that repeats (a model too large, a learning rate that diverges) is not trained
    again on every resume."""
    return bool(row) and row["status"] in ("failed", "diverged") and (row.get("attempts") or 0) >= max_attempts


def make_searcher(study, *, store: str, known: dict[str, dict],
                  rungs: dict[str, dict[int, dict]] | None = None, retry_failed: bool = False) -> Searcher:
    """The searcher a study asks for. ``known``: finished trials already in
    the store (trial id -> row with status and results), so nothing finished
    is trained again and a resumed sampler is told what it missed. ``rungs``:
    the rungs each trial of a multi-fidelity search reached before. A grid
    leaves out the trials ``out_of_attempts`` unless ``retry_failed``."""
    search = study.search
    if search.probe is not None:
        return ProbeSearch(study, known=known)
    if search.sampler == "grid":
        from archsearch.planner import plan

        planned = plan(study)
        cap = study.execution.max_attempts
        inner = GridSearch([t for t in planned if known.get(t.trial_id, {}).get("status") != "completed"
                            and (retry_failed or not out_of_attempts(known.get(t.trial_id), cap))])
    else:
        inner = SampledSearch(study, journal=search_journal(store, study.name), known=known)
    if search.fidelity is None:
        return inner
    return HalvingSearch(inner, objectives=parse_objectives(search.objectives), rungs=search.fidelity.rungs,
                         eta=search.fidelity.eta, kind=search.fidelity.kind,
                         history=_history(study, rungs or {}, known))


def _history(study, rungs: dict[str, dict[int, dict]], known: dict[str, dict]) -> dict[str, dict[int, dict]]:
    """This study's trials among those that reached a rung, each rung's row
    joined with the trial's plan columns (so every objective can be scored)."""
    from archsearch.planner import plan

    ids = {t.trial_id for t in plan(study)} if study.search.sampler == "grid" else set(rungs)
    return {trial_id: {rung: {**known.get(trial_id, {}), **row} for rung, row in reached.items()}
            for trial_id, reached in rungs.items() if trial_id in ids}


__all__ = ["out_of_attempts", "GridSearch", "HalvingSearch", "Job", "Objective", "ProbeSearch", "spearman_interval", "rank_order", "SampledSearch", "Searcher", "make_searcher", "objective_values",
           "parse_objectives", "search_journal"]
