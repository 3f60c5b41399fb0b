"""Progress of a running study on stderr.

On a terminal: a bar for the study (done / running / failed, an ETA) and one
below it per running trial (its step of how many, latest training loss,
tokens/s, its ETA), with a line above them per finished trial. Anywhere else
(a file, a CI log): plain lines only, one per finished trial and a heartbeat
every ``heartbeat_s`` seconds that says the same as the bars, so a log never
sits silent for minutes.

The study's ETA is the running trials' remaining tokens at the tokens/s each
measures, plus the trials not yet started at the mean duration of a trial so
far (finished ones, else the running ones' projected), shared among the
trials that run at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn
from rich.text import Text

from archsearch.units import duration, si


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
        self.started_at = self.last_line = clock()
        self.done = 0  # trials ended: completed, shared or failed
        self.widest = 1  # the most trials seen running at once
        self.live: dict[str, dict | None] = {}  # running trial -> its latest report (None before the first)
        self.rows: dict[str, TaskID] = {}
        self.durations: list[float] = []  # wall seconds of the trials that trained to their end
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(bar_width=20), TextColumn("{task.fields[count]}"),
            TextColumn("{task.fields[info]}"), TextColumn("{task.fields[eta]}"),
            console=self.console, disable=not self.bar)
        self.task = self.progress.add_task("trials", total=total, count=f"0/{total}", info="", eta="")

    def __enter__(self) -> TrialProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def started(self, trial_id: str) -> None:
        """A trial was handed to a worker; it shows as starting until its first report."""
        self.live[trial_id] = None
        self.widest = max(self.widest, len(self.live))
        if self.bar:
            self.rows[trial_id] = self.progress.add_task(f"  {trial_id[:8]}", total=None, count="", info="starting",
                                                         eta="")

    def reported(self, trial_id: str, report: dict) -> None:
        """A running trial's latest progress report (see ``train.progress.Reporter``)."""
        self.live[trial_id] = report
        if trial_id in self.rows:
            self.progress.update(self.rows[trial_id], total=report["total_steps"], completed=report["step"],
                                 count=f"{report['step']}/{report['total_steps']}", info=_trial_info(report),
                                 eta=_eta_text(_remaining_s(report)))

    def stopped(self, trial_id: str) -> None:
        """A trial left its worker (ended, failed, paused at a rung, or its worker died)."""
        self.live.pop(trial_id, None)
        if trial_id in self.rows:
            self.progress.remove_task(self.rows.pop(trial_id))

    def update(self, *, completed: int, running: int, failed: int) -> None:
        """The counts now; off a terminal, a heartbeat line when one is due."""
        self.done = completed + failed
        eta = self.eta_s()
        self.progress.update(self.task, completed=self.done, count=f"{self.done}/{self.total}",
                             info=f"running {running}  failed {failed}", eta=_eta_text(eta))
        now = self.clock()
        if self.enabled and not self.bar and now - self.last_line >= self.heartbeat_s:
            self._line(f"{self.done}/{self.total} trials done, {running} running, {failed} failed, "
                       f"{duration(now - self.started_at)} elapsed{f', ETA {duration(eta)}' if eta is not None else ''}")
            for trial_id, report in self.live.items():
                self._line(f"  trial {trial_id}: " + ("starting" if report is None else trial_line(report)))

    def eta_s(self) -> float | None:
        """Seconds until the study ends, estimated as the module's docstring says; None until measured."""
        remaining = [_remaining_s(r) if r is not None else None for r in self.live.values()]
        projected = [r["elapsed_s"] + left for r, left in zip(self.live.values(), remaining)
                     if r is not None and left is not None]
        typical = sum(self.durations) / len(self.durations) if self.durations else (
            sum(projected) / len(projected) if projected else None)
        if typical is None:
            return None
        queued = max(0, self.total - self.done - len(self.live))
        work = [typical if left is None else left for left in remaining]
        return max([(sum(work) + queued * typical) / self.widest, *work])

    def finished(self, *, trial_id: str, label: str, status: str, val_loss: float, wall_s: float,
                 shared_with: str | None = None) -> None:
        """One line for a trial that trained to the end, or (``shared_with``) that took the result
        of the trial training the same model."""
        loss = f"val_loss {val_loss:.4f}" if status == "completed" else f"{status} (val_loss {val_loss})"
        if shared_with is not None:
            self._line(f"trial {trial_id} {label}: {loss}, shared from trial {shared_with} "
                       "(same model, not trained again)")
            return
        self.durations.append(wall_s)
        self._line(f"trial {trial_id} {label}: {loss} in {wall_s:.1f}s")

    def note(self, message: str) -> None:
        self._line(message, style="yellow")

    def _line(self, message: str, style: str | None = None) -> None:
        if not self.enabled:
            return
        self.last_line = self.clock()
        # Text, not markup: trial labels hold values a user wrote.
        self.console.print(Text(message, style=style or ""), soft_wrap=True, highlight=False)


def _remaining_s(report: dict) -> float | None:
    """Seconds a running trial has left at the tokens/s it measures; None before it measures."""
    rate, total = report.get("tokens_per_s"), report.get("total_tokens")
    if not rate or total is None:
        return None
    return max(0.0, (total - report["tokens"]) / rate)


def _trial_info(report: dict) -> str:
    loss = report.get("train_loss")
    rate = report.get("tokens_per_s")
    return " ".join(part for part in (f"loss {loss:.3f}" if loss is not None else "",
                                      f"{si(rate)} tok/s" if rate else "") if part)


def trial_line(report: dict) -> str:
    """A running trial in plain words: ``step 120/400, loss 2.310, 5.1k tokens/s, ETA 40s``."""
    parts = [f"step {report['step']}/{report['total_steps']}"]
    if report.get("train_loss") is not None:
        parts.append(f"loss {report['train_loss']:.3f}")
    if report.get("tokens_per_s"):
        parts.append(f"{si(report['tokens_per_s'])} tokens/s")
    left = _remaining_s(report)
    if left is not None:
        parts.append(f"ETA {duration(left)}")
    return ", ".join(parts)


def _eta_text(seconds: float | None) -> str:
    return "" if seconds is None else f"ETA {duration(seconds)}"
