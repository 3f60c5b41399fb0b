"""What a sampled search learnt, from the proposals it stored (``Store.proposals``).

``history``: each finished proposal's objective values in the order they were asked, with the
best so far, what optuna-dashboard calls the optimisation history. ``importance``: how much
each axis mattered to each objective, by Optuna's PED-ANOVA evaluator (Watanabe et al. 2023,
https://arxiv.org/abs/2304.10255), which needs neither scikit-learn nor a fitted surrogate:
it compares the distribution of each axis' values among the best proposals (the top 10%)
with its distribution among all of them. Optuna is imported when ``importance`` runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# PED-ANOVA compares the top quantile with all: below this many proposals there is no top to speak of
MIN_FOR_IMPORTANCE = 8


@dataclass(frozen=True, kw_only=True)
class Objective:
    name: str
    minimise: bool

    @classmethod
    def parse(cls, label: str) -> Objective:
        name, _, direction = label.partition(":")
        return cls(name=name, minimise=direction != "max")


def finished(proposals: list[dict]) -> list[dict]:
    """The proposals with values (completed), in the order they were asked, fields decoded."""
    out = []
    for row in sorted(proposals, key=lambda r: r["number"]):
        decoded = {**row, **{k: json.loads(row[k]) if isinstance(row[k], str) else row[k]
                             for k in ("point", "objectives", "values", "trial_ids")}}
        if decoded["state"] == "completed" and decoded["values"]:
            out.append(decoded)
    return out


def history(proposals: list[dict]) -> dict[str, dict[str, list]]:
    """Per objective: the proposals' numbers, their values, and the best value so far (by the
    objective's direction), over the finished proposals in the order they were asked."""
    rows = finished(proposals)
    if not rows:
        return {}
    out = {}
    for i, label in enumerate(rows[0]["objectives"]):
        objective = Objective.parse(label)
        pick = min if objective.minimise else max
        values = [float(r["values"][i]) for r in rows]
        best = [pick(values[:k + 1]) for k in range(len(values))]
        out[label] = {"number": [r["number"] for r in rows], "value": values, "best": best}
    return out


def importance(proposals: list[dict]) -> dict[str, dict[str, float]]:
    """Per objective, each axis that varies among the finished proposals and its importance
    (PED-ANOVA, summing to 1 over the axes); empty below ``MIN_FOR_IMPORTANCE`` proposals."""
    rows = finished(proposals)
    if len(rows) < MIN_FOR_IMPORTANCE:
        return {}
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    distributions = _distributions([r["point"] for r in rows])
    if not distributions:
        return {}
    out = {}
    for i, label in enumerate(rows[0]["objectives"]):
        objective = Objective.parse(label)
        study = optuna.create_study(direction="minimize" if objective.minimise else "maximize")
        for row in rows:
            params = {name: _param(row["point"][name], dist) for name, dist in distributions.items()
                      if name in row["point"]}
            study.add_trial(optuna.trial.create_trial(
                params=params, distributions={n: distributions[n] for n in params}, value=float(row["values"][i])))
        found = optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
        out[label] = {name: float(value) for name, value in found.items()}
    return out


def _distributions(points: list[dict[str, Any]]) -> dict[str, Any]:
    """An Optuna distribution per axis that varies: a range over the numbers it took, else a
    choice of the values (as text) it took."""
    import optuna

    seen: dict[str, list] = {}
    for point in points:
        for name, value in point.items():
            seen.setdefault(name, []).append(value)
    out = {}
    for name, values in seen.items():
        if len({json.dumps(v, sort_keys=True, default=str) for v in values}) < 2:
            continue
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            if all(isinstance(v, int) for v in values):
                out[name] = optuna.distributions.IntDistribution(min(values), max(values))
            else:
                out[name] = optuna.distributions.FloatDistribution(min(values), max(values))
        else:
            out[name] = optuna.distributions.CategoricalDistribution(sorted({_text(v) for v in values}))
    return out


def _param(value: Any, distribution: Any) -> Any:
    import optuna

    return _text(value) if isinstance(distribution, optuna.distributions.CategoricalDistribution) else value


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


__all__ = ["history", "importance"]
