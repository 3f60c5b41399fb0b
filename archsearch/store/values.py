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

