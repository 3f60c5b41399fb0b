"""Every planned trial, in plan order: the grid search."""

from __future__ import annotations

from archsearch.planner import PlannedTrial
from archsearch.search._base import Job


class GridSearch:
    """A fixed list of trials handed out in order; results change nothing."""

    def __init__(self, trials: list[PlannedTrial]):
        self._queue = list(trials)
        self.total = len(trials)

    def ask(self, n: int) -> list[Job]:
        out, self._queue = self._queue[:n], self._queue[n:]
        return [Job(trial) for trial in out]

    def tell(self, job: Job, result: dict | None) -> None:
        pass

    def prune(self, job: Job) -> None:
        pass

    @property
    def expected(self) -> int:
        return self.total

    @property
    def exhausted(self) -> bool:
        return not self._queue
