"""Run a study's trials on Ray and write every result to the store.

Embedded local Ray by default (``address="local"`` so a stale cluster is never
joined by accident); a cluster with ``address``. Only the driver touches the
store: workers return results, so DuckDB sees one writer.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from archsearch.planner import PlannedTrial, plan
from archsearch.search import Searcher
from archsearch.space.schema import Study
from archsearch.store import Store, checkpoint_dir, open_store


@dataclass(frozen=True)
class RunSummary:
    study: str
    planned: int
    skipped: int  # already completed in the store, not trained again
    completed: int
    failed: int
    wall_time_s: float


def run_study(study: Study, *, store: str | Path = "archsearch.duckdb", address: str | None = None,
              max_parallel: int | None = None, show_progress: bool = True) -> RunSummary:
    """Plan ``study``, train every trial the store has not finished, record all.

    ``address``: None for embedded local Ray, or a cluster address ("auto",
    "ray://host:10001"). ``max_parallel`` overrides ``execution.max_parallel``.
    """
    from archsearch.search import make_searcher

    start = time.perf_counter()
    origin = study._origin
    with open_store(store) as db:
        db.add_study(name=study.name, path=origin.path if origin else "", config=_config(study))
        searcher = make_searcher(study, store=str(store), known=db.trial_rows())
        if study.search.sampler == "grid":  # the whole grid shows in `status` before anything runs
            trials = plan(study)
            db.add_trials(study.name, [t.to_dict() for t in trials])
            planned, skipped = len(trials), len(trials) - searcher.total
        completed = failed = 0
        if not searcher.exhausted:
            completed, failed = _run_on_ray(searcher, db, study, store=store, address=address,
                                            max_parallel=max_parallel, show_progress=show_progress)
        if study.search.sampler != "grid":
            db.record_proposals(study.name, searcher.records)
            planned = len(db.trials(study.name))
            skipped = planned - completed - failed
    return RunSummary(study=study.name, planned=planned, skipped=skipped,
                      completed=completed, failed=failed, wall_time_s=time.perf_counter() - start)


def _trial_task(payload: dict) -> dict:
    """Runs inside a Ray worker: one trial, returned as a plain dict."""
    from archsearch.arch.spec import ArchSpec
    from archsearch.train import train_trial

    result = train_trial(spec=ArchSpec.from_dict(payload["spec"]), recipe=payload["recipe"],
                         data=payload["data"], seed=payload["seed"], threads=payload["threads"],
                         checkpoint_dir=payload["checkpoint_dir"])
    return result.to_dict()



def _run_on_ray(searcher: Searcher, db: Store, study: Study, *, store: str | Path, address: str | None,
                max_parallel: int | None, show_progress: bool) -> tuple[int, int]:
    import ray

    execution = study.execution
    threads = execution.threads_per_trial
    owns_ray = not ray.is_initialized()
    if owns_ray:
        if address not in (None, "local", "auto"):
            _check_reachable(address)
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
        ray.init(address=address or "local", include_dashboard=False, logging_level="ERROR",
                 log_to_driver=False, configure_logging=True)
    try:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        width = max_parallel or (execution.max_parallel if execution.max_parallel != "auto" else 0)
        width = max(1, width or cpus // threads)
        task = ray.remote(num_cpus=min(threads, cpus), max_retries=execution.retries)(_trial_task)
        return _drain(searcher, db, task, study=study.name, store=store, width=width, threads=threads,
                      show_progress=show_progress)
    finally:
        if owns_ray:
            ray.shutdown()


def _drain(searcher: Searcher, db: Store, task: Any, *, study: str, store: str | Path, width: int, threads: int,
           show_progress: bool) -> tuple[int, int]:
    import ray

    from archsearch.execute.progress import TrialProgress

    running: dict[Any, PlannedTrial] = {}
    completed = failed = 0
    with TrialProgress(total=searcher.expected, enabled=show_progress) as progress:
        while True:
            asked = searcher.ask(width - len(running))
            if not asked and not running:
                break
            db.add_trials(study, [t.to_dict() for t in asked])
            for trial in asked:
                db.mark_running(trial.trial_id)
                payload = dict(spec=trial.spec.to_dict(), recipe=trial.recipe, data=trial.data,
                               seed=trial.seed, threads=threads,
                               checkpoint_dir=str(checkpoint_dir(store, trial.trial_id)))
                running[task.remote(payload)] = trial
            progress.update(completed=completed, running=len(running), failed=failed)
            ready, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
            for ref in ready:
                trial = running.pop(ref)
                try:
                    result = ray.get(ref)
                    db.finish(trial.trial_id, result)
                    completed += 1
                except Exception as err:  # a trial's failure is recorded, never fatal to the study
                    result = None
                    db.fail(trial.trial_id, _one_line(err))
                    failed += 1
                    progress.note(f"trial {trial.trial_id} failed: {_one_line(err)}")
                searcher.tell(trial, result)
            records = getattr(searcher, "records", None)
            if records:  # proposals reach the store as they finish
                db.record_proposals(study, records)
                records.clear()
        progress.update(completed=completed, running=0, failed=failed)
    return completed, failed


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail in one line when nothing listens at a cluster address: Ray itself
    retries for minutes before giving up."""
    import socket

    from archsearch.errors import ArchsearchError

    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ArchsearchError(f"Ray address '{address}' is not host:port or ray://host:port")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as err:
        raise ArchsearchError(f"cannot reach a Ray cluster at {address} ({err}); start one with "
                              "`ray start --head` there, or leave out --address to run locally") from None


def _one_line(err: BaseException) -> str:
    cause = getattr(err, "cause", None) or err
    text = f"{type(cause).__name__}: {cause}".strip().splitlines()
    return text[-1] if text else type(cause).__name__


def _config(study: Study) -> dict:
    """The resolved study as saved beside its results (the space inlined)."""
    return {**study.model_dump(mode="json", exclude={"space"}), "space": study.space.model_dump(mode="json")}
