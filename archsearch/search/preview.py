"""What a study's search will run, said before it runs (``archsearch plan``): the sampler, how
many points it proposes and the space they come from, the fidelity rungs, and the training
FLOPs all that implies, at most and as expected.

A grid's points are known: its FLOPs are summed over its planned trials. A sampler's are not:
``draws`` points are drawn at random from the same distributions the sampler draws from
(Optuna's RandomSampler, the search's seed) and planned, and each proposal is taken to cost
what they cost: at most the dearest drawn point, as expected their mean. With fidelity rungs,
a trial trains first to the lowest rung and goes on only if promoted, so the expected FLOPs
count the share of its budget an average trial trains under the rule (``trained_share``); the
most is every trial trained to its end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from archsearch.errors import SpecError
from archsearch.planner import PlannedTrial, plan, plan_points
from archsearch.space.expand import axes_of, compile_expressions, expand, resolve_point
from archsearch.space.schema import Study

# points a sampler's preview draws to estimate what a proposal costs
DRAWS = 32


@dataclass(frozen=True, kw_only=True)
class SearchPlan:
    """A study's search, before it runs. ``space``: the points it draws from, in words;
    ``points``: how many, where they are countable; ``rungs``: the share of each trial's tokens
    it trains to at each rung (None without fidelity); ``sample``: the trials of the drawn points
    (a sampler) or the whole grid."""

    sampler: str
    proposals: int  # points it will propose: search.trials, or all of a smaller space's
    space: str
    points: int | None
    trials_per_proposal: float
    rungs: list[float] | None
    fidelity: str | None
    most_flops: float
    expected_flops: float
    infeasible: int = 0  # drawn points no width reaches a budget target at
    asked: int | None = None  # search.trials (a sampler): more than ``proposals`` where the space runs out
    sample: list[PlannedTrial] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"sampler": self.sampler, "proposals": self.proposals, "space": self.space, "points": self.points,
                "trials_per_proposal": self.trials_per_proposal, "rungs": self.rungs, "fidelity": self.fidelity,
                "most_train_flops": self.most_flops, "expected_train_flops": self.expected_flops,
                "infeasible_drawn": self.infeasible, "trials_asked": self.asked,
                "sample": [t.to_dict() for t in self.sample]}


def plan_search(study: Study, *, draws: int = DRAWS) -> SearchPlan:
    """What ``study``'s search proposes and trains (see the module's docstring)."""
    search = study.search
    fidelity = search.fidelity
    rungs = [fidelity.eta ** -(fidelity.rungs - 1 - k) for k in range(fidelity.rungs)] if fidelity else None
    points = _count_points(study)
    if search.sampler == "grid":
        trials = plan(study)
        trained = [t for t in trials if t.same_as is None]
        most = sum(t.train_flops for t in trained)
        share = trained_share(fidelity.kind, fidelity.rungs, fidelity.eta, len(trained)) if fidelity else 1.0
        return SearchPlan(sampler="grid", proposals=points or 0, space=_space_words(study, points), points=points,
                          trials_per_proposal=len(trials) / max(1, points or 1), rungs=rungs,
                          fidelity=fidelity.kind if fidelity else None, most_flops=most,
                          expected_flops=most * share, sample=trials)
    drawn, infeasible = _drawn(study, draws)
    costs = [sum(t.train_flops for t in planned) for planned in drawn] or [0.0]
    per_point = len(study.budget.target_list()) * len(study.seeds)
    proposals = search.trials if points is None else min(search.trials, points)  # distinct points only
    share = trained_share(fidelity.kind, fidelity.rungs, fidelity.eta, proposals * per_point) if fidelity else 1.0
    return SearchPlan(sampler=search.sampler, proposals=proposals, space=_space_words(study, points),
                      points=points, trials_per_proposal=sum(map(len, drawn)) / max(1, len(drawn)), rungs=rungs,
                      fidelity=fidelity.kind if fidelity else None, most_flops=proposals * max(costs),
                      expected_flops=proposals * (sum(costs) / len(costs)) * share, infeasible=infeasible,
                      asked=search.trials,
                      sample=[t for planned in drawn for t in planned])


def trained_share(kind: str, rungs: int, eta: int, total: int) -> float:
    """The mean share of its full token budget a trial trains under successive halving (ASHA
    alike): a share eta^-k of the trials reaches rung k, whose budget is eta^-(rungs-1-k);
    Hyperband by its brackets, each starting at its own rung."""
    budget = [eta ** -(rungs - 1 - k) for k in range(rungs)]

    def bracket(start: int) -> float:  # a trial's expected share in a bracket starting at rung ``start``
        return sum(eta ** -(k - start) * (budget[k] - (budget[k - 1] if k > start else 0.0))
                   for k in range(start, rungs))

    if kind != "hyperband":
        return bracket(0)
    from archsearch.search.halving import _hyperband_brackets

    brackets = _hyperband_brackets(rungs, eta, max(1, total))
    return sum(n * bracket(s) for s, n in brackets) / sum(n for _, n in brackets)


def _drawn(study: Study, draws: int) -> tuple[list[list[PlannedTrial]], int]:
    """The planned trials of ``draws`` points drawn as a random sampler draws them, and how many
    drawn points could not be planned (no width reaches a target there)."""
    import optuna

    from archsearch.search.sampled import suggest_point

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    axes, compiled = axes_of(study.space), compile_expressions(study.space)
    sampler = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=study.search.seed))
    planned, infeasible, seen = [], 0, set()
    for _ in range(draws * 20):  # constraints may reject draws
        if len(planned) + infeasible >= draws:
            break
        point = resolve_point(study.space, suggest_point(sampler.ask(), axes, compiled), compiled)
        key = repr(sorted(point.items())) if point is not None else None
        if point is None or key in seen:
            continue
        seen.add(key)
        try:
            planned.append(plan_points(study, [point]))
        except SpecError:
            infeasible += 1
    return planned, infeasible


def _count_points(study: Study) -> int | None:
    """The space's points where every axis is a list (conditions and constraints applied), else None."""
    if any(axis.values is None for axis in axes_of(study.space).values()):
        return None
    try:
        return len(expand(study.space))
    except SpecError:  # too many to list
        return None


def _space_words(study: Study, points: int | None) -> str:
    if points is not None:
        return f"{points:,} points"
    parts = []
    for name, axis in axes_of(study.space).items():
        if axis.values is None:
            parts.append(f"{name} in [{_number(axis.low)}, {_number(axis.high)}]{' (log)' if axis.log else ''}")
        elif len(axis.values) > 1:
            parts.append(f"{name} ({len(axis.values)} values)")
    return "ranges: " + " x ".join(parts)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


__all__ = ["SearchPlan", "plan_search", "trained_share"]
