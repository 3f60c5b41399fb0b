"""What the analysis commands print: a Pareto front (``pareto``, and after a run), scaling-law
fits with their intervals (``fit``), arms against a baseline (``compare``) and the stored rows
of ``archsearch analyze``."""

from __future__ import annotations

import re

from archsearch.terminal import (
    _axis_cells,
    _fmt,
    _print,
    _shared_line,
    _shown_axes,
    _table,
    console,
    plain,
    short_ids,
    split_axes,
)


def front_table(front: list[dict], columns: list[str]) -> None:
    """The front's rows: the trials with the axes that differ along it, or a CSV's rows."""
    title = f"Pareto front ({', '.join(columns)})"
    if not (front and "trial_id" in front[0]):
        table = _table(title, columns, text=tuple(columns[:1]))
        for row in front:
            table.add_row(*(_fmt(row.get(c)) for c in columns))
        _print(console(), table, wide=False)
        return
    from archsearch.analysis.arms import arm_labels

    trainings = _trainings(front)
    shown = [members[0] for members in trainings.values()]
    varying, shared = split_axes([_shown_axes(row) for row in shown])
    axes, axis_cells = _axis_cells([_shown_axes(row) for row in shown], varying, wide=False)
    table = _table(title, ["trial", *axes, *columns], text=("trial", "axes"))
    shown = short_ids([members[0]["trial_id"] for members in trainings.values()])
    for members, cells_of_axes in zip(trainings.values(), axis_cells):
        row = members[0]
        trial = shown[row["trial_id"]] + (f" (+{len(members) - 1})" if len(members) > 1 else "")
        table.add_row(plain(trial), *cells_of_axes, *(_fmt(row.get(c)) for c in columns))
    out = console()
    _print(out, table, wide=False, note=_shared_line(shared))
    for members in trainings.values():
        if len(members) > 1:
            out.print(plain(f"{shown[members[0]['trial_id']]} (+{len(members) - 1}): one training gives the result of "
                            f"{len(members)} arms (twins: same spec, data, recipe and seed): "
                            + "; ".join(arm_labels(members))))


def _trainings(rows: list[dict]) -> dict[str, list[dict]]:
    """Rows by the training that gave their result (``same_as``, else their own), in first-seen order."""
    out: dict[str, list[dict]] = {}
    for row in rows:
        out.setdefault(row.get("same_as") or row["trial_id"], []).append(row)
    return out


def fit_tables(result: dict) -> None:
    """Scaling-law fits, one row per group and law, each estimate with its interval;
    then predictions, multipliers, skipped fits and notes."""
    # the constants some fit has: B and beta only where an L(N, D) was fitted
    names = [n for n in ["E", "A", "B", "alpha", "beta"] if any(n in fit["estimates"] for fit in result["fits"])]
    table = _table("scaling-law fits", ["group", "law", "points", *names], text=("group", "law"))
    for fit in result["fits"]:
        # each estimate over its interval's two ends, so the columns stay narrow enough for the
        # group's axes at 80 columns
        cells = [_estimate(fit["estimates"].get(n)).replace(" [", "\n[", 1).replace(", ", ",\n") for n in names]
        # a group's axes one a line, so a narrow terminal folds between them, not inside a value
        table.add_row(plain(fit["group"]).replace(", ", ",\n"), fit["law"], str(fit["points"]), *cells)
    # every column as wide as its longest line: rich would otherwise narrow all columns alike
    # and fold the group's axes inside their values
    for column in table.columns:
        column.min_width = max((len(line) for cell in column.cells for line in str(cell).split("\n")), default=1)
    out = console()
    _print(out, table, wide=False)
    for p in result.get("predictions", []):
        at = ", ".join(f"{k}={v:.3g}" for k, v in p["at"].items())
        low, high = p["prediction_interval"]
        out.print(plain(f"{p['group']} {p['law']} at {at}: loss {_estimate(p['loss'])}, prediction interval "
                        f"[{_fmt(low)}, {_fmt(high)}]{' (extrapolated)' if p['extrapolated'] else ''}"))
    for m in result.get("multipliers", []):
        out.print(plain(f"compute multiplier at C={m['compute']:.3g}: {_estimate(m['multiplier'])} "
                        f"({m['meaning']})"))
    for fit in result["fits"]:
        if fit.get("cautions"):
            out.print(plain(f"caution: {fit['group']} {fit['law']}: {'; '.join(fit['cautions'])}"))
    for s in result["skipped"]:
        # the fit's own message may already name its law and group: say them once
        reason = s["reason"].removeprefix(f"{s['law']} for {s['group']}: ")
        out.print(plain(f"skipped {s['group']} {s['law']}: {reason}"))
    for note in result["notes"]:
        out.print(plain(f"note: {note}"))


def _estimate(estimate: dict | None) -> str:
    if estimate is None:
        return ""
    if estimate["low"] is None:
        return _fit_number(estimate["value"])
    low, high = _fit_number(estimate["low"]), _fit_number(estimate["high"])
    return f"{_fit_number(estimate['value'])} [{low}, {high}]"


def _fit_number(value) -> str:
    """A fitted constant: as `_fmt` up to a million, in scientific notation beyond (a law's A
    can be 1e20, whose 27 digits would push the table past any terminal) and below 1e-3."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value != 0 and (
            abs(value) >= 1e6 or abs(value) < 1e-3):
        return f"{value:.4g}"
    return _fmt(value)


def compare_table(result) -> None:
    """``archsearch compare``: one row per arm, its mean difference from the baseline with
    the interval, the test, its p-values (Holm's with several arms) and, paired, the seeds
    where the arm is below the baseline."""
    rows, level = result.differences, result.differences[0].level
    holm = ["p\nHolm"] if len(rows) > 1 else []
    group = ["group"] if result.within else []
    columns = [*group, "arm", "n", "mean\ndiff.", f"{level:.0%}\ninterval", "test", "p", "p\nperm.", *holm, "below"]
    table = _table(f"{result.metric}: each arm minus {result.baseline}, over seeds", columns,
                   text=("group", "arm", "test"))
    for d in rows:
        # the interval's ends on two lines and an arm's axes one a line: at 80 columns the
        # cells then fold between values, never inside a number
        interval = "-" if d.low is None else f"{d.low:+.3g}\n{d.high:+.3g}"
        arm = "\n".join(map(plain, re.split(r" (?=[^ =]+=)", d.arm)))
        cells = [*([plain(d.group)] if group else []), arm, f"{d.n}/{d.n_baseline}", f"{d.difference:+.3g}",
                 interval, d.test, _p(d.p_value),
                 _p(d.p_permutation), *([_p(d.p_holm)] if holm else []),
                 "-" if d.below is None else f"{d.below}/{d.pairs}"]
        table.add_row(*cells)
    # an arm's longest axis on one line: the columns of numbers give way first
    parts = [part for d in rows for part in re.split(r" (?=[^ =]+=)", d.arm)]
    table.columns[len(group)].min_width = min(24, max(map(len, parts)))
    table.collapse_padding = True
    out = console()
    bases = {(d.group, d.baseline): d.mean_baseline for d in rows}
    means = ", ".join(f"{plain(g + ' ' if g else '')}{plain(b)} {_fmt(m)}" for (g, b), m in bases.items())
    _print(out, table, wide=False, note=f"baseline mean: {means}; n: trials of the arm/of the baseline")
    for text in result.notes + sorted({f"{d.arm}: {d.note}" for d in rows if d.note}):
        out.print(plain(f"note: {text}"))


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.2g}"


def profile_table(title: str, rows: list[dict], keys: list[str], fold: str | None = None) -> None:
    """Stored analysis rows, one line per setting (the ``keys`` of it shown) and layer, one column per
    metric; the layers of the per-layer metric ``fold`` are listed in one column of their setting's line."""
    lines: dict[tuple, dict] = {}
    metrics: list[str] = []
    for row in rows:
        where = tuple(row["setting"].get(key) for key in keys)
        if row["metric"] == fold:
            lines.setdefault(where + (None,), {}).setdefault(fold, []).append(row["layer"])
            continue
        lines.setdefault(where + (row["layer"],), {})[row["metric"]] = row["value"]
    for values in lines.values():
        metrics += [metric for metric in values if metric not in metrics]
    table = _table(title, [*keys, "layer", *metrics], text=tuple(keys))
    for where, values in lines.items():
        table.add_row(*(_fmt(str(v) if isinstance(v, bool) else v) for v in where),
                      *(_fmt(values.get(m)) for m in metrics))
    _print(console(), table, wide=False)
