"""The one protocol between a search and the driver that runs its trials."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from archsearch.planner import PlannedTrial


@dataclass(frozen=True)
class Job:
    """One run of a trial: to its full budget, or (multi-fidelity) to the
    share ``stop_at`` of its tokens, ending rung ``rung``."""

    trial: PlannedTrial
    stop_at: float | None = None
    rung: int | None = None


class Searcher(Protocol):
    """Hands out trials to start and hears how they ended.

    The driver calls ``ask(n)`` whenever it has ``n`` free slots (it may get
    fewer, or none while the search waits for results), then ``tell`` once per
    trial it started. The search is over when ``exhausted`` is true and every
    trial handed out has been told.

    Beside its trials a search keeps what the driver writes to the store:
    ``records`` (a sampler's finished proposals; the driver empties the list
    once written), ``ladder`` (a fidelity ladder's rank correlation, once
    known), ``pruned`` (trials stopped for good at a rung, once the search is
    over), ``rungs`` (how many rungs a trial's budget is cut into; 1 for a
    search without rungs) and ``notes`` (what the run's summary should say of
    the search, such as a space that ran out before ``trials``). A search with
    none of these keeps them empty.
    """

    records: list[dict]
    notes: list[str]
    ladder: dict | None
    pruned: list[tuple[PlannedTrial, int]]
    rungs: int

    def ask(self, n: int) -> list[Job]:
        """Up to ``n`` jobs to start now."""

    def tell(self, job: Job, result: dict | None) -> None:
        """``job`` finished with ``result`` (a ``TrialResult`` dict), or failed (None)."""

    def pause(self, job: Job, result: dict) -> None:
        """``job``'s trial stopped at its rung with ``result`` and waits; it may be promoted later."""

    def prune(self, job: Job) -> None:
        """``job``'s trial stops for good short of its full budget."""

    def take(self, ids: set[str]) -> list[PlannedTrial]:
        """Hand over the not yet started trials among ``ids`` (and never ask them)."""

    @property
    def expected(self) -> int:
        """About how many trials are still to run (for progress)."""

    @property
    def exhausted(self) -> bool:
        """True once ``ask`` will never return another trial."""
