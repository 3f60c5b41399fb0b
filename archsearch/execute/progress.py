"""Progress of a running study on stderr.

On a terminal: a bar (done / running / failed, an ETA) with a line above it
per finished trial. Anywhere else (a file, a CI log): plain lines only, one
per finished trial and a heartbeat every ``heartbeat_s`` seconds, so a log
never sits silent for minutes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class TrialProgress:
    """Progress over ``total`` trials; silent when not ``enabled``.

    ``console`` defaults to stderr; ``clock`` (seconds) is there for tests.
    """

    def __init__(self, *, total: int, enabled: bool = True, heartbeat_s: float = 30.0,
                 console: Console | None = None, clock: Callable[[], float] = time.monotonic):
        self.total = total
        self.enabled = enabled
        self.console = console or Console(stderr=True)
        self.bar = enabled and self.console.is_terminal
        self.heartbeat_s = heartbeat_s
        self.clock = clock
        self.started = self.last_line = clock()
        self.done = 0
        self.progress = Progress(
            TextColumn("[bold]trials"), BarColumn(), MofNCompleteColumn(),
            TextColumn("running {task.fields[running]}  failed {task.fields[failed]}"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=self.console, disable=not self.bar)
        self.task = self.progress.add_task("trials", total=total, running=0, failed=0)

    def __enter__(self) -> TrialProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def update(self, *, completed: int, running: int, failed: int) -> None:
        """The counts now; off a terminal, a heartbeat line when one is due."""
        self.done = completed + failed
        self.progress.update(self.task, completed=self.done, running=running, failed=failed)
        now = self.clock()
        if self.enabled and not self.bar and now - self.last_line >= self.heartbeat_s:
            self._line(f"{self.done}/{self.total} trials done, {running} running, {failed} failed, "
                       f"{now - self.started:.0f}s elapsed")

    def finished(self, *, trial_id: str, label: str, status: str, val_loss: float, wall_s: float,
                 shared_with: str | None = None) -> None:
        """One line for a trial that trained to the end, or (``shared_with``) that took the result
        of the trial training the same model."""
        loss = f"val_loss {val_loss:.4f}" if status == "completed" else f"{status} (val_loss {val_loss})"
        if shared_with is not None:
            self._line(f"trial {trial_id} {label}: {loss}, shared from trial {shared_with} "
                       "(same model, not trained again)")
            return
        self._line(f"trial {trial_id} {label}: {loss} in {wall_s:.1f}s")

    def note(self, message: str) -> None:
        self._line(message, style="yellow")

    def _line(self, message: str, style: str | None = None) -> None:
        if not self.enabled:
            return
        self.last_line = self.clock()
        # Text, not markup: trial labels hold values a user wrote.
        self.console.print(Text(message, style=style or ""), soft_wrap=True, highlight=False)
