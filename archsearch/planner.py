"""Plan a study: every trial it would run, with solved widths, and no training.

A trial is a point of the space x a budget target x a seed (x an arm, for
the looped and HRM protocols). Its id hashes the resolved spec, recipe, data
and seed (and a baseline's partner), so the same work always has the same id
and a store never trains it twice. Every trial is matched on one measure and
reports all of them.

Two trials of different arms can still train the very same model: the
iso_param baseline of a looped point (its group applied once) is the same
stack for loops=1, 2 and 4, only its partner differs. Such twins keep their
own ids and rows (each arm is complete in the store), but share one
training: ``train_key`` leaves the partner out, and every trial after the
first with a key names that first one in ``same_as``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from typing import Any

from archsearch import __version__
from archsearch.arch.families import SpecMaker, layer_count, spec_maker
from archsearch.arch.spec import ArchSpec
from archsearch.arch.structures.memory_counts import overhead as memory_overhead
from archsearch.budget.memory import MemoryEstimate, estimate_memory, readable_bytes
from archsearch.budget import (
    BudgetError,
    Solution,
    count_params,
    flops_per_token,
    solve,
    state_size,
)
from archsearch.data import seq_len_of, vocab_size_of
from archsearch.errors import SpecError
from archsearch.space.expand import check_trial_count, expand
from archsearch.space.schema import Study
from archsearch.space.training import deciding, planned_steps
from archsearch.units import axes_text


@dataclass(frozen=True, kw_only=True)
class PlannedTrial:
    """One trial, fully resolved: what to build, train on, and match."""

    trial_id: str
    study: str
    axes: dict[str, Any]
    seed: int
    match: str  # params | flops | state, or iso_param / iso_flop for a protocol's baseline arm
    target: float
    achieved: float  # the matched measure of this trial
    match_error: float  # achieved / target - 1
    params: int  # non-embedding
    total_params: int
    flops_per_token: float  # training FLOPs per token at the study's seq_len
    state: int | None  # values kept per sequence at seq_len (None: no formula yet)
    sweep_group: str | None  # trials differing only in lr share it (recipe.lr: {sweep: [...]})
    spec: ArchSpec
    recipe: dict
    data: dict
    tokens: int = 0  # training tokens the recipe gives it (steps x batch_size x seq_len)
    same_as: str | None = None  # an earlier planned trial that trains the identical model: its result is shared
    eval_flops: float = 0.0  # forward FLOPs of every evaluation the recipe makes
    memory: MemoryEstimate | None = None  # estimated peak training memory, by part (budget.memory)

    @property
    def train_key(self) -> str:
        """Hash of what determines the trained weights and metrics (spec, recipe, data, seed), without
        the partner a baseline's id adds: trials with equal keys train once and share the result."""
        return training_key(self.spec.to_dict(), self.recipe, self.data, self.seed)

    @property
    def train_flops(self) -> float:
        """Training FLOPs of the whole trial: FLOPs per token x tokens."""
        return self.flops_per_token * self.tokens

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("trial_id", "study", "axes", "seed", "match", "target", "achieved",
                                            "match_error", "params", "total_params", "flops_per_token", "state",
                                            "sweep_group", "tokens", "train_flops", "eval_flops", "same_as")}
        out["peak_memory"] = self.memory.to_dict() if self.memory is not None else None
        out.update(family=self.spec.family, structure=self.spec.structure, d_model=self.spec.d_model,
                   num_layers=self.spec.num_layers, mlp_widths=list(self.spec.mlp_widths),
                   spec=self.spec.to_dict(), recipe=self.recipe, data=self.data)
        if self.spec.structure == "memory":  # the paper reports it: "+3.7% parameters"
            out["memory_overhead"] = memory_overhead(self.spec)
        return out


def plan(study: Study) -> list[PlannedTrial]:
    """Every trial of ``study`` with solved widths; builds no torch module.

    Raises ``SpecError`` (pointing at the budget target, naming the trial)
    when a target cannot be reached: every trial's exact measure is within
    ``budget.tolerance`` of its target, or the plan is refused.
    """
    check_trial_count(study)  # targets x seeds x learning rates, before the space is expanded
    return plan_points(study, expand(study.space))


def memory_limit(study: Study) -> tuple[int | None, str]:
    """The bytes one trial may use and where that comes from: ``execution.memory``, else this
    machine's memory for a CPU trial (None for a GPU trial without ``execution.memory``)."""
    import os

    if study.execution.memory is not None:
        return study.execution.memory, "execution.memory"
    if study.execution.gpus:
        return None, ""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "this machine's memory"
    except (ValueError, OSError):
        return None, ""


def check_memory(study: Study, trials: list[PlannedTrial]) -> None:
    """Refuse a plan with a trial whose estimated peak (``budget.memory``) exceeds ``memory_limit``,
    naming the trial, its estimate by part and the fix; ``execution.memory_check: false`` skips it."""
    limit, source = memory_limit(study)
    if limit is None or not study.execution.memory_check:
        return
    workers = study.execution.workers_per_trial  # each worker holds the model and reads batch / workers rows
    for trial in trials:
        need = trial.memory.total - (workers - 1) * (trial.memory.activations + trial.memory.logits) // workers
        if need <= limit:
            continue
        parts = ", ".join(f"{name} {readable_bytes(value)}" for name, value in trial.memory.to_dict().items()
                          if name != "total")
        message = (f"trial {trial.trial_id} ({', '.join(f'{k}={v}' for k, v in trial.axes.items())}) needs about "
                   f"{readable_bytes(need)} at its training peak ({parts}), more than the {readable_bytes(limit)} of "
                   f"{source}")
        hint = ("lower recipe.batch_size or data.seq_len, raise recipe.grad_accum, or pass --ignore-memory "
                "(execution.memory_check: false) if the estimate is wrong")
        if study._origin is None:
            raise SpecError(message, field="recipe.batch_size", hint=hint)
        raise study._origin.error(message, loc=("recipe", "batch_size"), hint=hint)


def plan_points(study: Study, points: list[dict[str, Any]]) -> list[PlannedTrial]:
    """The trials of given resolved points (``expand`` or a sampler's
    proposals): each point at every budget target and seed. Refuses more
    than ``MAX_TRIALS`` of them before any is solved."""
    check_trial_count(study, points)
    space, budget = study.space, study.budget
    recipes = _recipes(study.recipe.model_dump())
    data = study.data.model_dump()
    vocab, seq_len = _data_sizes(study, data)
    measure = _measure(budget.match, seq_len=seq_len, embeddings=budget.count_embeddings)
    trials, seen = [], set()

    def add(axes: dict, seed: int, arm: Arm, partner: ArchSpec | None, index: int) -> None:
        # a protocol's baseline belongs to its partner: two partners never share one baseline trial
        def paired(recipe: dict) -> str | None:
            return trial_id(partner, recipe, data, seed) if partner is not None else None

        swept = dict(recipes[0], lr="sweep")
        group = trial_id(arm.spec, swept, data, seed, paired(swept)) if len(recipes) > 1 else None
        for recipe in recipes:
            arm_axes = dict(axes, lr=recipe["lr"]) if group else axes
            pair = paired(recipe)
            trial = _trial(study, arm_axes, seed, arm, recipe, data, seq_len, group, pair)
            if abs(trial.match_error) > budget.tolerance:
                raise _budget_error(study, index, arm_axes, BudgetError(
                    f"achieves {trial.achieved:.6g} against {trial.target:.6g} ({trial.match_error:+.2%}), "
                    f"outside the tolerance of {budget.tolerance:.2%}", hint="raise budget.tolerance"))
            if trial.trial_id not in seen:
                seen.add(trial.trial_id)
                trials.append(trial)

    for point in points:
        make = spec_maker(point, space.model, vocab_size=vocab)
        solver = _solver(study, point)
        for index, target in enumerate(budget.target_list()):
            try:
                solution = solver(target=target, make_spec=make, measure=measure)
                arms = [Arm(point["family"], budget.match, target, solution.achieved, solution.spec)]
                if budget.protocol != "none" and point["family"] in PAIRED:
                    arms.append(_baseline_arm(study, point, make, solution.spec, solver, seq_len))
            except BudgetError as err:
                raise _budget_error(study, index, point, err) from None
            except ValueError as err:  # the point makes no valid model (HRM with one layer)
                raise _point_error(study, point, err) from None
            _check_carry(study, solution.spec)
            for arm in arms:
                axes = dict(point, arm=arm.name) if len(arms) > 1 else point
                partner = arms[0].spec if arm.name == "baseline" else None
                for seed in study.seeds:
                    add(axes, seed, arm, partner, index)
    trials = _mark_twins(trials)
    check_memory(study, trials)
    return trials


def _mark_twins(trials: list[PlannedTrial]) -> list[PlannedTrial]:
    """Each trial that trains the same model as an earlier one gets ``same_as`` = that one's id."""
    first: dict[str, str] = {}
    out = []
    for trial in trials:
        owner = first.setdefault(trial.train_key, trial.trial_id)
        out.append(trial if owner == trial.trial_id else replace(trial, same_as=owner))
    return out


def twin_lines(trials: list[PlannedTrial]) -> list[str]:
    """What ``plan`` and ``run`` say about twins: a count, then one line per arm that trains
    for others, naming the arms that share its training by the axes where they differ from it
    (axes every trial shares left out, seeds folded together). Empty when no two trials train
    the same model."""
    twins = [t for t in trials if t.same_as is not None]
    if not twins:
        return []
    by_id = {t.trial_id: t for t in trials}
    values: dict[str, set[str]] = {}
    for trial in trials:
        for name, value in trial.axes.items():
            values.setdefault(name, set()).add(repr(value))
    varying = {name for name, seen in values.items() if len(seen) > 1}
    shared: dict[str, dict[str, set[int]]] = {}  # the owner's arm -> the arms sharing its training -> seeds
    for twin in twins:
        owner = by_id[twin.same_as].axes
        differ = {k: v for k, v in twin.axes.items() if k in owner and owner[k] != v}
        arm = _arm_label({k: v for k, v in owner.items() if k in varying})
        shared.setdefault(arm, {}).setdefault(_arm_label(differ), set()).add(twin.seed)
    lines = [f"{len(twins)} of {len(trials)} planned trials are duplicates: each trains the same model "
             "(spec, data, recipe, seed) as another arm's trial, so it shares that training and gets its row from it"]
    for owner, arms in shared.items():
        seeds = sorted(set().union(*arms.values()))
        lines.append(f"  {owner} trains once for: {'; '.join(arms)} ({sum(map(len, arms.values()))} trials, "
                     f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))})")
    return lines


def _arm_label(axes: dict) -> str:
    return axes_text(axes) or "the same axes"


@dataclass(frozen=True)
class Arm:
    """One model a point and target plan: the point's own, or a protocol's baseline."""

    name: str
    match: str
    target: float
    achieved: float
    spec: ArchSpec


# the families a protocol pairs with a baseline: looped with a plain stack, HRM with the Universal Transformer
PAIRED = ("looped", "hrm")


def _solver(study: Study, point: dict):
    """``solve`` with the space's width rules filled in; takes target, make_spec, measure (and overrides)."""
    model, budget = study.space.model, study.budget

    # a point's own width (a derived d_model) is fixed: the budget solves its MLPs alone
    fixed = point.get("d_model")

    def solver(**kwargs) -> Solution:
        settings = dict(num_layers=layer_count(point), head_dim=model.head_dim, mlp_ratio=model.mlp_ratio,
                        multiple_of=model.multiple_of, tolerance=budget.tolerance,
                        solve_for="mlp" if fixed else budget.solve_for, d_model=fixed or model.d_model)
        return solve(**{**settings, **kwargs})

    return solver


def _data_sizes(study: Study, data: dict) -> tuple[int, int]:
    """Vocabulary and sequence length, from archsearch.data (a task's class knows them); its
    errors name a field but no file, so they get the study's file and line here."""
    try:
        return vocab_size_of(data), seq_len_of(data)
    except SpecError as err:
        if err.path is not None or err.field is None or study._origin is None:
            raise
        raise study._origin.error(err.message, loc=tuple(err.field.split(".")), hint=err.hint) from None


def _recipes(recipe: dict) -> list[dict]:
    """One recipe per swept learning rate (or the recipe itself)."""
    lr = recipe["lr"]
    if isinstance(lr, dict):
        return [dict(recipe, lr=value) for value in lr["sweep"]]
    return [recipe]


def _baseline_arm(study: Study, point: dict, make: SpecMaker, partner: ArchSpec, solver, seq_len: int) -> Arm:
    """The protocol's comparison model for a looped or HRM trial, width-solved to it.

    Looped k x L: iso_param is the same k layers applied once, iso_flop is
    L x k distinct layers; HRM (N cycles of T fast steps): the Universal
    Transformer over the same layers for N * T steps (the HRM-LM paper's
    unrolled depth). The baseline's MLP width is then solved at the
    partner's d_model (d_model too, if that cannot reach it) so it has the
    partner's parameters (iso_param) or training FLOPs (iso_flop), per-loop
    heads and gates included.
    """
    protocol = study.budget.protocol  # seq_len: the data's (a task keeps its own in params)
    embeddings = study.budget.count_embeddings
    if point["family"] == "looped":
        copies = 1 if protocol == "iso_param" else partner.options["loops"]

        def make_baseline(d: int, width: int) -> ArchSpec:
            looped = make(d, width)
            return replace(looped, structure="stack", options={}, layers=looped.layers * copies)
    else:
        steps = partner.options["N"] * partner.options["T"]

        def make_baseline(d: int, width: int) -> ArchSpec:
            return replace(make(d, width), family="universal", structure="universal", options={"steps": steps})
    measure = _measure("params" if protocol == "iso_param" else "flops", seq_len=seq_len, embeddings=embeddings)
    target = measure(partner)
    try:
        solution = solver(target=target, make_spec=make_baseline, measure=measure, solve_for="mlp",
                          d_model=partner.d_model)
    except BudgetError:
        try:
            solution = solver(target=target, make_spec=make_baseline, measure=measure)
        except BudgetError as err:
            raise BudgetError(f"its {protocol} baseline: {err}", closest=err.closest, hint=err.hint) from None
    return Arm("baseline", protocol, target, solution.achieved, solution.spec)


def _measure(match: str, *, seq_len: int, embeddings: bool):
    if match == "params":
        return lambda spec: count_params(spec, embeddings=embeddings)
    if match == "flops":
        return lambda spec: flops_per_token(spec, seq_len=seq_len, kind="train")
    return lambda spec: state_size(spec, seq_len=seq_len)


def trial_id(spec: ArchSpec, recipe: dict, data: dict, seed: int, pair: str | None = None) -> str:
    """Hash of everything that determines a trial's result (and, for a protocol's baseline, the
    id of the trial it is the baseline of)."""
    return _digest(spec.to_dict(), recipe, data, seed, pair)


def training_key(spec: dict, recipe: dict, data: dict, seed: int) -> str:
    """The ``train_key`` of a trial given as the dicts a store keeps: its id without a partner."""
    return _digest(spec, recipe, data, seed, None)


def _digest(spec: dict, recipe: dict, data: dict, seed: int, pair: str | None) -> str:
    described = {"spec": spec, "recipe": deciding(recipe), "data": data, "seed": seed}
    if pair is not None:
        described["pair"] = pair
    blob = json.dumps(described, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _trial(study: Study, axes: dict, seed: int, arm: Arm, recipe: dict, data: dict, seq_len: int,
           sweep_group: str | None, pair: str | None) -> PlannedTrial:
    spec = arm.spec
    steps = planned_steps(recipe, params=count_params(spec), seq_len=seq_len)
    try:
        state = state_size(spec, seq_len=seq_len)
    except NotImplementedError:
        state = None
    return PlannedTrial(
        trial_id=trial_id(spec, recipe, data, seed, pair), study=study.name, axes=axes, seed=seed,
        match=arm.match, target=arm.target, achieved=arm.achieved, match_error=arm.achieved / arm.target - 1,
        params=count_params(spec), total_params=count_params(spec, embeddings=True),
        flops_per_token=flops_per_token(spec, seq_len=seq_len), state=state, sweep_group=sweep_group, spec=spec,
        recipe=recipe, data=data, tokens=steps * recipe["batch_size"] * seq_len,
        eval_flops=evaluations(recipe, steps) * recipe["eval_batches"] * recipe["batch_size"] * seq_len
        * flops_per_token(spec, seq_len=seq_len, kind="forward"),
        memory=estimate_memory(spec, batch_size=recipe["batch_size"], grad_accum=recipe["grad_accum"],
                               seq_len=seq_len))


def evaluations(recipe: dict, steps: int) -> int:
    """How many times training evaluates: every ``eval_every`` steps, and at the last step."""
    return steps // recipe["eval_every"] + (steps % recipe["eval_every"] != 0)


def _named(point: dict) -> str:
    return f"trial ({axes_text(point, separator=', ')})"


def _check_carry(study: Study, spec: ArchSpec) -> None:
    """A memory that carries its state across batches reads one text stream per batch row."""
    if spec.structure != "memory" or not spec.options.get("carry"):
        return
    if study.data.kind != "text":
        problem, loc, hint = (f"memory.carry needs text data (one stream per batch row), not {study.data.kind}",
                              ("data", "kind"), "use data.kind: text, or memory.carry: false")
    elif study.recipe.grad_accum != 1:
        problem, loc, hint = ("memory.carry keeps one state per batch row, so micro-batches cannot split rows",
                              ("recipe", "grad_accum"), "use recipe.grad_accum: 1")
    else:
        return
    if study._origin is None:
        raise SpecError(problem, field=".".join(loc), hint=hint)
    raise study._origin.error(problem, loc=loc, hint=hint)


def _budget_error(study: Study, index: int, point: dict, err: BudgetError) -> SpecError:
    message = f"impossible budget for {_named(point)}: {err}"
    origin = study._origin
    loc = ("budget", "targets", index) if isinstance(study.budget.targets, list) else ("budget", "targets")
    if origin is None:
        return SpecError(message, field=".".join(map(str, loc)), hint=err.hint)
    return origin.error(message, loc=loc, hint=err.hint)


def _point_error(study: Study, point: dict, err: ValueError) -> SpecError:
    message = f"{_named(point)} makes no valid model: {err}"
    hint = "change these axes, or add a constraint that excludes them"
    origin = study.space._origin
    if origin is None:
        return SpecError(message, field="space.axes", hint=hint)
    return origin.error(message, loc=("axes",), hint=hint)


__all__ = ["PlannedTrial", "check_memory", "plan", "plan_points", "training_key", "trial_id", "twin_lines", "__version__"]
