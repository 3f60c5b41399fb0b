"""The progress bar of a running study: done / running / failed and an ETA."""

from __future__ import annotations

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


class TrialProgress:
    """A rich progress bar over trials; a no-op when disabled."""

    def __init__(self, *, total: int, enabled: bool = True):
        self.enabled = enabled
        self.progress = Progress(
            TextColumn("[bold]trials"), BarColumn(), MofNCompleteColumn(),
            TextColumn("running {task.fields[running]}  failed {task.fields[failed]}"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=Console(stderr=True), disable=not enabled)
        self.task = self.progress.add_task("trials", total=total, running=0, failed=0)

    def __enter__(self) -> TrialProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def update(self, *, completed: int, running: int, failed: int) -> None:
        self.progress.update(self.task, completed=completed + failed, running=running, failed=failed)

    def note(self, message: str) -> None:
        if self.enabled:
            self.progress.console.print(f"[yellow]{message}")
