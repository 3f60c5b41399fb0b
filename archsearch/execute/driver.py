"""Run a study's trials on Ray and write every result to the store.

Embedded Ray by default: a private instance for this run alone, listening
on 127.0.0.1 only, with its session files in its own temporary folder, so
``--address auto`` from another shell never finds it. ``address`` joins an
existing cluster instead.

Only the driver touches the store, and it holds the store's run lock for
the whole run (a second run on the same store refuses). Workers stream each
evaluation back as they train; the driver writes those points as they come
so a reader sees curves grow, and a finished trial's row and curve in one
transaction. A trial whose worker dies is retried from its last checkpoint,
up to ``execution.retries`` times, each attempt counted in the store.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from archsearch.errors import ArchsearchError
from archsearch.execute.progress import TrialProgress
from archsearch.planner import PlannedTrial, plan
from archsearch.space.schema import Study
from archsearch.store import RunLock, Store, checkpoint_dir, open_store

LOOPBACK = ("127.0.0.1", "localhost", "::1")
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


def run_study(study: Study, *, store: str | Path = "archsearch.duckdb", address: str | None = None,
              max_parallel: int | None = None, show_progress: bool = True,
              heartbeat_s: float | None = None) -> RunSummary:
    """Plan ``study``, train every trial the store has not finished, record all.

    ``address``: None for a private embedded Ray, or a cluster: "auto" (the
    one ``ray start`` made on this machine), "HOST:PORT" or "ray://HOST:PORT".
    ``max_parallel`` overrides ``execution.max_parallel``. Progress goes to
    stderr: a bar on a terminal, else one line per finished trial and a
    heartbeat every ``heartbeat_s`` (default 30 s, or $ARCHSEARCH_HEARTBEAT_S).
    Raises StoreError when another run is writing ``store``.
    """
    start = time.perf_counter()
    trials = plan(study)
    origin = study._origin
    if heartbeat_s is None:
        heartbeat_s = float(os.environ.get("ARCHSEARCH_HEARTBEAT_S", DEFAULT_HEARTBEAT_S))
    db = open_store(store)
    with RunLock(store, study=study.name):
        db.add_study(name=study.name, path=origin.path if origin else "", config=_config(study))
        db.add_trials(study.name, [t.to_dict() for t in trials])
        db.mark_interrupted()  # we hold the lock: whatever is still `running` lost its driver
        done = db.completed_ids()
        todo = [t for t in trials if t.trial_id not in done]
        counts = {"completed": 0, "failed": 0, "diverged": 0}
        if todo:
            with TrialProgress(total=len(todo), enabled=show_progress, heartbeat_s=heartbeat_s) as progress:
                counts = _run_on_ray(todo, db, study, store=store, address=address, max_parallel=max_parallel,
                                     progress=progress)
    return RunSummary(study=study.name, planned=len(trials), skipped=len(trials) - len(todo),
                      completed=counts["completed"], failed=counts["failed"] + counts["diverged"],
                      diverged=counts["diverged"], wall_time_s=time.perf_counter() - start)


def _trial_task(payload: dict):
    """Runs inside a Ray worker: yields ("resumed", step) when it starts from
    a checkpoint, ("eval", row) as the trial evaluates, then ("result",
    TrialResult dict). Training runs on a thread so its evaluations can
    leave while it goes on."""
    import queue
    import threading

    from archsearch.arch.spec import ArchSpec
    from archsearch.train import checkpoint, train_trial

    rows: queue.Queue = queue.Queue()
    outcome: dict = {}
    location = payload["checkpoint_dir"]
    # Object storage: train into a local folder, mirrored there after each write.
    local = tempfile.mkdtemp(prefix="archsearch-trial-") if checkpoint.is_uri(location) else None
    if local is not None:
        checkpoint.pull(location, local)

    def train() -> None:
        try:
            outcome["result"] = train_trial(
                spec=ArchSpec.from_dict(payload["spec"]), recipe=payload["recipe"], data=payload["data"],
                seed=payload["seed"], threads=payload["threads"], checkpoint_dir=local or location,
                on_eval=rows.put,
                on_checkpoint=(lambda folder: checkpoint.push(folder, location)) if local else None).to_dict()
        except BaseException as err:  # re-raised below, in the task's own thread
            outcome["error"] = err
        finally:
            rows.put(None)
            if local is not None:
                shutil.rmtree(local, ignore_errors=True)

    found = checkpoint.latest(local or location)
    if found is not None:
        yield ("resumed", int(found.name.removeprefix(checkpoint.STEP_PREFIX)))
    thread = threading.Thread(target=train, name="trial", daemon=True)
    thread.start()
    while (row := rows.get()) is not None:
        yield ("eval", row)
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    yield ("result", outcome["result"])


def _run_on_ray(todo: list[PlannedTrial], db: Store, study: Study, *, store: str | Path, address: str | None,
                max_parallel: int | None, progress: TrialProgress) -> dict[str, int]:
    import ray

    execution = study.execution
    owns_ray = not ray.is_initialized()
    private_dir = _start_ray(address) if owns_ray else None
    try:
        per_trial = _per_trial(execution)
        width = _width(per_trial, ray.cluster_resources(), max_parallel=max_parallel or execution.max_parallel)
        options = dict(num_cpus=per_trial["CPU"], num_gpus=per_trial["GPU"], max_retries=0,
                       num_returns="streaming")
        if per_trial["memory"]:
            options["memory"] = per_trial["memory"]
        task = ray.remote(**options)(_trial_task)
        return _Drain(db, task, store=store, storage=_storage(study), threads=execution.threads_per_trial,
                      retries=execution.retries, progress=progress).run(todo, width=width)
    finally:
        if owns_ray:
            ray.shutdown()
            if private_dir is not None:
                shutil.rmtree(private_dir, ignore_errors=True)


def _start_ray(address: str | None) -> str | None:
    """Start a private embedded Ray (returns its folder) or join ``address`` (returns None)."""
    import ray

    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    quiet = dict(include_dashboard=False, logging_level="ERROR", log_to_driver=False, configure_logging=True)
    if address not in (None, "local"):
        if address == "auto":
            address = _recorded_cluster()
        _check_reachable(address)
        _warn_if_open(address)
        try:
            ray.init(address=address, **quiet)
        except ConnectionError as err:
            hint = ("start one with `ray start --head`, or leave out --address to run locally"
                    if _token_mode() else
                    "if it uses token authentication (what `ray start --head` turns on since Ray 2.59), "
                    "set RAY_AUTH_MODE=token; Ray reads the token from ~/.ray/auth_token or $RAY_AUTH_TOKEN")
            raise ArchsearchError(f"cannot join the Ray cluster at '{address}': {str(err).splitlines()[0]}; "
                                  f"{hint}") from None
        return None
    # Session files in a folder of our own: `ray.init("auto")` looks for a
    # cluster under /tmp/ray and so never joins this one. Short prefix: Ray
    # puts unix sockets in it, whose paths are capped near 107 bytes.
    folder = tempfile.mkdtemp(prefix="asray-", dir="/tmp" if os.path.isdir("/tmp") else None)
    with _loopback_only():
        ray.init(address="local", _temp_dir=folder, **quiet)
    return folder


def _recorded_cluster() -> str:
    """What ``--address auto`` joins: $RAY_ADDRESS, or the cluster ``ray
    start`` recorded on this machine. Never Ray's own fallback for "auto",
    which joins any Ray process it finds running: another run's embedded one."""
    from ray._private.utils import read_ray_address

    found = os.environ.get("RAY_ADDRESS") or read_ray_address()
    if not found:
        raise ArchsearchError("--address auto: no cluster started with `ray start` on this machine and RAY_ADDRESS "
                              "is unset; start one with `ray start --head`, give its HOST:PORT, or leave out "
                              "--address to run locally")
    return found


@contextmanager
def _loopback_only() -> Iterator[None]:
    """Ray binds every server to the node address, which on Linux is the
    machine's network address, and turns a given 127.0.0.1 into it. Its
    single-machine mode (the default on macOS and Windows) uses 127.0.0.1:
    the variable switches it on for the processes Ray starts, the constant
    for this one, which read it when ray was imported."""
    from ray._private import ray_constants

    variable = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    saved_env, saved_flag = os.environ.get(variable), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[variable] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = saved_env


def _per_trial(execution: Any) -> dict[str, float]:
    """What Ray reserves for each trial (CPUs default to its torch threads)."""
    return {"CPU": execution.cpus or execution.threads_per_trial, "GPU": execution.gpus,
            "memory": execution.memory or 0}


_FIELDS = {"CPU": "cpus", "GPU": "gpus", "memory": "memory"}


def _width(per_trial: dict[str, float], resources: dict[str, float], *, max_parallel: int | str) -> int:
    """Trials at once: ``max_parallel``, or with "auto" as many as the
    cluster's resources fit. Raises when not even one trial fits, since Ray
    would wait for such a task forever."""
    fits = []
    for name, need in per_trial.items():
        if need:
            have = resources.get(name, 0)
            if have < need:
                unit = " bytes" if name == "memory" else ""
                raise ArchsearchError(f"execution.{_FIELDS[name]}: each trial asks for {need:g}{unit} but the Ray "
                                      f"cluster has {have:g}{unit} in all; lower it or add nodes that have it")
            fits.append(int(have // need))
    if max_parallel != "auto":
        return int(max_parallel)
    return max(1, min(fits or [1]))


class _Drain:
    """Keeps ``width`` trials running and records everything they report.

    What a pass through the loop gathers (results, failures, the trials it
    starts, and evaluation points at most ``POINTS_EVERY_S`` old) is written
    in one transaction: on a busy machine a DuckDB transaction costs tens of
    milliseconds, most of it opening and closing the file, so a short trial
    costs one transaction, not four.
    """

    def __init__(self, db: Store, task: Any, *, store: str | Path, storage: str | None, threads: int, retries: int,
                 progress: TrialProgress):
        self.db, self.task, self.store, self.storage = db, task, store, storage
        self.threads, self.retries, self.progress = threads, retries, progress
        self.counts = {"completed": 0, "failed": 0, "diverged": 0}
        self.running: dict[Any, tuple[PlannedTrial, int, float]] = {}  # generator -> trial, attempt, started
        self.again: deque[tuple[PlannedTrial, int]] = deque()  # retries of trials whose worker died
        self.points: list[tuple[str, dict]] = []  # evaluations not yet written
        self.points_since = time.monotonic()

    def run(self, todo: list[PlannedTrial], *, width: int) -> dict[str, int]:
        queue = deque((trial, 1) for trial in todo)
        while queue or self.again or self.running:
            ended = [event for generator in self._ready() for event in self._take(generator)]
            starting = []
            while (queue or self.again) and len(self.running) + len(starting) < width:
                starting.append(self.again.popleft() if self.again else queue.popleft())
            due = self.points and time.monotonic() - self.points_since >= POINTS_EVERY_S
            if ended or starting or due:
                self._write(ended, starting)
            # Started only once the store says so: a kill in between leaves
            # them `running` with no driver, which reads as interrupted.
            for trial, attempt in starting:
                self._submit(trial, attempt=attempt)
            self.progress.update(completed=self.counts["completed"], running=len(self.running),
                                 failed=self.counts["failed"] + self.counts["diverged"])
        return self.counts

    def _ready(self) -> list[Any]:
        import ray

        generators = list(self.running)
        if not generators:
            return []
        ready, _ = ray.wait(generators, num_returns=len(generators), timeout=0)
        if not ready:
            ready, _ = ray.wait(generators, num_returns=1, timeout=0.5)
        return ready

    def _write(self, ended: list[tuple], starting: list[tuple[PlannedTrial, int]]) -> None:
        """Points, then ended trials, then the trials about to start: one transaction."""
        with self.db.transaction() as con:
            self.db.add_points(self.points, con=con)
            for trial, kind, value, wall_s in ended:
                if kind == "result":
                    status = self.db.finish(trial.trial_id, value, con=con)
                else:
                    status, error = kind, value
                    self.db.fail(trial.trial_id, error, status=status, con=con)
                self.counts[status] += 1
                if kind == "result":
                    self.progress.finished(trial_id=trial.trial_id, label=_label(trial), status=status,
                                           val_loss=value["val_loss"], wall_s=wall_s)
                else:
                    self.progress.note(f"trial {trial.trial_id} {status}: {error}")
            for trial, _ in starting:
                self.db.mark_running(trial.trial_id, con=con)
        self.points, self.points_since = [], time.monotonic()

    def _submit(self, trial: PlannedTrial, *, attempt: int) -> None:
        payload = dict(spec=trial.spec.to_dict(), recipe=trial.recipe, data=trial.data, seed=trial.seed,
                       threads=self.threads,
                       checkpoint_dir=str(checkpoint_dir(self.store, trial.trial_id, storage=self.storage)))
        self.running[self.task.remote(payload)] = (trial, attempt, time.perf_counter())

    def _take(self, generator: Any) -> list[tuple]:
        """Every item a ready trial has sent: its points are kept; its end,
        ``(trial, "result" | "failed" | "diverged", result or error, wall_s)``,
        is returned. A dead worker's trial is queued again instead."""
        import ray

        trial, attempt, started = self.running[generator]
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
                    self.progress.note(f"trial {trial.trial_id}: worker died ({type(err).__name__}); "
                                       f"retry {attempt} of {self.retries}")
                    self.again.append((trial, attempt + 1))
                    return []
            except Exception as err:  # a trial's failure is recorded, never fatal to the study
                cause = getattr(err, "cause", None) or err
                kind = "diverged" if isinstance(cause, FloatingPointError) else "failed"
                value = _one_line(err)
            if kind == "resumed":
                self.progress.note(f"trial {trial.trial_id}: attempt {attempt} resumes from step {value}")
            elif kind == "eval":
                self.points.append((trial.trial_id, value))
            if kind in ("resumed", "eval"):
                if ray.wait([generator], timeout=0)[0]:
                    continue
                return []
            del self.running[generator]
            return [(trial, kind, value, time.perf_counter() - started)]


def _label(trial: PlannedTrial) -> str:
    """The trial's arm in a few words: its family and the axes it was planned at."""
    axes = " ".join(f"{k}={v}" for k, v in trial.axes.items() if k != "family")
    return f"{trial.spec.family} {axes}".strip()


def _storage(study: Study) -> str | None:
    """``execution.storage`` as an absolute path, or the URI as written."""
    storage = study.execution.storage
    if not storage or "://" in storage:
        return storage
    return str(Path(storage).expanduser().resolve())


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail in one line when nothing listens at a cluster address: Ray itself
    retries for minutes before giving up."""
    import socket

    host, port = _host_port(address)
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as err:
        raise ArchsearchError(f"cannot reach a Ray cluster at {address} ({err}); start one with "
                              "`ray start --head` there, or leave out --address to run locally") from None


def _host_port(address: str) -> tuple[str, str]:
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ArchsearchError(f"Ray address '{address}' is not auto, host:port or ray://host:port")
    return host.strip("[]"), port


def _warn_if_open(address: str) -> None:
    """A cluster reached over the network without Ray's token authentication
    runs whatever anyone who can reach its port sends it."""
    host, _ = _host_port(address)
    if host not in LOOPBACK and not _token_mode():
        print(f"warning: joining the Ray cluster at {address} without authentication: anyone who can reach "
              "that port can run code on the cluster; start it with token authentication and set "
              "RAY_AUTH_MODE=token here", file=sys.stderr)


def _token_mode() -> bool:
    return os.environ.get("RAY_AUTH_MODE", "").lower() == "token"


def _one_line(err: BaseException) -> str:
    cause = getattr(err, "cause", None) or err
    text = f"{type(cause).__name__}: {cause}".strip().splitlines()
    return text[-1] if text else type(cause).__name__


def _config(study: Study) -> dict:
    """The resolved study as saved beside its results (the space inlined,
    the checkpoint storage as an absolute path)."""
    config = {**study.model_dump(mode="json", exclude={"space"}), "space": study.space.model_dump(mode="json")}
    config["execution"]["storage"] = _storage(study)
    return config
