"""What a trial says while it trains, between its evaluations.

Two streams leave the training loop through one callback: the training-loss
curve, a row every ``recipe.log_every`` steps (the mean loss of the steps
since the previous row), which the store keeps beside the evaluation curve;
and, every ``every_s`` seconds, where the trial is (its step of how many,
tokens, latest loss, tokens/s), which the driver shows and keeps for
``archsearch status``. Both go out together, so a fast model sends one
message every few seconds, not one a step.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# How often a training trial tells the driver where it is.
PROGRESS_EVERY_S = 2.0
# The latest loss in a progress report: the mean of this many last steps.
RECENT_STEPS = 10

OnProgress = Callable[[dict, list[dict]], None]


class Reporter:
    """Collects a trial's training-loss rows and sends them, with a progress report, to
    ``on_progress(report, rows)`` every ``every_s`` seconds and on ``flush``.

    ``report`` holds ``step``, ``total_steps`` (where this call stops), ``tokens``,
    ``total_tokens`` (at ``total_steps``, from the tokens a step has taken), ``train_loss``
    (the mean of the last ``RECENT_STEPS`` steps), ``tokens_per_s`` (over this attempt after
    its first step, which pays for warming up: None in the first report) and ``elapsed_s``
    (this attempt's). ``rows`` hold ``step``, ``tokens``, ``train_loss``,
    ``lr`` and ``tokens_per_s`` (since the previous row). ``clock`` is there for tests.
    """

    def __init__(self, *, on_progress: OnProgress, log_every: int, total_steps: int, step: int, tokens: int,
                 every_s: float = PROGRESS_EVERY_S, clock: Callable[[], float] = time.monotonic):
        self.on_progress, self.log_every, self.total_steps, self.every_s = on_progress, log_every, total_steps, every_s
        self.clock = clock
        self.first_step, self.first_tokens = step, tokens
        self.step, self.tokens, self.train_loss = step, tokens, float("nan")
        self.started = self.sent = self.row_time = clock()
        self.warm: tuple[int, float] | None = None  # tokens and time at the end of this attempt's first step
        self.row_tokens = tokens
        self.losses: list[float] = []  # since the last row
        self.recent: list[float] = []
        self.rows: list[dict] = []

    def after_step(self, *, step: int, tokens: int, loss: float, lr: float, curve: bool = True) -> None:
        """One optimizer step done: ``step`` steps and ``tokens`` tokens so far, its ``loss`` and ``lr``.
        ``curve=False`` (the exit gate's stage) reports progress without adding to the LM's curve."""
        self.step, self.tokens = step, tokens
        self.recent = (self.recent + [loss])[-RECENT_STEPS:]
        now = self.clock()
        if self.warm is None:
            self.warm = (tokens, now)
        if curve:
            self.losses.append(loss)
            if step % self.log_every == 0 or step == self.total_steps:
                seconds = now - self.row_time
                self.rows.append(dict(step=step, tokens=tokens, train_loss=sum(self.losses) / len(self.losses), lr=lr,
                                      tokens_per_s=(tokens - self.row_tokens) / seconds if seconds > 0 else None))
                self.losses, self.row_time, self.row_tokens = [], now, tokens
        # the first step at once, so a trial shows up as soon as it trains
        if now - self.sent >= self.every_s or step == self.first_step + 1:
            self.flush()

    def flush(self) -> None:
        """Send what has gathered, and where the trial is now."""
        now = self.clock()
        done_steps, done_tokens, seconds = self.step - self.first_step, self.tokens - self.first_tokens, now - self.started
        per_step = done_tokens / done_steps if done_steps else None
        rate = None
        if self.warm is not None and self.tokens > self.warm[0] and now > self.warm[1]:
            rate = (self.tokens - self.warm[0]) / (now - self.warm[1])
        report = dict(step=self.step, total_steps=self.total_steps, tokens=self.tokens,
                      total_tokens=(self.tokens + round(per_step * (self.total_steps - self.step))
                                    if per_step is not None else None),
                      train_loss=sum(self.recent) / len(self.recent) if self.recent else None,
                      tokens_per_s=rate,
                      elapsed_s=seconds)
        rows, self.rows, self.sent = self.rows, [], now
        self.on_progress(report, rows)
