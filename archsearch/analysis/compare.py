"""Is an arm's loss different from the baseline's, over seeds? Torch-free; scipy is imported when a test runs.

Every arm is compared with one baseline arm on one metric (``val_loss`` by
default; any numeric column, e.g. ``gen_gap``). The difference is arm minus
baseline, so a negative difference of a loss means the arm is better.

- **Paired** when both arms have exactly one trial per seed and the same
  seeds: the per-seed differences d_i get a paired t-test (t = mean(d) /
  (sd(d) / sqrt(n)), n - 1 degrees of freedom) and a sign-flip permutation
  test (every assignment of signs to the d_i; exact up to 13 pairs, sampled
  beyond). Pairing removes what a seed does to both arms alike (data order,
  initialisation), which is often most of the spread at small scale.
- **Welch** otherwise (seeds differ, or an arm pools several trials per seed):
  Welch's t-test with Welch-Satterthwaite degrees of freedom, and a
  permutation test of the arm labels.

Both permutation p-values are two-sided as scipy computes them: twice the smaller
one-sided p-value, at most 1. With n paired seeds the exact sign-flip p-value
cannot go below 2 / 2^n (0.25 at 3 seeds, 0.0625 at 5).

The interval is the t interval of the mean difference at ``level``. With
several arms against one baseline, ``p_holm`` is Holm's step-down adjustment
of the t-tests' p-values over all the comparisons (family-wise error at most
1 - level).

An arm is what names a trial but its seed: by default every axis whose value
differs between the trials (and the budget target when there are several),
and arms alike in those but for their family or match kind are told apart as
the dashboards tell them (``arms.arm_labels``); ``by`` names the columns or
axes instead, pooling the rest. A protocol's baseline is always an arm of its
own, named by its protocol and model (``arm=baseline (iso-FLOP: 4-layer
stack)``): an iso-param and an iso-FLOP baseline share their axes but are two
models. ``within`` (e.g.
``family``) compares each arm with the baseline of its own group: taper
schedules against each family's uniform MLPs.

Sizes are never pooled by surprise: when the trials have several budget
targets, each arm is compared with the baseline at its own target (as
``within="target"`` does, said in the notes), unless ``within`` says otherwise
or ``pool=True`` asks for one test over every size (with a note that the
sizes' own spread is then part of the test).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from archsearch.analysis.arms import PROTOCOLS, arm_label, arm_labels
from archsearch.analysis.tables import as_table, numeric_column
from archsearch.units import axis_value

# permutation resamples when the exact set is larger (scipy enumerates it when it is not)
RESAMPLES = 9_999


@dataclass(frozen=True, kw_only=True)
class Difference:
    """One arm against the baseline on ``metric``: ``difference`` = mean(arm) -
    mean(baseline) (paired: the mean per-seed difference), its interval
    [``low``, ``high``] at ``level``, the t-test's ``p_value``, the permutation
    test's ``p_permutation`` and the Holm-adjusted ``p_holm``. ``pairs`` and
    ``below`` (pairs where the arm's value is below the baseline's) only when
    ``paired``. A p-value is None where the test is undefined (see ``note``)."""

    arm: str
    baseline: str
    metric: str
    test: str  # "paired t" | "Welch t"
    paired: bool
    n: int
    n_baseline: int
    mean: float
    mean_baseline: float
    difference: float
    low: float | None
    high: float | None
    level: float
    p_value: float | None
    p_permutation: float | None
    p_holm: float | None = None
    pairs: int | None = None
    below: int | None = None
    note: str | None = None
    group: str | None = None  # the ``within`` group the arm and its baseline belong to

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Comparison:
    """Every arm against one baseline; ``notes`` say how arms were formed."""

    metric: str
    baseline: str
    by: list[str]
    differences: list[Difference]
    notes: list[str] = field(default_factory=list)
    within: list[str] = field(default_factory=list)

    def get(self, arm: str, group: str | None = None) -> Difference:
        """The comparison of the arm labelled ``arm`` (in ``group``, with ``within``)."""
        for row in self.differences:
            if row.arm == arm and row.group == group:
                return row
        raise KeyError(f"no arm '{arm}'{f' in {group}' if group else ''}; have: "
                       f"{', '.join(d.arm for d in self.differences)}")

    def to_dict(self) -> dict:
        return {"metric": self.metric, "baseline": self.baseline, "by": self.by, "within": self.within,
                "notes": self.notes, "differences": [d.to_dict() for d in self.differences]}


def compare_arms(data: Any, *, baseline: str, by: str | list[str] | None = None,
                 within: str | list[str] | None = None, metric: str = "val_loss", seed_col: str = "seed",
                 level: float = 0.95, seed: int = 0, pool: bool = False) -> Comparison:
    """Compare every arm of ``data`` (a trials table, DataFrame, rows or columns)
    with the ``baseline`` arm on ``metric``.

    ``by``: columns or axes (a list or comma-separated) whose values make an
    arm; default every axis that varies. ``within``: columns or axes that
    split the rows into groups (e.g. ``family``), each arm compared with the
    baseline of its own group. ``baseline`` selects one arm (per group) by its
    label, or by values (``transformer``) or ``name=value`` pairs separated by
    commas that only it has. ``seed``: of the sampled permutations. ``pool``:
    one test over every budget target (by default, each target apart). Rows
    whose metric is missing or not finite are left out. Raises a one-line
    ValueError for an unknown column, an ambiguous baseline or an arm with one trial.
    """
    if not 0.5 <= level < 1:
        raise ValueError(f"level {level}: give an interval level in [0.5, 1), e.g. 0.95")
    table = as_table(data)
    values = numeric_column(table, metric, what="metric column")
    seeds = numeric_column(table, seed_col, what="seed column")
    groups_by = _names(within) if within is not None else []
    sizes = len(set(table.column("target").to_pylist())) if "target" in table.column_names else 1
    notes = []
    if sizes > 1 and within is None and not pool and "target" not in _names(by or []):
        groups_by = ["target"]
        notes.append(f"the trials have {sizes} budget targets: each arm is compared with the baseline at its own "
                     "target (as --within target; --pool tests over every size at once)")
    elif sizes > 1 and pool and "target" not in groups_by + _names(by or []):
        notes.append(f"pooled {sizes} budget targets into each arm: the sizes' own spread is part of each test")
    keys = [k for k in _arm_keys(table, by) if k not in groups_by]
    if not keys and (by is not None or groups_by or not _kinds_differ(table)):
        raise ValueError(f"within {', '.join(groups_by)} leaves nothing that tells arms apart; give by (--by)")
    groups = ([_label(g, bare=len(groups_by) == 1) for g in _arm_values(table, groups_by)] if groups_by
              else [""] * table.num_rows)
    labels = _labels(table, keys, groups, told_apart=by is None)
    kept = np.isfinite(values) & np.isfinite(seeds)
    if (~kept).any():
        notes.append(f"left out {int((~kept).sum())} rows without a finite {metric}")
    arms: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    for group, label, value, s, ok in zip(groups, labels, values, seeds, kept):
        if ok:
            arm = arms.setdefault(group, {}).setdefault(label, ([], []))
            arm[0].append(float(value))
            arm[1].append(float(s))
    out, bases = [], []
    for group in sorted(arms, key=_group_order):
        base = _pick_baseline(baseline, list(arms[group]), group=group, keys=keys)
        bases.append(base)
        try:
            out += [_difference(label, base, arms[group][label], arms[group][base], metric=metric, level=level,
                                seed=seed, group=group or None) for label in sorted(arms[group]) if label != base]
        except ValueError as err:
            if within is not None or pool or groups_by != ["target"]:
                raise
            raise ValueError(f"{err} at target {group}, or give --pool to test over every size at once") from None
    if not out:
        raise ValueError(f"only the baseline arm '{bases[0]}' has results for {metric}; nothing to compare")
    return Comparison(metric=metric, baseline=bases[0] if len(set(bases)) == 1 else baseline, by=keys,
                      differences=_with_holm(out), notes=notes, within=groups_by)


def _group_order(label: str) -> tuple:
    """Groups in order, a budget target's by its number (2e+05 before 1e+06)."""
    try:
        return (0, float(label), "")
    except ValueError:
        return (1, 0.0, label)


def _names(text: str | list[str]) -> list[str]:
    return [k.strip() for k in (text.split(",") if isinstance(text, str) else text) if k.strip()]


def _arm_keys(table: pa.Table, by: str | list[str] | None) -> list[str]:
    """The names that make an arm: given, or every axis that varies (and the target when it does)."""
    if by is not None:
        keys = _names(by)
        for key in keys:  # unknown names fail here, with the columns there are
            _column_or_axis(table, key)
        return keys
    axes = _axes(table)
    if axes is None:
        raise ValueError("this table has no axes column: say which columns make an arm with by (--by), "
                         f"from: {', '.join(table.column_names)}")
    keys = varying_axes(axes)
    if "target" in table.column_names and len(set(table.column("target").to_pylist())) > 1:
        keys.append("target")
    if not keys and not _kinds_differ(table):
        raise ValueError("every trial has the same axes: there is one arm, nothing to compare")
    return keys


def _kinds_differ(table: pa.Table) -> bool:
    """Whether rows differ in family or match kind, which tells arms of one axes dict apart."""
    columns = [table.column(c).to_pylist() for c in ("family", "match") if c in table.column_names]
    return len(set(zip(*columns))) > 1 if columns else False


def varying_axes(axes: list[dict]) -> list[str]:
    """The axis names that tell the rows ``axes`` apart, in first-seen order:
    those whose value differs between the rows that have them, then those only
    some rows have (a memory's slots beside a plain transformer) where they
    split rows the others do not."""
    seen: dict[str, set[str]] = {}
    for row in axes:
        for name, value in row.items():
            seen.setdefault(name, set()).add(json.dumps(value, sort_keys=True, default=str))
    names = [name for name, values in seen.items() if len(values) > 1]

    def arms(keys: list[str]) -> int:
        return len({tuple(json.dumps(row.get(k), default=str) for k in keys) for row in axes})

    for name in seen:
        if name not in names and any(name not in row for row in axes) and arms(names + [name]) > arms(names):
            names.append(name)
    return [name for name in seen if name in names]


def _axes(table: pa.Table) -> list[dict] | None:
    if "axes" not in table.column_names:
        return None
    rows = [json.loads(v) if isinstance(v, str) else (v or {}) for v in table.column("axes").to_pylist()]
    # rows of dicts become an Arrow struct, every row with every field: a missing axis reads None
    return [{name: value for name, value in row.items() if value is not None} for row in rows]


def _column_or_axis(table: pa.Table, key: str) -> list[Any]:
    if key in table.column_names:
        return table.column(key).to_pylist()
    axes = _axes(table)
    if axes is not None and any(key in row for row in axes):
        return [row.get(key) for row in axes]
    raise ValueError(f"no column or axis '{key}' to form arms by; have: {', '.join(table.column_names)}"
                     + (" and the axes in the axes column" if axes is not None else ""))


def _arm_values(table: pa.Table, keys: list[str]) -> list[list[tuple[str, Any]]]:
    """Each row's (name, value) pairs under ``keys``; a name the row lacks is left out."""
    columns = [_column_or_axis(table, key) for key in keys]
    return [[(key, column[i]) for key, column in zip(keys, columns) if column[i] is not None]
            for i in range(table.num_rows)]


def _labels(table: pa.Table, keys: list[str], groups: list[str], *, told_apart: bool) -> list[str]:
    """Each row's arm over ``keys``: ``a=x b=y``, or the values alone under
    one key, a protocol's baseline by its protocol and model; ``told_apart``
    (the default arms): rows of one group alike but for family or match kind
    get it appended."""
    columns = {c: table.column(c).to_pylist() for c in ("family", "match", "spec") if c in table.column_names}
    rows = [{"axes": {name: _text(value) for name, value in pairs}, **{c: v[i] for c, v in columns.items()}}
            for i, pairs in enumerate(_arm_values(table, keys))]
    bare = len(keys) == 1
    if not told_apart:
        return [arm_label(row, keys, separator=" ", bare=bare) for row in rows]
    labels = [""] * len(rows)
    members: dict[str, list[int]] = {}
    for i, group in enumerate(groups):
        members.setdefault(group, []).append(i)
    for held in members.values():  # arms of different groups are never compared: each group's told apart alone
        for i, label in zip(held, arm_labels([rows[i] for i in held], keys, separator=" ", bare=bare)):
            labels[i] = label
    return labels


def _label(pairs: list[tuple[str, Any]], *, bare: bool) -> str:
    """``transformer`` (``bare``: arms named by one column), else ``family=memory memory.aux=self``."""
    if bare:
        return " ".join(_text(value) for _, value in pairs)
    return " ".join(f"{name}={_text(value)}" for name, value in pairs)


def _text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1e4:
        return f"{value:.4g}"
    return axis_value(value)


def _yaml_spelling(word: str) -> str:
    """A boolean value as a study file writes it (``memory=false``, as labels show it), also when a
    baseline is given in Python's spelling (``memory=False``)."""
    head, sep, value = word.rpartition("=")
    return head + sep + value.lower() if value in ("True", "False") else word


def _pick_baseline(text: str, labels: list[str], *, group: str = "", keys: list[str] = ()) -> str:
    """The one label equal to ``text``, or the one holding every comma-separated term of it
    (a label of one key's bare values also holds ``key=value``)."""
    if text in labels:
        return text
    terms = [t.strip() for t in text.split(",") if t.strip()]

    def holds(label: str) -> bool:
        parts = label.split(" ")
        # a protocol's baseline by its protocol: iso-FLOP (as shown) or iso_flop (as the study file says)
        words = set(parts) | {p.partition("=")[2] for p in parts} | {p.strip("(),:") for p in parts}
        words |= {kind for kind, name in PROTOCOLS.items() if f"({name}" in label}
        if len(keys) == 1:
            words |= {f"{keys[0]}={p}" for p in parts}
        spelled = {_yaml_spelling(w) for w in words}
        return all(_yaml_spelling(term) in spelled for term in terms)

    found = [label for label in labels if holds(label)]
    if len(found) == 1:
        return found[0]
    among = f" of {group}" if group else ""
    if not found:
        have = "; ".join(sorted(labels)[:12]) + (f"; and {len(labels) - 12} more" if len(labels) > 12 else "")
        raise ValueError(f"no arm{among} matches baseline '{text}'; the arms{among} are: {have}")
    shown = "; ".join(found[:6]) + (f"; and {len(found) - 6} more" if len(found) > 6 else "")
    raise ValueError(f"baseline '{text}' matches {len(found)} arms{among} ({shown}); add name=value terms "
                     "separated by commas until one is left")


def _difference(label: str, base: str, arm: tuple[list[float], list[float]], ref: tuple[list[float], list[float]],
                *, metric: str, level: float, seed: int, group: str | None = None) -> Difference:
    x, x_seeds = np.asarray(arm[0]), arm[1]
    y, y_seeds = np.asarray(ref[0]), ref[1]
    if len(x) < 2 or len(y) < 2:
        few = label if len(x) < 2 else base
        raise ValueError(f"arm '{few}' has {min(len(x), len(y))} result for {metric}; a test over seeds needs at "
                         "least 2 per arm: run more seeds")
    common = dict(arm=label, baseline=base, metric=metric, n=len(x), n_baseline=len(y), mean=float(x.mean()),
                  mean_baseline=float(y.mean()), level=level, group=group)
    paired = len(set(x_seeds)) == len(x_seeds) and sorted(x_seeds) == sorted(y_seeds)
    if paired:
        order_x, order_y = np.argsort(x_seeds), np.argsort(y_seeds)
        d = x[order_x] - y[order_y]
        est = _paired_t(d, level)
        return Difference(test="paired t", paired=True, pairs=len(d), below=int((d < 0).sum()),
                          p_permutation=_permutation(d, None, seed=seed), **est, **common)
    why = ("the arms' seeds differ" if len(set(x_seeds)) == len(x_seeds) and len(set(y_seeds)) == len(y_seeds)
           else "an arm has several trials per seed")
    est = _welch_t(x, y, level)
    note = "; ".join(filter(None, [f"unpaired: {why}", est.pop("note", None)]))
    return Difference(test="Welch t", paired=False, p_permutation=_permutation(x, y, seed=seed), note=note, **est,
                      **common)


def _paired_t(d: np.ndarray, level: float) -> dict:
    """The paired t-test of differences ``d``: mean, interval, two-sided p."""
    n, mean = len(d), float(d.mean())
    se = float(d.std(ddof=1)) / math.sqrt(n)
    return _t_result(mean, se, n - 1, level)


def _welch_t(x: np.ndarray, y: np.ndarray, level: float) -> dict:
    """Welch's t-test of mean(x) - mean(y), Welch-Satterthwaite degrees of freedom."""
    vx, vy = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    se = math.sqrt(vx + vy)
    df = (vx + vy) ** 2 / (vx**2 / (len(x) - 1) + vy**2 / (len(y) - 1)) if se > 0 else float("nan")
    return _t_result(float(x.mean() - y.mean()), se, df, level)


def _t_result(mean: float, se: float, df: float, level: float) -> dict:
    from scipy import stats

    if not se > 0:
        note = "no spread between seeds: the t-test and its interval are undefined"
        return dict(difference=mean, low=None, high=None, p_value=None, note=note)
    half = float(stats.t.ppf(0.5 + level / 2, df)) * se
    p = float(2 * stats.t.sf(abs(mean) / se, df))
    return dict(difference=mean, low=mean - half, high=mean + half, p_value=min(1.0, p))


def _permutation(x: np.ndarray, y: np.ndarray | None, *, seed: int) -> float:
    """Two-sided permutation p-value of the mean difference: sign flips of the
    paired differences ``x`` (``y`` None), else shuffles of the arm labels. Two-sided as
    scipy.stats.permutation_test defines it: twice the smaller of the two one-sided p-values
    (at most 1), not the share of permutations at least as far from zero in either direction."""
    from scipy import stats

    def mean_gap(a, b, axis):
        return np.mean(a, axis=axis) - np.mean(b, axis=axis)

    if y is None:
        data, kind = (x, np.zeros_like(x)), "samples"
    else:
        data, kind = (x, y), "independent"
    result = stats.permutation_test(data, mean_gap, permutation_type=kind, vectorized=True, n_resamples=RESAMPLES,
                                    alternative="two-sided", random_state=np.random.default_rng(seed))
    return float(result.pvalue)


def _with_holm(rows: list[Difference]) -> list[Difference]:
    """Holm's step-down adjustment of the t-tests' p-values over the arms."""
    from dataclasses import replace

    tested = sorted((r.p_value, i) for i, r in enumerate(rows) if r.p_value is not None)
    adjusted: dict[int, float] = {}
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[i] = running
    return [replace(r, p_holm=adjusted.get(i)) for i, r in enumerate(rows)]
