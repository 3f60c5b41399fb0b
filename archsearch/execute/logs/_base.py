"""What every logging backend is told, and the names and numbers they share.

The driver tells a ``TrialLogger`` of each trial it starts (with its config,
the row the store keeps of it), of every row the trial reports ("eval": an
evaluation; "train": a training-loss row every ``recipe.log_every`` steps),
and of how it ended. Backends log every number of a row under ``KIND/NAME``
(``eval/val_loss``, ``train/train_loss``) against the row's training tokens,
so trials of different batch sizes line up.
"""

from __future__ import annotations

import importlib
import json
import math
import re
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

from archsearch.errors import ArchsearchError
from archsearch.units import axes_text

if TYPE_CHECKING:
    from archsearch.planner import PlannedTrial

KINDS = ("eval", "train")
X_AXIS = "tokens"  # every backend's x: the row's training tokens
# Columns of a row that are its position, not a measurement.
POSITION = ("step", "tokens")


class LoggingError(ArchsearchError):
    """A backend the study asks for is not installed or cannot start: theirs to fix, exit 2."""

    exit_code = 2


class TrialLogger(Protocol):
    """One place a run's trials are logged to (TensorBoard, W&B, MLflow), or all of them."""

    def start(self, trial: PlannedTrial, config: dict) -> None:
        """``trial`` starts (or starts again: a retry, a promotion, a resume); ``config`` is its stored row."""

    def log(self, trial_id: str, kind: str, row: dict) -> None:
        """One row the trial reported; ``kind`` is "eval" or "train"."""

    def end(self, trial_id: str, status: str, result: dict | None) -> None:
        """The trial ended: completed, paused (at a rung), failed or diverged; ``result`` when it trained."""

    def close(self) -> None:
        """The run ends: what is still open ends as interrupted."""


def require(module: str, extra: str) -> ModuleType:
    """Import a backend's package, or say in one line how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise LoggingError(f"logging.{extra} needs the {module} package: pip install 'archsearch[{extra}]'") from err


def arm_name(trial: PlannedTrial) -> str:
    """The trial's arm in words: its family, then its other axes (a swept lr aside, a
    protocol's baseline saying which): ``transformer num_layers=2 taper.shape=cosine``."""
    parts = [str(trial.axes.get("family", trial.spec.family)), axes_text(trial.axes, leave_out=("family", "lr"))]
    if trial.match.startswith("iso_"):  # a protocol's baseline: iso_param or iso_flop
        parts.append(f"baseline={trial.match}")
    return " ".join(part for part in parts if part)


def path_part(text: str) -> str:
    """``text`` as one folder name: what a path cannot hold becomes ``_``."""
    return re.sub(r"[^A-Za-z0-9_.,=+-]+", "_", text.replace(" ", ",")).strip("._") or "_"


def numbers(kind: str, row: dict) -> tuple[int, dict[str, float]]:
    """A row's x (its tokens) and its measurements as ``KIND/NAME``: every number but the position."""
    values = {f"{kind}/{name}": float(value) for name, value in row.items()
              if name not in POSITION and isinstance(value, (int, float)) and not isinstance(value, bool)}
    return int(row[X_AXIS]), values


def flat(config: dict, *, prefix: str = "") -> dict[str, bool | int | float | str]:
    """``config`` as dotted keys of plain values (lists as JSON), for parameter tables;
    the spec (every layer) and memory estimate are left to the JSON of the whole config."""
    out: dict[str, bool | int | float | str] = {}
    for name, value in config.items():
        if not prefix and name in ("spec", "peak_memory"):
            continue
        key = f"{prefix}{name}"
        if isinstance(value, dict):
            out.update(flat(value, prefix=f"{key}."))
        elif isinstance(value, (list, tuple)):
            out[key] = json.dumps(value)
        elif isinstance(value, float) and not math.isfinite(value):
            out[key] = str(value)
        elif value is not None:
            out[key] = value
    return out


def config_json(config: dict) -> str:
    return json.dumps(config, indent=2, sort_keys=True, default=str)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


class Loggers:
    """Every backend a run logs to, as one ``TrialLogger``. A backend that raises is
    dropped with one line through ``warn`` (the run's progress), never the study: the
    store keeps every result whatever a backend does."""

    def __init__(self, backends: dict[str, TrialLogger], *, warn: Callable[[str], None] = _stderr):
        self.backends = dict(backends)
        self.warn = warn

    def start(self, trial: PlannedTrial, config: dict) -> None:
        self._each(lambda backend: backend.start(trial, config))

    def log(self, trial_id: str, kind: str, row: dict) -> None:
        self._each(lambda backend: backend.log(trial_id, kind, row))

    def end(self, trial_id: str, status: str, result: dict | None) -> None:
        self._each(lambda backend: backend.end(trial_id, status, result))

    def close(self) -> None:
        self._each(lambda backend: backend.close())

    def __enter__(self) -> Loggers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _each(self, call: Callable[[TrialLogger], None]) -> None:
        for name, backend in list(self.backends.items()):
            try:
                call(backend)
            except Exception as err:  # a logging service down is no reason to stop a day-long run
                del self.backends[name]
                self.warn(f"logging to {name} stopped: {type(err).__name__}: {err}; the store keeps every result")
