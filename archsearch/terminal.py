"""What the command line prints: rich tables of plans, fronts and stores."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console
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
    table = Table(title=f"Pareto front ({', '.join(columns)})", header_style="bold")
    for name in ["trial", "axes", *columns]:
        table.add_column(name, justify="right")
    for row in front:
        axes = ", ".join(f"{k}={v}" for k, v in row["axes"].items())
        table.add_row(row["trial_id"], axes, *(_fmt(row[c]) for c in columns))
    console.print(table)


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
    table = Table(title=title, header_style="bold")
    for name in [*keys, "layer", *metrics]:
        table.add_column(name, justify="right")
    for where, values in lines.items():
        table.add_row(*(_fmt(str(v) if isinstance(v, bool) else v) for v in where),
                      *(_fmt(values.get(m)) for m in metrics))
    console.print(table)
