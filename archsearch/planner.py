"""Plan a study: every trial it would run, with solved widths, and no training.

A trial is a point of the space x a budget target x a seed (x an arm, for
looped protocols). Its id hashes the resolved spec, recipe, data and seed, so
the same work always has the same id and a store never trains it twice. Every
trial is matched on one measure and reports all of them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from typing import Any

from archsearch import __version__
from archsearch.arch.families import layer_count, spec_maker
from archsearch.arch.spec import ArchSpec
from archsearch.budget import (
    BudgetError,
    count_params,
    flops_per_token,
    solve,
    state_size,
)
from archsearch.data import seq_len_of, vocab_size_of
from archsearch.errors import SpecError
from archsearch.space.expand import check_trial_count, expand
from archsearch.space.schema import Study


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

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("trial_id", "study", "axes", "seed", "match", "target", "achieved",
                                            "match_error", "params", "total_params", "flops_per_token", "state",
                                            "sweep_group")}
        out.update(family=self.spec.family, structure=self.spec.structure, d_model=self.spec.d_model,
                   num_layers=self.spec.num_layers, mlp_widths=list(self.spec.mlp_widths),
                   spec=self.spec.to_dict(), recipe=self.recipe, data=self.data)
        return out


def plan(study: Study) -> list[PlannedTrial]:
    """Every trial of ``study`` with solved widths; builds no torch module.

    Raises ``SpecError`` (pointing at the budget target) when a target cannot
    be reached.
    """
    check_trial_count(study)  # targets x seeds x learning rates, before the space is expanded
    return plan_points(study, expand(study.space))


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

    def add(axes: dict, seed: int, match: str, target: float, achieved: float, spec: ArchSpec) -> None:
        group = trial_id(spec, dict(recipes[0], lr="sweep"), data, seed) if len(recipes) > 1 else None
        for recipe in recipes:
            arm_axes = dict(axes, lr=recipe["lr"]) if group else axes
            trial = _trial(study, arm_axes, seed, match, target, achieved, spec, recipe, data, seq_len, group)
            if trial.trial_id not in seen:
                seen.add(trial.trial_id)
                trials.append(trial)

    for point in points:
        make = spec_maker(point, space.model, vocab_size=vocab)
        for index, target in enumerate(budget.target_list()):
            try:
                solution = solve(target=target, make_spec=make, measure=measure, num_layers=layer_count(point),
                                 head_dim=space.model.head_dim, mlp_ratio=space.model.mlp_ratio,
                                 multiple_of=space.model.multiple_of, tolerance=budget.tolerance,
                                 solve_for=budget.solve_for, d_model=space.model.d_model)
            except BudgetError as err:
                raise _budget_error(study, index, point, err) from None
            arms = [("looped", point, budget.match, target, solution.achieved, solution.spec)]
            if budget.protocol != "none" and point["family"] == "looped":
                arms = [("looped", *arms[0][1:]), _baseline_arm(budget.protocol, point, solution.spec, seq_len)]
            for arm, axes, match, arm_target, achieved, spec in arms:
                axes = dict(axes, arm=arm) if len(arms) > 1 else axes
                for seed in study.seeds:
                    add(axes, seed, match, arm_target, achieved, spec)
    return trials


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


def _baseline_arm(protocol: str, point: dict, looped: ArchSpec, seq_len: int) -> tuple:
    """The protocol's comparison model for a looped trial.

    iso_param: the same k layers applied once (same parameters, fewer FLOPs);
    iso_flop: loops x k distinct layers (same FLOPs, more parameters).
    """
    loops = looped.options["loops"]
    layers = looped.layers if protocol == "iso_param" else looped.layers * loops
    baseline = replace(looped, structure="stack", options={}, layers=layers)
    if protocol == "iso_param":
        target, achieved = count_params(looped), count_params(baseline)
    else:
        target = flops_per_token(looped, seq_len=seq_len)
        achieved = flops_per_token(baseline, seq_len=seq_len)
    return ("baseline", point, protocol, target, achieved, baseline)


def _measure(match: str, *, seq_len: int, embeddings: bool):
    if match == "params":
        return lambda spec: count_params(spec, embeddings=embeddings)
    if match == "flops":
        return lambda spec: flops_per_token(spec, seq_len=seq_len, kind="train")
    return lambda spec: state_size(spec, seq_len=seq_len)


def trial_id(spec: ArchSpec, recipe: dict, data: dict, seed: int) -> str:
    """Hash of everything that determines a trial's result."""
    blob = json.dumps({"spec": spec.to_dict(), "recipe": recipe, "data": data, "seed": seed}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _trial(study: Study, axes: dict, seed: int, match: str, target: float, achieved: float, spec: ArchSpec,
           recipe: dict, data: dict, seq_len: int, sweep_group: str | None) -> PlannedTrial:
    try:
        state = state_size(spec, seq_len=seq_len)
    except NotImplementedError:
        state = None
    return PlannedTrial(
        trial_id=trial_id(spec, recipe, data, seed), study=study.name, axes=axes, seed=seed, match=match,
        target=target, achieved=achieved, match_error=achieved / target - 1, params=count_params(spec),
        total_params=count_params(spec, embeddings=True), flops_per_token=flops_per_token(spec, seq_len=seq_len),
        state=state, sweep_group=sweep_group, spec=spec, recipe=recipe, data=data)


def _budget_error(study: Study, index: int, point: dict, err: BudgetError) -> SpecError:
    where = ", ".join(f"{k}={v}" for k, v in point.items())
    message = f"impossible budget for trial ({where}): {err}"
    origin = study._origin
    loc = ("budget", "targets", index) if isinstance(study.budget.targets, list) else ("budget", "targets")
    if origin is None:
        return SpecError(message, field=".".join(map(str, loc)), hint=err.hint)
    return origin.error(message, loc=loc, hint=err.hint)


__all__ = ["PlannedTrial", "plan", "plan_points", "trial_id", "__version__"]
