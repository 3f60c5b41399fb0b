"""What the command line prints: rich tables of plans, fronts and stores."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

# Piped output keeps whole rows instead of squeezing tables to 80 columns.
console = Console(width=None if sys.stdout.isatty() else 240)


def plan_table(trials: list, *, layers: bool = False) -> None:
    """One row per planned trial: family, other axes, widths, measures, match error."""
    table = Table(title=f"{len(trials)} planned trials", header_style="bold")
    for name in ["trial", "family", "axes", "seed", "match", "target", "achieved", "error", "params", "d_model",
                 "MLP widths", "FLOPs/token", "state"]:
        table.add_column(name, justify="left" if name == "axes" else "right")
    for t in trials:
        axes = " ".join(f"{k}={v}" for k, v in t.axes.items() if k != "family")
        widths = ",".join(str(w) for w in t.spec.mlp_widths)
        table.add_row(t.trial_id, t.spec.family, axes, str(t.seed), t.match, _fmt(t.target), _fmt(t.achieved),
                      f"{t.match_error:+.2%}", f"{t.params:,}", str(t.spec.d_model), widths,
                      f"{t.flops_per_token:.3g}", _fmt(t.state))
    console.print(table)
    memories = [t.to_dict() for t in trials if t.spec.structure == "memory"]
    if memories:
        console.print("memory overhead (its params over the rest, embeddings included): "
                      + ", ".join(f"{t['trial_id']} +{t['memory_overhead']:.2%}" for t in memories))
    if layers:
        for t in trials:
            layer_table(t)


def layer_table(trial) -> None:
    """The per-layer plan of one trial."""
    from archsearch.arch.structures.stack import layer_params

    spec = trial.spec
    table = Table(title=f"trial {trial.trial_id}: d_model={spec.d_model}, heads={spec.num_heads}",
                  header_style="bold")
    for name in ("layer", "mixer", "mlp", "MLP width", "params"):
        table.add_column(name, justify="right")
    for i, layer in enumerate(spec.layers):
        params = layer_params(spec, layer)
        table.add_row(str(i), layer.mixer, layer.mlp, str(layer.mlp_width), f"{params:,}")
    console.print(table)


def front_table(front: list[dict], columns: list[str]) -> None:
    """The front's rows: trials with their axes, or a CSV's rows."""
    table = Table(title=f"Pareto front ({', '.join(columns)})", header_style="bold")
    trials = bool(front) and "trial_id" in front[0]
    for name in ["trial", "axes", *columns] if trials else columns:
        table.add_column(name, justify="right")
    for row in front:
        cells = [_fmt(row.get(c)) for c in columns]
        if trials:
            axes = ", ".join(f"{k}={v}" for k, v in (row.get("axes") or {}).items())
            cells = [str(row["trial_id"]), axes, *cells]
        table.add_row(*(escape(c) for c in cells))
    console.print(table)


def fit_tables(result: dict) -> None:
    """Scaling-law fits, one row per group and law, each estimate with its interval;
    then predictions, multipliers, skipped fits and notes."""
    names = ["E", "A", "B", "alpha", "beta"]
    table = Table(title="scaling-law fits", header_style="bold")
    for name in ["group", "law", "points", *names]:
        table.add_column(name, justify="right")
    for fit in result["fits"]:
        cells = [_estimate(fit["estimates"].get(n)) for n in names]
        table.add_row(escape(fit["group"]), fit["law"], str(fit["points"]), *cells)
    console.print(table)
    for p in result.get("predictions", []):
        at = ", ".join(f"{k}={v:.3g}" for k, v in p["at"].items())
        low, high = p["prediction_interval"]
        console.print(f"{escape(p['group'])} {p['law']} at {at}: loss {_estimate(p['loss'])}, prediction interval "
                      f"[{_fmt(low)}, {_fmt(high)}]{' (extrapolated)' if p['extrapolated'] else ''}")
    for m in result.get("multipliers", []):
        console.print(f"compute multiplier at C={m['compute']:.3g}: {_estimate(m['multiplier'])} "
                      f"({escape(m['meaning'])})")
    for s in result["skipped"]:
        console.print(f"skipped {escape(s['group'])} {s['law']}: {escape(s['reason'])}")
    for note in result["notes"]:
        console.print(f"note: {escape(note)}")


def _estimate(estimate: dict | None) -> str:
    if estimate is None:
        return ""
    if estimate["low"] is None:
        return _fmt(estimate["value"])
    return f"{_fmt(estimate['value'])} [{_fmt(estimate['low'])}, {_fmt(estimate['high'])}]"


def run_summary(summary, *, store: Path, report: Path) -> None:
    """After a run: counts, the best trial, the front, and the report path."""
    from archsearch_dashboards.report import (
        DEFAULT_OBJECTIVES,
        completed_rows,
        write_report,
    )

    import archsearch as A
    from archsearch.analysis import pareto_front

    console.print(f"[bold]{summary.study}[/]: {summary.planned} trials planned, {summary.skipped} already done, "
                  f"{summary.completed} trained, {summary.failed} failed in {summary.wall_time_s:.0f}s")
    with A.open_store(store, read_only=True) as db:
        rows = completed_rows(db, summary.study)
        if not rows:
            console.print("[red]no completed trials; see `archsearch status` for the errors")
            return
        best = min(rows, key=lambda r: r["val_loss"])
        axes = ", ".join(f"{k}={v}" for k, v in best["axes"].items())
        console.print(f"best trial {best['trial_id']}: val_loss {best['val_loss']:.4f} at "
                      f"{best['params']:,} non-embedding params ({axes})")
        front_table(pareto_front(rows, DEFAULT_OBJECTIVES), ["val_loss", "params"])
        path = write_report(db, report, study=summary.study)
    console.print(f"report: {path}")


def status_tables(db, *, study: str | None, as_json: bool) -> None:
    studies = db.studies().to_pylist()
    trials = db.trials(study).to_pylist()
    if as_json:
        print(json.dumps({"studies": studies, "trials": trials}, indent=2, default=str))
        return
    table = Table(title=f"studies in {db.path}", header_style="bold")
    for name in ("study", "trials", "completed", "failed", "updated"):
        table.add_column(name, justify="right")
    for s in studies:
        table.add_row(s["name"], str(s["trials"]), str(s["completed"]), str(s["failed"]), str(s["updated_at"])[:19])
    console.print(table)
    table = Table(title="trials", header_style="bold")
    for name in ("trial", "axes", "params", "status", "val_loss", "tokens/s", "error"):
        table.add_column(name, justify="right")
    for t in trials:
        axes = ", ".join(f"{k}={v}" for k, v in json.loads(t["axes"]).items())
        table.add_row(t["trial_id"], axes, f"{t['params']:,}", t["status"], _fmt(t["val_loss"]),
                      _fmt(t["tokens_per_s"]), (t["error"] or "")[:60])
    console.print(table)


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
