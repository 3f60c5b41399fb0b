"""Reading files a user names, safely: regular files only, and never more than asked.

A path in a study can name anything: ``/dev/zero`` (endless), a named pipe
(blocks until someone writes), a folder, a symlink loop. ``kind_problem``
says what is wrong with such a path in words, and ``read_head`` opens a file
without blocking, checks on the open descriptor that it is a regular file (so
the check and the read see the same file) and reads at most a given number of
bytes, whatever size the file claims. Torch-free.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


class FileKindError(OSError):
    """A path that is not a readable regular file; the message says what it is instead."""


def _kind(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory"
    if stat.S_ISFIFO(mode):
        return "is a named pipe"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "is a device"
    if stat.S_ISSOCK(mode):
        return "is a socket"
    return "is not a regular file"


def kind_problem(path: str | Path, *, folder_ok: bool = False) -> str | None:
    """None for a regular file (or a folder, when ``folder_ok``), else what the path is, in words:
    "does not exist", "is a directory", "is a named pipe", "is a device", "is a symlink loop"."""
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        return _os_problem(err)
    if folder_ok and stat.S_ISDIR(mode):
        return None
    return _kind(mode)


def _os_problem(err: OSError) -> str:
    if err.errno == errno.ELOOP:
        return "is a symlink loop"
    if err.errno in (errno.ENOENT, errno.ENOTDIR):
        return "does not exist"
    if err.errno == errno.EACCES:
        return "cannot be read (permission denied)"
    if err.errno == errno.ENAMETOOLONG:
        return "is a path too long for this system"
    return f"cannot be read ({err.strerror})"


def read_head(path: str | Path, limit: int) -> bytes:
    """At most ``limit`` bytes from the start of the regular file ``path``.

    Raises ``FileKindError`` (message: what the path is) for anything else,
    without blocking on a pipe or reading a device.
    """
    try:
        # O_NONBLOCK: opening a named pipe with no writer returns at once instead of hanging
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise FileKindError(_os_problem(err)) from None
    problem = _kind(os.fstat(fd).st_mode)
    if problem is not None:
        os.close(fd)
        raise FileKindError(problem)
    with os.fdopen(fd, "rb") as file:
        try:
            return file.read(limit)
        except OSError as err:
            raise FileKindError(_os_problem(err)) from None


def write_problem(path: str | Path) -> str | None:
    """Why nothing could be written at ``path`` (a file, or a folder to make), in words, or None,
    found before any work is done: a file is made and removed in the folder that would hold it
    (the nearest one that exists), so a read-only or virtual folder (``/proc``), a missing
    permission, a full disk's refusal or a file where a folder should be is told at once. An
    existing device or pipe is left to ``output_problem``."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = None
    if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return None
    folder = path if mode is not None and stat.S_ISDIR(mode) else path.parent
    while not os.path.lexists(folder) and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is not a folder"
    probe = folder / f".archsearch-write-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as err:
        if err.errno == errno.EACCES:
            return f"{folder} is not writable (permission denied)"
        return f"{folder} cannot be written to ({err.strerror or err})"
    os.close(fd)
    os.unlink(probe)
    return None


def output_problem(path: str | Path) -> str | None:
    """What makes ``path`` unfit to write an output to, in words, or None: a named pipe no
    process reads ("is a named pipe no process reads": opening it would block until one does)
    or a socket. A regular file, a folder, a device (``/dev/null``, a terminal), a pipe with a
    reader or a path not there yet are fine."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # not there yet (or a dangling link): the writer makes it or says why not
    if stat.S_ISSOCK(mode):
        return "is a socket"
    if not stat.S_ISFIFO(mode):
        return None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        if err.errno == errno.ENXIO:
            return "is a named pipe no process reads"
        return _os_problem(err)
    os.close(fd)
    return None
