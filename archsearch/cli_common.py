"""What every command of the command line shares: argument and option types,
the default store, and the wrapper that turns a user's mistake into one line."""

from __future__ import annotations

import errno
import functools
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer

StudyArg = Annotated[Path, typer.Argument(help="study YAML file")]
StoreOpt = Annotated[Path, typer.Option("--store", help="results store (DuckDB file)")]
StudyOpt = Annotated[Optional[str], typer.Option("--study", help="only this study (default: all)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]
WideOpt = Annotated[bool, typer.Option("--wide", help="every column (default: the ones that fit 80 columns)")]
AddressOpt = Annotated[Optional[str], typer.Option(help="Ray cluster address; default: embedded local Ray")]
MaxParallelOpt = Annotated[Optional[int], typer.Option(help="trials at once (default: the study's, else CPUs)")]
ReportOpt = Annotated[Optional[Path], typer.Option(help="report path [default: reports/STUDY.html]")]
ProgressOpt = Annotated[bool, typer.Option(help="show the progress bar (on a terminal)")]
SetOpt = Annotated[Optional[list[str]], typer.Option(
    "--set", help="KEY=VALUE override of the study, validated like the file (repeatable), "
                  "e.g. --set recipe.steps=50 --set data.paths=[wiki.train.txt]")]
IgnoreMemoryOpt = Annotated[bool, typer.Option(
    "--ignore-memory", help="plan trials whose estimated peak memory exceeds execution.memory or this machine's")]
DEFAULT_STORE = Path("archsearch.duckdb")


def _memory_override(overrides: list[str] | None, ignore_memory: bool) -> list[str]:
    """``--ignore-memory`` is ``--set execution.memory_check=false`` (so a resume command repeats it)."""
    return [*(overrides or []), *(["execution.memory_check=false"] if ignore_memory else [])]


def _default_report(study: str | None) -> Path:
    """``reports/STUDY.html`` for ``run`` and ``report`` alike (``reports/all.html`` for several studies)."""
    return Path("reports") / f"{study or 'all'}.html"


def _fail(message: str, code: int) -> None:
    from archsearch.terminal import plain

    typer.echo(f"error: {plain(message)}", err=True)
    raise typer.Exit(code)


def writable_kind(path: Path, what: str, fix: str = "choose another path") -> None:
    """Refuse, in one line and before any work, an output path that a write would block on (a
    named pipe no process reads) or cannot write (a socket, a folder that refuses a file); see
    ``files.output_problem`` and ``files.write_problem``."""
    from archsearch.files import output_problem, write_problem

    problem = output_problem(path)
    if problem is not None:
        _fail(f"cannot write {what} {path}: it {problem}; {fix}", 2)
    problem = write_problem(path)
    if problem is not None:
        _fail(f"cannot write {what} {path}: {problem}; {fix}", 2)


@contextmanager
def _writing(path: Path, what: str, fix: str = "choose another path"):
    """A file or folder the user named that cannot be written: one line, exit 2, ending with ``fix``."""
    import duckdb

    writable_kind(path, what, fix)
    try:
        yield
    except (OSError, duckdb.IOException) as err:
        reason = getattr(err, "strerror", None) or str(err).splitlines()[0]
        _fail(f"cannot write {what} {path}: {reason}; {fix}", 2)


def require_study(db, study: str, store: Path, fix: str) -> None:
    """Raise StoreError (exit 2) unless ``study`` is in the open store ``db``;
    the line names the studies it holds and ends with ``fix``."""
    from archsearch.errors import StoreError, did_you_mean

    names = db.studies().column("name").to_pylist()
    if study not in names:
        hint = did_you_mean(study, names)
        held = ", ".join(f"'{n}'" for n in names) or "none"
        raise StoreError(f"study '{study}' is not in {store} (it holds {held}"
                         f"{'; ' + hint if hint else ''}); {fix}")


@contextmanager
def reading(store: Path, study: str | None = None):
    """The store a command reads, opened read-only, with ``--study`` (when
    given) checked to be in it: either missing is one line and exit 2."""
    import archsearch as A

    with A.open_store(store, read_only=True) as db:
        if study is not None:
            require_study(db, study, store, "see `archsearch status --store PATH` for its studies")
        yield db


def full_trial_id(store: Path, trial: str) -> str:
    """The trial a user named, by its whole id or a unique prefix of it (the tables show ids
    by their first characters); one line and exit 2 when the store has none or several."""
    from archsearch.errors import StoreError

    with reading(store) as db:
        found = db.sql("SELECT trial_id FROM trials WHERE starts_with(trial_id, ?) ORDER BY trial_id LIMIT 4",
                       [trial]).column("trial_id").to_pylist()
    if trial in found or len(found) == 1:
        return trial if trial in found else found[0]
    if not found:
        raise StoreError(f"no trial {trial} in {store}; `archsearch status --store {store}` lists them")
    more = ", ..." if len(found) > 3 else ""
    raise StoreError(f"trial {trial} could be any of {', '.join(found[:3])}{more} in {store}; give more of its id")


def user_errors(command):
    """Turn every error a user can cause into one line and a non-zero exit."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        from archsearch.errors import ArchsearchError

        try:
            _finite_options(kwargs)
            return command(*args, **kwargs)
        except ArchsearchError as err:
            _fail(str(err), err.exit_code)
        except (ValueError, FileNotFoundError) as err:
            _fail(str(err), 2)
        except OSError as err:
            if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            # a full disk wherever a command writes (a report, an export, a temporary folder)
            _fail(f"cannot write {err.filename or 'a file'}: {err.strerror}; free space on that disk, then run "
                  "the command again", 2)
        except KeyboardInterrupt as stop:
            from archsearch.execute.process import exit_code

            _fail("interrupted", exit_code(stop))

    return wrapper


def _finite_options(options: dict) -> None:
    """Refuse a NaN or an infinity given to any number option of a command (``--level nan``,
    ``--extrapolate inf``): no command means one, and each would flow into its results."""
    import math

    for name, value in options.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"--{name.replace('_', '-')} {value}: give a finite number")


def leave_now(code: object) -> None:
    """End the command-line process with exit status ``code`` (a ``SystemExit``'s)
    without Python's teardown, once what that teardown is for is done.

    After a command that imported torch (and Ray) prints its last line,
    freeing every module and object takes 0.3-0.7 s on an idle machine and
    seconds under load; nothing of it is needed once the cleanup is done:
    Ray is shut down, every atexit handler runs (temporary folders of
    ``tempfile``'s finalizers, logging, multiprocessing's children, Ray's and
    torch's own), then stdout and stderr are flushed and the process ends
    with the status Python would have given. Stores hold no connection past
    a call and the run lock is released when its command returns.

    Returns, leaving the ordinary exit to the caller, where that exit does
    more than this: a status that is not an int (Python prints it), a
    thread that is not a daemon (Python waits for it), or a stream that
    cannot be flushed (Python reports that itself). Only for the
    command-line process: ``os._exit`` ends the interpreter it runs in.
    """
    import atexit
    import os
    import sys
    import threading

    if code is None:
        code = 0
    if not isinstance(code, int):
        return
    if any(t.is_alive() and not t.daemon and t is not threading.main_thread() for t in threading.enumerate()):
        return
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    atexit._run_exitfuncs()  # runs each handler once and clears them: an ordinary exit after it runs none twice
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed pipe (`archsearch ls | head`): as Python reports it
        return
    os._exit(code)
