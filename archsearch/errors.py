"""Errors a user can cause, each rendered as one line: what, where, how to fix."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ArchsearchError(Exception):
    """Base of every error the CLI turns into one line and a non-zero exit."""

    exit_code = 1


class SpecError(ArchsearchError):
    """A space or study file is wrong; names the file, line and field.

    Rendered as ``path:line: field: message (hint)``.
    """

    exit_code = 2

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 field: str | None = None, hint: str | None = None):
        self.message = message
        self.path = path
        self.line = line
        self.field = field
        self.hint = hint
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.path or "<study>"
        if self.line is not None:
            where += f":{self.line}"
        text = f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"
        return f"{text} ({self.hint})" if self.hint else text


class StoreError(ArchsearchError):
    """The store the user named is missing, unreadable, busy, of another
    schema version, or lacks the study asked for: theirs to fix (another
    --store, --study, or waiting for a run), so exit 2 like a bad file."""

    exit_code = 2


class StoreFullError(StoreError):
    """The disk holding the store is full: nothing half-written is kept (DuckDB rolls the
    transaction back); the user frees space and resumes. ``path``: the store."""

    def __init__(self, message: str, *, path: str):
        self.path = path
        super().__init__(message)


class ClusterError(ArchsearchError):
    """The cluster the user pointed at cannot be reached, joined or asked (a wrong address or
    token, no cluster started, a job id it lacks), or cannot fit a trial's resources: theirs to
    fix, so exit 2."""

    exit_code = 2


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """A hint naming the closest of ``choices`` to ``word``, or None."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else None
