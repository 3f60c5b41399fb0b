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


def test_the_sweep_reads_each_folder_once_and_removes_nothing_live(tmp_path, monkeypatch):
    """90 leftover folders (as many as one machine's /tmp held): the sweep costs one marker read
    and at most one process lookup per folder (a millisecond or so, against the seconds Ray
    takes to start; counted here, not timed, so a loaded machine cannot fail it)."""
    from archsearch.execute import cluster

    me = dict(host=socket.gethostname(), pid=os.getpid(), started=_started(os.getpid()))
    for i in range(60):
        folder(tmp_path, f"unmarked{i}")
    for i in range(30):
        folder(tmp_path, f"live{i}", me)
    lookups, reads = [], []
    monkeypatch.setattr(cluster, "_started", lambda pid: lookups.append(pid) or _started(pid))
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: reads.append(path) or real_open(path, *a, **k))
    assert remove_dead_folders(str(tmp_path)) == []
    assert len(lookups) == 1 + 30  # this process once, then each live folder's driver
    names = [*(f"unmarked{i}" for i in range(60)), *(f"live{i}" for i in range(30))]
    markers = sorted(str(path) for path in reads if str(path).startswith(str(tmp_path)))
    assert markers == sorted(str(tmp_path / f"{PREFIX}{name}" / OWNER) for name in names)
    assert len(list(tmp_path.iterdir())) == 90
