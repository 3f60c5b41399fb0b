"""Expand a space into its points: grids, ranges, conditions, derived values
and constraints, all before any model is sized or trained. Torch-free.

A point is a flat mapping of dotted axis names (``taper.shape``) and derived
names to values. Expressions see dots as underscores (``taper_shape``).
"""

from __future__ import annotations

import itertools
import json
import math
import random
from typing import Any

from pydantic import TypeAdapter, ValidationError

from archsearch.errors import SpecError
from archsearch.space.expr import Expr, ExprError, order_derived, parse
from archsearch.space.schema import FAMILY_AXES, MAMBA2_AXES, Axes, Axis, Space, Study
from archsearch.units import axes_text

MAX_POINTS = 100_000
# Trials one study may plan (points x targets x seeds x learning rates x arms):
# counted before any is solved, so a study that could never run fails in a second.
MAX_TRIALS = 10_000


def expression_name(axis_name: str) -> str:
    return axis_name.replace(".", "_")


def axes_of(space: Space) -> dict[str, Axis]:
    """Every axis of the space by dotted name, in declaration order."""
    out: dict[str, Axis] = {}

    def walk(model: Any, prefix: str) -> None:
        for name in type(model).model_fields:
            value = getattr(model, name)
            if isinstance(value, Axis):
                out[prefix + name] = value
            else:
                walk(value, f"{prefix}{name}.")

    walk(space.axes, "")
    return out


def axis_values(space: Space, name: str, axis: Axis) -> list:
    """The concrete values of one axis (a range is gridded or sampled, then typed)."""
    if axis.values is not None:
        return list(axis.values)
    if axis.grid is None and axis.sample is None:
        raise _origin_error(space, ("axes", *name.split(".")),
                            "a range needs exactly one of grid: N or sample: N for a grid search",
                            "add grid: N or sample: N, or set search.sampler to sample the range itself")
    lo, hi = (math.log(axis.low), math.log(axis.high)) if axis.log else (axis.low, axis.high)
    if axis.grid is not None:
        raw = [lo + (hi - lo) * i / max(1, axis.grid - 1) for i in range(axis.grid)]
    else:
        rng = random.Random(f"{space.seed}:{name}")
        raw = [rng.uniform(lo, hi) for _ in range(axis.sample)]
    raw = [math.exp(v) for v in raw] if axis.log else raw
    adapter = _adapter(name)
    typed = []
    for value in raw:
        value = round(value) if is_int_axis(name) else value
        try:
            value = adapter.validate_python(value)
        except ValidationError as err:
            raise _origin_error(space, ("axes", *name.split(".")),
                                f"range gives {value!r}: {err.errors()[0]['msg']}", "narrow low/high") from None
        if value not in typed:
            typed.append(value)
    return typed


def expand(space: Space) -> list[dict[str, Any]]:
    """Every point of ``space`` after conditions, family relevance, derived
    values and constraints, without duplicates. Raises SpecError on bad
    expressions, a space too large to list, or a space left empty."""
    axes = axes_of(space)
    compiled = compile_expressions(space)
    values = {name: axis_values(space, name, axis) for name, axis in axes.items()}
    size = math.prod(len(v) for v in values.values())
    if size > MAX_POINTS:
        raise _origin_error(space, ("axes",), f"the grid has {size:,} points (limit {MAX_POINTS:,})",
                            "use sample: N on wide ranges, or fewer values")
    names = list(values)
    points, seen, rejected = [], set(), 0
    for combo in itertools.product(*(values[n] for n in names)):
        point = _resolve(space, dict(zip(names, combo)), axes, compiled)
        if point is None:
            rejected += 1
            continue
        key = json.dumps(point, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            points.append(point)
    if not points:
        raise _origin_error(space, ("constraints",), f"the constraints leave no point ({rejected:,} rejected)",
                            "loosen a constraint or widen an axis")
    return points


def resolve_point(space: Space, raw: dict[str, Any], compiled: dict | None = None) -> dict[str, Any] | None:
    """One proposed point (raw axis values, e.g. from a sampler) after
    conditions, family relevance, derived values and constraints; None where
    a constraint rejects it. Axes left out of ``raw`` take their defaults."""
    axes = axes_of(space)
    compiled = compiled if compiled is not None else compile_expressions(space)
    point = {}
    for name, axis in axes.items():
        if name in raw:
            point[name] = raw[name]
        elif axis.values is not None:
            point[name] = axis.values[0]
    return _resolve(space, point, axes, compiled)


def check_trial_count(study: Study, points: list[dict] | None = None) -> None:
    """Refuse a study that would plan more than ``MAX_TRIALS`` trials, before any is solved.

    Without ``points`` only the factors every point shares are counted
    (targets x seeds x learning rates), so a ladder of 1,000 targets times
    20,000 seeds fails before the space is even expanded; with them, the exact
    count (a looped point under a protocol is two arms).
    """
    recipe_lr = study.recipe.lr
    factors = {("budget", "targets"): (len(study.budget.target_list()), "target"),
               ("seeds",): (len(study.seeds), "seed"),
               ("recipe", "lr"): (1 if isinstance(recipe_lr, float) else len(recipe_lr.sweep), "learning rate")}
    if points is not None:
        # a protocol pairs looped and hrm points with a baseline arm (planner.PAIRED)
        arms = sum(2 if study.budget.protocol != "none" and p["family"] in ("looped", "hrm") else 1 for p in points)
        factors = {("space", "axes"): (arms, "point"), **factors}
    total = math.prod(count for count, _ in factors.values())
    if total <= MAX_TRIALS:
        return
    shown = " x ".join(f"{count:,} {noun}{'s' if count != 1 else ''}" for count, noun in factors.values())
    message = f"the study plans {total:,} trials ({shown}; limit {MAX_TRIALS:,})"
    hint = "fewer targets, seeds or learning rates, or sample: N on wide axes"
    loc = max(factors, key=lambda key: factors[key][0])
    if loc == ("space", "axes"):
        raise _origin_error(study.space, ("axes",), message, hint)
    if study._origin is None:
        raise SpecError(message, field=".".join(loc), hint=hint)
    raise study._origin.error(message, loc=loc, hint=hint)


def compile_expressions(space: Space) -> dict:
    """Parse every ``when``, derived value and constraint once, checking names."""
    axes = axes_of(space)
    known = {expression_name(n) for n in axes}
    out: dict = {"when": {}, "derived": [], "constraints": []}
    for name, axis in axes.items():
        if axis.when is not None:
            out["when"][name] = _parse(space, ("axes", *name.split("."), "when"), axis.when, known)
    everything = known | set(space.derived)
    derived = {name: _parse(space, ("derived", name), text, everything) for name, text in space.derived.items()}
    try:
        order = order_derived(space.derived, known)
    except ExprError as err:
        raise _origin_error(space, ("derived",), err.message, err.hint or "check the derived values") from None
    out["derived"] = [(name, derived[name]) for name in order]
    for index, text in enumerate(space.constraints):
        out["constraints"].append((index, _parse(space, ("constraints", index), text, everything)))
    return out


def _resolve(space: Space, point: dict, axes: dict[str, Axis], compiled: dict) -> dict | None:
    env = {expression_name(k): None for k in axes}
    env.update({expression_name(k): v for k, v in point.items()})
    for name, expr in compiled["when"].items():
        if not _evaluate(space, ("axes", *name.split("."), "when"), expr, env):
            point.pop(name, None)
    family = point.get("family", "transformer")
    point = {k: v for k, v in point.items() if k in FAMILY_AXES[family]}
    _canonical(point)
    # an axis this point does not have reads as None, so "family != 'looped'
    # or loops > 1" works for every family
    env = {expression_name(k): None for k in axes}
    env.update({expression_name(k): v for k, v in point.items()})
    for name, expr in compiled["derived"]:
        value = _evaluate(space, ("derived", name), expr, env)
        dotted = next((a for a in axes if expression_name(a) == name), None)
        if dotted is not None:
            value = _typed(space, dotted, value)
            if dotted in FAMILY_AXES[family]:
                point[dotted] = value
        else:
            point[name] = value
        env[name] = value
    for index, expr in compiled["constraints"]:
        if not _evaluate(space, ("constraints", index), expr, env):
            return None
    _check_placement(space, point)
    return point


def _check_placement(space: Space, point: dict) -> None:
    """A memory placed after a layer the point does not have is the user's mistake, not a build error."""
    placement = point.get("memory.placement")
    if point["family"] != "memory" or placement is None or placement < point["num_layers"]:
        return
    raise _origin_error(space, ("axes", "memory", "placement"),
                        f"memory placement {placement} is past the top layer "
                        f"(num_layers={point['num_layers']} has layers 0..{point['num_layers'] - 1})",
                        "lower it, or add a constraint: 'memory_placement < num_layers'")


def _canonical(point: dict) -> None:
    """Settings that cannot matter for this point are pinned or dropped, so
    points that build the same model collapse into one."""
    if point.get("taper.shape") == "uniform":
        point["taper.ratio"] = 1.0  # a uniform taper has no ratio
    if point["family"] == "hybrid":
        if point.get("hybrid.pattern"):  # a written pattern replaces the ratio
            point.pop("hybrid.ratio", None)
            point.pop("hybrid.mixer", None)
        else:
            point.pop("hybrid.pattern", None)
    if point["family"] == "looped" and not point.get("hybrid.pattern"):
        point["hybrid.pattern"] = "A"
    if point["family"] == "looped" and not point.get("exit_gate"):  # the gate's options need a gate
        for name in ("exit_threshold", "cache_hole", "exit_entropy"):
            point.pop(name, None)
    if point.get("mlp") == "none":  # no MLP: nothing to taper
        point["taper.shape"], point["taper.ratio"] = "uniform", 1.0
    if point["family"] in ("hybrid", "looped") and "S" not in point.get("hybrid.pattern", "") \
            and point.get("hybrid.mixer") != "mamba2":  # no Mamba-2 layer reads these
        for name in MAMBA2_AXES:
            point.pop(name, None)


def _typed(space: Space, dotted: str, value: Any) -> Any:
    try:
        return _adapter(dotted).validate_python(value)
    except ValidationError as err:
        raise _origin_error(space, ("derived", expression_name(dotted)),
                            f"gives {value!r} for axis {dotted}: {err.errors()[0]['msg']}",
                            "fix the expression") from None


def _parse(space: Space, loc: tuple, text: str, known: set[str]) -> Expr:
    try:
        expr = parse(text)
    except ExprError as err:
        raise _origin_error(space, loc, f"bad expression: {err.message}", err.hint or "") from None
    for name in sorted(expr.names - known):
        from archsearch.errors import did_you_mean

        raise _origin_error(space, loc, f"unknown name '{name}' in expression",
                            did_you_mean(name, known) or f"known: {', '.join(sorted(known))}")
    return expr


def _evaluate(space: Space, loc: tuple, expr: Expr, env: dict) -> Any:
    try:
        return expr.evaluate(env)
    except ExprError as err:
        where = axes_text(env, separator=", ")
        raise _origin_error(space, loc, f"{err.message} (at {where})", err.hint or "") from None


_ADAPTERS: dict[str, TypeAdapter] = {}


def _adapter(dotted: str) -> TypeAdapter:
    """The value type of one axis, taken from the schema's Axis[...] annotation."""
    if dotted not in _ADAPTERS:
        model: Any = Axes
        parts = dotted.split(".")
        for part in parts[:-1]:
            model = model.model_fields[part].annotation
        annotation = model.model_fields[parts[-1]].annotation
        axis_type = annotation.__origin__ if hasattr(annotation, "__metadata__") else annotation
        inner = axis_type.model_fields["values"].annotation.__args__[0].__args__[0]
        _ADAPTERS[dotted] = TypeAdapter(inner)
    return _ADAPTERS[dotted]


def is_int_axis(dotted: str) -> bool:
    try:
        _adapter(dotted).validate_python(1.5, strict=True)
    except ValidationError:
        return True
    return False


def check_axis_value(space: Space, name: str, value: Any) -> Any:
    """``value`` typed as axis ``name`` takes it, or a SpecError at that axis."""
    try:
        return _adapter(name).validate_python(value)
    except ValidationError as err:
        raise axis_error(space, name, f"range gives {value!r}: {err.errors()[0]['msg']}", "narrow low/high") from None


def axis_error(space: Space, name: str, message: str, hint: str) -> SpecError:
    """A SpecError at axis ``name`` (dotted) of ``space``'s file."""
    return _origin_error(space, ("axes", *name.split(".")), message, hint)


def _origin_error(space: Space, loc: tuple, message: str, hint: str) -> SpecError:
    origin = space._origin
    if origin is None:
        field = ".".join(str(p) for p in loc)
        return SpecError(message, field=field, hint=hint or None)
    return origin.error(message, loc=loc, hint=hint or None)
