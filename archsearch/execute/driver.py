"""Run a study's trials on Ray and write every result to the store.

Embedded Ray by default, private to the run (see ``cluster``); ``address``
joins an existing cluster instead. A ``Searcher`` says which trials to start
and hears how each ended.

Only the driver touches the store, and it holds the store's run lock for
the whole run (a second run on the same store refuses). Workers stream each
evaluation back as they train, and every few seconds their progress (step,
tokens, latest loss, tokens/s) with the training-loss rows since the last;
the driver writes those as they come (at most ``POINTS_EVERY_S`` late) so a
reader sees curves grow and where each running trial is, and a finished
trial's row and curve in one transaction. A trial whose worker dies is retried from its last checkpoint,
up to ``execution.retries`` times, each attempt counted in the store.

Twins, trials of different arms that train the same model (same spec, data,
recipe and seed: ``PlannedTrial.train_key``), train once: the first one
handed out trains, the others wait for it and then get its result and curve
(``Store.share``, their ``same_as`` naming it), as does a twin of a trial
the store finished before.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import deque
from contextlib import suppress
from dataclasses import dataclass
from collections.abc import Callable
from pathlib import Path
from typing import Any

from archsearch.execute.cluster import per_trial, start_ray, trials_at_once
from archsearch.execute.logs import Loggers, trial_loggers
from archsearch.execute.process import native_output_to
from archsearch.execute.preflight import (build_cpu_kernels, cpu_builds_missing, kernel_settings, preflight_checks,
                                          preflight_kernels)
from archsearch.execute.progress import TrialProgress
from archsearch.execute.task import _trial_task
from archsearch.execute.writer import StoreWriter
from archsearch.planner import PlannedTrial, plan, training_key, twin_lines
from archsearch.search import Job, Searcher
from archsearch.space.schema import Study
from archsearch.store import RunLock, Store, checkpoint_dir, divergence, open_store
from archsearch.units import axes_text

DEFAULT_HEARTBEAT_S = 30.0
# Evaluation points of running trials reach the store at most this late.
POINTS_EVERY_S = 1.0


@dataclass(frozen=True)
class RunSummary:
    study: str
    planned: int
    skipped: int  # already completed in the store, not trained again
    completed: int
    failed: int  # failed or diverged
    wall_time_s: float
    diverged: int = 0
    shared: int = 0  # completed with a twin's result (same spec, data, recipe, seed), not trained again
    held: int = 0  # failed or diverged after execution.max_attempts attempts: left as they are
    pruned: int = 0  # stopped at a rung by a multi-fidelity search (trained, not to the end)
    notes: tuple[str, ...] = ()  # what the search says of itself (a space that ran out before search.trials)


def run_study(study: Study, *, store: str | Path = "archsearch.duckdb", address: str | None = None,
              max_parallel: int | None = None, show_progress: bool = True,
              heartbeat_s: float | None = None, retry_failed: bool = False) -> RunSummary:
    """Plan ``study``, train every trial the store has not finished, record all.

    ``address``: None for a private embedded Ray, or a cluster: "auto" (the
    one ``ray start`` made on this machine), "HOST:PORT" or "ray://HOST:PORT".
    ``max_parallel`` overrides ``execution.max_parallel``. Progress goes to
    stderr: a bar on a terminal, else one line per finished trial and a
    heartbeat every ``heartbeat_s`` (default 30 s, or $ARCHSEARCH_HEARTBEAT_S).
    A failed or diverged trial that has had ``execution.max_attempts``
    attempts is left as it is (``held``) unless ``retry_failed``.
    Raises StoreError when another run is writing ``store``.
    """
    from archsearch.search import make_searcher, out_of_attempts

    start = time.perf_counter()
    origin = study._origin
    if heartbeat_s is None:
        heartbeat_s = float(os.environ.get("ARCHSEARCH_HEARTBEAT_S", DEFAULT_HEARTBEAT_S))
    loggers = trial_loggers(study.logging, study=study.name)  # a backend's package missing stops it here
    db = open_store(store)
    with RunLock(store, study=study.name), loggers:
        db.add_study(name=study.name, path=origin.path if origin else "", config=_config(study),
                     text=_file_text(origin.path) if origin else None)
        db.mark_interrupted()  # we hold the lock: whatever is still `running` lost its driver
        known = db.trial_rows()
        searcher = make_searcher(study, store=str(store), known=known, rungs=db.rung_rows(),
                                 retry_failed=retry_failed)
        grid = study.search.sampler == "grid" and study.search.probe is None
        held = 0
        if grid:  # the whole grid shows in `status` before anything runs
            trials = plan(study)
            db.add_trials(study.name, [t.to_dict() for t in trials])
            if not retry_failed:
                held = sum(out_of_attempts(known.get(t.trial_id), study.execution.max_attempts) for t in trials)
            planned, skipped = len(trials), len(trials) - searcher.expected - held
        counts = {"completed": 0, "failed": 0, "diverged": 0, "shared": 0, "pruned": 0}
        if not searcher.exhausted:
            preflight_checks(study, db, trials if grid else None)  # raises, before anything trains, on a leak
            preflight_kernels(study.name, db, [t.spec for t in trials] if grid else None)
            missing = cpu_builds_missing([t.spec for t in trials] if grid else None, address=address)
            if missing:
                build_cpu_kernels(missing)
            with TrialProgress(total=searcher.expected, enabled=show_progress, heartbeat_s=heartbeat_s) as progress:
                loggers.warn = progress.note
                for line in twin_lines(trials) if grid else ():
                    progress.note(line)
                try:
                    counts = _run_on_ray(searcher, db, study, store=store, address=address,
                                         max_parallel=max_parallel, progress=progress, loggers=loggers)
                except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP: the trials it stopped say so
                    with suppress(Exception):
                        db.mark_interrupted()
                    raise
        _store_search_records(searcher, db, study.name)
        if not grid:
            planned = len(db.trials(study.name))
            skipped = planned - sum(counts.values())
    return RunSummary(study=study.name, planned=planned, skipped=skipped, completed=counts["completed"],
                      failed=counts["failed"] + counts["diverged"], diverged=counts["diverged"],
                      shared=counts["shared"], pruned=counts["pruned"], held=held, notes=tuple(searcher.notes),
                      wall_time_s=time.perf_counter() - start)


def _run_on_ray(searcher: Searcher, db: Store, study: Study, *, store: str | Path, address: str | None,
                max_parallel: int | None, progress: TrialProgress, loggers: Loggers) -> dict[str, int]:
    import ray

    owns_ray = not ray.is_initialized()
    with native_output_to(ray_log(store)) as log:
        private_dir = start_ray(address, log=str(log)) if owns_ray else None
        try:
            return _drain(searcher, db, study, store=store, max_parallel=max_parallel, progress=progress,
                          loggers=loggers)
        finally:
            if owns_ray:
                ray.shutdown()
                if private_dir is not None:
                    shutil.rmtree(private_dir, ignore_errors=True)


def ray_log(store: str | Path) -> Path:
    """Where a run on ``store`` keeps Ray's native output (its C++ log lines): beside the store."""
    return Path(f"{store}.ray.log")


def _drain(searcher: Searcher, db: Store, study: Study, *, store: str | Path, max_parallel: int | None,
           progress: TrialProgress, loggers: Loggers) -> dict[str, int]:
    import ray

    execution = study.execution
    needs, workers = per_trial(execution), execution.workers_per_trial
    # A trial's workers wait for each other: never start more trials than all their workers fit.
    scaled, resources = {name: need * workers for name, need in needs.items()}, ray.cluster_resources()
    width = trials_at_once(scaled, resources, max_parallel=max_parallel or execution.max_parallel)
    if workers > 1:
        width = min(width, trials_at_once(scaled, resources, max_parallel="auto"))
    options = dict(num_cpus=needs["CPU"], num_gpus=needs["GPU"], max_retries=0)
    if needs["memory"]:
        options["memory"] = needs["memory"]
    task = ray.remote(num_returns="streaming", **options)(_trial_task)
    return _Scheduler(searcher, db, task, study=study.name, store=store, storage=study.execution.resolved_storage(),
                      threads=execution.threads_per_trial, retries=execution.retries, progress=progress,
                      workers=dict(count=workers, options=options), kernels=kernel_settings(),
                      nice=execution.nice, loggers=loggers).run(width)


class _Scheduler:
    """The run's scheduler: keeps ``width`` trials running on Ray (a dead
    worker's job queued again, a twin held back for the training it shares)
    and records everything they report.

    What a pass through the loop gathers (results, failures, the trials it
    starts, the search's records, and evaluation and training-loss points and
    progress at most ``POINTS_EVERY_S`` old) is handed to the store's writer
    thread as one piece of work (see ``writer``): on a busy machine a DuckDB
    transaction costs tens of milliseconds, most of it opening and closing
    the file, so the loop never waits for one, and what queues while one is
    written goes into the next together.
    """

    def __init__(self, searcher: Searcher, db: Store, task: Any, *, study: str, store: str | Path,
                 storage: str | None, threads: int, retries: int, progress: TrialProgress, workers: dict,
                 kernels: dict[str, str | None], nice: int | None = None, loggers: Loggers | None = None):
        self.searcher, self.db, self.task, self.study, self.workers = searcher, db, task, study, workers
        self.kernels = kernels  # the driver's kernel settings, for every trial's task
        self.nice = nice  # execution.nice: each trial's niceness, else its worker's (the driver's when embedded)
        self.store, self.storage, self.threads, self.retries, self.progress = store, storage, threads, retries, progress
        self.counts = {"completed": 0, "failed": 0, "diverged": 0, "shared": 0, "pruned": 0}
        self.loggers = loggers or Loggers({})  # TensorBoard, W&B, MLflow: told of each trial that trains
        self.running: dict[Any, tuple[Job, int, float]] = {}  # generator -> job, attempt, started
        self.retry_queue: deque[tuple[Job, int]] = deque()  # jobs whose worker died, with their next attempt
        self.points: list[tuple[str, dict]] = []  # evaluations not yet written
        self.train_points: list[tuple[str, dict]] = []  # training-loss rows not yet written
        self.reports: dict[str, dict] = {}  # running trials' progress reports not yet written
        self.points_since = time.monotonic()
        # twins (see the module's docstring), by train key: the trial that trained it and its result;
        # the job training it now and the twins waiting for that job; then the twins handed out this
        # pass (their rows to add) and the twins whose result was already trained (to end next pass)
        self.trained: dict[str, tuple[str, dict]] = {
            training_key(row["spec"], row["recipe"], row["data"], row["seed"]): (row["trained"], _result(row))
            for row in db.completed_plans()}
        self.training: dict[str, Job] = {}
        self.waiting_twins: dict[str, list[Job]] = {}
        self.twins_to_add: list[Job] = []
        self.twins_with_results: list[tuple] = []
        self.writer = StoreWriter(db)

    def run(self, width: int) -> dict[str, int]:
        """Train until the search has nothing left to start and nothing runs; the counts by status.
        However it ends (an interrupt, an error), what was handed to the writer is written first."""
        try:
            return self._run(width)
        finally:
            self.writer.close()

    def _run(self, width: int) -> dict[str, int]:
        while True:
            ended = self._with_twins([event for generator in self._ready() for event in self._take(generator)])
            for job, kind, value, _, _ in ended:  # told first, so a search can promote at once
                self.searcher.tell(job, value if kind == "result" and not divergence(value) else None)
            starting = []
            while self.retry_queue and len(self.running) + len(starting) < width:
                starting.append(self.retry_queue.popleft())
            room = width - len(self.running) - len(starting)
            if room > 0:
                starting += [(job, 1) for job in self._ask(room)]
            due = ((self.points or self.train_points or self.reports)
                   and time.monotonic() - self.points_since >= POINTS_EVERY_S)
            if ended or starting or due or self.twins_to_add:
                self._write(ended, starting)
            # Started as their `running` is handed to the writer: a kill before it lands leaves
            # them `planned`, one after it `running` with no driver (read as interrupted);
            # either way `resume` trains them from their newest checkpoint.
            for job, attempt in starting:
                self._submit(job, attempt=attempt)
            self.progress.update(completed=self.counts["completed"] + self.counts["shared"],
                                 running=len(self.running), failed=self.counts["failed"] + self.counts["diverged"])
            if not self.running and not self.retry_queue and not self.twins_with_results:
                break
        self.writer.flush()
        with self.db.transaction() as con:
            for trial, rung in self.searcher.pruned:
                self.db.prune(trial.trial_id, rung=rung, rungs=self.searcher.rungs, con=con)
        self.counts["pruned"] = len(self.searcher.pruned)
        return self.counts

    def _ask(self, room: int) -> list[Job]:
        """Up to ``room`` jobs to train; the twins handed out with them train nothing: each waits
        for the trial training its model, or takes the result the store or this run has of it."""
        out: list[Job] = []
        while room > 0:
            jobs, absorbed = self.searcher.ask(room), 0
            for job in jobs:
                key = _train_key(job)
                if key in self.trained:
                    source, result = self.trained[key]
                    self.twins_with_results.append((job, "result", result, 0.0, source))
                elif key in self.training:
                    self.waiting_twins.setdefault(key, []).append(job)
                else:
                    if key is not None:
                        self.training[key] = job
                    out.append(job)
                    room -= 1
                    continue
                self.twins_to_add.append(job)
                absorbed += 1
            if not jobs or not absorbed:  # asked again only for the slots its twins left free
                break
        return out

    def _with_twins(self, ended: list[tuple]) -> list[tuple]:
        """``ended``, each trained trial followed by the twins that waited for it, after the twins
        that found their result already trained: ``(job, kind, value, wall_s, source)``, where
        ``source`` is the trial whose training a twin shares (None for a trial that trained)."""
        out, self.twins_with_results = self.twins_with_results, []
        for entry in ended:
            out.append(entry)
            job, kind, value = entry[:3]
            key = _train_key(job)
            if key is None or self.training.get(key) is not job:
                continue
            del self.training[key]
            if kind == "result" and not divergence(value):
                self.trained[key] = (job.trial.trial_id, value)
            out += [(twin, kind, value, 0.0, job.trial.trial_id) for twin in self.waiting_twins.pop(key, [])]
        return out

    def _ready(self) -> list[Any]:
        import ray

        generators = list(self.running)
        if not generators:
            return []
        ready, _ = ray.wait(generators, num_returns=len(generators), timeout=0)
        if not ready:
            ready, _ = ray.wait(generators, num_returns=1, timeout=0.5)
        return ready

    def _write(self, ended: list[tuple], starting: list[tuple[Job, int]]) -> None:
        """Points, ended trials, the search's records, the trials about to start: handed to the
        store's writer as one piece of work (one transaction, or part of one). What it tells the
        terminal and the counts is worked out here, from the results themselves."""
        twins = [job.trial.to_dict() for job in self.twins_to_add]
        points, train_points = self.points, self.train_points
        running = self._running_ids()
        # a trial that ended has no progress left to show, whatever it reported this pass
        reports = {k: v for k, v in self.reports.items() if k in running}
        gone = [job.trial.trial_id for job, *_ in ended]
        records, ladder = list(self.searcher.records), self.searcher.ladder and dict(self.searcher.ladder)
        self.searcher.records.clear()
        outcomes = [self._outcome(*entry) for entry in ended]
        added = [job.trial.to_dict() for job, attempt in starting if attempt == 1]
        # a promotion is no new attempt; a retry is
        marks = [(job.trial.trial_id, attempt > 1 or not job.rung) for job, attempt in starting]
        rungs = [(job.trial.trial_id, job.rung, job.stop_at or 1.0, value) for job, kind, value, _, source in ended
                 if source is None and kind == "result" and job.rung is not None]
        db, study = self.db, self.study

        def write(con: Any) -> None:
            # first, so the twins handed out last pass have their rows before they share a result
            db.add_trials(study, twins, con=con)
            db.add_points(points, con=con)
            db.add_train_points(train_points, con=con)
            db.record_progress(reports, con=con)
            db.forget_progress(gone, con=con)
            for trial_id, rung, fraction, value in rungs:
                db.record_rung(trial_id, rung, fraction, value, con=con)
            for record in outcomes:
                record(con)
            if records:
                db.record_proposals(study, records, con=con)
            if ladder is not None:
                db.record_ladder(study, ladder, con=con)
            db.add_trials(study, added, con=con)
            for trial_id, new_attempt in marks:
                db.mark_running(trial_id, new_attempt=new_attempt, con=con)

        self.writer.put(write)
        self.points, self.train_points, self.reports = [], [], {}
        self.points_since, self.twins_to_add = time.monotonic(), []

    def _outcome(self, job: Job, kind: str, value: Any, wall_s: float, source: str | None) -> Callable[[Any], Any]:
        """How one ended trial is recorded (given the transaction's connection), once its line is
        printed and it is counted: its status follows from its result as the store would write it."""
        trial_id, db = job.trial.trial_id, self.db
        if source is not None:
            return self._share(job, source, kind, value)
        if kind != "result":
            self.counts[kind] += 1
            self.progress.note(f"trial {trial_id} {kind}: {value}")
            self.loggers.end(trial_id, kind, None)
            return lambda con: db.fail(trial_id, value, status=kind, con=con)
        status = "diverged" if divergence(value) else ("paused" if job.stop_at is not None else "completed")
        if status != "paused":
            self.counts[status] += 1
        self.progress.finished(trial_id=trial_id, label=_label(job.trial), status=status,
                               val_loss=value["val_loss"], wall_s=wall_s)
        self.loggers.end(trial_id, status, value)
        if job.stop_at is not None:
            return lambda con: db.pause(trial_id, value, con=con)
        return lambda con: db.finish(trial_id, value, con=con)

    def _share(self, job: Job, source: str, kind: str, value: Any) -> Callable[[Any], Any]:
        """A twin takes the result (``value``, as it was told) of the trial that trained its model:
        its status is that trial's (completed, or as its training ended)."""
        trial_id, db = job.trial.trial_id, self.db
        if trial_id == source:  # a sampler proposed this very trial again: its one row has its result
            return lambda con: None
        status = kind if kind != "result" else ("diverged" if divergence(value) else "completed")
        self.counts["shared" if status == "completed" else status] += 1
        if status == "completed":
            self.progress.finished(trial_id=trial_id, label=_label(job.trial), status=status,
                                   val_loss=value["val_loss"], wall_s=0.0, shared_with=source)
        else:
            self.progress.note(f"trial {trial_id} {status}, as trial {source} that trains the same model did")
        return lambda con: db.share(trial_id, source, con=con)

    def _submit(self, job: Job, *, attempt: int) -> None:
        trial = job.trial
        payload = dict(spec=trial.spec.to_dict(), recipe=trial.recipe, data=trial.data, seed=trial.seed,
                       threads=self.threads, stop_at=job.stop_at, workers=self.workers, kernels=self.kernels,
                       nice=self.nice,
                       checkpoint_dir=str(checkpoint_dir(self.store, trial.trial_id, storage=self.storage)))
        self.running[self.task.remote(payload)] = (job, attempt, time.perf_counter())
        self.progress.started(trial.trial_id)
        self.loggers.start(trial, trial.to_dict())

    def _running_ids(self) -> set[str]:
        return {job.trial.trial_id for job, _, _ in self.running.values()}

    def _take(self, generator: Any) -> list[tuple]:
        """Every item a ready trial has sent: its points are kept; its end,
        ``(job, "result" | "failed" | "diverged", result or error, wall_s)``,
        is returned. A dead worker's job is queued again instead."""
        import ray

        job, attempt, started = self.running[generator]
        trial_id = job.trial.trial_id
        while True:
            try:
                kind, value = ray.get(next(generator))
            except StopIteration:  # ended without a result (it always sends one)
                kind, value = "failed", "the trial's worker ended without a result"
            except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                    ray.exceptions.ObjectLostError, ray.exceptions.OwnerDiedError) as err:
                kind, value = "failed", f"worker died {attempt} times ({type(err).__name__})"
                if attempt <= self.retries:  # again, from its newest checkpoint
                    del self.running[generator]
                    self.progress.stopped(trial_id)
                    self.progress.note(f"trial {trial_id}: worker died ({type(err).__name__}); "
                                       f"retry {attempt} of {self.retries}")
                    self.retry_queue.append((job, attempt + 1))
                    return []
            except Exception as err:  # a trial's failure is recorded, never fatal to the study
                cause = getattr(err, "cause", None) or err
                kind = "diverged" if isinstance(cause, FloatingPointError) else "failed"
                value = _one_line(err)
            if kind == "resumed":
                self.progress.note(f"trial {trial_id}: attempt {attempt} resumes from step {value}")
            elif kind == "eval":
                self.points.append((trial_id, value))
                self.loggers.log(trial_id, kind, value)
            elif kind == "progress":
                self.train_points += [(trial_id, row) for row in value["rows"]]
                self.reports[trial_id] = value["at"]
                self.progress.reported(trial_id, value["at"])
                for row in value["rows"]:
                    self.loggers.log(trial_id, "train", row)
            if kind in ("resumed", "eval", "progress"):
                if ray.wait([generator], timeout=0)[0]:
                    continue
                return []
            del self.running[generator]
            self.progress.stopped(trial_id)
            return [(job, kind, value, time.perf_counter() - started, None)]


def _store_search_records(searcher: Searcher, db: Store, study: str, *, con: Any = None) -> None:
    """What a search learnt beside its trials: a sampler's finished proposals
    (as they end), a fidelity ladder's rank correlation (once it is known)."""
    if searcher.records:
        db.record_proposals(study, searcher.records, con=con)
        searcher.records.clear()
    if searcher.ladder is not None:
        db.record_ladder(study, searcher.ladder, con=con)


def _train_key(job: Job) -> str | None:
    """The job's train key where it trains a trial to its end (a twin can share it), else None."""
    return job.trial.train_key if job.stop_at is None and job.rung is None else None


def _result(row: dict) -> dict:
    """A completed trial's result columns as a training reports them (its curve is in the store)."""
    names = ("train_loss", "val_loss", "val_accuracy", "steps", "tokens", "wall_time_s", "tokens_per_s")
    return {**{name: row[name] for name in names}, "curve": []}


def _label(trial: PlannedTrial) -> str:
    """The trial's arm in a few words: its family and the axes it was planned at."""
    return f"{trial.spec.family} {axes_text(trial.axes, leave_out=('family',))}".strip()


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
    """The resolved study as saved beside its results (the space inlined,
    the checkpoint storage as an absolute path)."""
    config = {**study.model_dump(mode="json", exclude={"space"}), "space": study.space.model_dump(mode="json")}
    config["execution"]["storage"] = study.execution.resolved_storage()
    return config
