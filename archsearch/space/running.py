"""The execution and logging sections of a study file: how its trials run and where their curves go.

Kept apart from the space and budget schema because the drivers and the trackers read
them alone. Torch-free, like the rest of ``archsearch.space``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from archsearch.space.training import Strict

_MEMORY = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([KMGT]i?B)?\s*$", re.IGNORECASE)
_MEMORY_UNITS = {"": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
                 "tib": 2**40}


def _memory_bytes(value: Any) -> Any:
    """``"4GiB"``, ``"512MB"`` or a number of bytes, as bytes."""
    if isinstance(value, str):
        found = _MEMORY.match(value)
        if not found:
            raise ValueError(f"memory '{value}' is not a size such as 4GiB, 512MB or a number of bytes")
        return int(float(found[1]) * _MEMORY_UNITS[(found[2] or "").lower()])
    return value


class Execution(Strict):
    max_parallel: Annotated[int, Field(ge=1, le=10_000)] | Literal["auto"] = Field(
        default="auto", description="trials at once; auto = as many as the cluster's CPUs (and GPUs) fit")
    threads_per_trial: int = Field(default=1, ge=1, le=1024, description="torch threads inside each trial")
    retries: int = Field(default=1, ge=0, le=10, description="re-runs of a trial whose worker died")
    max_attempts: int = Field(
        default=3, ge=1, le=100, description="attempts a trial gets over all runs of the study (worker retries "
                                             "included) before run and resume leave a failed or diverged trial "
                                             "as it is; resume --retry-failed trains such trials once more")
    workers_per_trial: int = Field(
        default=1, ge=1, le=1024, description="data-parallel workers training each trial (torch DDP: gloo on CPU, "
                                              "NCCL on GPU); each reserves cpus/gpus/memory and reads "
                                              "batch_size / N rows of every batch")
    cpus: float | None = Field(default=None, gt=0, le=1024,
                               description="CPUs Ray reserves for each trial; default threads_per_trial")
    gpus: float = Field(default=0, ge=0, le=64, description="GPUs per trial; a fraction packs small trials")
    nice: int | None = Field(default=None, ge=-20, le=19,
                             description="niceness of each trial's processes; default: the driver's on embedded "
                                         "Ray, the cluster's workers' on a cluster (lower needs privileges)")
    memory: Annotated[int | None, BeforeValidator(_memory_bytes), Field(ge=1)] = Field(
        default=None, description="memory Ray reserves per trial: 4GiB, 512MB or bytes; plan refuses a trial "
                                  "whose estimated peak exceeds it (default: this machine's memory)")
    memory_check: bool = Field(default=True, description="refuse a trial whose estimated peak memory exceeds "
                                                         "execution.memory or the machine's (--ignore-memory: false)")
    storage: str | None = Field(
        default=None, description="where checkpoints go, reachable from every node: a shared folder, or a "
                                  "URI pyarrow opens (s3://bucket/path, gs://..., file:///...); "
                                  "default: beside the store")

    def resolved_storage(self) -> str | None:
        """``storage`` as an absolute path (a relative one is taken from the current folder, as
        the study is run), or the URI as written; None for the default."""
        if not self.storage or "://" in self.storage:
            return self.storage
        return str(Path(self.storage).expanduser().resolve())


class TensorBoardLogging(Strict):
    """TensorBoard event files of every trained trial, in DIR/STUDY/ARM/TRIAL_ID."""

    dir: str = Field(default="runs", min_length=1,
                     description="the folder `tensorboard --logdir` reads; relative to the folder archsearch "
                                 "runs in, as --store is")


class WandbLogging(Strict):
    """A Weights & Biases run per trained trial: its group the study, its job type the arm."""

    project: str = Field(default="archsearch", min_length=1, max_length=128, description="the W&B project")
    entity: str | None = Field(default=None, description="the W&B team or user; default: W&B's own")
    mode: Literal["online", "offline"] | None = Field(
        default=None, description="offline keeps the runs on disk for `wandb sync`; default: W&B's own "
                                  "($WANDB_MODE, else online)")
    dir: str | None = Field(default=None, description="the folder W&B keeps its local files under (DIR/wandb); "
                                                      "default: W&B's own (the current folder)")


class MlflowLogging(Strict):
    """An MLflow run per trained trial, tagged with its study, arm and trial id."""

    tracking_uri: str | None = Field(
        default=None, description="an MLflow tracking server or store (http://HOST:5000, sqlite:///mlflow.db, "
                                  "file:///path); default: MLflow's own ($MLFLOW_TRACKING_URI)")
    experiment: str | None = Field(default=None, min_length=1, max_length=500,
                                   description="the MLflow experiment; default: the study's name")


class Logging(Strict):
    """Where each trained trial's config and curves also go as it trains, beside the store:
    evaluation rows under eval/, training rows under train/, against training tokens."""

    tensorboard: TensorBoardLogging | None = Field(
        default=None, description="event files for TensorBoard ({} for the defaults); needs "
                                  "pip install 'archsearch[tensorboard]'")
    wandb: WandbLogging | None = Field(default=None, description="Weights & Biases runs ({} for the defaults); "
                                                                 "needs pip install 'archsearch[wandb]'")
    mlflow: MlflowLogging | None = Field(default=None, description="MLflow runs ({} for the defaults); needs "
                                                                   "pip install 'archsearch[mlflow]'")
