"""The one run that writes a store, marked by an OS lock beside it.

A driver holds an exclusive ``flock`` on ``<store>.lock`` for as long as it
runs. The kernel drops the lock when the process ends, however it ends
(SIGKILL, a lost node's reboot), so a reader can tell a live run from trials
a dead driver left ``running``, and a second run on the same store refuses
in one line instead of interleaving its writes with the first's.
Torch-free.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from datetime import datetime, timezone
from pathlib import Path

from archsearch.errors import StoreError


def lock_path(store: str | Path) -> Path:
    return Path(f"{store}.lock")


class RunLock:
    """Held while one run writes ``store``; a context manager.

    Raises StoreError (naming the run that holds it) when another run has it.
    """

    def __init__(self, store: str | Path, *, study: str, wait_s: float = 2.0):
        self.store = str(store)
        self.study = study
        # Readers take the lock shared for a moment to test liveness; a short
        # wait keeps such a probe from turning a fresh run away.
        self.wait_s = wait_s
        self.fd: int | None = None

    def __enter__(self) -> RunLock:
        path = lock_path(self.store)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    holder = _read_holder(fd)
                    os.close(fd)
                    raise StoreError(f"{self.store} is being written by another run ({holder}); wait for it to "
                                     "finish, or pass another --store") from None
                time.sleep(0.05)
        holder = dict(study=self.study, pid=os.getpid(), host=socket.gethostname(),
                      since=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"))
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def run_alive(store: str | Path) -> bool:
    """Whether a run holds ``store``'s lock now (False when none ever did)."""
    path = lock_path(store)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a shared lock taken above
    return False


def _read_holder(fd: int) -> str:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        holder = {}
    if not holder:
        return "a run that has just started"
    return f"study '{holder.get('study')}', pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('since')}"
