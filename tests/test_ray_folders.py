"""An embedded Ray's folder (/tmp/asray-*) outlives a driver killed outright
(SIGKILL: no cleanup runs). Each folder names its driver, and the next
embedded start removes the folders whose driver is provably gone, never one
whose driver runs, nor one without a readable marker. No Ray is started here:
``start_ray`` calls ``remove_dead_folders`` and then ``claim`` on its folder."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from archsearch.execute.cluster import OWNER, PREFIX, _started, claim, remove_dead_folders

ROOT = Path(__file__).resolve().parents[1]


def folder(parent: Path, name: str, owner: dict | None = None) -> Path:
    path = parent / f"{PREFIX}{name}"
    (path / "session_1").mkdir(parents=True)
    if owner is not None:
        (path / OWNER).write_text(json.dumps(owner))
    return path


def killed_driver(path: Path) -> int:
    """A process that claims ``path`` as a driver does, then is SIGKILLed; its pid."""
    child = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                              "from archsearch.execute.cluster import claim\n"
                              "claim(sys.argv[1]); print('claimed', flush=True); time.sleep(60)", str(path)],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "claimed"
    assert remove_dead_folders(str(path.parent)) == []  # its driver still runs
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    return child.pid


def test_only_folders_whose_driver_is_gone_are_removed(tmp_path):
    dead = folder(tmp_path, "dead")
    pid = killed_driver(dead)
    live = folder(tmp_path, "live")
    claim(str(live))  # this process: a run in progress
    unmarked = folder(tmp_path, "unmarked")  # another version's, or one whose marker is not written yet
    half = folder(tmp_path, "half")
    (half / OWNER).write_text('{"host": "')
    me = dict(host=socket.gethostname(), pid=os.getpid(), started=_started(os.getpid()))
    reused = folder(tmp_path, "reused", dict(me, started=me["started"] + "0"))  # our pid, another start: a reused id
    elsewhere = folder(tmp_path, "elsewhere", dict(me, host="another-host", pid=pid))  # a shared /tmp's other host
    unknown = folder(tmp_path, "unknown", dict(me, pid=pid, started=None))  # written where /proc could not tell
    other_name = tmp_path / "ray-dead"
    other_name.mkdir()
    (other_name / OWNER).write_text((dead / OWNER).read_text())

    removed = remove_dead_folders(str(tmp_path))

    assert sorted(removed) == sorted([str(dead), str(reused)])
    assert not dead.exists() and not reused.exists()
    for kept in (live, unmarked, half, elsewhere, unknown, other_name):
        assert kept.exists(), kept
    assert json.loads((live / OWNER).read_text()) == me


def test_the_sweep_adds_nothing_noticeable_to_a_start(tmp_path):
    """90 leftover folders (as many as this machine's /tmp held): about a
    millisecond, against the seconds Ray takes to start."""
    me = dict(host=socket.gethostname(), pid=os.getpid(), started=_started(os.getpid()))
    for i in range(60):
        folder(tmp_path, f"unmarked{i}")
    for i in range(30):
        folder(tmp_path, f"live{i}", me)
    start = time.perf_counter()
    assert remove_dead_folders(str(tmp_path)) == []
    assert time.perf_counter() - start < 0.2
