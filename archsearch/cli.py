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
        except (ValueError, FileNotFoundError) as err:
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


analyze_app = typer.Typer(help="Analyses of trained trials, loaded from their checkpoints (docs/inspect.md).",
                          no_args_is_help=True)
app.add_typer(analyze_app, name="analyze")

TrialArg = Annotated[str, typer.Argument(help="trial id (see `archsearch status`)")]
BatchesOpt = Annotated[int, typer.Option(help="calibration batches, from the trial's validation data")]
BatchSizeOpt = Annotated[int, typer.Option(help="rows per calibration batch")]
SeedOpt = Annotated[int, typer.Option(help="seed of the calibration batches (and of injected noise)")]


def _analysis(run, title: str, columns: list[str], as_json: bool, fold: str | None = None, **kwargs) -> None:
    """Run one ``archsearch.inspect.runs`` analysis and show (or print as JSON) the rows it stored."""
    from archsearch.inspect.runs import Calibration

    calib = Calibration(batches=kwargs.pop("batches"), batch_size=kwargs.pop("batch_size"), seed=kwargs.pop("seed"))
    rows = run(calib=calib, **kwargs)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    from archsearch.terminal import profile_table

    profile_table(title, rows, columns, fold)


@analyze_app.command("rho")
@user_errors
def analyze_rho(trial_id: TrialArg, store: StoreOpt = DEFAULT_STORE,
                mode: Annotated[str, typer.Option(help="noise, wanda, magnitude or int8")] = "noise",
                noise: Annotated[float, typer.Option(help="injected error, relative to the hidden state")] = 1e-2,
                sparsity: Annotated[float, typer.Option(help="for wanda and magnitude")] = 0.5,
                batches: BatchesOpt = 4, batch_size: BatchSizeOpt = 8, seed: SeedOpt = 0, as_json: JsonOpt = False):
    """Error contraction rho per layer, with predicted and measured amplification."""
    from archsearch.inspect.runs import analyze_rho as run

    _analysis(run, f"rho of {trial_id} ({mode})", ["mode"], as_json, trial_id=trial_id, store=store, mode=mode,
              noise=noise, sparsity=sparsity, batches=batches, batch_size=batch_size, seed=seed)


@analyze_app.command("prune")
@user_errors
def analyze_prune(trial_id: TrialArg, store: StoreOpt = DEFAULT_STORE,
                  max_removed: Annotated[Optional[int], typer.Option(help="most layers removed (default L/2)")] = None,
                  alpha: Annotated[float, typer.Option(help="weight of Block Influence in the blend")] = 0.5,
                  batches: BatchesOpt = 4, batch_size: BatchSizeOpt = 8, seed: SeedOpt = 0, as_json: JsonOpt = False):
    """Depth pruning (stack models): perplexity and tokens/s with k layers removed, per ranking."""
    from archsearch.inspect.runs import analyze_prune as run

    _analysis(run, f"depth pruning of {trial_id}", ["ranking", "removed"], as_json, fold="dropped",
              trial_id=trial_id, store=store, max_removed=max_removed, alpha=alpha, batches=batches,
              batch_size=batch_size, seed=seed)


@analyze_app.command("wanda")
@user_errors
def analyze_wanda(trial_id: TrialArg, store: StoreOpt = DEFAULT_STORE,
                  sparsity: Annotated[float, typer.Option(help="total share of weights pruned")] = 0.5,
                  spread: Annotated[float, typer.Option(help="depth schedule: first/last layer at (1 -/+ spread) x")]
                  = 0.5, method: Annotated[str, typer.Option(help="wanda or magnitude")] = "wanda",
                  batches: BatchesOpt = 4, batch_size: BatchSizeOpt = 8, seed: SeedOpt = 0, as_json: JsonOpt = False):
    """Wanda pruning: a uniform against a depth-decreasing schedule at the same total sparsity."""
    from archsearch.inspect.runs import analyze_wanda as run

    _analysis(run, f"{method} at {sparsity:.0%} on {trial_id}", ["schedule"], as_json, trial_id=trial_id,
              store=store, sparsity=sparsity, spread=spread, method=method, batches=batches, batch_size=batch_size,
              seed=seed)


@analyze_app.command("exit")
@user_errors
def analyze_exit(trial_id: TrialArg, store: StoreOpt = DEFAULT_STORE,
                 thresholds: Annotated[str, typer.Option(help="comma-separated exit thresholds in (0, 1]")]
                 = "0.5,0.7,0.8,0.9,0.95,0.99,1.0",
                 adapt_steps: Annotated[int, typer.Option(help="steps of cache-hole adaptation (0: none)")] = 0,
                 cache_hole: Annotated[float, typer.Option(help="share of tokens taking sampled exits")] = 0.5,
                 lr: Annotated[float, typer.Option(help="learning rate of the adaptation")] = 1e-4,
                 batches: BatchesOpt = 4, batch_size: BatchSizeOpt = 8, seed: SeedOpt = 0, as_json: JsonOpt = False):
    """Early exit (looped models with exit gates): perplexity against the share of loop steps run."""
    from archsearch.inspect.runs import analyze_exit as run

    try:
        values = tuple(float(t) for t in thresholds.split(","))
    except ValueError:
        raise ValueError(f"--thresholds: {thresholds!r} is not a comma-separated list of numbers") from None
    if any(not 0 < t <= 1 for t in values):
        raise ValueError(f"--thresholds: every threshold must be in (0, 1], got {thresholds}")
    _analysis(run, f"early exit of {trial_id}", ["adapted", "threshold"], as_json, trial_id=trial_id, store=store,
              thresholds=values, adapt_steps=adapt_steps, cache_hole=cache_hole, lr=lr, batches=batches,
              batch_size=batch_size, seed=seed)


@analyze_app.command("probe")
@user_errors
def analyze_probe(trial_id: TrialArg, store: StoreOpt = DEFAULT_STORE,
                  state: Annotated[str, typer.Option(help="comma-separated: hidden:LAYER, gpn or memory")] = "hidden:0",
                  target: Annotated[str, typer.Option(help="comma-separated: position or lag:K")] = "position",
                  baseline: Annotated[Optional[str], typer.Option(help="another trial, probed the same way")] = None,
                  lam: Annotated[float, typer.Option(help="ridge penalty")] = 1e-3,
                  batches: BatchesOpt = 4, batch_size: BatchSizeOpt = 8, seed: SeedOpt = 0, as_json: JsonOpt = False):
    """Linear probes from states to targets (and on a baseline), and learned-decay half-lives."""
    from archsearch.inspect.runs import analyze_probe as run

    _analysis(run, f"probes of {trial_id}", ["model", "state", "target"], as_json, trial_id=trial_id, store=store,
              states=tuple(state.split(",")), targets=tuple(target.split(",")), baseline=baseline, lam=lam,
              batches=batches, batch_size=batch_size, seed=seed)


if __name__ == "__main__":
    app()
