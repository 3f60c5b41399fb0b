"""Strict JSON for every ``--json`` of the command line: JSON has no NaN or infinity, and a
parser that follows the standard rejects the ``NaN``/``Infinity`` that ``json.dumps`` writes.
Torch-free, and light enough to import before any command runs."""

from __future__ import annotations

import json
import math


def strict_json(value: object, **dumps_options) -> str:
    """``value`` as strict JSON: every NaN or infinity (which ``json.dumps`` writes as the
    non-JSON ``NaN``/``Infinity``) becomes ``null``, in lists and mappings at any depth; objects
    JSON has no type for are written as their ``str``. What every ``--json`` prints."""

    def clean(item: object) -> object:
        if isinstance(item, float):
            return item if math.isfinite(item) else None
        if isinstance(item, dict):
            return {key: clean(inner) for key, inner in item.items()}
        if isinstance(item, (list, tuple)):
            return [clean(inner) for inner in item]
        if type(item).__module__ == "numpy" and hasattr(item, "item"):  # numpy scalars and 0-d arrays
            return clean(item.item())
        return item

    return json.dumps(clean(value), allow_nan=False, default=str, **dumps_options)
