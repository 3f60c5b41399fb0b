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


def read_csv(path: str | Path) -> pa.Table:
    """A CSV file as an Arrow table; a missing or unreadable file is a one-line ValueError."""
    import pyarrow.csv as pacsv

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file (give a CSV file with a header row)")
    try:
        return pacsv.read_csv(path)
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"{path}: cannot read as CSV: {first}") from None


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
