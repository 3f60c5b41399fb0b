"""The console script's prompt exit (``cli.entry``, ``cli_common.leave_now``)
keeps what an ordinary exit gives: the command's exit status, every line of
its output, the atexit handlers (temporary folders go), and the threads
Python would wait for. Each check runs the entry point in a subprocess, as
the ``archsearch`` script does; no torch, no Ray."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import archsearch as A

STUDY = Path(__file__).resolve().parents[1] / "studies" / "quickstart.yaml"

# The entry point with a temporary folder whose finalizer runs at exit, and an atexit handler that says it ran.
# The thread prints once the main thread has ended (not after a sleep the command might outlast).
PROGRAM = """
import atexit, sys, tempfile, threading, time
from archsearch.cli import entry
folder = tempfile.TemporaryDirectory(prefix="archsearch-exit-test-")
print(folder.name, file=sys.stderr, flush=True)
atexit.register(print, "handler ran", file=sys.stderr)
if sys.argv[1] == "thread":
    def after_main():
        while threading.main_thread().is_alive():
            time.sleep(0.01)
        print("thread finished", file=sys.stderr)
    threading.Thread(target=after_main).start()
sys.argv = ["archsearch", *sys.argv[2:]]
entry()
"""


def run_entry(*args: str, thread: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROGRAM, "thread" if thread else "plain", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, status", [(["--version"], 0), (["plan", "/no/such/study.yaml"], 2),
                                          (["no-such-command"], 2)], ids=["version", "user-error", "usage-error"])
def test_the_exit_status_and_cleanup_are_an_ordinary_exits(args, status):
    """Fails if the prompt exit skips the atexit handlers (the temporary
    folder would stay) or changes a status."""
    done = run_entry(*args)
    folder, *_ = done.stderr.splitlines()
    assert done.returncode == status, done.stderr
    assert "handler ran" in done.stderr and not Path(folder).exists()


def test_every_line_of_a_long_output_arrives():
    """``plan --json`` of the quickstart, read through a pipe, is whole JSON, every trial in it."""
    done = run_entry("plan", STUDY, "--json")
    assert done.returncode == 0, done.stderr
    assert [t["trial_id"] for t in json.loads(done.stdout)] == [t.trial_id for t in A.plan(A.load_study(STUDY))]


def test_a_thread_still_running_is_waited_for():
    """A non-daemon thread finishes before the process ends, as Python
    guarantees. Fails if ``leave_now`` calls ``os._exit`` without looking for threads."""
    done = run_entry("--version", thread=True)
    assert done.returncode == 0 and "thread finished" in done.stderr, done.stderr
