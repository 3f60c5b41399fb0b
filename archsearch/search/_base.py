"""The one protocol between a search and the driver that runs its trials."""

from __future__ import annotations

from typing import Protocol

from archsearch.planner import PlannedTrial


class Searcher(Protocol):
    """Hands out trials to start and hears how they ended.

    The driver calls ``ask(n)`` whenever it has ``n`` free slots (it may get
    fewer, or none while the search waits for results), then ``tell`` once per
    trial it started. The search is over when ``exhausted`` is true and every
    trial handed out has been told.
    """

    def ask(self, n: int) -> list[PlannedTrial]:
        """Up to ``n`` trials to start now."""

    def tell(self, trial: PlannedTrial, result: dict | None) -> None:
        """``trial`` finished with ``result`` (a ``TrialResult`` dict), or failed (None)."""

    @property
    def expected(self) -> int:
        """About how many trials are still to run (for progress)."""

    @property
    def exhausted(self) -> bool:
        """True once ``ask`` will never return another trial."""
