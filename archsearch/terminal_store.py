"""What a store's commands print: ``status`` (its studies, trials, running trials, checks and
fidelity ladders) and the summary after ``run`` (counts, the best trial, the front, the report)."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table
from rich.text import Text

from archsearch.jsontext import strict_json
from archsearch.terminal import (
    _all_names,
    _axis,
    _axis_cells,
    _fmt,
    _print,
    _shared_line,
    _shown_axes,
    _table,
    console,
    doing,
    plain,
    short_ids,
    split_axes,
)
from archsearch.terminal_results import front_table
from archsearch.units import duration


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
