"""Weights & Biases: one run per trained trial, all in the driver.

A run's group is the study, its job type the arm, its name ``ARM/TRIAL``
(the id's first 8 characters) and its id the study and trial id, so a trial
started again (a retry, a promotion, ``resume``) continues its run. Several
trials train at once, so each is its own run object (``reinit="create_new"``),
with W&B's console capture and system metrics off: the driver's output and
machine are not the trial's.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from archsearch.execute.logs._base import KINDS, X_AXIS, arm_name, numbers, require

if TYPE_CHECKING:
    from archsearch.planner import PlannedTrial

ID_LIMIT = 64  # W&B's longest run id


class WandbLogger:
    def __init__(self, *, project: str, entity: str | None, mode: str | None, dir: str | None, study: str):
        self.wandb = require("wandb", "wandb")
        self.options = dict(project=project, entity=entity, mode=mode, dir=dir, group=study)
        self.study = study
        self.runs: dict[str, Any] = {}

    def run_id(self, trial_id: str) -> str:
        text = f"{self.study[:ID_LIMIT - len(trial_id) - 1]}-{trial_id}"
        return re.sub(r"[^A-Za-z0-9_-]", "-", text)

    def start(self, trial: PlannedTrial, config: dict) -> None:
        if trial.trial_id in self.runs:
            return
        arm = arm_name(trial)
        settings = self.wandb.Settings(console="off", x_disable_stats=True, silent=True)
        run = self.wandb.init(**self.options, job_type=arm[:ID_LIMIT], name=f"{arm}/{trial.trial_id[:8]}",
                              id=self.run_id(trial.trial_id), resume="allow", config=config,
                              reinit="create_new", settings=settings)
        run.define_metric(X_AXIS)
        for kind in KINDS:
            run.define_metric(f"{kind}/*", step_metric=X_AXIS)
        self.runs[trial.trial_id] = run

    def log(self, trial_id: str, kind: str, row: dict) -> None:
        if trial_id in self.runs:
            tokens, values = numbers(kind, row)
            self.runs[trial_id].log({X_AXIS: tokens, **values})

    def end(self, trial_id: str, status: str, result: dict | None) -> None:
        run = self.runs.pop(trial_id, None)
        if run is None:
            return
        run.summary.update({"status": status, **(numbers("result", result)[1] if result is not None else {})})
        run.finish(exit_code=0 if status in ("completed", "paused") else 1)

    def close(self) -> None:
        for trial_id in list(self.runs):
            self.end(trial_id, "interrupted", None)
        self.wandb.teardown()  # W&B's service process ends with the run
