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

from archsearch.execute.preflight import preflight_kernels
from archsearch.planner import plan
from archsearch.search import Job, Searcher
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
        db.add_study(name=study.name, path=origin.path if origin else "", config=_config(study),
                     text=_file_text(origin.path) if origin else None)
        searcher = make_searcher(study, store=str(store), known=db.trial_rows(), rungs=db.rung_rows())
        grid = study.search.sampler == "grid" and study.search.probe is None
        if grid:  # the whole grid shows in `status` before anything runs
            trials = plan(study)
            db.add_trials(study.name, [t.to_dict() for t in trials])
            planned, skipped = len(trials), len(trials) - searcher.expected
        completed = failed = 0
        if not searcher.exhausted:
            preflight_kernels(study.name, db, [t.spec for t in trials] if grid else None)
            completed, failed = _run_on_ray(searcher, db, study, store=store, address=address,
                                            max_parallel=max_parallel, show_progress=show_progress)
        _store_search_records(searcher, db, study.name)
        if not grid:
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
                         checkpoint_dir=payload["checkpoint_dir"], stop_at=payload.get("stop_at"))
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

    running: dict[Any, Job] = {}
    completed = failed = 0
    with TrialProgress(total=searcher.expected, enabled=show_progress) as progress:
        while True:
            asked = searcher.ask(width - len(running))
            if not asked and not running:
                break
            db.add_trials(study, [job.trial.to_dict() for job in asked])
            for job in asked:
                trial = job.trial
                db.mark_running(trial.trial_id, new_attempt=not job.rung)  # a promotion is no new attempt
                payload = dict(spec=trial.spec.to_dict(), recipe=trial.recipe, data=trial.data,
                               seed=trial.seed, threads=threads, stop_at=job.stop_at,
                               checkpoint_dir=str(checkpoint_dir(store, trial.trial_id)))
                running[task.remote(payload)] = job
            progress.update(completed=completed, running=len(running), failed=failed)
            ready, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
            for ref in ready:
                job = running.pop(ref)
                trial_id = job.trial.trial_id
                try:
                    result = ray.get(ref)
                except Exception as err:  # a trial's failure is recorded, never fatal to the study
                    result = None
                    db.fail(trial_id, _one_line(err))
                    failed += 1
                    progress.note(f"trial {trial_id} failed: {_one_line(err)}")
                if result is not None and job.rung is not None:
                    db.record_rung(trial_id, job.rung, job.stop_at or 1.0, result)
                if result is not None and job.stop_at is not None:
                    db.pause(trial_id, result)
                elif result is not None:
                    db.finish(trial_id, result)
                    completed += 1
                searcher.tell(job, result)
            _store_search_records(searcher, db, study)
        progress.update(completed=completed, running=0, failed=failed)
    for trial, rung in getattr(searcher, "pruned", ()):
        db.prune(trial.trial_id, rung=rung, rungs=searcher.rungs)
    _store_search_records(searcher, db, study)
    return completed, failed


def _store_search_records(searcher: Searcher, db: Store, study: str) -> None:
    """What a search learnt beside its trials: a sampler's finished proposals
    (as they end), a fidelity ladder's rank correlation (once it is known)."""
    records = getattr(searcher, "records", None)
    if records:
        db.record_proposals(study, records)
        records.clear()
    ladder = getattr(searcher, "ladder", None)
    if ladder is not None:
        db.record_ladder(study, ladder)


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


def _file_text(path: str) -> str | None:
    """The study file as written (kept with each version of the study)."""
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")[:1_000_000]
    except OSError:
        return None


def _config(study: Study) -> dict:
    """The resolved study as saved beside its results (the space inlined)."""
    return {**study.model_dump(mode="json", exclude={"space"}), "space": study.space.model_dump(mode="json")}
