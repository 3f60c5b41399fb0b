"""Which trials are one arm, and how an arm is named. Torch-free.

One way of naming arms for every reader of results: ``compare`` and ``fit``
on the command line, the run summary, the report and the live app. An arm is
named by the axes that vary (a swept learning rate aside), ``a=x, b=y``. A
protocol's baseline (``arm=baseline``) also says which protocol matched it
and what model it is, from what the store recorded (``match`` and the spec):
an iso-param and an iso-FLOP baseline of one looped point share their axes
but are two models, so two arms. Rows alike but for their family or match
kind get that appended. Rows are dicts with ``axes`` (a dict), and where the
store has them ``family``, ``match`` and ``spec`` (a dict or JSON text).
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from archsearch.units import axis_value

# The match kinds of a protocol's baseline arm (planner._baseline_arm), as a reader names them.
PROTOCOLS = {"iso_param": "iso-param", "iso_flop": "iso-FLOP"}


def decoded(value):
    """A JSON column as the store holds it (text) or already decoded."""
    return json.loads(value) if isinstance(value, str) else value


def arm_axes(rows: list[dict]) -> list[str]:
    """Axis names whose value differs between the trials that have them, in first-seen order.

    A swept learning rate is tuning, not an arm, so it never splits one; an
    axis that is absent or None for a trial (one that applies to another
    family only) does not count as a value.
    """
    names: dict[str, set] = {}
    # rows of one arm often share one decoded dict (the report's rows): read each once
    for axes in {id(row["axes"]): row["axes"] for row in rows}.values():
        for name, value in axes.items():
            if name == "lr" or value is None:
                continue
            names.setdefault(name, set()).add(repr(value))
    return [name for name, values in names.items() if len(values) > 1]


def axis_text(row: dict, axis: str) -> str:
    """The value of ``axis`` for a row as every view shows it (raw, unescaped).

    A protocol's baseline (``arm=baseline``) says which protocol matched it
    and what model it is: an iso-param and an iso-FLOP baseline are two arms.
    """
    if axis == "arm" and row.get("match") in PROTOCOLS:
        return baseline_text(row)
    return axis_value(row["axes"].get(axis))


def baseline_text(row: dict) -> str:
    """``baseline (iso-FLOP: 8-layer stack)``: a protocol baseline's protocol and model."""
    protocol = PROTOCOLS[row["match"]]
    spec = decoded(row.get("spec")) or {}
    if "layers" not in spec:  # a table without the spec (a CSV) still knows the protocol
        return f"baseline ({protocol})"
    layers = len(spec["layers"])
    structure = spec.get("structure", "stack")
    if structure == "stack":
        model = f"{layers}-layer stack"
    elif structure == "universal":
        model = f"Universal Transformer, {layers} layers x {(spec.get('options') or {}).get('steps', '?')} steps"
    else:
        model = f"{structure}, {layers} layers"
    return f"baseline ({protocol}: {model})"


def arm_label(row: dict, axes: list[str], *, separator: str = ", ", bare: bool = False) -> str:
    """The arm of a row: ``a=x, b=y`` over the ``axes`` that apply to it
    (raw, unescaped; ``bare``: the values only, ``x y``); a protocol's
    baseline always says which it is."""
    parts = [axis_text(row, a) if bare else f"{a}={axis_text(row, a)}"
             for a in axes if row["axes"].get(a) is not None]
    if row.get("match") in PROTOCOLS and "arm" not in axes:
        parts.append(baseline_text(row))
    return separator.join(parts) or str(row.get("family", "all"))


def arm_labels(rows: list[dict], axes: list[str] | None = None, *, separator: str = ", ",
               bare: bool = False) -> list[str]:
    """``arm_label`` of each row (over ``arm_axes(rows)`` unless ``axes`` are
    given), worked out once per distinct axes dict, family and match.

    Rows of different families or match kinds that the axes alone would
    label alike (a transformer matched on FLOPs and one matched on
    parameters, in one store) get what differs appended, so that no two
    arms share a label, a colour or a fit.
    """
    axes = arm_axes(rows) if axes is None else axes
    seen: dict[tuple, str] = {}
    keys = []
    for row in rows:
        key = (id(row["axes"]), row.get("family"), row.get("match"))
        if key not in seen:
            seen[key] = arm_label(row, axes, separator=separator, bare=bare)
        keys.append(key)
    _tell_apart(seen)
    return [seen[key] for key in keys]


def _tell_apart(labels: dict[tuple, str]) -> None:
    """Append the family or match kind to labels that several (axes, family, match) keys share."""
    for where, name in ((1, "family"), (2, "matched on")):
        shared: dict[str, set] = defaultdict(set)
        for key, label in labels.items():
            shared[label].add(key[where])
        for key, label in labels.items():
            if len(shared[label]) > 1:
                labels[key] = f"{label} ({name} {key[where]})"


def table_rows(table: Any) -> list[dict]:
    """What naming an arm reads of each row of an Arrow table: ``axes``
    (decoded, None values dropped: an Arrow struct gives every row every
    field), ``family``, ``match`` and ``spec`` where the table has them."""
    names = [c for c in ("family", "match", "spec") if c in table.column_names]
    columns = {c: table.column(c).to_pylist() for c in names}
    texts = table.column("axes").to_pylist() if "axes" in table.column_names else [None] * table.num_rows
    axes: dict[str, dict] = {}  # arms repeat their axes: one dict per distinct text, as the report's rows
    rows = []
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            value = {k: v for k, v in (text or {}).items() if v is not None}
        else:
            if text not in axes:
                axes[text] = {k: v for k, v in json.loads(text).items() if v is not None}
            value = axes[text]
        rows.append({"axes": value, **{c: columns[c][i] for c in names}})
    return rows
