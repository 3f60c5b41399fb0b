"""MLflow: one run per trained trial, through an ``MlflowClient`` (several trials
train at once, and MLflow's module-level API holds one active run).

The experiment is ``logging.mlflow.experiment`` (default: the study's name);
a run is named ``ARM/TRIAL`` (the id's first 8 characters) and tagged
``archsearch.study``, ``archsearch.arm`` and ``archsearch.trial_id``, by which
a trial started again (a retry, a promotion, ``resume``) finds its run and
goes on in it. The config goes in as parameters (dotted keys) and as
``config.json``; every row's numbers as metrics with the tokens as step.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from archsearch.execute.logs._base import LoggingError, arm_name, config_json, flat, numbers, require

if TYPE_CHECKING:
    from archsearch.planner import PlannedTrial

TAG = "archsearch.trial_id"
PARAMS_PER_BATCH = 100  # MLflow's limit for one log_batch
PARAM_LIMIT = 6000  # characters of one parameter's value


class MlflowLogger:
    def __init__(self, *, tracking_uri: str | None, experiment: str | None, study: str):
        mlflow = require("mlflow", "mlflow")
        from mlflow.entities import Metric, Param

        self._metric, self._param = Metric, Param
        name = experiment or study
        # here, before anything trains: a tracking store that cannot be opened stops the run at once
        try:
            self.client = mlflow.MlflowClient(tracking_uri=tracking_uri)
            found = self.client.get_experiment_by_name(name)
            self.experiment_id = found.experiment_id if found is not None else self.client.create_experiment(name)
        except Exception as err:
            where = tracking_uri or "MLflow's default tracking store"
            raise LoggingError(f"logging.mlflow: cannot open {where}: {type(err).__name__}: "
                               f"{' '.join(str(err).split())}") from err
        self.study = study
        self.runs: dict[str, str] = {}  # trial id -> MLflow run id

    def start(self, trial: PlannedTrial, config: dict) -> None:
        if trial.trial_id in self.runs:
            return
        found = self.client.search_runs([self.experiment_id], filter_string=f"tags.`{TAG}` = '{trial.trial_id}'",
                                        max_results=1)
        if found:
            run_id = found[0].info.run_id
            self.client.update_run(run_id, status="RUNNING")
        else:
            arm = arm_name(trial)
            tags = {"archsearch.study": self.study, "archsearch.arm": arm, TAG: trial.trial_id}
            run_id = self.client.create_run(self.experiment_id, run_name=f"{arm}/{trial.trial_id[:8]}",
                                            tags=tags).info.run_id
            params = [self._param(key, str(value)[:PARAM_LIMIT]) for key, value in flat(config).items()]
            for at in range(0, len(params), PARAMS_PER_BATCH):
                self.client.log_batch(run_id, params=params[at:at + PARAMS_PER_BATCH])
            self.client.log_text(run_id, config_json(config), "config.json")
        self.runs[trial.trial_id] = run_id

    def log(self, trial_id: str, kind: str, row: dict) -> None:
        if trial_id not in self.runs:
            return
        tokens, values = numbers(kind, row)
        now = int(time.time() * 1000)
        self.client.log_batch(self.runs[trial_id], metrics=[self._metric(key, value, now, tokens)
                                                            for key, value in values.items()])

    def end(self, trial_id: str, status: str, result: dict | None) -> None:
        run_id = self.runs.pop(trial_id, None)
        if run_id is None:
            return
        self.client.set_tag(run_id, "archsearch.status", status)
        if result is not None:
            tokens, values = numbers("result", result)
            now = int(time.time() * 1000)
            self.client.log_batch(run_id, metrics=[self._metric(key, value, now, tokens)
                                                   for key, value in values.items()])
        ended = {"completed": "FINISHED", "paused": "FINISHED", "interrupted": "KILLED"}.get(status, "FAILED")
        self.client.set_terminated(run_id, status=ended)

    def close(self) -> None:
        for trial_id in list(self.runs):
            self.end(trial_id, "interrupted", None)
