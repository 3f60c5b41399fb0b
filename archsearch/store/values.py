"""Values every store table writes: the code version, the time, finite floats."""

from __future__ import annotations

import math
import subprocess
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def code_version() -> str:
    """Package version plus the git commit (and '+dirty') when run from a checkout."""
    from archsearch import __version__

    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return __version__
    return f"{__version__}+{sha}{'.dirty' if dirty else ''}" if sha else __version__


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _finite(value: float | None) -> float | None:
    """NaN and infinities are stored as NULL: JSON has no spelling for them."""
    return value if value is None or math.isfinite(value) else None



def insert_rows(con, head: str, columns: list[str], rows: list[list], *, key: int = 0, tail: str = "") -> None:
    """``head`` (``INSERT [OR REPLACE] INTO table``) of ``rows``, values in ``columns``' order, as
    one statement over an Arrow table: DuckDB's ``executemany`` runs one statement a row (1,000
    rows took 7 s on a loaded 2-core machine, against 0.2 s this way). A row whose first ``key``
    values repeat an earlier one's replaces it, as one statement a row would have; ``tail``
    follows the SELECT (an ``ON CONFLICT`` clause)."""
    import pyarrow as pa

    if key:
        rows = list({tuple(row[:key]): row for row in rows}.values())
    if not rows:
        return
    table = pa.table({name: [row[i] for row in rows] for i, name in enumerate(columns)})
    name = f"incoming_{id(table)}"
    con.register(name, table)
    try:
        listed = ", ".join(f'"{c}"' for c in columns)
        con.execute(f"{head} ({listed}) SELECT {listed} FROM {name} {tail}")
    finally:
        con.unregister(name)


def thinned_query(table: str, columns: list[str]) -> str:
    """SQL for ``columns`` of ``table``'s rows of the trials in a list (parameter 1), about a
    number of them per trial (parameters 2 and 3, the same number), evenly spaced by step with
    each trial's first and last kept: curves of millions of points load as a few hundred."""
    listed = ", ".join(columns)
    return (f"SELECT {listed} FROM (SELECT {listed}, row_number() OVER w AS i, "
            f"count(*) OVER (PARTITION BY trial_id) AS n FROM {table} "
            "WHERE trial_id IN (SELECT unnest(?::VARCHAR[])) WINDOW w AS (PARTITION BY trial_id ORDER BY step)) "
            "WHERE n <= ? OR i = 1 OR i = n OR (i - 1) % ceil(n / ?)::BIGINT = 0 ORDER BY trial_id, step")
