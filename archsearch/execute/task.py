"""The task a trial runs as in a Ray worker, in a module of its own: a worker
unpickles it by importing this module, so it imports what training needs
(torch and the model code, on the task's first lines) and none of the driver's
store, planner or search.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from archsearch.execute.parallel import data_parallel_ranks
from archsearch.execute.preflight import use_kernel_settings

# A trial that checkpoints to object storage trains into a local mirror named by its process,
# so a later trial on the node can remove the mirror of one that was killed before its cleanup.
MIRROR_PREFIX = "archsearch-trial-"
# a dead process's mirror is removed only when it has not changed for this long, in case its pid
# was seen from another PID namespace sharing the folder (a container beside this one)
MIRROR_STALE_S = 600.0


def _trial_task(payload: dict):
    """Runs inside a Ray worker: yields ("resumed", step) when it starts from
    a checkpoint, ("eval", row) as the trial evaluates, ("progress", {"at":
    report, "rows": training-loss rows}) every few seconds as it trains (see
    ``train.progress``), then ("result", TrialResult dict). Training runs on
    a thread so what it reports can leave while it goes on."""
    if payload.get("nice") is not None:  # first, so every thread the trial starts inherits it
        renice(payload["nice"])
    import queue
    import threading

    from archsearch.arch.spec import ArchSpec
    from archsearch.train import checkpoint, train_trial

    use_kernel_settings(payload["kernels"])
    items: queue.Queue = queue.Queue()
    outcome: dict = {}
    location = payload["checkpoint_dir"]
    # Object storage: train into a local folder, mirrored there after each write.
    local = mirror_folder() if checkpoint.is_uri(location) else None
    if local is not None:
        checkpoint.pull(location, local)

    def train() -> None:
        try:
            with data_parallel_ranks(payload) as rank:
                outcome["result"] = train_trial(
                    spec=ArchSpec.from_dict(payload["spec"]), recipe=payload["recipe"], data=payload["data"],
                    seed=payload["seed"], threads=payload["threads"], checkpoint_dir=local or location,
                    stop_at=payload["stop_at"], rank=rank, on_eval=lambda row: items.put(("eval", row)),
                    on_progress=lambda at, rows: items.put(("progress", {"at": at, "rows": rows})),
                    on_checkpoint=(lambda folder: checkpoint.push(folder, location)) if local else None).to_dict()
        except BaseException as err:  # re-raised below, in the task's own thread
            outcome["error"] = err
        finally:
            items.put(None)
            if local is not None:
                shutil.rmtree(local, ignore_errors=True)

    found = checkpoint.latest(local or location)
    if found is not None:
        yield ("resumed", int(found.name.removeprefix(checkpoint.STEP_PREFIX)))
    thread = threading.Thread(target=train, name="trial", daemon=True)
    thread.start()
    while (item := items.get()) is not None:
        yield item
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    yield ("result", outcome["result"])


def mirror_folder(root: str | None = None) -> str:
    """A new local mirror for this process's trial, under ``root`` (the temporary folder), after
    removing the mirrors that killed trials left there (see `sweep_mirrors`)."""
    root = root or tempfile.gettempdir()
    sweep_mirrors(root)
    return tempfile.mkdtemp(prefix=f"{MIRROR_PREFIX}{os.getpid()}-", dir=root)


def sweep_mirrors(root: str) -> list[Path]:
    """Remove the mirrors under ``root`` that belong to this user, whose process is gone and which
    have not changed for `MIRROR_STALE_S`: what a trial killed by SIGKILL or preemption leaves
    (each a full local copy of its checkpoints). Returns the folders removed."""
    removed = []
    for folder in Path(root).glob(f"{MIRROR_PREFIX}*-*"):
        pid = folder.name.removeprefix(MIRROR_PREFIX).split("-", 1)[0]
        try:
            info = folder.lstat()
        except OSError:
            continue
        if (not pid.isdigit() or not folder.is_dir() or folder.is_symlink() or info.st_uid != os.getuid()
                or _alive(int(pid)) or time.time() - info.st_mtime < MIRROR_STALE_S):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def renice(nice: int) -> None:
    """Every thread of this process at niceness ``nice`` (Linux keeps one per thread, and threads
    started later inherit their starter's). Raising a priority above the worker's needs privileges:
    refused, it fails the trial with that said."""
    tasks = [int(tid) for tid in os.listdir("/proc/self/task")] if os.path.isdir("/proc/self/task") else [0]
    for tid in tasks:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:  # a thread that ended meanwhile
            continue
        except PermissionError:
            raise PermissionError(f"execution.nice {nice}: this user may not run a trial at a higher priority than "
                                  f"its Ray worker's (nice {os.getpriority(os.PRIO_PROCESS, 0)}); "
                                  "raise execution.nice or leave it out") from None
