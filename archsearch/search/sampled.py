"""A sampled search: Optuna's samplers, asked for one point at a time.

Each proposal is one point of the space, drawn from the axes' own
distributions (listed values as choices, ranges as int or float ranges, log
where the axis says so; conditional axes are only drawn where they exist).
The point is planned like any other (every budget target and seed), its
trials run, and the sampler is told the mean of each objective over them.
Samplers that support it are told nothing yet of trials still running, but
TPE's constant liar keeps parallel proposals apart.

Every proposal is a point not proposed before: a sampler that proposes a
point again is told the value that point has (once it has one) and asked for
another; after ``REPEATS_BEFORE_FILL`` repeats in a row, a space of listed
values has one of its points not yet proposed put to the sampler. A space
counts as run out (``ran_out``) once every point of a space of listed values
has been proposed, or after ``MAX_REPEATS`` repeats in a row.

The sampler's history lives in an Optuna journal file beside the store, so a
killed driver loses nothing: ``resume`` re-runs the proposals that were still
running and asks for new ones only after them, never repeating a finished one.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from archsearch.errors import SpecError
from archsearch.planner import PlannedTrial, plan_points
from archsearch.search._base import Job
from archsearch.search.objectives import objective_values, parse_objectives
from archsearch.space.expand import (
    axes_of,
    axis_error,
    check_axis_value,
    compile_expressions,
    expand,
    expression_name,
    is_int_axis,
    resolve_point,
)
from archsearch.space.expr import ExprError
from archsearch.space.schema import FAMILY_AXES, Axis, Study

# consecutive proposals the constraints may reject before the search gives up
MAX_REJECTIONS = 1000
# consecutive proposals of points proposed before, after which the space counts as run out
MAX_REPEATS = 200
# consecutive repeats after which a space of listed values has one of its points not yet
# proposed put to the sampler (Optuna's enqueue_trial), so N trials reach N points quickly
REPEATS_BEFORE_FILL = 10
# the row of a trial a multi-fidelity search stopped short of its budget
_PRUNED: dict = {"pruned": True}


def search_journal(store: str | Path, study: str) -> Path:
    """Where a study's sampler history lives: ``STORE.search/STUDY.journal``
    beside the store (named after the whole file name, so two stores never share it)."""
    store = Path(store).resolve()
    return store.parent / f"{store.name}.search" / f"{study}.journal"


@dataclass
class _Proposal:
    number: int  # Optuna's trial number
    point: dict[str, Any]
    trials: list[PlannedTrial]
    waiting: set[str] = field(default_factory=set)
    rows: dict[str, dict | None] = field(default_factory=dict)
    repeats: list[int] = field(default_factory=list)  # Optuna trials that proposed this point again
    paused: dict[str, tuple[int, list[float]]] = field(default_factory=dict)  # trial id -> rung, its values
    told_paused: bool = False  # the sampler heard it was pruned at a rung; it may still be promoted


class SampledSearch:
    """Ask-and-tell over an Optuna study kept in ``journal``.

    ``known``: trial id -> store row of trials finished before (any study), so
    a proposal that plans an already trained trial is scored without training.
    """

    def __init__(self, study: Study, *, journal: Path, known: dict[str, dict]):
        optuna = _optuna()
        if not isinstance(study.recipe.lr, (int, float)):
            raise _study_error(study, ("recipe", "lr"), "a learning-rate sweep cannot be combined with a sampler",
                               "give one lr, or use search.sampler: grid")
        self.study = study
        self.objectives = parse_objectives(study.search.objectives)
        self.budget = study.search.trials
        self.known = known
        self.records: list[dict] = []  # finished proposals, for the store
        self.ladder: dict | None = None  # (the Searcher protocol's: no ladder, no rungs, nothing pruned)
        self.pruned: list[tuple[PlannedTrial, int]] = []
        self.rungs = 1
        self._axes = axes_of(study.space)
        self._compiled = compile_expressions(study.space)
        self._check_ranges()
        journal.parent.mkdir(parents=True, exist_ok=True)
        directions = [o.direction for o in self.objectives]
        with _experimental_allowed():
            storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
            self._optuna = optuna.create_study(study_name=study.name, storage=storage, load_if_exists=True,
                                               directions=directions, sampler=_sampler(study.search))
        if [d.name.lower() for d in self._optuna.directions] != directions:
            raise _study_error(study, ("search", "objectives"),
                               f"this study's search began with other objectives (journal {journal})",
                               "keep the objectives, or give the study a new name")
        self._queue: list[PlannedTrial] = []
        self._open: dict[int, _Proposal] = {}
        self._awaiting: dict[str, list[int]] = {}  # trial id -> proposals waiting for it
        history = self._optuna.get_trials(deepcopy=False)
        self.counted = sum(1 for t in history if t.user_attrs.get("counted"))
        self._seen = {point_key(t.user_attrs["point"]): t.number for t in history
                      if t.user_attrs.get("counted") and "point" in t.user_attrs}  # point -> its proposal
        self._outcomes = {t.number: _outcome(t) for t in history  # a finished proposal's outcome, for its repeats
                          if t.user_attrs.get("counted") and t.state.is_finished()}
        self._points = _listed_points(study)  # None where the space has ranges
        self.space_points = None if self._points is None else len(self._points)
        self._fill_rng = random.Random(study.search.seed)
        self.ran_out = False
        self.notes: list[str] = []
        self._resume_running()

    # the Searcher protocol

    def ask(self, n: int) -> list[Job]:
        out: list[Job] = []
        while len(out) < n:
            if self._queue:
                out.append(Job(self._queue.pop(0)))
            elif not self._propose():
                break
        return out

    def tell(self, job: Job, result: dict | None) -> None:
        row = None if result is None else {**job.trial.to_dict(), **result}
        self._record(job.trial.trial_id, row)

    def pause(self, job: Job, result: dict) -> None:
        """``job``'s trial stopped at its rung and waits. Once every trial of its proposal
        waits or ended, the sampler is told the proposal was pruned at that rung (with the
        rung's value, for one objective), as Optuna's own pruners tell TPE: so a sampler
        under ASHA learns from the rungs, not only from the few trials that reach the end.
        Should the rungs promote the proposal to the end later, its final value is told too."""
        values = objective_values(self.objectives, {**job.trial.to_dict(), **result})
        for number in self._awaiting.get(job.trial.trial_id, []):
            proposal = self._open.get(number)
            if proposal is None or proposal.told_paused or values is None:
                continue
            proposal.paused[job.trial.trial_id] = (job.rung, values)
            if {t.trial_id for t in proposal.trials} <= set(proposal.paused) | set(proposal.rows):
                self._tell_paused(proposal)

    def prune(self, job: Job) -> None:
        self._record(job.trial.trial_id, _PRUNED)

    def take(self, ids: set[str]) -> list[PlannedTrial]:
        """Remove queued trials ``ids`` and return them; their proposals still wait for them."""
        taken = [t for t in self._queue if t.trial_id in ids]
        self._queue = [t for t in self._queue if t.trial_id not in ids]
        return taken

    @property
    def expected(self) -> int:
        per_point = len(self.study.budget.target_list()) * len(self.study.seeds)
        return max(1, self._proposals_left() * per_point + len(self._queue))

    @property
    def exhausted(self) -> bool:
        return not self._queue and not self._proposals_left()

    def _proposals_left(self) -> int:
        """Proposals still to ask for: to ``trials``, and no more than the points not yet proposed."""
        if self.ran_out:
            return 0
        left = self.budget - self.counted
        if self.space_points is not None:
            left = min(left, self.space_points - len(self._seen))
        return max(0, left)

    @property
    def best(self) -> list:
        """Optuna's best trials (one, or the Pareto set for several objectives)."""
        return self._optuna.best_trials

    # proposing

    def _propose(self) -> bool:
        """Ask the sampler for one new point and queue its trials; False when
        the trial budget is spent."""
        from optuna.trial import TrialState

        if not self._proposals_left():
            self._note_ran_out()
            return False
        rejected = repeated = 0
        while True:
            with _experimental_allowed():
                trial = self._optuna.ask()
                point = resolve_point(self.study.space, suggest_point(trial, self._axes, self._compiled),
                                      self._compiled)
            if point is None:
                trial.set_user_attr("rejected", "a constraint rejects this point")
                self._optuna.tell(trial, state=TrialState.FAIL)
                rejected += 1
                if rejected >= MAX_REJECTIONS:
                    break
                continue
            key = point_key(point)
            if key in self._seen:
                trial.set_user_attr("repeat_of", self._seen[key])
                self._repeat(trial.number, self._seen[key])
                repeated += 1
                if repeated % REPEATS_BEFORE_FILL == 0:
                    self._fill()
                if repeated >= MAX_REPEATS:
                    self.ran_out = True
                    self._note_ran_out()
                    return False
                continue
            self._seen[key] = trial.number
            trial.set_user_attr("counted", True)
            trial.set_user_attr("point", json.loads(json.dumps(point, default=str)))
            self.counted += 1
            try:
                planned = plan_points(self.study, [point])
            except SpecError as err:  # e.g. no width reaches a budget target at this depth
                trial.set_user_attr("infeasible", err.message)
                self._optuna.tell(trial, state=TrialState.FAIL)
                self._outcomes[trial.number] = ("fail", None)
                return True
            trial.set_user_attr("trial_ids", [t.trial_id for t in planned])
            self._open_proposal(trial.number, point, planned)
            return True
        raise _study_error(self.study, ("constraints",),
                           f"the sampler proposed {MAX_REJECTIONS} points in a row that the constraints reject",
                           "loosen the constraints or narrow the axes they cut")

    def _repeat(self, repeat: int, number: int) -> None:
        """Optuna trial ``repeat`` proposes the point of proposal ``number`` again: it is told
        that proposal's outcome, now or once it has one, and counts for nothing."""
        if number in self._open:
            self._open[number].repeats.append(repeat)
        else:
            self._tell_outcome(repeat, self._outcomes.get(number))

    def _tell_outcome(self, number: int, outcome: tuple[str, list[float] | None] | None) -> None:
        """Tell trial ``number`` an outcome (state, values) another trial had; none known: failed."""
        from optuna.trial import TrialState

        state, values = outcome or ("fail", None)
        if state == "complete":
            self._optuna.tell(number, values, skip_if_finished=True)
        else:
            self._optuna.tell(number, state=TrialState.PRUNED if state == "pruned" else TrialState.FAIL,
                              skip_if_finished=True)

    def _fill(self) -> None:
        """Put a point of the space not yet proposed to the sampler, for its next proposal."""
        if self._points is None:
            return
        unseen = [point for point in self._points if point_key(point) not in self._seen]
        if unseen:
            self._optuna.enqueue_trial(self._fill_rng.choice(unseen))

    def _note_ran_out(self) -> None:
        """Say once, where the space has fewer points than ``trials``, that it ran out."""
        if self.notes or self.counted >= self.budget:
            return
        why = (f"the space holds {self.space_points} points" if self.space_points is not None
               else f"the sampler proposed {MAX_REPEATS} points in a row that it had proposed before")
        self.notes.append(f"the space ran out after {self.counted} of {self.budget} proposals: {why}")

    def _check_ranges(self) -> None:
        space = self.study.space
        for name, axis in self._axes.items():
            if axis.values is None and is_int_axis(name):
                if math.ceil(axis.low) > math.floor(axis.high):
                    raise axis_error(space, name, f"no integer lies in [{axis.low}, {axis.high}]", "widen the range")
                check_axis_value(space, name, math.ceil(axis.low))
                check_axis_value(space, name, math.floor(axis.high))
            elif axis.values is None:
                check_axis_value(space, name, axis.low)
                check_axis_value(space, name, axis.high)

    # bookkeeping

    def _open_proposal(self, number: int, point: dict, planned: list[PlannedTrial]) -> None:
        proposal = _Proposal(number=number, point=point, trials=planned)
        self._open[number] = proposal
        for trial in planned:
            proposal.waiting.add(trial.trial_id)
            in_flight = trial.trial_id in self._awaiting
            self._awaiting.setdefault(trial.trial_id, []).append(number)
            known = self.known.get(trial.trial_id)
            if known is not None and known.get("status") == "completed":
                self._record(trial.trial_id, known)
            elif not in_flight:
                self._queue.append(trial)

    def _record(self, trial_id: str, row: dict | None) -> None:
        for number in self._awaiting.pop(trial_id, []):
            proposal = self._open.get(number)
            if proposal is None:
                continue
            proposal.rows[trial_id] = row
            proposal.waiting.discard(trial_id)
            if not proposal.waiting:
                self._close(self._open.pop(number))

    def _tell_paused(self, proposal: _Proposal) -> None:
        """Tell the sampler ``proposal`` was pruned at the lowest rung its trials wait at."""
        import optuna
        from optuna.trial import TrialState

        rung = min(r for r, _ in proposal.paused.values())
        at_rung = [values[0] for r, values in proposal.paused.values() if r == rung]
        frozen = self._optuna.get_trials(deepcopy=False)[proposal.number]
        handle = optuna.trial.Trial(self._optuna, frozen._trial_id)
        if len(self.objectives) == 1:  # Optuna keeps intermediate values for one objective only
            handle.report(sum(at_rung) / len(at_rung), step=rung)
        handle.set_user_attr("paused_at_rung", rung)
        self._optuna.tell(proposal.number, state=TrialState.PRUNED, skip_if_finished=True)
        proposal.told_paused = True

    def _tell_continued(self, proposal: _Proposal, values: list[float]) -> None:
        """A proposal told pruned at a rung reached the end after all: its value goes in as a
        trial of its own at the same point (not counted as a proposal)."""
        import optuna

        frozen = self._optuna.get_trials(deepcopy=False)[proposal.number]
        with _experimental_allowed():
            self._optuna.add_trial(optuna.trial.create_trial(
                params=frozen.params, distributions=frozen.distributions, values=values,
                user_attrs={"continues": proposal.number}))

    def _close(self, proposal: _Proposal) -> None:
        """Tell the sampler (and the proposal's repeats) its mean objectives over its trials."""
        record = dict(number=proposal.number, point=proposal.point, trial_ids=list(proposal.rows),
                      objectives=[o.label for o in self.objectives])
        scored = [objective_values(self.objectives, row) if row is not None and row is not _PRUNED else None
                  for row in proposal.rows.values()]
        if any(row is _PRUNED for row in proposal.rows.values()):
            outcome, state = ("pruned", None), "pruned"
        elif any(values is None for values in scored):
            outcome, state = ("fail", None), "failed"
        else:
            outcome, state = ("complete", [sum(column) / len(column) for column in zip(*scored)]), "completed"
        for number in [proposal.number, *proposal.repeats]:
            self._tell_outcome(number, outcome)
        if proposal.told_paused and outcome[0] == "complete":
            self._tell_continued(proposal, outcome[1])
        self._outcomes[proposal.number] = outcome
        self.records.append(dict(record, values=outcome[1], state=state))

    def _resume_running(self) -> None:
        """Proposals a dead driver left running: re-plan them (their trial ids
        come out the same) and queue what is not finished, before anything new."""
        from optuna.trial import TrialState

        running = self._optuna.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        for trial in running:
            point = trial.user_attrs.get("point")
            if "repeat_of" in trial.user_attrs:
                continue
            if point is None or "trial_ids" not in trial.user_attrs:
                self._optuna.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
                continue
            self._open_proposal(trial.number, point, plan_points(self.study, [point]))
        for trial in self._optuna.get_trials(deepcopy=False, states=(TrialState.PRUNED,)):
            # told pruned at a rung, its trials still waiting there in the store: the rungs may go on
            point, ids = trial.user_attrs.get("point"), trial.user_attrs.get("trial_ids", [])
            if "paused_at_rung" in trial.user_attrs and any(
                    self.known.get(i, {}).get("status") == "paused" for i in ids):
                self._open_proposal(trial.number, point, plan_points(self.study, [point]))
                self._open[trial.number].told_paused = True
        for trial in running:  # repeats once the proposals they repeat are open again
            if "repeat_of" in trial.user_attrs:
                self._repeat(trial.number, trial.user_attrs["repeat_of"])


def _listed_points(study: Study) -> list[dict] | None:
    """Every point of a space whose axes are all lists (conditions and constraints applied);
    None where an axis is a range or the points are too many to list."""
    if any(axis.values is None for axis in axes_of(study.space).values()):
        return None
    try:
        return expand(study.space)
    except SpecError:
        return None


def point_key(point: dict) -> str:
    """One text per point, the same for a point and its copy read back from the journal."""
    return json.dumps(point, sort_keys=True, default=str)


def _outcome(trial: Any) -> tuple[str, list[float] | None]:
    """A finished Optuna trial's outcome as a repeat of its point is told it."""
    state = trial.state.name.lower()
    return (state, list(trial.values)) if state == "complete" else (state, None)


def suggest_point(trial: Any, axes: dict[str, Axis], compiled: dict) -> dict[str, Any]:
    """One point drawn through an Optuna ``trial``: a value per axis the point has, family first
    (``axes`` and ``compiled`` as ``axes_of`` and ``compile_expressions`` give them)."""
    raw = {"family": _draw(trial, "family", axes["family"])}
    relevant = FAMILY_AXES[raw["family"]]
    env = {expression_name(name): None for name in axes}
    env.update(family=raw["family"])
    for name, axis in axes.items():
        if name == "family" or name not in relevant:
            continue
        when = compiled["when"].get(name)
        if when is not None and not _holds(when, env):
            continue
        raw[name] = _draw(trial, name, axis)
        env[expression_name(name)] = raw[name]
    return raw


def _draw(trial: Any, name: str, axis: Axis) -> Any:
    if axis.values is not None:
        if len(axis.values) == 1:
            return axis.values[0]
        return trial.suggest_categorical(name, list(axis.values))
    if is_int_axis(name):
        return trial.suggest_int(name, math.ceil(axis.low), math.floor(axis.high), log=axis.log)
    return trial.suggest_float(name, axis.low, axis.high, log=axis.log)


def _holds(expr: Any, env: dict) -> bool:
    """A ``when`` condition on what is drawn so far; one that needs a later
    axis counts as true here and is decided when the point is resolved."""
    try:
        return bool(expr.evaluate(env))
    except (ExprError, TypeError):
        return True


def _sampler(search: Any) -> Any:
    optuna = _optuna()
    seed, budget = search.seed, search.trials
    startup = max(2, min(10, budget // 4))
    samplers = optuna.samplers
    if search.sampler == "random":
        return samplers.RandomSampler(seed=seed)
    if search.sampler == "tpe":
        return samplers.TPESampler(seed=seed, n_startup_trials=startup, multivariate=True, constant_liar=True)
    if search.sampler == "nsga2":
        return samplers.NSGAIISampler(seed=seed, population_size=max(4, min(50, budget // 4)))
    if search.sampler == "cmaes":
        return samplers.CmaEsSampler(seed=seed, n_startup_trials=startup, warn_independent_sampling=False)
    return samplers.GPSampler(seed=seed, n_startup_trials=startup)


def _optuna():
    """optuna, imported on first use; a missing install fails loudly with the fix."""
    try:
        import optuna
    except ImportError as err:  # pragma: no cover - optuna is a dependency
        raise ImportError("a sampled search needs optuna: pip install optuna") from err
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


@contextlib.contextmanager
def _experimental_allowed():
    """Optuna's ExperimentalWarning (the journal storage, TPE's multivariate and constant-liar
    options, the GP sampler: features chosen on purpose) silenced inside only; the caller's
    warning filters are as they were outside."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=_optuna().exceptions.ExperimentalWarning)
        yield


def _study_error(study: Study, loc: tuple, message: str, hint: str) -> SpecError:
    origin = study._origin
    if origin is None:
        return SpecError(message, field=".".join(map(str, loc)), hint=hint)
    return origin.error(message, loc=loc, hint=hint)
