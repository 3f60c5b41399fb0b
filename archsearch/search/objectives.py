"""What a search optimises: measures of a trial, each with a direction.

Every objective is computed from what the store keeps of a trial (its plan
and its result), so any finished trial can be scored again later.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# fp32 state: 4 bytes a value (``state`` counts values kept per sequence)
STATE_BYTES_PER_VALUE = 4


@dataclass(frozen=True)
class Objective:
    name: str  # one of archsearch.space.schema.OBJECTIVES
    direction: str  # "minimize" | "maximize"

    @property
    def label(self) -> str:
        return f"{self.name}:{'min' if self.direction == 'minimize' else 'max'}"


def parse_objectives(texts: list[str]) -> list[Objective]:
    """``["val_loss:min", "params:min"]`` -> objectives (the schema has checked the names)."""
    out = []
    for text in texts:
        name, _, way = text.partition(":")
        out.append(Objective(name, "minimize" if way == "min" else "maximize"))
    return out


def objective_values(objectives: list[Objective], row: dict) -> list[float] | None:
    """Each objective of one finished trial, from a row holding its plan and
    result (``params``, ``flops_per_token``, ``state``, ``val_loss``, ``train_loss``,
    ``tokens``, ``tokens_per_s``, ``val_accuracy``); None when one is missing or not finite
    (a diverged trial is never scored)."""
    values = []
    for objective in objectives:
        value = _measure(objective.name, row)
        if value is None or not math.isfinite(value):
            return None
        values.append(float(value))
    return values


def _measure(name: str, row: dict) -> float | None:
    if name == "train_flops":
        flops, tokens = row.get("flops_per_token"), row.get("tokens")
        return None if flops is None or tokens is None else flops * tokens
    if name == "gen_gap":  # as the store's trials read computes it (archsearch.store.schema.GEN_GAP)
        val, train = row.get("val_loss"), row.get("train_loss")
        return None if val is None or train is None else val - train
    if name == "state_bytes":
        state = row.get("state")
        return None if state is None else state * STATE_BYTES_PER_VALUE
    value = row.get(name)
    return None if value is None else float(value)
