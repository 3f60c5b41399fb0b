"""A store's paths made shareable for ``export --parquet --portable``: every study file,
data path and cache folder the store names is written relative to the current folder
when it lies under it, else by its name alone, and each data file that is here is
described by its size and sha256, so that an export names no folder of one machine and
still says which bytes its trials read."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import duckdb
import pyarrow as pa

DATA_FILES = "data_files"  # the table of an export that describes the data files
_SCHEMA = pa.schema([("name", pa.string()), ("bytes", pa.int64()), ("sha256", pa.string())])


def store_paths(con: duckdb.DuckDBPyConnection, present: set[str]) -> tuple[list[str], list[str]]:
    """The absolute paths the store names: (data paths, other paths: study files and caches)."""
    data: dict[str, None] = {}  # in the order the trials name them
    other: dict[str, None] = {}
    if "trials" in present:
        for (text,) in con.execute("SELECT CAST(data AS VARCHAR) FROM trials GROUP BY 1 "
                                   "ORDER BY min(created_at), min(trial_id)").fetchall():
            spec = json.loads(text) if text else {}
            data.update(dict.fromkeys(p for p in spec.get("paths") or [] if os.path.isabs(p)))
            if spec.get("cache_dir") and os.path.isabs(spec["cache_dir"]):
                other[spec["cache_dir"]] = None
    if "studies" in present:
        other.update(dict.fromkeys(p for (p,) in con.execute("SELECT path FROM studies ORDER BY name").fetchall()
                                   if p and os.path.isabs(p)))
    return list(data), [p for p in other if p not in data]


def shared_name(path: str, here: Path) -> str:
    """``path`` relative to ``here`` when it lies under it, else its last part."""
    try:
        return Path(path).relative_to(here).as_posix()
    except ValueError:
        return Path(path).name or path


def describe_files(paths: list[str], names: dict[str, str]) -> pa.Table:
    """The ``data_files`` table: one row per data file found at ``paths`` (a folder's files each, by their name under
    the folder's shared name): its shared name, bytes and sha256. A path that is not on this
    machine gets a row with no size or digest, so the export says it could not vouch for it."""
    rows = []
    for path in paths:
        root = Path(path)
        if root.is_file():
            rows.append(_describe(root, names[path]))
        elif root.is_dir():
            for file in sorted(p for p in root.rglob("*") if p.is_file()):
                rows.append(_describe(file, f"{names[path]}/{file.relative_to(root).as_posix()}"))
        else:
            rows.append({"name": names[path], "bytes": None, "sha256": None})
    return pa.Table.from_pylist(rows, schema=_SCHEMA)


def _describe(file: Path, name: str) -> dict:
    with open(file, "rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
    return {"name": name, "bytes": file.stat().st_size, "sha256": digest}


def rewrite(column: str, kind: str, names: dict[str, str]) -> str:
    """A SQL expression for ``column`` with every path of ``names`` replaced by its shared
    name, in the text as stored and JSON-escaped (longest first, so no path is cut short
    by another that begins it). Columns that cannot hold a path come back unchanged."""
    quoted = f'"{column}"'
    if kind not in ("VARCHAR", "JSON") or not names:
        return quoted
    expression = f"CAST({quoted} AS VARCHAR)"
    for path in sorted(names, key=len, reverse=True):
        pairs = {path: names[path], json.dumps(path)[1:-1]: json.dumps(names[path])[1:-1]}
        for spelled, shared in pairs.items():
            expression = f"replace({expression}, {_literal(spelled)}, {_literal(shared)})"
    if kind == "JSON":
        expression = f"CAST({expression} AS JSON)"
    return f"{expression} AS {quoted}"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
