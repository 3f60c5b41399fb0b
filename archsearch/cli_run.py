"""Training a study and following it: ``run`` and ``resume`` (embedded or existing Ray),
``submit`` (a Ray job on a cluster), and ``status`` of a store or a submitted job."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Optional

import typer

from archsearch.cli_common import (
    DEFAULT_STORE,
    AddressOpt,
    IgnoreMemoryOpt,
    JsonOpt,
    MaxParallelOpt,
    ProgressOpt,
    ReportOpt,
    SetOpt,
    StoreOpt,
    StudyArg,
    StudyOpt,
    WideOpt,
    _default_report,
    _fail,
    _memory_override,
    _writing,
    reading,
    require_study,
    user_errors,
    writable_kind,
)
from archsearch.jsontext import strict_json

RetryFailedOpt = Annotated[bool, typer.Option(
    "--retry-failed", help="also train the failed and diverged trials that used up execution.max_attempts")]
LogToOpt = Annotated[Optional[list[str]], typer.Option(
    "--log-to", metavar="NAME[=VALUE]", help="also send each trial's config and curves to tensorboard[=DIR], wandb[=PROJECT] or "
                     "mlflow[=TRACKING_URI], beside the study's logging: section (repeatable)")]


@user_errors
def run(study: StudyArg, store: StoreOpt = DEFAULT_STORE, address: AddressOpt = None,
        max_parallel: MaxParallelOpt = None, report: ReportOpt = None, progress: ProgressOpt = True,
        overrides: SetOpt = None, retry_failed: RetryFailedOpt = False, ignore_memory: IgnoreMemoryOpt = False,
        log_to: LogToOpt = None):
    """Run the study (embedded Ray unless --address), writing the store."""
    _run(study, store=store, address=address, max_parallel=max_parallel, report=report, progress=progress,
         resume=False, overrides=_memory_override(overrides, ignore_memory), retry_failed=retry_failed,
         log_to=log_to or [])


@user_errors
def resume(study: StudyArg, store: StoreOpt = DEFAULT_STORE, address: AddressOpt = None,
           max_parallel: MaxParallelOpt = None, report: ReportOpt = None, progress: ProgressOpt = True,
           overrides: SetOpt = None, retry_failed: RetryFailedOpt = False, ignore_memory: IgnoreMemoryOpt = False,
           log_to: LogToOpt = None):
    """Continue an interrupted study; finished trials are skipped."""
    _run(study, store=store, address=address, max_parallel=max_parallel, report=report, progress=progress,
         resume=True, overrides=_memory_override(overrides, ignore_memory), retry_failed=retry_failed,
         log_to=log_to or [])



def _run(study_path: Path, *, store: Path, address, max_parallel, report, progress, resume: bool,
         overrides: list[str], retry_failed: bool = False, log_to: list[str] = ()) -> None:
    import archsearch as A
    from archsearch.errors import StoreError, StoreFullError
    from archsearch.execute import run_study
    from archsearch.execute.process import exit_code, interrupt_on_termination

    study = _logging_to(A.load_study(study_path, overrides=overrides), log_to)
    if resume:
        if not store.exists():
            raise StoreError(f"no store at {store}; nothing to resume (use `archsearch run {study_path}`)")
        with reading(store) as db:
            require_study(db, study.name, store, f"start it with `archsearch run {study_path}`")
    with _writing(store.parent, "the store's folder", "pass --store a path this user can write"):
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
    from archsearch.terminal_store import run_summary

    report = report or _default_report(study.name)
    with _writing(report, "the report"):
        run_summary(summary, store=store, report=report,
                    retry=shlex.join([*again, "--retry-failed"]), attempts=study.execution.max_attempts)


def _logging_to(study, log_to: list[str]):
    """``study`` with each ``--log-to`` added to its logging: section (its origin kept for messages)."""
    from archsearch.execute.logs import with_log_to

    if not log_to:
        return study
    origin = study._origin
    study = study.model_copy(update={"logging": with_log_to(study.logging, log_to)})
    study._origin = origin
    return study


JobAddressOpt = Annotated[Optional[str], typer.Option(
    "--address", envvar="RAY_API_SERVER_ADDRESS", help="the cluster's Ray job server, http://HOST:8265")]
LOG_TAIL = 20


@user_errors
def submit(study: StudyArg, address: Annotated[str, typer.Option(
               envvar="RAY_API_SERVER_ADDRESS", help="the cluster's Ray job server, http://HOST:8265")],
           store: Annotated[Path, typer.Option("--store", help="results store on the cluster's head node "
                                                             "(relative: to the home folder there)")] = DEFAULT_STORE,
           wait: Annotated[bool, typer.Option("--wait", help="follow the job's log to its end; exit 1 if it "
                                                            "failed")] = False,
           overrides: SetOpt = None, log_to: LogToOpt = None):
    """Send the study to a Ray cluster as a Ray job; prints the job id."""
    import archsearch as A
    from archsearch.execute import jobs

    job_id = jobs.submit_study(_logging_to(A.load_study(study, overrides=overrides or ()), log_to or []),
                               address=address, store=str(store))
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


@user_errors
def status(store: StoreOpt = DEFAULT_STORE, study: StudyOpt = None, as_json: JsonOpt = False,
           wide: WideOpt = False,
           job: Annotated[Optional[str], typer.Option("--job", help="a Ray job's status and log tail instead "
                                                                  "(needs --address)")] = None,
           address: JobAddressOpt = None):
    """Studies and trials in a store (or, with --job, a submitted job)."""
    from archsearch.terminal_store import status_tables

    if job is not None:
        _job_status(job, address, as_json=as_json)
        return
    with reading(store, study) as db:
        status_tables(db, study=study, as_json=as_json, wide=wide)



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
