"""Plan a study: every trial it would run, with solved widths, and no training.

A trial is a point of the space x a budget target x a seed. Its id hashes the
resolved spec, recipe, data and seed, so the same work always has the same id
and a store never trains it twice.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from typing import Any

from archsearch import __version__
from archsearch.arch.families import spec_maker
from archsearch.arch.spec import ArchSpec
from archsearch.budget import BudgetError, count_params, flops_per_token, solve_params
from archsearch.space.schema import Space, Study

BYTE_VOCAB = 256


@dataclass(frozen=True, kw_only=True)
class PlannedTrial:
    """One trial, fully resolved: what to build, train on, and match."""

    trial_id: str
    study: str
    axes: dict[str, Any]
    seed: int
    match: str
    target: float
    params: int  # non-embedding
    total_params: int
    flops_per_token: float  # training FLOPs per token at the study's seq_len
    match_error: float  # params / target - 1
    spec: ArchSpec
    recipe: dict
    data: dict

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("trial_id", "study", "axes", "seed", "match", "target", "params",
                                            "total_params", "flops_per_token", "match_error")}
        out.update(d_model=self.spec.d_model, num_layers=self.spec.num_layers,
                   mlp_widths=list(self.spec.mlp_widths), spec=self.spec.to_dict(),
                   recipe=self.recipe, data=self.data)
        return out


def grid(space: Space) -> list[dict[str, Any]]:
    """Every point of the space's axes, as flat dotted names -> value.

    A uniform taper has no ratio, so its ratio is pinned to 1.0 and the
    duplicate points that would differ only in ratio collapse into one.
    """
    axes = _flatten(space.axes.model_dump())
    names = list(axes)
    points, seen = [], set()
    for values in itertools.product(*(axes[n] for n in names)):
        point = dict(zip(names, values))
        if point.get("taper.shape") == "uniform":
            point["taper.ratio"] = 1.0
        key = json.dumps(point, sort_keys=True)
        if key not in seen:
            seen.add(key)
            points.append(point)
    return points


def plan(study: Study) -> list[PlannedTrial]:
    """Every trial of ``study`` with solved widths; builds no torch module.

    Raises ``SpecError`` (pointing at the budget target) when a target cannot
    be reached.
    """
    space = study.space
    vocab = vocab_size(study.data.model_dump())
    recipe, data = study.recipe.model_dump(), study.data.model_dump()
    trials, seen = [], set()
    for point in grid(space):
        make = spec_maker(space, point, vocab_size=vocab)
        for index, target in enumerate(study.budget.targets):
            try:
                solution = solve_params(target=target, make_spec=make, num_layers=point["num_layers"],
                                        head_dim=space.model.head_dim, mlp_ratio=space.model.mlp_ratio,
                                        multiple_of=space.model.multiple_of, tolerance=study.budget.tolerance)
            except BudgetError as err:
                raise _budget_error(study, index, point, err) from None
            for seed in study.seeds:
                trial = _trial(study, point, seed, target, solution.spec, recipe, data)
                if trial.trial_id not in seen:
                    seen.add(trial.trial_id)
                    trials.append(trial)
    return trials


def vocab_size(data: dict) -> int:
    """The vocabulary a data config implies, without loading the data."""
    return data["vocab_size"] if "vocab_size" in data else BYTE_VOCAB


def trial_id(spec: ArchSpec, recipe: dict, data: dict, seed: int) -> str:
    """Hash of everything that determines a trial's result."""
    blob = json.dumps({"spec": spec.to_dict(), "recipe": recipe, "data": data, "seed": seed}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _trial(study: Study, point: dict, seed: int, target: float, spec: ArchSpec,
           recipe: dict, data: dict) -> PlannedTrial:
    params = count_params(spec)
    return PlannedTrial(
        trial_id=trial_id(spec, recipe, data, seed), study=study.name, axes=point, seed=seed,
        match=study.budget.match, target=target, params=params,
        total_params=count_params(spec, embeddings=True),
        flops_per_token=flops_per_token(spec, seq_len=study.data.seq_len, kind="train"),
        match_error=params / target - 1, spec=spec, recipe=recipe, data=data)


def _budget_error(study: Study, index: int, point: dict, err: BudgetError) -> Exception:
    from archsearch.errors import SpecError

    where = ", ".join(f"{k}={v}" for k, v in point.items())
    message = f"impossible budget for trial ({where}): {err}"
    origin = study._origin
    if origin is None:
        return SpecError(message, field=f"budget.targets[{index}]", hint=err.hint)
    return origin.error(message, loc=("budget", "targets", index), hint=err.hint)


def _flatten(tree: dict, prefix: str = "") -> dict[str, list]:
    out: dict[str, list] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


__all__ = ["PlannedTrial", "grid", "plan", "trial_id", "vocab_size", "__version__"]
