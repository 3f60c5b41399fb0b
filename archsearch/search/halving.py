"""Multi-fidelity search by training tokens: successive halving, ASHA and
Hyperband, for one objective or several.

A trial first trains to the lowest rung (a fraction ``eta**-(rungs-1)`` of its
full token budget), stops, and waits. It is promoted to the next rung when it
ranks in the top ``1/eta`` of the trials that reached its rung: by the one
objective, or, for several, by non-dominated rank with crowding distance as
the tie-break (as MOASHA does; Optuna's pruners cannot prune multi-objective
studies). A promoted trial continues from its checkpoint. Trials never
promoted end ``pruned`` at their rung, their curves kept. The search that
proposed a trial (a grid, or a sampler: BOHB-style) hears each rung it stops
at (``pause``), its end, and at last whether it was pruned.

The schedule must be WSD: every rung below the last lies in the stable phase,
so a trial stopped at a rung and continued later follows exactly the learning
rates of an uninterrupted run, and its final result equals one. A cosine
schedule is set by the full length: a run stopped early has seen a partly
decayed rate that its continuation cannot match honestly, so it is refused.

``asha`` promotes as soon as a rung holds enough results (asynchronous, no
idle workers); ``halving`` waits until every trial of a rung is in
(synchronous); ``hyperband`` runs halving brackets that start at each rung in
turn, with fewer, longer trials in later brackets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from archsearch.planner import PlannedTrial
from archsearch.search._base import Job, Searcher
from archsearch.search.objectives import Objective, objective_values


@dataclass
class _Entry:
    trial: PlannedTrial | None  # None: known from the store only, trained to the end
    bracket: int
    rung: int = 0  # the rung it is running to, or stopped at
    results: dict[int, list[float] | None] = field(default_factory=dict)  # rung -> objective values
    running: bool = False
    promoted_from: set[int] = field(default_factory=set)


class HalvingSearch:
    """Wraps the search that proposes trials (grid or a sampler) with rungs.

    ``inner`` hands out new trials; this class decides how far each trains.
    ``rungs`` counts the full budget too: rungs=3, eta=3 stops trials at 1/9
    and 1/3 of their tokens before training the best to the end.
    """

    def __init__(self, inner: Searcher, *, objectives: list[Objective], rungs: int, eta: int, kind: str,
                 total: int | None = None, history: dict[str, dict[int, dict]] | None = None):
        self.inner, self.objectives, self.rungs, self.eta, self.kind = inner, objectives, rungs, eta, kind
        self.entries: dict[str, _Entry] = {}
        self.pruned: list[tuple[PlannedTrial, int]] = []  # filled once the search is over
        total = (total or inner.expected) + len(history or {})
        self.brackets = _hyperband_brackets(rungs, eta, total) if kind == "hyperband" else None
        self._bracket_started = [0] * (len(self.brackets) if self.brackets else 1)
        self._finished = False
        if history:
            self._restore(history)

    def _restore(self, history: dict[str, dict[int, dict]]) -> None:
        """Continue a search a dead driver left: each trial's rungs reached
        (trial id -> rung -> its row of plan and result, from the store) come
        back as they were, so ranks and promotions go on from there."""
        waiting = {t.trial_id: t for t in self.inner.take(set(history))}
        for trial_id, reached in history.items():
            top = max(reached)
            trial = waiting.get(trial_id)
            if trial is None and top < self.rungs - 1:
                continue  # the search that proposed it no longer holds it: it stays as it is
            bracket = min(reached) if self.brackets else 0
            entry = _Entry(trial=trial, bracket=bracket, rung=top, promoted_from=set(r for r in reached if r < top))
            entry.results = {r: objective_values(self.objectives, row) for r, row in reached.items()}
            self.entries[trial_id] = entry
            self._bracket_started[bracket] += 1

    def fraction(self, rung: int) -> float:
        """The share of a trial's full token budget trained by the end of ``rung``."""
        return float(self.eta ** -(self.rungs - 1 - rung))

    # the Searcher protocol

    def ask(self, n: int) -> list[Job]:
        jobs: list[Job] = []
        while len(jobs) < n:
            entry = self._promotable()
            if entry is None:
                entry = self._start_new()
            if entry is None:
                break
            entry.running = True
            last = entry.rung == self.rungs - 1
            jobs.append(Job(entry.trial, stop_at=None if last else self.fraction(entry.rung), rung=entry.rung))
        if not jobs and not any(e.running for e in self.entries.values()):
            self._finish()
        return jobs

    def tell(self, job: Job, result: dict | None) -> None:
        entry = self.entries[job.trial.trial_id]
        entry.running = False
        row = None if result is None else {**job.trial.to_dict(), **result}
        values = None if row is None else objective_values(self.objectives, row)
        entry.results[entry.rung] = values
        if values is None or entry.rung == self.rungs - 1:  # failed, diverged, or trained to the end
            self.inner.tell(job, result)
        else:
            self.inner.pause(job, result)

    def pause(self, job: Job, result: dict) -> None:
        self.inner.pause(job, result)

    def prune(self, job: Job) -> None:
        self.inner.prune(job)

    @property
    def expected(self) -> int:
        return self.inner.expected

    @property
    def records(self) -> list[dict]:
        """The proposing search's records (a sampler's proposals)."""
        return self.inner.records

    @property
    def ladder(self) -> dict | None:
        return self.inner.ladder

    @property
    def notes(self) -> list[str]:
        return self.inner.notes

    @property
    def exhausted(self) -> bool:
        return self._finished

    # deciding

    def _start_new(self) -> _Entry | None:
        bracket = self._open_bracket()
        if bracket is None:
            return None
        asked = self.inner.ask(1)
        if not asked:
            return None
        start = self.brackets[bracket][0] if self.brackets else 0
        entry = _Entry(trial=asked[0].trial, bracket=bracket, rung=start)
        self.entries[entry.trial.trial_id] = entry
        self._bracket_started[bracket] += 1
        return entry

    def _open_bracket(self) -> int | None:
        """Hyperband fills its brackets one after another; the others have one."""
        if not self.brackets:
            return 0
        for index, (_, size) in enumerate(self.brackets):
            if self._bracket_started[index] < size:
                return index
        return None

    def _promotable(self) -> _Entry | None:
        """The best trial that has earned the next rung, from the top rung down."""
        for rung in range(self.rungs - 2, -1, -1):
            for bracket in range(len(self._bracket_started)):
                members = [e for e in self.entries.values() if e.bracket == bracket and rung in e.results]
                if self.kind != "asha" and not self._rung_complete(bracket, rung):
                    continue
                ranked = self._ranked([e for e in members if e.results[rung] is not None], rung)
                for entry in ranked[:len(members) // self.eta]:
                    if (rung not in entry.promoted_from and not entry.running and entry.rung == rung
                            and entry.trial is not None):
                        entry.promoted_from.add(rung)
                        entry.rung = rung + 1
                        return entry
        return None

    def _rung_complete(self, bracket: int, rung: int) -> bool:
        """Synchronous halving: no trial will enter this rung any more, and every
        one that entered it has its result."""
        members = [e for e in self.entries.values() if e.bracket == bracket]
        start = self.brackets[bracket][0] if self.brackets else 0
        if rung < start:
            return False
        if rung == start:
            size = self.brackets[bracket][1] if self.brackets else None
            started = self._bracket_started[bracket] >= size if size else self.inner.exhausted
            return started and all(rung in e.results for e in members)
        if not self._rung_complete(bracket, rung - 1):
            return False
        below = sum(1 for e in members if rung - 1 in e.results)
        return sum(1 for e in members if rung in e.results) >= below // self.eta

    def _ranked(self, entries: list[_Entry], rung: int) -> list[_Entry]:
        values = [[v if o.direction == "minimize" else -v for v, o in zip(e.results[rung], self.objectives)]
                  for e in entries]
        order = rank_order(values)
        return [entries[i] for i in order]

    def _finish(self) -> None:
        """Nothing runs and nothing can start: every stopped trial is pruned."""
        if self._finished:
            return
        for entry in self.entries.values():
            last = entry.rung == self.rungs - 1 and entry.rung in entry.results
            if not last and entry.results.get(entry.rung) is not None and entry.trial is not None:
                self.pruned.append((entry.trial, entry.rung))
                self.inner.prune(Job(entry.trial, stop_at=self.fraction(entry.rung), rung=entry.rung))
        self._finished = True


def rank_order(values: list[list[float]]) -> list[int]:
    """Indices from best to worst, all objectives minimised: by non-dominated
    front, then by crowding distance (larger first) within a front. One
    objective reduces to sorting by value."""
    if not values:
        return []
    if len(values[0]) == 1:
        return sorted(range(len(values)), key=lambda i: values[i][0])
    order: list[int] = []
    remaining = list(range(len(values)))
    while remaining:
        front = [i for i in remaining if not any(_dominates(values[j], values[i]) for j in remaining if j != i)]
        distance = _crowding(values, front)
        order += sorted(front, key=lambda i: -distance[i])
        remaining = [i for i in remaining if i not in set(front)]
    return order


def _dominates(a: list[float], b: list[float]) -> bool:
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def _crowding(values: list[list[float]], front: list[int]) -> dict[int, float]:
    distance = {i: 0.0 for i in front}
    for m in range(len(values[front[0]])):
        ordered = sorted(front, key=lambda i: values[i][m])
        low, high = values[ordered[0]][m], values[ordered[-1]][m]
        distance[ordered[0]] = distance[ordered[-1]] = math.inf
        if high == low:
            continue
        for before, here, after in zip(ordered, ordered[1:], ordered[2:]):
            distance[here] += (values[after][m] - values[before][m]) / (high - low)
    return distance


def _hyperband_brackets(rungs: int, eta: int, total: int) -> list[tuple[int, int]]:
    """(starting rung, trials) per bracket: bracket s starts at rung s with
    about ``eta**(rungs-1-s) * rungs / (rungs - s)`` trials (Li et al. 2018),
    scaled so the brackets together start ``total`` trials."""
    raw = [math.ceil(rungs / (rungs - s) * eta ** (rungs - 1 - s)) for s in range(rungs)]
    scale = total / sum(raw)
    return [(s, max(1, round(n * scale))) for s, n in enumerate(raw)]
