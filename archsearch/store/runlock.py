"""The one run that writes a store, marked by OS locks keyed by what the store is.

A driver holds an exclusive ``flock`` for as long as it runs. The kernel
drops it when the process ends, however it ends (SIGKILL, a lost node's
reboot), so a reader can tell a live run from trials a dead driver left
``running``, and a second run on the same store refuses in one line instead
of interleaving its writes with the first's.

A store can have several names: a symlink, a hard link, ``a/../b``. The lock
follows the file, not the name: one lock file beside the store's resolved
path (``<real path>.lock``, which also holds who runs) and, once the store
exists, one keyed by its device and inode in the machine's temporary folder
(``archsearch-locks/<dev>-<inode>.lock``), which a hard link in another
folder shares. A run takes both; a reader through any name tests both.
The run removes the shared one when it ends, and removes as it starts
those no run holds (left by runs that were killed), so the temporary folder
does not fill with one file per store ever run; a run that took a lock file
checks that its name still leads to it, and opens the new one if another run
removed it meanwhile. Torch-free.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import tempfile
import time
from contextlib import suppress
from datetime import datetime, timezone
from pathlib import Path

from archsearch.errors import StoreError, StoreFullError

LOCK_FOLDER = "archsearch-locks"


def lock_path(store: str | Path) -> Path:
    """The lock beside the store's resolved path (symlinks and ``..`` followed)."""
    return Path(f"{os.path.realpath(store)}.lock")


def lock_paths(store: str | Path) -> list[Path]:
    """Every lock file that stands for ``store``: beside its real path, and by inode once it exists."""
    paths = [lock_path(store)]
    try:
        info = os.stat(store)
    except OSError:
        return paths
    if stat.S_ISREG(info.st_mode):
        paths.append(Path(tempfile.gettempdir()) / LOCK_FOLDER / f"{info.st_dev}-{info.st_ino}.lock")
    return paths


def _open_lock(path: Path, store: str) -> int:
    """A descriptor on the lock file ``path`` (made if missing), which must be a regular file."""
    shared = path.parent.name == LOCK_FOLDER
    if shared and not path.parent.is_dir():
        path.parent.mkdir(exist_ok=True)
        with suppress(OSError):  # another user's run may have made it first
            os.chmod(path.parent, 0o1777)  # every user's runs share it, as /tmp itself
    try:
        # O_NONBLOCK and O_NOFOLLOW: a lock that is a pipe or a link to a device is refused, not waited on
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as err:
        reason = "is a symlink" if err.errno == errno.ELOOP else err.strerror
        raise StoreError(f"cannot lock store {store}: its lock {path} {reason}; remove {path} "
                         "(no run holds it), or pass another --store") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StoreError(f"cannot lock store {store}: its lock {path} is not a regular file; remove {path}, "
                         "or pass another --store")
    if shared:
        with suppress(OSError):  # so another user's run on the same store can take it too
            os.fchmod(fd, 0o666)
    return fd


class RunLock:
    """Held while one run writes ``store``; a context manager.

    Raises StoreError (naming the run that holds it) when another run has
    it, through whatever name that run opened the store by.
    """

    def __init__(self, store: str | Path, *, study: str, wait_s: float = 2.0):
        self.store = str(store)
        self.study = study
        # Readers take the lock shared for a moment to test liveness; a short
        # wait keeps such a probe from turning a fresh run away.
        self.wait_s = wait_s
        self.fds: list[int] = []
        self.shared: Path | None = None  # the inode-keyed lock, removed on release

    def __enter__(self) -> RunLock:
        deadline = time.monotonic() + self.wait_s
        try:
            for path in lock_paths(self.store):
                self.fds.append(self._take(path, deadline))
                if path.parent.name == LOCK_FOLDER:
                    self.shared = path
        except BaseException:
            self._release()
            raise
        if self.shared is not None:
            remove_unheld_locks(self.shared.parent, keep=self.shared)
        holder = dict(study=self.study, pid=os.getpid(), host=socket.gethostname(),
                      since=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"))
        try:
            for fd in self.fds:
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(holder).encode(), 0)
        except OSError as err:
            self._release()
            if err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreFullError(f"cannot write store {self.store}'s lock: {err.strerror}; the disk is full: "
                                     "free space on it, then resume", path=self.store) from None
            raise StoreError(f"cannot write store {self.store}'s lock: {err.strerror}; pass another --store") from None
        return self

    def _take(self, path: Path, deadline: float) -> int:
        fd = _open_lock(path, self.store)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() > deadline:
                    holder = _read_holder(fd)
                    os.close(fd)
                    raise StoreError(f"{self.store} is being written by another run ({holder}); wait for it to "
                                     "finish, or pass another --store") from None
                time.sleep(0.05)
                continue
            if _names(path, fd):
                return fd
            # the run that held it removed the file while this one waited: take the one the name leads to now
            os.close(fd)
            fd = _open_lock(path, self.store)

    def _release(self) -> None:
        if self.shared is not None:  # removed while still held, so no run can take it in between
            with suppress(OSError):
                os.unlink(self.shared)
            self.shared = None
        for fd in self.fds:
            with suppress(OSError):
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        self.fds = []

    def __exit__(self, *exc) -> None:
        self._release()


def run_alive(store: str | Path) -> bool:
    """Whether a run holds ``store``'s lock now, through any name of it (False when none ever did)."""
    for path in lock_paths(store):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops a shared lock taken above
    return False


def remove_unheld_locks(folder: Path, *, keep: Path) -> None:
    """Remove the lock files in the shared ``folder`` that no run holds, ``keep`` apart: those of
    runs that were killed (a SIGKILL, a node lost) before they could remove their own. Each is
    removed while held, so a run that opened it meanwhile finds its name gone once it has the lock
    and opens the file the name leads to then. Another user's files stay (the folder is sticky)."""
    with suppress(OSError):
        for entry in os.scandir(folder):
            if not entry.name.endswith(".lock") or entry.path == str(keep):
                continue
            try:
                fd = os.open(entry.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    continue
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # refused while a run holds it
                if _names(Path(entry.path), fd):
                    os.unlink(entry.path)
            except OSError:  # held (BlockingIOError), or another user's file
                continue
            finally:
                os.close(fd)  # closing drops the lock taken above


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file open on ``fd``."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _read_holder(fd: int) -> str:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        holder = {}
    if not holder:
        return "a run that has just started"
    return f"study '{holder.get('study')}', pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('since')}"
