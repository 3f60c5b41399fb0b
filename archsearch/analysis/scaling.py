"""Scaling-law fits over result tables: per family or any grouping column. Torch-free.

The variables come from columns: N from ``n_col``; D from ``d_col``, or
D = C / (6 N) when only training FLOPs are given; C from ``c_col``, or
``flops_per_token x D`` when the table has the store's ``flops_per_token``,
or 6 N D otherwise.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from archsearch.analysis.arms import arm_axes, arm_labels, table_rows
from archsearch.analysis.fit import bounded_points, fit_law
from archsearch.analysis.laws import ScalingFit, compute_multiplier, law_named
from archsearch.analysis.pareto import Front, pareto, parse_objectives
from archsearch.analysis.tables import as_table, decoded_rows, group_labels, numeric_column


@dataclass(frozen=True, kw_only=True)
class Fits:
    """Every fit of a table, and the (group, law) pairs that could not be fitted, with why."""

    fits: list[ScalingFit]
    skipped: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def get(self, group: str, law: str) -> ScalingFit:
        """The fit of ``law`` (N, C, ND) for ``group``; a one-line ValueError names those there are."""
        key = law_named(law).key
        for fit in self.fits:
            if fit.group == group and fit.law.key == key:
                return fit
        have = ", ".join(f"{f.group} {f.law.name}" for f in self.fits) or "none"
        raise ValueError(f"no {law_named(law).name} fit for '{group}'; fitted: {have}")

    def compute_multiplier(self, baseline: str, other: str, compute: float | None = None) -> dict:
        """The effective-compute multiplier of ``other`` over ``baseline`` (see
        ``fit.compute_multiplier``); at the largest compute both have reached by default."""
        base, them = self.get(baseline, "C"), self.get(other, "C")
        if compute is None:
            compute = min(base.ranges["C"][1], them.ranges["C"][1])
        return compute_multiplier(base, them, compute)

    def pair(self, text: str) -> tuple[str, str]:
        """``A,B`` as two fitted groups, split at the comma that leaves a group
        on each side (an arm's name holds commas: ``arm=looped, loops=2``)."""
        groups = {f.group for f in self.fits}
        for at in (i for i, c in enumerate(text) if c == ","):
            first, second = text[:at].strip(), text[at + 1:].strip()
            if first in groups and second in groups:
                return first, second
        raise ValueError(f"--compare '{text}': give two fitted groups as A,B, e.g. --compare transformer,mamba; "
                         f"fitted: {'; '.join(sorted(groups))}")

    def to_dict(self) -> dict:
        return {"fits": [f.to_dict() for f in self.fits], "skipped": self.skipped, "notes": self.notes}


def fit_scaling(data: Any, *, laws: Sequence[str] = ("N", "C", "ND"), by: str | None = "family",
                pool_arms: bool = False, loss_col: str = "val_loss", n_col: str | None = "params",
                d_col: str | None = "tokens", c_col: str | None = None, drop_highest: int = 0,
                bootstrap: int = 200, level: float = 0.95, seed: int = 0, grid: bool = True,
                progress: Callable[[str], None] | None = None) -> Fits:
    """Fit each of ``laws`` to each group of ``data`` (any table; see ``tables.as_table``).

    ``by`` is a column or a store axis (None: one group, ``all``). A fit
    runs over one arm: a group that holds several arms of a store (its
    ``axes`` differ, a lr aside, or its match kind: a looped arm beside its
    iso-param and iso-FLOP baselines) is fitted arm by arm, each fit named
    as the report names the arm (``arms.arm_labels``); a group of one arm
    keeps the group's name. ``pool_arms`` fits one law over each group's
    arms instead (a trend across them, and a note says so).
    ``drop_highest`` leaves out that many highest-loss points of each fit
    (as Besiroglu et al. did with Chinchilla's). Rows without a loss (trials
    not finished) are left out. A group a law cannot be fitted to is listed
    in ``skipped`` with the reason; a table none can be fitted to raises a
    one-line ValueError. ``progress`` is told, before each fit, which one it
    is, of how many, and on how many points (``archsearch fit`` prints it).
    """
    table = as_table(data)
    if not 0 < level < 1:
        raise ValueError(f"level {level}: must be between 0 and 1, e.g. 0.95")
    laws = [law_named(law) for law in laws]
    columns, notes = _variables(table, n_col=n_col, d_col=d_col, c_col=c_col)
    loss = numeric_column(table, loss_col)
    labels = np.array(fit_groups(table, by, pool_arms=pool_arms), dtype=object)
    fits, skipped = [], []
    groups = sorted(set(labels[np.isfinite(loss)]))
    count = 0
    for group in groups:
        in_group = labels == group
        for law in laws:
            count += 1
            try:
                if any(v not in columns for v in law.variables):
                    raise ValueError(f"{law.name} needs {_needs(law)}")
                rows = _rows(in_group, loss, [columns[v] for v in law.variables], drop_highest)
                if progress is not None:
                    drawn = bounded_points(len(rows))
                    of = f" of {drawn:,} points, the starts searched on {drawn:,}" if drawn < len(rows) else ""
                    progress(f"fitting {law.name} to {group} ({count} of {len(groups) * len(laws)}): "
                             f"{len(rows):,} points, {bootstrap} resamples{of}")
                fits.append(fit_law({v: columns[v][rows] for v in law.variables}, loss[rows], law, group=group,
                                    bootstrap=bootstrap, level=level, seed=seed, grid=grid))
            except ValueError as err:
                skipped.append({"group": group, "law": law.name, "reason": str(err)})
    if not fits:
        reasons = list(dict.fromkeys(s["reason"] for s in skipped))
        more = f"; and {len(reasons) - MAX_REASONS} more" if len(reasons) > MAX_REASONS else ""
        raise ValueError(f"nothing to fit: {'; '.join(reasons[:MAX_REASONS]) or f'no rows with a {loss_col}'}"
                         + more)
    pooled = _pooled_arms(table, labels, {f.group for f in fits}) if pool_arms else []
    return Fits(fits=fits, skipped=skipped, notes=notes + pooled)


# The reasons ``nothing to fit`` names (a study of one size has one per arm and law).
MAX_REASONS = 3


def fit_groups(table, by: str | None, *, pool_arms: bool = False) -> list[str]:
    """The fit each row belongs to: its ``by`` group (``tables.group_labels``)
    where that group holds one arm, else its arm as the report names it
    (``arms.arm_labels``; ``group: arm`` where one arm spans several groups);
    with ``pool_arms``, or a table without a store's ``axes``, its group."""
    groups = group_labels(table, by)
    if pool_arms or "axes" not in table.column_names:
        return groups
    arms = arm_labels(table_rows(table))
    held, homes = defaultdict(set), defaultdict(set)
    for group, arm in zip(groups, arms):
        held[group].add(arm)
        homes[arm].add(group)
    return [group if len(held[group]) == 1 else arm if len(homes[arm]) == 1 else f"{group}: {arm}"
            for group, arm in zip(groups, arms)]


def _pooled_arms(table, labels: np.ndarray, groups: set[str]) -> list[str]:
    """A note for each fitted group that holds several arms of a store
    (``pool_arms``): rows whose axes (a swept lr aside) or match kind differ,
    such as a family's taper schedules, or a looped arm beside its iso-param
    and iso-FLOP baselines. One law over them is a trend across
    architectures, not any one's scaling law."""
    if "axes" not in table.column_names:
        return []
    rows = table_rows(table)
    arms = arm_labels(rows)
    notes = []
    for group in sorted(groups):
        members = np.flatnonzero(labels == group)
        count = len({arms[i] for i in members})
        if count < 2:
            continue
        differ = arm_axes([rows[i] for i in members])
        if len({rows[i].get("match") for i in members}) > 1:
            differ.append("match")
        notes.append(f"{group}: one fit over {count} arms (they differ in {', '.join(differ)}), a trend "
                     "across them rather than one arm's scaling law; without --pool-arms each arm is fitted apart")
    return notes


def extrapolated_front(data: Any, objectives: str | Sequence[tuple[str, str]], scale: float, *,
                       by: str | None = "family", pool_arms: bool = False, n_col: str = "params",
                       loss_col: str | None = None, bootstrap: int = 200, level: float = 0.95, seed: int = 0,
                       reference: Sequence[float] | None = None) -> Front:
    """The front at ``n_col = scale``, one row per fit of ``fit_scaling``: per
    arm of each group of ``by`` (a group of one arm by the group's name,
    under the key ``arm``), or with ``pool_arms`` per group (under ``by``).

    Each fit's ``loss_col`` (default: the first objective) is its L(N)
    prediction at ``scale``, with the confidence and prediction intervals;
    the other objectives are those of its largest trial, and the notes say
    so. ``Front.indices`` number these rows.
    """
    objectives = parse_objectives(objectives) if isinstance(objectives, str) else list(objectives)
    loss_col = loss_col or objectives[0][0]
    if loss_col not in [c for c, _ in objectives]:
        raise ValueError(f"the loss column '{loss_col}' is not one of the objectives")
    if not (scale > 0 and np.isfinite(scale)):
        raise ValueError(f"extrapolate to {n_col}={scale:g}: the scale must be positive and finite")
    table = as_table(data)
    fits = fit_scaling(table, laws=("N",), by=by, pool_arms=pool_arms, loss_col=loss_col, n_col=n_col,
                       d_col=None, bootstrap=bootstrap, level=level, seed=seed)
    labels = np.array(fit_groups(table, by, pool_arms=pool_arms), dtype=object)
    sizes = numeric_column(table, n_col)
    key = (by or "group") if pool_arms else "arm"
    carried = [c for c, _ in objectives if c not in (loss_col, n_col)]
    rows = []
    for fit in fits.fits:
        prediction = fit.predict(N=scale)
        members = np.flatnonzero((labels == fit.group) & np.isfinite(sizes))
        largest = decoded_rows(table.take([int(members[np.argmax(sizes[members])])]))[0]
        rows.append({key: fit.group, loss_col: prediction.loss.value, n_col: scale,
                     "interval": [prediction.loss.low, prediction.loss.high],
                     "prediction_interval": [prediction.prediction_low, prediction.prediction_high],
                     "extrapolated": prediction.extrapolated, "carried_from": largest.get("trial_id"),
                     **{c: largest.get(c) for c in carried}})
    notes = [f"{loss_col} predicted at {n_col}={scale:g} from each {key}'s L(N) fit ({level:.0%} intervals)"]
    if carried:
        notes.append(f"{', '.join(carried)} taken from each {key}'s largest trial")
    notes += [f"{s['group']}: {s['reason']}" for s in fits.skipped]
    front = pareto(rows, objectives, reference=reference, matched="achieved")
    return replace(front, notes=notes + front.notes)


def _rows(in_group: np.ndarray, loss: np.ndarray, variables: list[np.ndarray], drop_highest: int) -> np.ndarray:
    """The group's rows with a loss and every variable, less the ``drop_highest`` highest losses."""
    usable = in_group & np.isfinite(loss)
    for values in variables:
        usable &= np.isfinite(values)
    rows = np.flatnonzero(usable)
    bad = rows[(loss[rows] <= 0) | np.any([v[rows] <= 0 for v in variables], axis=0)]
    if len(bad):
        raise ValueError(f"rows {', '.join(map(str, bad[:5]))}{' ...' if len(bad) > 5 else ''}: losses and "
                         "scales must be positive")
    if drop_highest:
        rows = rows[np.argsort(loss[rows], kind="stable")][:max(len(rows) - drop_highest, 0)]
    return np.sort(rows)


def _variables(table, *, n_col: str | None, d_col: str | None, c_col: str | None) -> tuple[dict, list[str]]:
    columns, notes = {}, []
    for variable, name in (("N", n_col), ("D", d_col), ("C", c_col)):
        if name is not None:
            columns[variable] = numeric_column(table, name)
    if "D" not in columns and {"N", "C"} <= set(columns):
        columns["D"] = columns["C"] / (6 * columns["N"])
        notes.append(f"tokens D = {c_col} / (6 {n_col})")
    if "C" not in columns and "D" in columns:
        if "flops_per_token" in table.column_names:
            columns["C"] = numeric_column(table, "flops_per_token") * columns["D"]
            notes.append(f"training compute C = flops_per_token x {d_col}")
        elif "N" in columns:
            columns["C"] = 6 * columns["N"] * columns["D"]
            notes.append(f"training compute C = 6 {n_col} {d_col}")
    return columns, notes


def _needs(law) -> str:
    return {"N": "a parameter count column (--n-col)", "C": "tokens or training FLOPs (--d-col or --flops-col)",
            "ND": "parameter counts and tokens or training FLOPs (--n-col, --d-col or --flops-col)"}[law.key]
