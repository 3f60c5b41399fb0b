"""The archsearch command line. Heavy imports live inside each command so
``archsearch --help`` answers at once."""

from __future__ import annotations

import math
import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from archsearch.cli_analyze import analyze_app
from archsearch.cli_kernels import kernels_app
from archsearch.cli_common import (
    StudyArg,
    StoreOpt,
    StudyOpt,
    JsonOpt,
    WideOpt,
    AddressOpt,
    MaxParallelOpt,
    ReportOpt,
    ProgressOpt,
    SetOpt,
    DEFAULT_STORE,
    _fail,
    _writing,
    full_trial_id,
    leave_now,
    writable_kind,
    reading,
    require_study,
    user_errors,
)
from archsearch.jsontext import strict_json

# Plain click help: rich help labels every flag `<bool>`.
app = typer.Typer(help="Declarative architecture search and scaling studies for language models.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode=None)

def _version(value: bool) -> None:
    if value:
        from archsearch.store.duck import code_version

        typer.echo(f"archsearch {code_version()}")
        raise typer.Exit()


@app.callback()
def main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                               help="print the version and exit")] = False):
    """Options before any command (the app's help text is the Typer's)."""


IgnoreMemoryOpt = Annotated[bool, typer.Option(
    "--ignore-memory", help="plan trials whose estimated peak memory exceeds execution.memory or this machine's")]


@app.command()
@user_errors
def plan(study: StudyArg, as_json: JsonOpt = False, wide: WideOpt = False,
         layers: Annotated[bool, typer.Option("--layers", help="show each trial's per-layer plan")] = False,
         overrides: SetOpt = None, ignore_memory: IgnoreMemoryOpt = False,
         store: Annotated[Path, typer.Option("--store", help="a store whose completed trials' speed estimates the "
                                                             "plan's wall time (when it exists)")] = DEFAULT_STORE):
    """Every trial the study would run, widths solved; trains nothing. A search (a sampler, or
    fidelity rungs) also says what it proposes and the training FLOPs it implies."""
    import archsearch as A

    loaded = A.load_study(study, overrides=_memory_override(overrides, ignore_memory))
    search = loaded.search
    if search.probe is None and (search.sampler != "grid" or search.fidelity is not None):
        from archsearch.search.preview import plan_search

        preview = plan_search(loaded)
        if as_json:
            out = preview.to_dict() if search.sampler != "grid" else [t.to_dict() for t in preview.sample]
            typer.echo(strict_json(out, indent=2))
            return
        from archsearch.terminal import search_plan

        search_plan(preview, layers=layers, wide=wide)
        return
    trials = A.plan(loaded)
    if as_json:
        typer.echo(strict_json([t.to_dict() for t in trials], indent=2))
        return
    from archsearch.terminal import lines, plan_table

    plan_table(trials, layers=layers, wide=wide)
    lines(_wall_time_line(trials, loaded, store))


def _wall_time_line(trials: list, study, store: Path) -> list[str]:
    """The plan's estimated training time from the completed trials of ``store``, if it exists."""
    import os

    from archsearch.analysis.walltime import duration, estimate

    if not store.is_file():
        return []
    with reading(store) as db:
        completed = db.sql("SELECT family, tokens_per_s, flops_per_token FROM trials WHERE status = 'completed'"
                           ).to_pylist()
    execution = study.execution
    at_once = execution.max_parallel if execution.max_parallel != "auto" else \
        max(1, (os.cpu_count() or 1) // max(1, int(execution.cpus or execution.threads_per_trial)))
    planned = [dict(family=t.spec.family, train_flops=t.train_flops) for t in trials if t.same_as is None]
    found = estimate(planned, completed, at_once=at_once)
    if found is None:
        return []
    left = f"; {found.trials - found.covered} of {found.trials} trials left out (a family {store} has not " \
           "trained)" if found.covered < found.trials else ""
    return [f"estimated training time: about {duration(found.wall_s)} at {found.at_once} trials at a time "
            f"(each trial's FLOPs over its family's median FLOP/s in {found.measured} completed trials of {store}; "
            f"evaluation and start-up not counted{left})"]


RetryFailedOpt = Annotated[bool, typer.Option(
    "--retry-failed", help="also train the failed and diverged trials that used up execution.max_attempts")]
LogToOpt = Annotated[Optional[list[str]], typer.Option(
    "--log-to", metavar="NAME[=VALUE]", help="also send each trial's config and curves to tensorboard[=DIR], wandb[=PROJECT] or "
                     "mlflow[=TRACKING_URI], beside the study's logging: section (repeatable)")]


@app.command()
@user_errors
def run(study: StudyArg, store: StoreOpt = DEFAULT_STORE, address: AddressOpt = None,
        max_parallel: MaxParallelOpt = None, report: ReportOpt = None, progress: ProgressOpt = True,
        overrides: SetOpt = None, retry_failed: RetryFailedOpt = False, ignore_memory: IgnoreMemoryOpt = False,
        log_to: LogToOpt = None):
    """Run the study (embedded Ray unless --address), writing the store."""
    _run(study, store=store, address=address, max_parallel=max_parallel, report=report, progress=progress,
         resume=False, overrides=_memory_override(overrides, ignore_memory), retry_failed=retry_failed,
         log_to=log_to or [])


@app.command()
@user_errors
def resume(study: StudyArg, store: StoreOpt = DEFAULT_STORE, address: AddressOpt = None,
           max_parallel: MaxParallelOpt = None, report: ReportOpt = None, progress: ProgressOpt = True,
           overrides: SetOpt = None, retry_failed: RetryFailedOpt = False, ignore_memory: IgnoreMemoryOpt = False,
           log_to: LogToOpt = None):
    """Continue an interrupted study; finished trials are skipped."""
    _run(study, store=store, address=address, max_parallel=max_parallel, report=report, progress=progress,
         resume=True, overrides=_memory_override(overrides, ignore_memory), retry_failed=retry_failed,
         log_to=log_to or [])


def _memory_override(overrides: list[str] | None, ignore_memory: bool) -> list[str]:
    """``--ignore-memory`` is ``--set execution.memory_check=false`` (so a resume command repeats it)."""
    return [*(overrides or []), *(["execution.memory_check=false"] if ignore_memory else [])]


def _run(study_path: Path, *, store: Path, address, max_parallel, report, progress, resume: bool,
         overrides: list[str], retry_failed: bool = False, log_to: list[str] = ()) -> None:
    import archsearch as A
    from archsearch.errors import StoreError, StoreFullError
    from archsearch.execute import run_study
    from archsearch.execute.logs import with_log_to
    from archsearch.execute.process import exit_code, interrupt_on_termination

    study = A.load_study(study_path, overrides=overrides)
    if log_to:
        origin = study._origin
        study = study.model_copy(update={"logging": with_log_to(study.logging, log_to)})
        study._origin = origin
    if resume:
        if not store.exists():
            raise StoreError(f"no store at {store}; nothing to resume (use `archsearch run {study_path}`)")
        with reading(store) as db:
            require_study(db, study.name, store, f"start it with `archsearch run {study_path}`")
    with _writing(store.parent, "the store's folder"):
        store.parent.mkdir(parents=True, exist_ok=True)
    writable_kind(report or _default_report(study.name), "the report")  # before training, not after
    again = ["archsearch", "resume", str(study_path), "--store", str(store)]
    again += [part for text in overrides for part in ("--set", text)]
    again += [part for text in log_to for part in ("--log-to", text)]
    for flag, value in (("--address", address), ("--max-parallel", max_parallel), ("--report", report)):
        again += [flag, str(value)] if value is not None else []
    try:
        with interrupt_on_termination():  # SIGTERM and SIGHUP end it as Ctrl-C does
            summary = run_study(study, store=store, address=address, max_parallel=max_parallel,
                                show_progress=progress, retry_failed=retry_failed)
    except KeyboardInterrupt as stop:
        _fail(f"interrupted; finished trials are saved, continue with: {shlex.join(again)}", exit_code(stop))
    except StoreFullError as err:
        # what reached the store before the disk filled is kept (the failed transaction rolled back)
        _fail(f"{err}: {shlex.join(again)}", 2)
    from archsearch.terminal import run_summary

    report = report or _default_report(study.name)
    with _writing(report, "the report"):
        run_summary(summary, store=store, report=report,
                    retry=shlex.join([*again, "--retry-failed"]), attempts=study.execution.max_attempts)


def _default_report(study: str | None) -> Path:
    """``reports/STUDY.html`` for ``run`` and ``report`` alike (``reports/all.html`` for several studies)."""
    return Path("reports") / f"{study or 'all'}.html"


JobAddressOpt = Annotated[Optional[str], typer.Option(
    "--address", envvar="RAY_API_SERVER_ADDRESS", help="the cluster's Ray job server, http://HOST:8265")]
LOG_TAIL = 20


@app.command()
@user_errors
def submit(study: StudyArg, address: Annotated[str, typer.Option(
               envvar="RAY_API_SERVER_ADDRESS", help="the cluster's Ray job server, http://HOST:8265")],
           store: Annotated[Path, typer.Option("--store", help="results store on the cluster's head node "
                                                             "(relative: to the home folder there)")] = DEFAULT_STORE,
           wait: Annotated[bool, typer.Option("--wait", help="follow the job's log to its end; exit 1 if it "
                                                            "failed")] = False,
           overrides: SetOpt = None):
    """Send the study to a Ray cluster as a Ray job; prints the job id."""
    import archsearch as A
    from archsearch.execute import jobs

    job_id = jobs.submit_study(A.load_study(study, overrides=overrides or ()), address=address, store=str(store))
    typer.echo(job_id)
    if not wait:
        typer.echo(f"follow it with: archsearch status --job {job_id} --address {address}", err=True)
        return
    state, message = jobs.follow(address, job_id, echo=lambda text: typer.echo(text, nl=False, err=True))
    _job_ended(job_id, state, message, address)


def _job_ended(job_id: str, state: str, message: str, address: str) -> None:
    if state == "FAILED" or state == "STOPPED":
        _fail(f"job {job_id} {state.lower()}: {message.strip().splitlines()[-1] if message.strip() else ''}; "
              f"its log: archsearch status --job {job_id} --address {address}", 1)
    typer.echo(f"job {job_id}: {state}", err=True)


@app.command()
@user_errors
def status(store: StoreOpt = DEFAULT_STORE, study: StudyOpt = None, as_json: JsonOpt = False,
           wide: WideOpt = False,
           job: Annotated[Optional[str], typer.Option("--job", help="a Ray job's status and log tail instead "
                                                                  "(needs --address)")] = None,
           address: JobAddressOpt = None):
    """Studies and trials in a store (or, with --job, a submitted job)."""
    from archsearch.terminal import status_tables

    if job is not None:
        _job_status(job, address, as_json=as_json)
        return
    with reading(store, study) as db:
        status_tables(db, study=study, as_json=as_json, wide=wide)


app.command("ls", help="Studies and trials in a store (same as status).")(status)


def _job_status(job_id: str, address: Optional[str], *, as_json: bool) -> None:
    from archsearch.execute import jobs

    if not address:
        raise ValueError(f"--job {job_id}: give the cluster's job server with --address http://HOST:8265 "
                         "(or set RAY_API_SERVER_ADDRESS)")
    state, message, log = jobs.job_state(address, job_id)
    tail = log.splitlines()[-LOG_TAIL:]
    if as_json:
        typer.echo(strict_json({"job": job_id, "status": state, "message": message, "log_tail": tail}, indent=2))
        return
    typer.echo(f"job {job_id}: {state}" + (f" ({message.strip()})" if message.strip() else ""))
    for line in tail:
        typer.echo(f"  {line}")


CsvOpt = Annotated[Optional[Path], typer.Option("--from-csv", help="read this CSV instead of a store")]
ByOpt = Annotated[Optional[str], typer.Option("--by", help="group by this column or axis "
                                                          "(default: family on a store, none on a CSV)")]
BootstrapOpt = Annotated[int, typer.Option(min=0, max=100_000, help="bootstrap resamples for the intervals")]
LevelOpt = Annotated[float, typer.Option(min=0.5, max=0.999, help="interval level")]


@app.command()
@user_errors
def pareto(objectives: Annotated[str, typer.Option(help="columns with directions, e.g. val_loss,params or "
                                                        "loss:min,params:min,speed:max")] = "val_loss,params",
           store: StoreOpt = DEFAULT_STORE, study: StudyOpt = None, from_csv: CsvOpt = None,
           matched: Annotated[str, typer.Option(help="target: compare a matched measure at its budget target; "
                                                     "achieved: the solver's raw value")] = "target",
           reference: Annotated[Optional[str], typer.Option(help="hypervolume reference point, one value per "
                                                                 "objective (default: worst + 10% of range)")]
           = None,
           extrapolate: Annotated[Optional[float], typer.Option(help="the front at this parameter count, "
                                                                     "from each group's L(N) fit")] = None,
           by: ByOpt = None, pool_arms: Annotated[bool, typer.Option(
               "--pool-arms", help="with --extrapolate: one L(N) over each group's arms, not one per arm")] = False,
           bootstrap: BootstrapOpt = 200, as_json: JsonOpt = False):
    """The non-dominated rows over two or more objectives, with the hypervolume."""
    from archsearch import analysis

    table = _analysis_table(store, study, from_csv)
    goals = analysis.parse_objectives(objectives)
    try:
        ref = [float(v) for v in reference.split(",")] if reference else None
    except ValueError:
        ref = [math.nan]
    if ref is not None and not all(math.isfinite(v) for v in ref):
        raise ValueError(f"--reference '{reference}': give one finite number per objective, e.g. 4.0,1e8,0")
    if extrapolate is not None and not (math.isfinite(extrapolate) and extrapolate > 0):
        raise ValueError(f"--extrapolate {extrapolate}: give a positive, finite parameter count, e.g. 1e9")
    if extrapolate is not None:
        front = analysis.extrapolated_front(table, goals, extrapolate, by=by or ("family" if from_csv is None
                                                                                   else None),
                                            pool_arms=pool_arms, bootstrap=bootstrap, reference=ref)
    else:
        front = analysis.pareto(table, goals, reference=ref, matched=matched)
    if not front.considered:
        raise ValueError(f"no row has a value for every objective ({', '.join(c for c, _ in goals)}) among "
                         f"{table.num_rows} read; nothing to compare (see `archsearch status` or the CSV)")
    if as_json:
        typer.echo(strict_json(front.to_dict(), indent=2))
        return
    from archsearch.terminal import front_table, lines

    names = [c for c, _ in goals]
    if front.rows and "trial_id" not in front.rows[0]:  # CSV rows by number, extrapolated rows by group
        first = "index" if extrapolate is None else next(iter(front.rows[0]))  # the arm or group
        rows = [dict(row, index=i) for i, row in zip(front.indices, front.rows)]
        front_table(rows, [first, *names])
    else:
        front_table(front.rows, names)
    said = [f"note: {note}" for note in front.notes]
    if front.hypervolume is not None:
        said.append(f"hypervolume {front.hypervolume:.6g} ({front.hypervolume_fraction or 0:.1%} of the box up to "
                    f"the reference {', '.join(f'{v:.6g}' for v in front.reference)})")
    lines(said)


@app.command()
@user_errors
def fit(store: StoreOpt = DEFAULT_STORE, study: StudyOpt = None, from_csv: CsvOpt = None,
        by: Annotated[Optional[str], typer.Option("--by", help="group by this column or axis (default: family on a "
                                                               "store, none on a CSV); every group is still fitted "
                                                               "arm by arm (so --by arm, a looped study's axis, too)"
                                                               " unless --pool-arms")] = None,
        pool_arms: Annotated[bool, typer.Option("--pool-arms", help="one law over all the arms of each group (a "
                                                                    "trend across them, not a scaling law)")]
        = False,
        law: Annotated[str, typer.Option(help="laws to fit: N (params), C (compute), ND (Chinchilla)")] = "N,C,ND",
        n_col: Annotated[str, typer.Option(help="parameter count column")] = "params",
        d_col: Annotated[Optional[str], typer.Option(help="training tokens column (store: tokens)")] = None,
        flops_col: Annotated[Optional[str], typer.Option(help="training FLOPs column; tokens = FLOPs / 6N "
                                                              "when there is no tokens column")] = None,
        loss_col: Annotated[str, typer.Option(help="loss column")] = "val_loss",
        drop_highest: Annotated[int, typer.Option(min=0, help="leave out this many highest losses per group")] = 0,
        bootstrap: BootstrapOpt = 200, level: LevelOpt = 0.95,
        seed: Annotated[int, typer.Option(help="seed of the bootstrap resamples")] = 0,
        at: Annotated[Optional[list[str]], typer.Option(help="predict the loss at e.g. N=1e9,D=2e10 or C=1e21 "
                                                            "(repeatable)")] = None,
        compare: Annotated[Optional[str], typer.Option(help="effective-compute multiplier of B over A, as A,B")]
        = None,
        as_json: JsonOpt = False):
    """Scaling-law fits, one per arm (named as the report names it; a family of one arm by the family), with
    bootstrap intervals. An arm with too few sizes is listed as skipped, not fitted."""
    from archsearch import analysis

    table = _analysis_table(store, study, from_csv)
    points = [_point(text) for text in at or []]
    result = analysis.fit_scaling(
        table, laws=law.split(","), by=by or ("family" if from_csv is None else None), pool_arms=pool_arms,
        loss_col=loss_col, n_col=n_col, d_col=d_col or ("tokens" if from_csv is None else None), c_col=flops_col,
        drop_highest=drop_highest, bootstrap=bootstrap, level=level, seed=seed,
        progress=_fit_progress if table.num_rows >= FIT_PROGRESS_ROWS else None)
    out = result.to_dict()
    out["predictions"] = [dict(group=f.group, law=f.law.name, **f.predict(**p).to_dict())
                          for p in points for f in result.fits if set(f.law.variables) <= _with_d(p)]
    if compare:
        at_c = next((p["C"] for p in points if "C" in p), None)
        out["multipliers"] = [result.compute_multiplier(*result.pair(compare), compute=at_c)]
    if as_json:
        typer.echo(strict_json(out, indent=2))
        return
    from archsearch.terminal import fit_tables

    fit_tables(out)


@app.command()
@user_errors
def compare(baseline: Annotated[str, typer.Option(help="the arm every other is compared with: its label, or values "
                                                       "only it has, e.g. transformer or memory.aux=none,family=memory "
                                                       "(a protocol's baseline: iso-param or iso_flop)")],
            store: StoreOpt = DEFAULT_STORE, study: StudyOpt = None, from_csv: CsvOpt = None,
            by: Annotated[Optional[str], typer.Option(help="columns or axes that make an arm, comma-separated "
                                                           "(default: every axis that varies, arms alike but for their "
                                                           "family or match told apart as the report does; a CSV "
                                                           "must say)")]
            = None,
            within: Annotated[Optional[str], typer.Option(help="compare inside each group of these columns or "
                                                               "axes, e.g. family: each family's own baseline")]
            = None,
            metric: Annotated[str, typer.Option(help="the column compared, e.g. val_loss, gen_gap, val_accuracy")]
            = "val_loss",
            seed_col: Annotated[str, typer.Option(help="the column that pairs trials across arms")] = "seed",
            level: LevelOpt = 0.95,
            seed: Annotated[int, typer.Option(help="seed of sampled permutations (exact up to 13 pairs)")] = 0,
            pool: Annotated[bool, typer.Option("--pool", help="one test over every budget target (by default "
                                                              "each arm meets the baseline at its own target)")]
            = False,
            as_json: JsonOpt = False):
    """Each arm against a baseline over seeds: mean difference, interval, t and permutation p-values
    (paired by seed where both arms share their seeds, Welch otherwise), at each budget target apart.
    The permutation p-value is two-sided as scipy computes it: twice the smaller one-sided p-value."""
    from archsearch import analysis

    result = analysis.compare_arms(_analysis_table(store, study, from_csv), baseline=baseline, by=by, within=within,
                                   metric=metric, seed_col=seed_col, level=level, seed=seed, pool=pool)
    if as_json:
        typer.echo(strict_json(result.to_dict(), indent=2))
        return
    from archsearch.terminal import compare_table

    compare_table(result)


# Tables of this many rows or more: fit says on stderr which fit it is on (each takes seconds, not milliseconds).
FIT_PROGRESS_ROWS = 100_000


def _fit_progress(text: str) -> None:
    typer.echo(text, err=True)


def _analysis_table(store: Path, study: Optional[str], from_csv: Optional[Path]):
    """The rows fit and pareto read: a CSV, or the completed trials of a store."""
    from archsearch import analysis

    if from_csv is not None:
        return analysis.read_csv(from_csv)
    with reading(store, study) as db:
        return analysis.completed_trials(db, study)


def _point(text: str) -> dict[str, float]:
    """``N=1e9,D=2e10`` -> {"N": 1e9, "D": 2e10}."""
    point = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and number > 0):
            raise ValueError(f"--at '{text}': write NAME=NUMBER pairs of positive, finite numbers, e.g. N=1e9,D=2e10 "
                             "or C=1e21")
        point[name.strip().upper()] = number
        if name.strip().upper() not in ("N", "D", "C"):
            raise ValueError(f"--at '{text}': unknown variable '{name}'; use N, D or C")
    return point


def _with_d(point: dict) -> set[str]:
    return set(point) | ({"D"} if {"N", "C"} <= set(point) else set())


@app.command()
@user_errors
def report(output: Annotated[Optional[Path], typer.Option(
               "-o", "--output", help="HTML file to write [default: reports/STUDY.html, as run writes]")] = None,
           store: StoreOpt = DEFAULT_STORE, study: StudyOpt = None,
           png: Annotated[Optional[Path], typer.Option(
               "--png", help="folder to write each figure as NAME.png (needs the png extra); "
                             "then the HTML only with -o")] = None):
    """A self-contained interactive HTML report, or its figures as PNG files."""
    from archsearch_dashboards.report import write_pngs, write_report

    from archsearch.terminal import REPORT_WORK, doing

    with reading(store, study) as db:
        if png is not None:
            with _writing(png, "PNG files to"), doing("drawing each figure as a PNG (through Chromium)"):
                for path in write_pngs(db, png, study=study):
                    typer.echo(f"png: {path}")
            if output is None:
                return
        names = db.studies().column("name").to_pylist()
        output = output or _default_report(study or (names[0] if len(names) == 1 else None))
        with _writing(output, "the report"), doing(REPORT_WORK):
            path = write_report(db, output, study=study)
    typer.echo(f"report: {path}")


@app.command()
@user_errors
def dashboard(store: StoreOpt = DEFAULT_STORE,
              host: Annotated[str, typer.Option(help="address to serve on (loopback by default)")] = "127.0.0.1",
              port: Annotated[int, typer.Option(min=1, max=65535, help="port to serve on")] = 8050,
              password: Annotated[Optional[str], typer.Option(
                  envvar="ARCHSEARCH_DASHBOARD_PASSWORD",
                  help="ask every visitor for this password (HTTP Basic, any user name); better set "
                       "ARCHSEARCH_DASHBOARD_PASSWORD than type it")] = None):
    """The live dashboard: figures that redraw as trials finish (Ctrl-C stops it)."""
    with reading(store):  # a store it cannot read: one line now, not an error on every redraw
        pass
    import importlib.util

    if importlib.util.find_spec("dash") is None:  # the app imports it only as it starts serving
        _fail("the dashboard needs Dash: pip install 'archsearch[dashboard]'", 2)
    if password and importlib.util.find_spec("dash_auth") is None:
        _fail("a dashboard password needs dash-auth: pip install 'archsearch[dashboard]'", 2)
    from archsearch_dashboards.app import serve

    if not _loopback(host):
        if password:
            typer.echo(f"note: the dashboard on {host} asks for the password, which HTTP sends unencrypted: serve "
                       "it on a trusted network or behind an HTTPS proxy", err=True)
        else:
            typer.echo(f"warning: the dashboard on {host} shows {store} to every machine that can reach port {port}, "
                       "with no password; set ARCHSEARCH_DASHBOARD_PASSWORD (or --password) to ask for one", err=True)
    # flushed: piped, the line would wait in a buffer while the server runs
    typer.echo(f"dashboard: http://{host}:{port}/ over {store} (Ctrl-C stops it)")
    sys.stdout.flush()
    serve(store, host=host, port=port, password=password)


def _loopback(host: str) -> bool:
    """Whether ``host`` is reached from this machine only (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


@app.command()
@user_errors
def export(parquet: Annotated[Optional[Path], typer.Option(
               "--parquet", help="folder to write one .parquet per table")] = None,
           hf: Annotated[Optional[tuple[str, Path]], typer.Option(
               "--hf", metavar="TRIAL DIR",
               help="write trial TRIAL (its id or a unique prefix) to the new folder DIR: a transformers "
                    "checkpoint (Llama, Mamba, Mamba-2; needs the hf extra), else safetensors and the spec "
                    "that rebuilds it")] = None,
           store: StoreOpt = DEFAULT_STORE):
    """The store as Parquet files, or a trained model as a transformers checkpoint."""
    if (parquet is None) == (hf is None):
        _fail("export needs one of --parquet DIR (the store) or --hf TRIAL DIR (a trained model)", 2)
    if parquet is not None:
        with reading(store) as db, _writing(parquet, "Parquet files to"):
            for path in db.export_parquet(parquet):
                typer.echo(path)
        return
    from archsearch.export import export_trial

    trial, folder = hf
    trial_id = full_trial_id(store, trial)
    with _writing(folder, "the model to"):
        done = export_trial(trial_id, folder, store=store)
    if done.status != "completed":
        typer.echo(f"{trial_id[:8]}: the trial is {done.status}; this is its newest checkpoint, not a final model")
    if done.kind == "transformers":
        typer.echo(f"{trial_id[:8]}: {done.hf_class} in {folder} (logits within {done.max_diff:.1e} of "
                   "archsearch's on a random batch); AutoModelForCausalLM.from_pretrained loads it")
    else:
        typer.echo(f"{trial_id[:8]}: not a transformers checkpoint: {done.reason}")
        typer.echo(f"{trial_id[:8]}: model.safetensors and spec.json in {folder}; "
                   "A.build_model(ArchSpec.from_dict(spec)) rebuilds it")


@app.command()
def schema(kind: Annotated[str, typer.Argument(help="study or space")] = "study"):
    """JSON Schema of study or space files, for editors."""
    from archsearch.space.schema import Space, Study

    models = {"study": Study, "space": Space}
    if kind not in models:
        _fail(f"unknown schema '{kind}'; choose study or space", 2)
    typer.echo(strict_json(models[kind].model_json_schema(), indent=2))


app.add_typer(analyze_app, name="analyze")
app.add_typer(kernels_app, name="kernels")


@app.command()
@user_errors
def bench(study: StudyArg,
          trial: Annotated[Optional[int], typer.Option("--trial", help="only trial N of `plan` (0-based; default all)")]
          = None,
          kernels: Annotated[str, typer.Option(
              help="on (Triton on CUDA, C++ kernels on a CPU), off (PyTorch) or both (default: both where a "
                   "kernel applies, else off)")] = "auto",
          rounds: Annotated[int, typer.Option(help="timed rounds, after one warm-up round")] = 5,
          hf: Annotated[bool, typer.Option(help="also time transformers' equivalent: Llama, Mamba, the gated delta rule")]
          = True,
          threads: Annotated[Optional[int], typer.Option(help="torch threads (default: the study's threads_per_trial)")]
          = None,
          batch_size: Annotated[Optional[int], typer.Option(help="override the recipe's batch size")] = None,
          compile_backend: Annotated[Optional[str], typer.Option(
              "--compile", help="also time each trial under torch.compile with this backend: inductor, aot_eager "
                                "or eager")] = None,
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
                          threads=threads or loaded.execution.threads_per_trial, batch_size=batch_size,
                          compile_backend=compile_backend)
    if as_json:
        typer.echo(strict_json(result, indent=2))
        return
    from archsearch.terminal import bench_table

    bench_table(loaded.name, result)


def entry() -> None:
    """The ``archsearch`` console script and ``python -m archsearch.cli``: the
    command, then a prompt exit with its status (``cli_common.leave_now``).
    Tests call ``app`` in-process (CliRunner), never this."""
    try:
        app()
    except SystemExit as stop:
        leave_now(stop.code)
        raise


if __name__ == "__main__":
    entry()
