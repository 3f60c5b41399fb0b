"""A fidelity ladder: rank every point of the grid on a synthetic probe
(MQAR, a MAD task), then train only the best share on the study's data.

The probe trial of a point is the same architecture planned on the probe's
data and recipe (its own vocabulary, hence its own trial id), marked
``fidelity: probe`` in its axes. After the promoted points finish, the rank
correlation between the two fidelities (Spearman's rho over the points that
have both, with a bootstrap interval) says how far the probe can be trusted.
"""

from __future__ import annotations

import math
from dataclasses import replace

from archsearch.planner import PlannedTrial, plan_points
from archsearch.search._base import Job
from archsearch.search.objectives import objective_values, parse_objectives
from archsearch.space.expand import expand
from archsearch.space.schema import Study

BOOTSTRAP_RESAMPLES = 2000


class ProbeSearch:
    """Probe trials first, then the top ``keep`` share of points on the study's data."""

    def __init__(self, study: Study, *, known: dict[str, dict]):
        probe = study.search.probe
        probe_study = study.model_copy(update=dict(data=probe.data, recipe=probe.recipe or study.recipe))
        self.objective = parse_objectives(study.search.objectives)[:1]
        self.keep, self.known = probe.keep, known
        self.points: list[tuple[list[PlannedTrial], list[PlannedTrial]]] = []
        for point in expand(study.space):
            probes = [replace(t, axes=dict(t.axes, fidelity="probe")) for t in plan_points(probe_study, [point])]
            self.points.append((probes, plan_points(study, [point])))
        self.scores: dict[str, float | None] = {}  # trial id -> first objective, None if failed
        for trial_id, row in known.items():
            if row.get("status") == "completed":
                values = objective_values(self.objective, row)
                self.scores[trial_id] = values[0] if values else None
        self._queue = [t for probes, _ in self.points for t in probes if t.trial_id not in self.scores]
        self._out: set[str] = set()
        self._promoted = False
        self.ladder: dict | None = None
        self.records: list[dict] = []  # (the Searcher protocol's: no proposals, no rungs, nothing pruned, no notes)
        self.pruned: list[tuple[PlannedTrial, int]] = []
        self.rungs = 1
        self.notes: list[str] = []

    # the Searcher protocol

    def ask(self, n: int) -> list[Job]:
        if not self._queue and not self._out and not self._promoted:
            self._promote()
        jobs = [Job(t) for t in self._queue[:n]]
        self._queue = self._queue[n:]
        self._out |= {job.trial.trial_id for job in jobs}
        if not jobs and not self._out and self._promoted and self.ladder is None:
            self.ladder = self._correlation()
        return jobs

    def tell(self, job: Job, result: dict | None) -> None:
        self._out.discard(job.trial.trial_id)
        values = None if result is None else objective_values(self.objective, {**job.trial.to_dict(), **result})
        self.scores[job.trial.trial_id] = values[0] if values else None

    def pause(self, job: Job, result: dict) -> None:
        pass

    def prune(self, job: Job) -> None:
        pass

    @property
    def expected(self) -> int:
        per_point = len(self.points[0][1]) if self.points else 0
        return len(self._queue) + math.ceil(self.keep * len(self.points)) * per_point

    @property
    def exhausted(self) -> bool:
        return self._promoted and not self._queue

    # deciding

    def _mean(self, trials: list[PlannedTrial]) -> float | None:
        values = [self.scores.get(t.trial_id) for t in trials]
        if not values or any(v is None for v in values):
            return None
        return sum(values) / len(values)

    def _promote(self) -> None:
        """Every probe is in: queue the study-data trials of the best points."""
        sign = 1 if self.objective[0].direction == "minimize" else -1
        scored = [(self._mean(probes), texts) for probes, texts in self.points]
        scored = [(score, texts) for score, texts in scored if score is not None]
        scored.sort(key=lambda pair: sign * pair[0])
        keep = max(1, math.ceil(self.keep * len(self.points))) if scored else 0
        self._queue = [t for _, texts in scored[:keep] for t in texts if t.trial_id not in self.scores]
        self._promoted = True

    def _correlation(self) -> dict | None:
        pairs = [(self._mean(probes), self._mean(texts)) for probes, texts in self.points]
        pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
        if len(pairs) < 3:
            return dict(points=len(pairs), spearman=None, low=None, high=None)
        rho, low, high = spearman_interval([a for a, _ in pairs], [b for _, b in pairs])
        return dict(points=len(pairs), spearman=rho, low=low, high=high)


def spearman_interval(x: list[float], y: list[float], *, level: float = 0.95, seed: int = 0) -> tuple:
    """Spearman's rho of ``x`` and ``y`` and a percentile bootstrap interval
    over resampled pairs (resamples with constant ranks are skipped)."""
    import numpy as np
    from scipy.stats import spearmanr

    x_, y_ = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    rho = float(spearmanr(x_, y_).statistic)
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(BOOTSTRAP_RESAMPLES):
        pick = rng.integers(0, len(x_), len(x_))
        if np.ptp(x_[pick]) == 0 or np.ptp(y_[pick]) == 0:
            continue
        draws.append(spearmanr(x_[pick], y_[pick]).statistic)
    tail = (1 - level) / 2 * 100
    low, high = np.nanpercentile(draws, [tail, 100 - tail]) if draws else (math.nan, math.nan)
    return rho, float(low), float(high)
