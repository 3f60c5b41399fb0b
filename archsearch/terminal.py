"""What the command line prints: rich tables of plans, fronts and stores.

The console reads no markup and no emoji codes, so a value a user wrote (axis
values, study names, paths, error text) prints as written, and every value
goes through ``plain`` so control characters never reach the terminal.
Tables show by default the columns that fit 80 columns: axes whose value is
the same in every row move to a line below, and the rest of the columns come
with ``wide=True`` (``--wide``).
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from archsearch.budget.memory import readable_bytes
from archsearch.jsontext import strict_json
from archsearch.units import duration

# C0/C1 control characters (ESC starts every ANSI sequence) and the bidi
# overrides that reorder what a terminal shows.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


# a piped console's width: wider than any row, so each line is as long as it is (tables keep their
# natural width; text is not wrapped)
UNBOUNDED = 100_000
# the shortest a trial id is shown in a table (its first characters, longer where two would read alike)
SHORT_ID = 8


def console(*, width: int | None = None) -> Console:
    """A console on stdout, ``width`` columns wide. By default a terminal uses its
    own width, ``COLUMNS`` sets one, and piped output is as wide as its widest line."""
    if width is None and not (sys.stdout.isatty() or os.environ.get("COLUMNS")):
        width = UNBOUNDED
    return Console(width=width, markup=False, emoji=False, highlight=False)


@contextmanager
def doing(what: str, *, after_s: float = 1.0) -> Iterator[None]:
    """Say on stderr that ``what`` is being done: a spinner on a terminal while it lasts, else one
    line once it has taken ``after_s`` seconds (work quicker than that passes in silence)."""
    err = Console(stderr=True, markup=False, emoji=False, highlight=False)
    if err.is_terminal:
        with err.status(what):
            yield
        return
    timer = threading.Timer(after_s, lambda: err.print(f"{what} ...", soft_wrap=True))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def short_ids(ids: list[str]) -> dict[str, str]:
    """Each id by its first ``SHORT_ID`` characters, or by as many as make every one in ``ids``
    unique (commands that take a trial accept any unique prefix of its id)."""
    unique = list(dict.fromkeys(ids))
    for length in range(SHORT_ID, max(map(len, unique), default=SHORT_ID) + 1):
        if len({i[:length] for i in unique}) == len(unique):
            return {i: i[:length] for i in unique}
    return {i: i for i in unique}


def plain(text: object) -> str:
    """``text`` with control characters written out as ``\\xNN``: safe to print anywhere."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def _table(title: str, columns: list[str], *, text: tuple = ("trial",)) -> Table:
    """A borderless table; the ``text`` columns left-aligned, numbers right."""
    # at least as wide as its title, which would otherwise wrap over a narrow table
    table = Table(title=plain(title), header_style="bold", box=box.SIMPLE_HEAD,
                  pad_edge=False, show_edge=False, min_width=len(plain(title)))
    for name in columns:
        # fold rather than cut a value that does not fit
        table.add_column("\n".join(map(plain, name.split("\n"))), justify="left" if name in text else "right",
                         overflow="fold")
    return table


def split_axes(axes: list[dict]) -> tuple[list[str], dict]:
    """The axis names whose value differs between ``axes`` (first-seen order),
    and the values shared by every row, of the rest."""
    values: dict[str, set] = {}
    for row in axes:
        for name, value in row.items():
            values.setdefault(name, set()).add(json.dumps(value, sort_keys=True, default=str))
    varying = [n for n, v in values.items() if len(v) > 1 or any(n not in row for row in axes)]
    shared = {n: axes[0][n] for n in values if n not in varying} if axes else {}
    return varying, shared


def _all_names(axes: list[dict]) -> list[str]:
    return list(dict.fromkeys(name for row in axes for name in row))


def _axis_cells(axes: list[dict], names: list[str], *, wide: bool) -> tuple[list[str], list[list[str]]]:
    """Column names and each row's cells for ``names``: a column per axis
    when every row has them all (or ``wide``), else one ``axes`` column of
    the ``name=value`` pairs a row has (conditional axes leave most empty).
    Unless ``wide``, a dotted name is a header of one line per part: values
    are mostly narrower than ``taper.shape``."""
    if wide or all(n in row for row in axes for n in names):
        headers = names if wide else [n.replace(".", ".\n") for n in names]
        return headers, [[_axis(row.get(n)) for n in names] for row in axes]
    return ["axes"], [[" ".join(f"{n}={_axis(row[n])}" for n in names if n in row)] for row in axes]


def _shared_line(shared: dict) -> str | None:
    return "same in every row: " + ", ".join(f"{k}={_axis(v)}" for k, v in shared.items()) if shared else None


def search_plan(preview, *, layers: bool = False, wide: bool = False) -> None:
    """``plan`` of a search (``search.preview.SearchPlan``): the grid's table, or a table of the
    trials of a sampler's drawn points, then what the search proposes and the FLOPs it implies."""
    out = console()
    if preview.sampler == "grid":
        plan_table(preview.sample, layers=layers, wide=wide)
        head = f"search: every one of the grid's {preview.space}"
    else:
        plan_table(preview.sample, layers=layers, wide=wide, title="trials of points drawn as the sampler draws them",
                   totals=False)
        head = (f"search: {preview.sampler} proposes {preview.proposals:,} points of a space of {preview.space}; "
                f"each is planned at every budget target and seed ({preview.trials_per_proposal:g} trials a point)")
    lines = [head]
    if preview.asked is not None and preview.asked > preview.proposals:
        lines.append(f"the space runs out: it holds {preview.proposals:,} points, fewer than search.trials "
                     f"({preview.asked:,}); every proposal is a point not proposed before")
    if preview.infeasible:
        lines.append(f"{preview.infeasible} of the points drawn reach no budget target (the sampler is told they "
                     "failed and draws again)")
    if preview.rungs is not None:
        shares = ", ".join(_share(r) for r in preview.rungs)
        lines.append(f"fidelity: {preview.fidelity}, trials stop at {shares} of their tokens; only the promoted go on")
    estimate = "" if preview.sampler == "grid" else " (from the points drawn)"
    lines.append(f"training FLOPs: at most {preview.most_flops:.3g} (every trial to its end), expected "
                 f"{preview.expected_flops:.3g}{estimate}")
    for text in lines:
        out.print(plain(text))


def _share(fraction: float) -> str:
    return "1" if fraction == 1 else f"1/{round(1 / fraction)}"


def plan_table(trials: list, *, layers: bool = False, wide: bool = False, title: str | None = None,
               totals: bool = True) -> None:
    """One row per planned trial: the axes that differ, params, match error,
    FLOPs/token (and state when matched on it); ``wide`` adds every axis,
    seed, target, achieved, d_model and MLP widths. ``totals``: the study's
    training FLOPs below (not for a sample of a search's trials)."""
    rows = [{**t.axes, "seed": t.seed} for t in trials]
    varying, shared = split_axes(rows)
    axes, axis_cells = _axis_cells(rows, _all_names(rows) if wide else varying, wide=wide)
    measures = ["params", "error", "FLOPs/token", "memory"]
    if wide:
        measures = ["match", "target", "achieved", "error", "params", "d_model", "MLP widths", "FLOPs/token", "state",
                    "memory"]
    elif trials and trials[0].match == "state":
        measures.append("state")
    matched = f", matched on {trials[0].match}" if trials and not wide else ""
    table = _table(f"{title or f'{len(trials)} planned trials'}{matched}", ["trial", *axes, *measures],
                   text=("trial", "axes"))
    shown = {t.trial_id: t.trial_id for t in trials} if wide else short_ids([t.trial_id for t in trials])
    for t, cells_of_axes in zip(trials, axis_cells):
        cells = {"match": t.match, "target": t.target, "achieved": t.achieved, "error": f"{t.match_error:+.2%}",
                 "params": t.params, "d_model": t.spec.d_model, "MLP widths": ",".join(map(str, t.spec.mlp_widths)),
                 "FLOPs/token": t.flops_per_token, "state": t.state,
                 "memory": readable_bytes(t.memory.total) if t.memory is not None else None}
        table.add_row(shown[t.trial_id], *cells_of_axes, *(_fmt(cells[m]) for m in measures))
    out = console()
    _print(out, table, wide=wide, note=None if wide else _shared_line(shared))
    from archsearch.planner import twin_lines

    for line in twin_lines(trials):
        out.print(plain(line))
    trained = [t for t in trials if t.same_as is None]
    if trials and totals:
        over = f"the {len(trials)} trials" if len(trained) == len(trials) else \
            f"the {len(trained)} trainings of the {len(trials)} trials"
        train, evaluation = sum(t.train_flops for t in trained), sum(t.eval_flops for t in trained)
        out.print(f"total FLOPs: {train + evaluation:.3g} = training {train:.3g} (FLOPs/token x tokens) + "
                  f"evaluation {evaluation:.3g} (forward FLOPs/token x evaluation tokens), summed over {over}")
        out.print("memory: each trial's estimated training peak (weights and gradients, AdamW state, activations "
                  "of a micro-batch, logits), without the Python and torch runtime")
        heavy = [t for t in trials if t.total_params > 2 * max(t.params, 1)]
        if heavy:
            t = max(heavy, key=lambda t: t.total_params / max(t.params, 1))
            out.print(f"note: embeddings hold {1 - t.params / t.total_params:.0%} of trial {t.trial_id}'s "
                      f"{t.total_params:,} parameters (vocabulary {t.spec.vocab_size:,}); budget.targets count "
                      "the rest only, unless budget.count_embeddings")
    memories = [t.to_dict() for t in trials if t.spec.structure == "memory"]
    if memories:
        out.print("memory overhead (its params over the rest, embeddings included): "
                  + ", ".join(f"{m['trial_id']} +{m['memory_overhead']:.2%}" for m in memories))
    if layers:
        for t in trials:
            out.print(layer_table(t))


def layer_table(trial) -> Table:
    """The per-layer plan of one trial."""
    from archsearch.arch.structures.stack import layer_params

    spec = trial.spec
    table = _table(f"trial {trial.trial_id}: d_model={spec.d_model}, heads={spec.num_heads}",
                   ["layer", "mixer", "mlp", "MLP width", "params"], text=("mixer", "mlp"))
    for i, layer in enumerate(spec.layers):
        table.add_row(str(i), _fmt(layer.mixer), _fmt(layer.mlp), _fmt(layer.mlp_width),
                      _fmt(layer_params(spec, layer)))
    return table


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


def _shown_axes(row: dict) -> dict:
    """A row's axes as the tables show them: a protocol's baseline by its protocol and model."""
    from archsearch.analysis.arms import PROTOCOLS, axis_text

    axes = row.get("axes") or {}
    if isinstance(axes, str):
        axes = json.loads(axes)
    if "arm" in axes and row.get("match") in PROTOCOLS:
        axes = {**axes, "arm": axis_text(row, "arm")}
    # the seed too, so rows that differ only by it read apart (said once below when it is the same)
    return {**axes, "seed": row["seed"]} if row.get("seed") is not None else axes


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


REPORT_WORK = "writing the report (scaling fits with bootstrap bands, then the figures)"


def run_summary(summary, *, store: Path, report: Path, retry: str = "", attempts: int = 0) -> None:
    """After a run: counts, the best trial, the front, and the report path; the failed trials
    left as they are after ``attempts`` attempts, with ``retry``, the command that trains them."""
    from archsearch_dashboards.report import (
        DEFAULT_OBJECTIVES,
        completed_rows,
        write_report,
    )

    import archsearch as A
    from archsearch.analysis import pareto_front

    out = console()
    out.print(Text.assemble((plain(summary.study), "bold"),
                            f": {summary.planned:,} trials planned, {summary.skipped:,} already done, "
                            f"{summary.completed:,} trained, "
                            + (f"{summary.shared:,} shared a twin's training, " if summary.shared else "")
                            + (f"{summary.pruned:,} stopped early by the search, " if summary.pruned else "")
                            + f"{summary.failed:,} failed in {summary.wall_time_s:,.0f}s"))
    for note in summary.notes:
        out.print(plain(note))
    if summary.held:
        out.print(f"{summary.held:,} failed or diverged trial{'s' * (summary.held != 1)} left as "
                  f"{'they are' if summary.held != 1 else 'it is'} after {attempts} attempts (execution.max_attempts); "
                  f"see `archsearch status --store {plain(store)}` for the errors, or train "
                  f"{'them' if summary.held != 1 else 'it'} again with: {plain(retry)}", soft_wrap=True)
    with A.open_store(store, read_only=True) as db:
        rows = completed_rows(db, summary.study)
        if not rows:
            out.print(f"no completed trials; see `archsearch status --store {plain(store)}` for the errors",
                      style="red")
            return
        best = min(rows, key=lambda r: r["val_loss"])
        axes = ", ".join(f"{k}={_axis(v)}" for k, v in _shown_axes(best).items())
        out.print(f"best trial {plain(best['trial_id'])}: val_loss {best['val_loss']:.4f} at "
                  f"{best['params']:,} non-embedding params ({axes})")
        front_table(pareto_front(rows, DEFAULT_OBJECTIVES), ["val_loss", "params"])
        with doing(REPORT_WORK):
            path = write_report(db, report, study=summary.study)
    out.print(f"report: {plain(path)}", soft_wrap=True)


def status_tables(db, *, study: str | None, as_json: bool, wide: bool = False) -> None:
    """The studies in a store and their trials: the axes that differ, params,
    status, val_loss, the generalisation gap (val_loss - train_loss), tokens/s,
    and each failed trial's error below the table, then the trials that share another's training;
    ``wide`` adds every axis, d_model, steps, tokens, wall time, attempts, ``same as`` and the error column."""
    studies = db.studies().to_pylist()
    trials = db.trials(study).to_pylist()
    ladders = db.ladders(study).to_pylist()
    checks = db.checks(study)
    progress = db.progress(study)  # where each running trial is
    if as_json:
        # the store keeps a trial's axes, spec, recipe and data as JSON text: given as the objects they are
        objects = [{**t, **{k: json.loads(t[k]) for k in ("axes", "spec", "recipe", "data")
                            if isinstance(t.get(k), str)},
                    **({"progress": progress[t["trial_id"]]} if t["trial_id"] in progress else {})} for t in trials]
        print(strict_json({"studies": studies, "trials": objects, "fidelity_ladders": ladders, "checks": checks},
                          indent=2))
        return
    out = console()
    out.print(f"studies in {plain(db.path)}", soft_wrap=True)
    table = _table("", ["study", "trials", "completed", "failed", "updated"], text=("study",))
    for s in studies:
        table.add_row(_fmt(s["name"]), _fmt(s["trials"]), _fmt(s["completed"]), _fmt(s["failed"]),
                      _fmt(str(s["updated_at"])[:19]))
    out.print(table)
    rows = [_shown_axes(t) for t in trials]
    varying, shared = split_axes(rows)
    axes, axis_cells = _axis_cells(rows, _all_names(rows) if wide else varying, wide=wide)
    measures = ["params", "status", "val_loss", "gap", "tokens/s"]
    if wide:
        measures += ["d_model", "steps", "tokens", "wall s", "attempts", "same as", "error"]
    table = _trials_table(f"trials{f' of {study}' if study else ''}", trials, axes, axis_cells, measures,
                          wide=wide)
    # what gives way at a narrow terminal: the gap, the speed, then the size
    _print(out, table, wide=wide, note=None if wide else _shared_line(shared),
           give_way=["gap", "tokens/s", "params", "val_loss"])
    for line in _twin_status(trials):
        out.print(plain(line))
    for line in _progress_lines(progress, wide=wide):
        out.print(plain(line))
    if not wide:
        for t in trials:
            if t["error"] and t["status"] != "pruned":
                out.print(Text.assemble((f"trial {plain(t['trial_id'])} failed: ", "red"), plain(t["error"])))
    for ladder in ladders:
        out.print(plain(_ladder_line(ladder)))
    for check in checks:
        out.print(plain(_check_line(check)))


def _progress_lines(progress: dict[str, dict], *, wide: bool) -> list[str]:
    """The running trials, each where its latest report put it and how long ago that was."""
    from archsearch.execute.progress import trial_line

    if not progress:
        return []
    shown = {t: t for t in progress} if wide else short_ids(list(progress))
    return ["running:"] + [f"  trial {shown[trial_id]}: {trial_line(report)} "
                           f"(reported {duration(report['age_s'])} ago)" for trial_id, report in progress.items()]


def _twin_status(trials: list[dict]) -> list[str]:
    """Rows not trained separately, by the trial whose training gives (or will give) their result."""
    shares: dict[str, list[str]] = {}
    for t in trials:
        if t.get("same_as"):  # a store from before schema 3 has no such column
            shares.setdefault(t["same_as"], []).append(t["trial_id"])
    if not shares:
        return []
    count = sum(map(len, shares.values()))
    lines = [f"{count} trial{' shares' if count == 1 else 's share'} another's training (same spec, data, "
             "recipe and seed), not trained separately:"]
    return lines + [f"  trial {source} gives its result to {', '.join(ids)}" for source, ids in shares.items()]


def _trials_table(title: str, trials: list[dict], axes: list[str], axis_cells: list[list[str]],
                  measures: list[str], *, wide: bool) -> Table:
    table = _table(title, ["trial", *axes, *measures], text=("trial", "axes", "status", "error"))
    shown = {t["trial_id"]: t["trial_id"] for t in trials} if wide else short_ids([t["trial_id"] for t in trials])
    for t, cells_of_axes in zip(trials, axis_cells):
        cells = {"params": t["params"], "status": t["status"], "val_loss": t["val_loss"], "gap": t["gen_gap"],
                 "tokens/s": t["tokens_per_s"], "d_model": t["d_model"], "steps": t["steps"], "tokens": t["tokens"],
                 "wall s": t["wall_time_s"], "attempts": t["attempts"], "same as": t.get("same_as"),
                 "error": t["error"]}
        table.add_row(shown[t["trial_id"]], *cells_of_axes, *(_fmt(cells[m]) for m in measures))
    return table


def _check_line(check: dict) -> str:
    """A study's check (``checks:`` in the study file) as it last ran."""
    name = {"causal": "causal-leakage check"}.get(check["check"], f"check {check['check']}")
    head = f"{name} of {check['study']} ({check['ran_at'].replace('T', ' ')[:19]})"
    if not check["passed"]:
        return f"{head}: FAILED: {check['failure']}"
    lengths = ", ".join(map(str, check["seq_len"]))
    return f"{head}: passed on {check['architectures']} architectures at {lengths} tokens"


def _ladder_line(ladder: dict) -> str:
    """A probe's rank agreement with the study's own data, with its interval."""
    head = f"fidelity ladder of {ladder['study']}: probe vs data over {ladder['points']} points"
    if ladder["spearman"] is None:
        return f"{head}: too few points for a rank correlation (3 needed)"
    return (f"{head}: Spearman {ladder['spearman']:+.2f}, 95% bootstrap interval "
            f"[{ladder['low']:+.2f}, {ladder['high']:+.2f}]")


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


def lines(texts: list[str]) -> None:
    """Lines of prose under a table, wrapped to the console's width."""
    out = console()
    for text in texts:
        out.print(plain(text))


def _print(out: Console, table: Table, *, wide: bool, note: str | None = None,
           give_way: list[str] | None = None) -> None:
    """Print ``table`` and a ``note`` below it, no value ever split inside a word: a cell may
    wrap between its words, never within one. Where even that does not fit the console, the
    columns named in ``give_way`` (by header, in that order; by default from the right, the
    first column kept) are left out until it fits, and a line says which (``--wide`` shows
    them). A ``wide`` table prints at its natural width, however wide the console."""
    for column in table.columns:
        words = [word for cell in (column.header, *column.cells) for word in str(cell).split()]
        column.min_width = max(column.min_width or 0, max(map(len, words), default=1))
    natural = out.measure(table, options=out.options.update(max_width=UNBOUNDED))
    dropped = []
    if wide:
        out = console(width=max(out.width, natural.maximum))
    else:
        order = give_way if give_way is not None else [str(c.header) for c in table.columns[:0:-1]]
        for name in order:
            if out.measure(table, options=out.options.update(max_width=UNBOUNDED)).minimum <= out.width:
                break
            column = next((c for c in table.columns if str(c.header) == name), None)
            if column is not None and len(table.columns) > 1:
                table.columns.remove(column)
                dropped.append(name.replace("\n", " ").replace(". ", "."))
    out.print(table)
    if dropped:
        out.print(plain(f"left out to fit {out.width} columns: {', '.join(dropped)} (--wide shows every column)"))
    if note:
        out.print(plain(note))


def _axis(value) -> str:
    """An axis value as the user wrote it (``3.0``, ``1e-05``), numbers without separators."""
    return plain(value) if isinstance(value, float) else _fmt(value)


def _fmt(value) -> str:
    """One cell: integers and numbers from 1,000 up with thousands
    separators, smaller floats to 4 significant digits (zeros kept, so a
    column's digits line up), text ``plain``."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:#.4g}"
    return plain(value)


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


def bench_table(study: str, result: dict) -> None:
    """``archsearch bench``: one row per trial and implementation, the step's speed and memory."""
    title = (f"{study}: {result['device']}, {result['threads']} threads, {result['dtype']}, "
             f"matmul {result['matmul_tflops'] * 1e3:.1f} GFLOP/s, median of {result['rounds']} rounds")
    columns = ["trial", "family", "impl", "kernels", "compile", "params", "step ms", "tokens/s", "MFU", "peak MB",
               "x HF"]
    table = _table(title, columns, text=("family", "impl", "kernels", "compile"))
    for row in result["rows"]:
        compiled = "-" if row["compile"] == "-" else f"{row['compile']} ({row['compile_s']:.0f} s)"
        table.add_row(str(row["trial"]), plain(row["family"]), plain(row["impl"]), plain(row["kernels"]),
                      plain(compiled), _fmt(row["params"]), _fmt(row["step_ms"]), _fmt(row["tokens_per_s"]),
                      f"{row['mfu']:.1%}", _fmt(row["peak_mb"]), "-" if row["vs_hf"] is None else f"{row['vs_hf']:.2f}x")
    _print(console(), table, wide=True)
