"""What a run's driver process keeps for itself while Ray lives in it: its terminal and its signals.

Ray's C++ core writes its own log lines (connection retries, a dying raylet) straight to file
descriptor 2, and installs a failure handler that answers SIGTERM with a native stack dump. A
run sends those lines to a log file (`native_output_to`), keeping Python's own stderr (progress,
errors) on the terminal, and puts back the handlers Python had (`signals_kept`), so SIGTERM and
SIGHUP end a run the way Ctrl-C does (`interrupt_on_termination`, `Interrupted`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# what ends a run as Ctrl-C does: `timeout`, systemd, Slurm and Kubernetes send SIGTERM; a closed
# terminal or ssh session, SIGHUP
TERMINATING = (signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal: the ``KeyboardInterrupt`` Ctrl-C raises, or its like for
    SIGTERM and SIGHUP, whose exit status it carries (128 + the signal's number)."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


def exit_code(interrupt: KeyboardInterrupt) -> int:
    """The exit status an interrupted command ends with: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP."""
    return getattr(interrupt, "exit_code", 128 + signal.SIGINT)


def _raise_interrupted(signum: int, frame) -> None:
    raise Interrupted(signum)


@contextmanager
def interrupt_on_termination() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise `Interrupted` in the main thread, as SIGINT raises
    KeyboardInterrupt; the handlers before are put back after. Off the main thread, where Python
    cannot set handlers, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {signum: signal.signal(signum, _raise_interrupted) for signum in TERMINATING}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


@contextmanager
def signals_kept() -> Iterator[None]:
    """Around code that starts Ray in this process: Python's handlers of SIGINT, SIGTERM and SIGHUP
    (or the default actions) are set again after it, over those Ray's core installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, *TERMINATING)}
    try:
        yield
    finally:
        for signum, handler in kept.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


@contextmanager
def native_output_to(path: Path) -> Iterator[Path]:
    """While inside, what is written to file descriptor 2 by native code (Ray's C++ log lines)
    goes to `path` (appended), while Python's ``sys.stderr`` goes where fd 2 went before. Where
    ``sys.stderr`` is not fd 2 (a test's captured stream, a notebook), it is left as it is."""
    try:
        python_on_fd2 = sys.stderr is not None and sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):
        python_on_fd2 = False
    if sys.stderr is not None:
        sys.stderr.flush()
    log = open(path, "ab")
    log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} process {os.getpid()}\n".encode())
    log.flush()
    saved = os.dup(2)
    stream = None
    try:
        if python_on_fd2:
            stream = open(os.dup(saved), "w", buffering=1, encoding=sys.stderr.encoding,
                          errors=sys.stderr.errors)
            previous, sys.stderr = sys.stderr, stream
        os.dup2(log.fileno(), 2)
        yield path
    finally:
        if stream is not None:
            stream.flush()
            sys.stderr = previous
            stream.close()
        os.dup2(saved, 2)
        os.close(saved)
        log.close()


__all__ = ["Interrupted", "exit_code", "interrupt_on_termination", "native_output_to", "signals_kept"]
