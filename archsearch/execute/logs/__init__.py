"""Each trained trial's config and curves, sent where researchers already look:
TensorBoard event files, Weights & Biases, MLflow (the study's ``logging:``
section, or ``archsearch run --log-to``).

Only the driver logs: it hears every row a trial reports, wherever the trial
trains, so a cluster's workers need none of these packages. Each backend's
package is imported when a run asks for it, and a missing one stops the run
before anything trains, with the install line. Twins (trials that share
another's training) are not logged: the trial that trained has the curves.

    loggers = trial_loggers(study.logging, study=study.name)
    loggers.start(trial, trial.to_dict()); loggers.log(trial_id, "eval", row)
    loggers.end(trial_id, "completed", result); loggers.close()
"""

from __future__ import annotations

from collections.abc import Sequence

from archsearch.errors import SpecError
from archsearch.execute.logs._base import KINDS, X_AXIS, Loggers, LoggingError, TrialLogger, arm_name, path_part
from archsearch.space.running import Logging

__all__ = ["KINDS", "X_AXIS", "Loggers", "LoggingError", "TrialLogger", "arm_name", "path_part", "trial_loggers",
           "with_log_to"]

# What ``--log-to NAME=VALUE`` sets of each backend's section.
LOG_TO = {"tensorboard": "dir", "wandb": "project", "mlflow": "tracking_uri"}


def trial_loggers(logging: Logging, *, study: str) -> Loggers:
    """The backends ``logging`` names, as one ``TrialLogger``; raises LoggingError for one
    whose package is missing (or, for MLflow, whose tracking store cannot be reached)."""
    backends: dict[str, TrialLogger] = {}
    if logging.tensorboard is not None:
        from archsearch.execute.logs._tensorboard import TensorBoardLogger

        backends["tensorboard"] = TensorBoardLogger(dir=logging.tensorboard.dir, study=study)
    if logging.wandb is not None:
        from archsearch.execute.logs._wandb import WandbLogger

        backends["wandb"] = WandbLogger(**logging.wandb.model_dump(), study=study)
    if logging.mlflow is not None:
        from archsearch.execute.logs._mlflow import MlflowLogger

        backends["mlflow"] = MlflowLogger(**logging.mlflow.model_dump(), study=study)
    return Loggers(backends)


def with_log_to(logging: Logging, targets: Sequence[str]) -> Logging:
    """``logging`` with each ``--log-to NAME[=VALUE]`` added: ``tensorboard=DIR``,
    ``wandb=PROJECT``, ``mlflow=TRACKING_URI``; a backend the study already names keeps
    its other keys, and a bare NAME keeps its value (or the default)."""
    sections = logging.model_dump(exclude_unset=True)
    for text in targets:
        name, sep, value = text.partition("=")
        name = name.strip()
        if name not in LOG_TO:
            raise SpecError(f"unknown backend {name!r}; give one of {', '.join(LOG_TO)}", path=f"--log-to {text}",
                            hint="for example --log-to tensorboard=runs or --log-to wandb=my-project")
        section = dict(sections.get(name) or {})
        if sep:
            if not value.strip():
                raise SpecError(f"{name}= needs a value ({LOG_TO[name]})", path=f"--log-to {text}")
            section[LOG_TO[name]] = value.strip()
        sections[name] = section
    try:
        return Logging.model_validate(sections)
    except ValueError as err:
        raise SpecError(str(err).splitlines()[-1].strip(), path="--log-to") from err
