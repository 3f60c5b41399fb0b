"""TensorBoard event files, one folder per trial: ``DIR/STUDY/ARM/TRIAL_ID``.

Written with the ``tensorboard`` package's own event-file writer and summary
protos, which import neither torch nor TensorFlow (tensorboardX imports torch
whenever it is installed, and the driver stays torch-free). Scalars are
classic ``simple_value`` summaries, as torch's SummaryWriter writes them; the
trial's config goes in as text and as HParams, so the HParams tab compares
arms. A trial started again (a retry, a promotion, a resume) writes a new
event file in its folder; TensorBoard reads them as one run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from archsearch.execute.logs._base import arm_name, config_json, flat, numbers, path_part, require

if TYPE_CHECKING:
    from archsearch.planner import PlannedTrial

# Seconds a written point may wait before it reaches the file (the writer's own default is 120).
FLUSH_S = 5


class TensorBoardLogger:
    def __init__(self, *, dir: str, study: str):
        require("tensorboard", "tensorboard")
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.plugins.hparams import summary_v2
        from tensorboard.plugins.text import metadata
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        from tensorboard.util import tensor_util

        self._event, self._summary, self._writer_class = Event, Summary, EventFileWriter
        self._hparams, self._text_metadata, self._tensor = summary_v2.hparams_pb, metadata, tensor_util
        self.root, self.study = Path(dir), study
        self.writers: dict[str, Any] = {}

    def folder(self, trial: PlannedTrial) -> Path:
        return self.root / path_part(self.study) / path_part(arm_name(trial)) / trial.trial_id

    def start(self, trial: PlannedTrial, config: dict) -> None:
        if trial.trial_id in self.writers:  # a retry of a trial still open
            return
        writer = self._writer_class(str(self.folder(trial)), flush_secs=FLUSH_S)
        self.writers[trial.trial_id] = writer
        hparams = {key: value for key, value in flat(config).items() if isinstance(value, (bool, int, float, str))}
        self._write(trial.trial_id, self._hparams(hparams, trial_id=trial.trial_id), step=0)
        self._write(trial.trial_id, self._text("config", f"```\n{config_json(config)}\n```"), step=0)

    def log(self, trial_id: str, kind: str, row: dict) -> None:
        if trial_id not in self.writers:
            return
        step, values = numbers(kind, row)
        summary = self._summary(value=[self._summary.Value(tag=tag, simple_value=value)
                                       for tag, value in values.items()])
        self._write(trial_id, summary, step=step)

    def end(self, trial_id: str, status: str, result: dict | None) -> None:
        if trial_id not in self.writers:
            return
        self._write(trial_id, self._text("status", status), step=int((result or {}).get("tokens") or 0))
        self.writers.pop(trial_id).close()

    def close(self) -> None:
        for trial_id in list(self.writers):
            self.end(trial_id, "interrupted", None)

    def _text(self, tag: str, text: str) -> Any:
        """A text summary, built here: ``tensorboard.summary.v1.text_pb`` imports TensorFlow."""
        value = self._summary.Value(tag=tag, metadata=self._text_metadata.create_summary_metadata(tag, ""),
                                    tensor=self._tensor.make_tensor_proto([text]))
        return self._summary(value=[value])

    def _write(self, trial_id: str, summary: Any, *, step: int) -> None:
        self.writers[trial_id].add_event(self._event(wall_time=time.time(), step=step, summary=summary))
