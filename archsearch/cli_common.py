"""What every command of the command line shares: argument and option types,
the default store, and the wrapper that turns a user's mistake into one line."""

from __future__ import annotations

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
DEFAULT_STORE = Path("archsearch.duckdb")


def _fail(message: str, code: int) -> None:
    from archsearch.terminal import plain

    typer.echo(f"error: {plain(message)}", err=True)
    raise typer.Exit(code)


@contextmanager
def _writing(path: Path, what: str):
    """A file or folder the user named that cannot be written: one line, exit 2."""
    import duckdb

    try:
        yield
    except (OSError, duckdb.IOException) as err:
        reason = getattr(err, "strerror", None) or str(err).splitlines()[0]
        _fail(f"cannot write {what} {path}: {reason}; choose another path", 2)


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
            _fail("interrupted", 130)

    return wrapper
