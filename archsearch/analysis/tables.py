"""How analysis reads its inputs: any table in, numeric columns out. Torch-free.

Every analysis takes an Arrow table (what ``Store.trials()`` returns), a pandas
or polars DataFrame, a list of row dicts or a dict of columns, and reads the
columns it needs as float arrays. A CSV is read into an Arrow table first.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

# Store columns that hold JSON text; decoded into objects wherever rows are shown.
JSON_COLUMNS = ("axes", "spec", "recipe", "data")


def as_table(data: Any) -> pa.Table:
    """An Arrow table from a table, a DataFrame (pandas, polars), rows or columns."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, dict):
        return pa.table(data)
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        return pa.Table.from_pylist(list(data))
    if type(data).__module__.split(".")[0] == "pandas":
        return pa.Table.from_pandas(data, preserve_index=False)
    if hasattr(data, "__arrow_c_stream__"):  # polars and any other Arrow-speaking frame
        return _plain_strings(pa.table(data))
    raise TypeError(f"cannot read a table from {type(data).__name__}; give an Arrow table, a DataFrame, "
                    "a list of row dicts or a dict of columns")


def _plain_strings(table: pa.Table) -> pa.Table:
    """Views (polars hands strings over as string_view) as plain strings, which
    every Arrow compute kernel takes."""
    schema = pa.schema([field.with_type(pa.large_string()) if pa.types.is_string_view(field.type) else field
                        for field in table.schema])
    return table.cast(schema) if schema != table.schema else table


# A results table is a few thousand rows of a few dozen columns; these bounds are far past
# that and keep a hostile file (a 2 GB file of NUL bytes, a header of a million names) from
# filling memory or taking minutes.
MAX_CSV_BYTES = 100_000_000
MAX_CSV_COLUMNS = 10_000


def read_csv(path: str | Path) -> pa.Table:
    """A CSV file as an Arrow table; whatever is wrong with the file is a one-line ValueError.

    Refused: a path that is not a regular file (a named pipe, a device, a folder), a file over
    ``MAX_CSV_BYTES`` or with NUL bytes, a header of more than ``MAX_CSV_COLUMNS`` names or
    naming a column twice, and a header with no rows under it.
    """
    import pyarrow.csv as pacsv

    from archsearch.files import FileKindError, kind_problem, read_head

    path = Path(path)
    problem = kind_problem(path)
    if problem is None and path.stat().st_size > MAX_CSV_BYTES:
        problem = f"is larger than {MAX_CSV_BYTES:,} bytes"
    try:
        data = b"" if problem else read_head(path, MAX_CSV_BYTES + 1)
    except FileKindError as err:
        problem = str(err)
    if not problem and len(data) > MAX_CSV_BYTES:
        problem = f"is larger than {MAX_CSV_BYTES:,} bytes"
    elif not problem and b"\x00" in data:
        problem = "is a binary file (it holds NUL bytes)"
    if problem:
        raise ValueError(f"{path}: {problem}, not a CSV file (give a CSV file with a header row)")
    header = data.split(b"\n", 1)[0]
    if header.count(b",") + 1 > MAX_CSV_COLUMNS:
        raise ValueError(f"{path}: the header names {header.count(b',') + 1:,} columns, more than "
                         f"{MAX_CSV_COLUMNS:,}; give a CSV of one row per trial and a column per measure")
    try:
        # one block for the whole file: a long field never straddles two blocks
        options = pacsv.ReadOptions(block_size=max(len(data) + 1, 1 << 20))
        table = pacsv.read_csv(pa.BufferReader(data), read_options=options)
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"{path}: cannot read as CSV: {first}") from None
    seen: set[str] = set()
    twice = [name for name in table.column_names if name in seen or seen.add(name)]
    if twice:
        raise ValueError(f"{path}: the header names column '{twice[0]}' more than once; rename or drop the "
                         "copies so each column has one name")
    if table.num_rows == 0:
        raise ValueError(f"{path}: the header has no rows under it; give one row per trial")
    return table


def numeric_column(table: pa.Table, name: str, *, what: str = "column") -> np.ndarray:
    """Column ``name`` as float64, missing values as NaN.

    Raises a one-line ValueError naming the columns there are when ``name`` is
    absent, or when it holds text rather than numbers.
    """
    if name not in table.column_names:
        raise ValueError(f"no {what} '{name}'; have: {', '.join(table.column_names)}")
    column = table.column(name)
    kind = column.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)
            or pa.types.is_null(kind)):
        sample = next((v for v in column.to_pylist() if v is not None), None)
        numeric = [c for c in table.column_names if _is_numeric(table.schema.field(c).type)]
        raise ValueError(f"{what} '{name}' is not numeric (it holds {kind}, e.g. {sample!r}); choose a numeric "
                         f"column: {', '.join(numeric) or 'none in this table'}")
    return np.asarray(column.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=float)


def _is_numeric(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind)


def group_labels(table: pa.Table, by: str | None) -> list[str]:
    """The group of every row under ``by``: a column, or an axis inside a JSON
    ``axes`` column (as the store keeps them); one group ``all`` when None."""
    if by is None:
        return ["all"] * table.num_rows
    if by in table.column_names:
        return [str(v) for v in table.column(by).to_pylist()]
    if "axes" in table.column_names:
        axes = [_decoded(v) or {} for v in table.column("axes").to_pylist()]
        if any(by in a for a in axes):
            return [str(a.get(by)) for a in axes]
    raise ValueError(f"no column or axis '{by}' to group by; have: {', '.join(table.column_names)}")


def decoded_rows(table: pa.Table) -> list[dict]:
    """Rows as dicts with the store's JSON text columns decoded into objects,
    the shape ``plan --json`` prints."""
    rows = table.to_pylist()
    for row in rows:
        for name in JSON_COLUMNS:
            if isinstance(row.get(name), str):
                row[name] = _decoded(row[name])
    return rows


def _decoded(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value
