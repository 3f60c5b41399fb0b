"""The archsearch command line. Heavy imports live inside each command so
``archsearch --help`` answers at once."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(help="Declarative architecture search and scaling studies for language models.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)

StudyArg = Annotated[Path, typer.Argument(help="study YAML file")]
StoreOpt = Annotated[Path, typer.Option("--store", help="results store (DuckDB file)")]
StudyOpt = Annotated[Optional[str], typer.Option("--study", help="only this study (default: all)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]
AddressOpt = Annotated[Optional[str], typer.Option(help="Ray cluster address; default: embedded local Ray")]
MaxParallelOpt = Annotated[Optional[int], typer.Option(help="trials at once (default: the study's, else CPUs)")]
ReportOpt = Annotated[Optional[Path], typer.Option(help="report path (default reports/STUDY.html)")]
ProgressOpt = Annotated[bool, typer.Option(help="show the progress bar (on a terminal)")]
DEFAULT_STORE = Path("archsearch.duckdb")


def _fail(message: str, code: int) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def user_errors(command):
    """Turn every error a user can cause into one line and a non-zero exit."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        from archsearch.errors import ArchsearchError

        try:
            return command(*args, **kwargs)
        except ArchsearchError as err:
            _fail(str(err), err.exit_code)
        except ValueError as err:
            _fail(str(err), 2)
        except KeyboardInterrupt:
            _fail("interrupted; finished trials are saved, run `archsearch resume STUDY` to continue", 130)

    return wrapper


@app.command()
@user_errors
def plan(study: StudyArg, as_json: JsonOpt = False,
         layers: Annotated[bool, typer.Option("--layers", help="show each trial's per-layer plan")] = False):
    """Every trial the study would run, with solved widths; trains nothing."""
    import archsearch as A

    trials = A.plan(A.load_study(study))
    if as_json:
        typer.echo(json.dumps([t.to_dict() for t in trials], indent=2))
        return
    from archsearch.terminal import plan_table

    plan_table(trials, layers=layers)


@app.command()
@user_errors
def run(study: StudyArg, store: StoreOpt = DEFAULT_STORE, address: AddressOpt = None,
        max_parallel: MaxParallelOpt = None, report: ReportOpt = None, progress: ProgressOpt = True):
    """Run the study (embedded Ray unless --address), writing the store."""
    _run(study, store=store, address=address, max_parallel=max_parallel, report=report, progress=progress,
         resume=False)


@app.command()
@user_errors
def resume(study: StudyArg, store: StoreOpt = DEFAULT_STORE, address: AddressOpt = None,
           max_parallel: MaxParallelOpt = None, report: ReportOpt = None, progress: ProgressOpt = True):
    """Continue an interrupted study; finished trials are not trained again."""
    _run(study, store=store, address=address, max_parallel=max_parallel, report=report, progress=progress,
         resume=True)


def _run(study_path: Path, *, store: Path, address, max_parallel, report, progress, resume: bool) -> None:
    import archsearch as A
    from archsearch.errors import StoreError
    from archsearch.execute import run_study

    study = A.load_study(study_path)
    if resume:
        if not store.exists():
            raise StoreError(f"no store at {store}; nothing to resume (use `archsearch run {study_path}`)")
        with A.open_store(store, read_only=True) as db:
            if study.name not in db.studies().column("name").to_pylist():
                raise StoreError(f"study '{study.name}' is not in {store}; start it with `archsearch run`")
    summary = run_study(study, store=store, address=address, max_parallel=max_parallel,
                        show_progress=progress and sys.stderr.isatty())
    from archsearch.terminal import run_summary

    run_summary(summary, store=store, report=report or Path("reports") / f"{study.name}.html")


@app.command()
@user_errors
def status(store: StoreOpt = DEFAULT_STORE, study: StudyOpt = None, as_json: JsonOpt = False):
    """Studies and trials in a store."""
    import archsearch as A
    from archsearch.terminal import status_tables

    with A.open_store(store, read_only=True) as db:
        status_tables(db, study=study, as_json=as_json)


app.command("ls", help="Studies and trials in a store (same as status).")(status)


@app.command()
@user_errors
def pareto(objectives: Annotated[str, typer.Option(help="columns, e.g. val_loss,params or tokens_per_s:max")]
           = "val_loss,params", store: StoreOpt = DEFAULT_STORE, study: StudyOpt = None, as_json: JsonOpt = False):
    """The non-dominated trials over the objectives."""
    from archsearch_dashboards.report import completed_rows

    import archsearch as A
    from archsearch.analysis import pareto_front, parse_objectives
    from archsearch.terminal import front_table

    with A.open_store(store, read_only=True) as db:
        rows = completed_rows(db, study)
    front = pareto_front(rows, parse_objectives(objectives))
    if as_json:
        typer.echo(json.dumps(front, indent=2, default=str))
    else:
        front_table(front, [c for c, _ in parse_objectives(objectives)])


@app.command()
@user_errors
def report(output: Annotated[Path, typer.Option("-o", "--output", help="HTML file to write")] = Path("report.html"),
           store: StoreOpt = DEFAULT_STORE, study: StudyOpt = None):
    """A self-contained interactive HTML report."""
    from archsearch_dashboards.report import write_report

    import archsearch as A

    with A.open_store(store, read_only=True) as db:
        path = write_report(db, output, study=study)
    typer.echo(f"report: {path}")


@app.command()
@user_errors
def export(parquet: Annotated[Path, typer.Option("--parquet", help="folder to write one .parquet per table")],
           store: StoreOpt = DEFAULT_STORE):
    """The store as Parquet files."""
    import archsearch as A

    with A.open_store(store, read_only=True) as db:
        for path in db.export_parquet(parquet):
            typer.echo(path)


@app.command()
def schema(kind: Annotated[str, typer.Argument(help="study or space")] = "study"):
    """JSON Schema of study or space files, for editors."""
    from archsearch.space.schema import Space, Study

    models = {"study": Study, "space": Space}
    if kind not in models:
        _fail(f"unknown schema '{kind}'; choose study or space", 2)
    typer.echo(json.dumps(models[kind].model_json_schema(), indent=2))


@app.command()
@user_errors
def bench(study: StudyArg,
          trial: Annotated[Optional[int], typer.Option("--trial", help="only trial N of `plan` (0-based; default all)")]
          = None,
          kernels: Annotated[str, typer.Option(help="on, off or both (default: both on CUDA, off on a CPU)")] = "auto",
          rounds: Annotated[int, typer.Option(help="timed rounds, after one warm-up round")] = 5,
          hf: Annotated[bool, typer.Option(help="also time Hugging Face transformers' Llama/Mamba where equivalent")]
          = True,
          threads: Annotated[Optional[int], typer.Option(help="torch threads (default: the study's threads_per_trial)")]
          = None,
          batch_size: Annotated[Optional[int], typer.Option(help="override the recipe's batch size")] = None,
          as_json: JsonOpt = False):
    """Time a training step of the study's planned architectures: tokens/s, MFU, peak memory."""
    import archsearch as A
    from archsearch.train.bench import bench_trials

    loaded = A.load_study(study)
    trials = A.plan(loaded)
    if trial is not None and not 0 <= trial < len(trials):
        raise ValueError(f"{study}: --trial {trial}: the study plans {len(trials)} trials, numbered 0 to {len(trials) - 1}")
    choices = {"auto": None, "on": ["on"], "off": ["off"], "both": ["on", "off"]}
    if kernels not in choices:
        raise ValueError(f"--kernels {kernels!r}: choose on, off, both or auto")
    if rounds < 1:
        raise ValueError(f"--rounds {rounds}: time at least one round")
    result = bench_trials(trials, [trial] if trial is not None else list(range(len(trials))), rounds=rounds,
                          kernels=choices[kernels], compare_hf=hf,
                          threads=threads or loaded.execution.threads_per_trial, batch_size=batch_size)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{loaded.name}: {result['device']}, {result['threads']} threads, {result['dtype']}, "
                        f"matmul {result['matmul_tflops'] * 1e3:.1f} GFLOP/s, median of {result['rounds']} rounds")
    for column in ("trial", "family", "impl", "kernels", "params", "step ms", "tokens/s", "MFU", "peak MB"):
        table.add_column(column, justify="left" if column in ("family", "impl", "kernels") else "right")
    for row in result["rows"]:
        table.add_row(str(row["trial"]), row["family"], row["impl"], row["kernels"], f"{row['params']:,}",
                      f"{row['step_ms']:.1f}", f"{row['tokens_per_s']:,.0f}", f"{row['mfu']:.1%}", f"{row['peak_mb']:.0f}")
    # wide enough that no column is cut when the output is not a terminal
    Console(width=max(Console().width, 120)).print(table)


if __name__ == "__main__":
    app()
