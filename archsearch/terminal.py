"""How the command line prints: the console, text made safe to print, one cell's
formatting, and tables laid out to fit the console's width. What each command
prints is built from these, in ``terminal_plan`` (plan, bench), ``terminal_results``
(pareto, fit, compare, analyze) and ``terminal_store`` (status, the summary of a run).

The console reads no markup and no emoji codes, so a value a user wrote (axis
values, study names, paths, error text) prints as written, and every value
goes through ``plain`` so control characters never reach the terminal.
Tables show by default the columns that fit 80 columns: axes whose value is
the same in every row move to a line below, and the rest of the columns come
with ``wide=True`` (``--wide``).
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from rich import box
from rich.console import Console
from rich.table import Table

from archsearch.units import axis_value

# C0/C1 control characters (ESC starts every ANSI sequence) and the bidi
# overrides that reorder what a terminal shows.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


# a piped console's width: wider than any row, so each line is as long as it is (tables keep their
# natural width; text is not wrapped)
UNBOUNDED = 100_000
# the shortest a trial id is shown in a table (its first characters, longer where two would read alike)
SHORT_ID = 8


def console(*, width: int | None = None) -> Console:
    """A console on stdout, ``width`` columns wide. By default a terminal uses its
    own width, ``COLUMNS`` sets one, and piped output is as wide as its widest line."""
    if width is None and not (sys.stdout.isatty() or os.environ.get("COLUMNS")):
        width = UNBOUNDED
    return Console(width=width, markup=False, emoji=False, highlight=False)


@contextmanager
def doing(what: str, *, after_s: float = 1.0) -> Iterator[None]:
    """Say on stderr that ``what`` is being done: a spinner on a terminal while it lasts, else one
    line once it has taken ``after_s`` seconds (work quicker than that passes in silence)."""
    err = Console(stderr=True, markup=False, emoji=False, highlight=False)
    if err.is_terminal:
        with err.status(what):
            yield
        return
    timer = threading.Timer(after_s, lambda: err.print(f"{what} ...", soft_wrap=True))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def short_ids(ids: list[str]) -> dict[str, str]:
    """Each id by its first ``SHORT_ID`` characters, or by as many as make every one in ``ids``
    unique (commands that take a trial accept any unique prefix of its id)."""
    unique = list(dict.fromkeys(ids))
    for length in range(SHORT_ID, max(map(len, unique), default=SHORT_ID) + 1):
        if len({i[:length] for i in unique}) == len(unique):
            return {i: i[:length] for i in unique}
    return {i: i for i in unique}


def plain(text: object) -> str:
    """``text`` with control characters written out as ``\\xNN``: safe to print anywhere."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def _table(title: str, columns: list[str], *, text: tuple = ("trial",)) -> Table:
    """A borderless table; the ``text`` columns left-aligned, numbers right."""
    # at least as wide as its title, which would otherwise wrap over a narrow table
    table = Table(title=plain(title), header_style="bold", box=box.SIMPLE_HEAD,
                  pad_edge=False, show_edge=False, min_width=len(plain(title)))
    for name in columns:
        # fold rather than cut a value that does not fit
        table.add_column("\n".join(map(plain, name.split("\n"))), justify="left" if name in text else "right",
                         overflow="fold")
    return table


def split_axes(axes: list[dict]) -> tuple[list[str], dict]:
    """The axis names whose value differs between ``axes`` (first-seen order),
    and the values shared by every row, of the rest."""
    values: dict[str, set] = {}
    for row in axes:
        for name, value in row.items():
            values.setdefault(name, set()).add(json.dumps(value, sort_keys=True, default=str))
    varying = [n for n, v in values.items() if len(v) > 1 or any(n not in row for row in axes)]
    shared = {n: axes[0][n] for n in values if n not in varying} if axes else {}
    return varying, shared


def _all_names(axes: list[dict]) -> list[str]:
    return list(dict.fromkeys(name for row in axes for name in row))


def _axis_cells(axes: list[dict], names: list[str], *, wide: bool) -> tuple[list[str], list[list[str]]]:
    """Column names and each row's cells for ``names``: a column per axis
    when every row has them all (or ``wide``), else one ``axes`` column of
    the ``name=value`` pairs a row has (conditional axes leave most empty).
    Unless ``wide``, a dotted name is a header of one line per part: values
    are mostly narrower than ``taper.shape``."""
    if wide or all(n in row for row in axes for n in names):
        headers = names if wide else [n.replace(".", ".\n") for n in names]
        return headers, [[_axis(row.get(n)) for n in names] for row in axes]
    return ["axes"], [[" ".join(f"{n}={_axis(row[n])}" for n in names if n in row)] for row in axes]


def _shared_line(shared: dict) -> str | None:
    return "same in every row: " + ", ".join(f"{k}={_axis(v)}" for k, v in shared.items()) if shared else None


def _shown_axes(row: dict) -> dict:
    """A row's axes as the tables show them: a protocol's baseline by its protocol and model."""
    from archsearch.analysis.arms import PROTOCOLS, axis_text

    axes = row.get("axes") or {}
    if isinstance(axes, str):
        axes = json.loads(axes)
    if "arm" in axes and row.get("match") in PROTOCOLS:
        axes = {**axes, "arm": axis_text(row, "arm")}
    # the seed too, so rows that differ only by it read apart (said once below when it is the same)
    return {**axes, "seed": row["seed"]} if row.get("seed") is not None else axes


def lines(texts: list[str]) -> None:
    """Lines of prose under a table, wrapped to the console's width."""
    out = console()
    for text in texts:
        out.print(plain(text))


def _print(out: Console, table: Table, *, wide: bool, note: str | None = None,
           give_way: list[str] | None = None) -> None:
    """Print ``table`` and a ``note`` below it, no value ever split inside a word: a cell may
    wrap between its words, never within one. Where even that does not fit the console, the
    columns named in ``give_way`` (by header, in that order; by default from the right, the
    first column kept) are left out until it fits, and a line says which (``--wide`` shows
    them). A ``wide`` table prints at its natural width, however wide the console."""
    for column in table.columns:
        words = [word for cell in (column.header, *column.cells) for word in str(cell).split()]
        column.min_width = max(column.min_width or 0, max(map(len, words), default=1))
    natural = out.measure(table, options=out.options.update(max_width=UNBOUNDED))
    dropped = []
    if wide:
        out = console(width=max(out.width, natural.maximum))
    else:
        order = give_way if give_way is not None else [str(c.header) for c in table.columns[:0:-1]]
        for name in order:
            if out.measure(table, options=out.options.update(max_width=UNBOUNDED)).minimum <= out.width:
                break
            column = next((c for c in table.columns if str(c.header) == name), None)
            if column is not None and len(table.columns) > 1:
                table.columns.remove(column)
                dropped.append(name.replace("\n", " ").replace(". ", "."))
    out.print(table)
    if dropped:
        out.print(plain(f"left out to fit {out.width} columns: {', '.join(dropped)} (--wide shows every column)"))
    if note:
        out.print(plain(note))


def _axis(value) -> str:
    """An axis value as the user wrote it (``3.0``, ``1e-05``), numbers without separators."""
    if isinstance(value, bool):
        return axis_value(value)
    return plain(value) if isinstance(value, float) else _fmt(value)


def _fmt(value) -> str:
    """One cell: integers and numbers from 1,000 up with thousands
    separators, smaller floats to 4 significant digits (zeros kept, so a
    column's digits line up), text ``plain``."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:#.4g}"
    return plain(value)
