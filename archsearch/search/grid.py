"""Every planned trial, in plan order: the grid search."""

from __future__ import annotations

from archsearch.planner import PlannedTrial
from archsearch.search._base import Job


class GridSearch:
    """A fixed list of trials handed out in order; results change nothing."""

    def __init__(self, trials: list[PlannedTrial]):
        self._queue = list(trials)
        self.total = len(trials)
        # nothing beside its trials (the Searcher protocol's records, ladder, pruned, rungs, notes)
        self.records: list[dict] = []
        self.ladder: dict | None = None
        self.pruned: list[tuple[PlannedTrial, int]] = []
        self.rungs = 1
        self.notes: list[str] = []

    def ask(self, n: int) -> list[Job]:
        out, self._queue = self._queue[:n], self._queue[n:]
        return [Job(trial) for trial in out]

    def tell(self, job: Job, result: dict | None) -> None:
        pass

    def pause(self, job: Job, result: dict) -> None:
        pass

    def prune(self, job: Job) -> None:
        pass

    def take(self, ids: set[str]) -> list[PlannedTrial]:
        """Remove the trials ``ids`` from the queue and return them (a
        multi-fidelity search restoring the ones it had started)."""
        taken = [t for t in self._queue if t.trial_id in ids]
        self._queue = [t for t in self._queue if t.trial_id not in ids]
        return taken

    @property
    def expected(self) -> int:
        return self.total

    @property
    def exhausted(self) -> bool:
        return not self._queue
