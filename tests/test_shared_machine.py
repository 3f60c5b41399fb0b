"""A run on a machine it shares: its trials at the driver's priority (or `execution.nice`),
its embedded Ray on ports the system picked free (so it runs beside a `ray start --head` on
Ray's default ports and beside another run), and a cluster address that is wrong said in one
line, in bounded time. Every Ray started here is stopped by its process ids."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

import archsearch as A
from tests.test_execute import ROOT, cmdline, descendants, stop_cluster, write_study

CLI = [sys.executable, "-m", "archsearch.cli"]
RAY = [sys.executable, "-m", "ray.scripts.scripts"]
# the ports a Ray node takes unless told otherwise: GCS, dashboard, Ray Client, dashboard agent
RAY_DEFAULT_PORTS = {6379, 8265, 10001, 52365}
RAY_WORKER_RANGE = range(10002, 20000)  # Ray's default range of workers' ports


def marked(mark: str) -> list[int]:
    """Ids of the processes whose environment holds ``mark`` (every process a run starts inherits it)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and mark.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def niceness(pid: int) -> int:
    """The niceness of process ``pid``'s main thread (field 19 of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[16])


def listening_ports(pids: list[int]) -> set[int]:
    """The TCP ports the processes ``pids`` listen on, from /proc/net/tcp{,6} and their sockets."""
    by_inode = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                by_inode[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    ports = set()
    for pid in pids:
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        ports |= {by_inode[link[8:-1]] for link in links if link.startswith("socket:[") and link[8:-1] in by_inode}
    return ports


def start_run(study: Path, store: Path, mark: str, *, prefix: tuple[str, ...] = ()) -> subprocess.Popen:
    env = {**os.environ, "ARCHSEARCH_TEST_RUN": mark}
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen([*prefix, *CLI, "run", str(study), "--store", str(store), "--report",
                             str(store.with_suffix(".html"))], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def session(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])
    except (OSError, IndexError, ValueError):
        return None


def kill_sessions(sessions: set[int]) -> None:
    """SIGKILL every process of these session ids (Ray's agents carry neither the run's
    environment nor a command line that names its folder, but keep its session)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and session(int(entry.name)) in sessions:
            try:
                os.kill(int(entry.name), 9)
            except ProcessLookupError:
                pass


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize(("increment", "setting"), [(4, None), (4, 9)], ids=["the-drivers", "execution.nice"])
def test_a_trial_runs_at_the_drivers_priority_unless_execution_nice_says(increment, setting, tmp_path, corpus):
    """Ray renices its workers to 15 unless told: on a loaded machine that left a trial a few
    percent of a core. A run started 4 nicer than the tests trains its trials at its own
    niceness, or at `execution.nice`; read from the trial's process while it trains. (Relative
    to the tests' own niceness, so the suite passes when it is itself run under nice.)"""
    from archsearch.store import checkpoint_dir

    driver_nice = min(19, os.getpriority(os.PRIO_PROCESS, 0) + increment)
    if setting is not None and setting < driver_nice:
        pytest.skip(f"the tests run at nice {driver_nice - increment}: execution.nice {setting} would need privileges")
    expected = driver_nice if setting is None else setting

    execution = f"nice: {setting}\n" if setting is not None else ""
    study = write_study(tmp_path, corpus, shapes="[uniform]", steps=3000, eval_every=50, execution=execution)
    (trial,) = A.plan(A.load_study(study))
    mark, store = uuid.uuid4().hex, tmp_path / "s.duckdb"
    run = start_run(study, store, mark, prefix=("nice", "-n", str(increment)))
    try:
        deadline = time.monotonic() + 180
        while not any(checkpoint_dir(store, trial.trial_id).glob("step-*")):  # it trains
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "no trial started"
            time.sleep(0.1)
        trials = [pid for pid in marked(mark) if cmdline(pid).startswith("ray::_trial_task")]
        assert trials
        assert niceness(run.pid) == driver_nice
        assert {niceness(pid) for pid in trials} == {expected}
    finally:
        kill_sessions({run.pid})


def head_processes(folder: str) -> list[int]:
    """The processes of the Ray `ray start --temp-dir` started under ``folder``: those naming it,
    and their children (Ray retitles its agents, whose command lines then name nothing)."""
    daemons = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and folder in cmdline(int(p.name))]
    return [*daemons, *(child for pid in daemons for child in descendants(pid))]


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True  # gone


def ports_taken(ports: set[int]) -> set[int]:
    taken = set()
    for port in ports:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                taken.add(port)
    return taken


@pytest.mark.ray
@pytest.mark.slow
def test_two_runs_at_once_beside_a_ray_head_on_its_default_ports(tmp_path, corpus):
    """A `ray start --head` with Ray's default ports (6379, 8265, 52365, ...), then two runs on
    two stores at once: both finish every trial, none of their processes listens on a port of
    Ray's defaults or of its default worker range, and the head still runs afterwards."""
    if taken := ports_taken(RAY_DEFAULT_PORTS):
        pytest.skip(f"Ray's default ports {sorted(taken)} are taken on this machine")
    folder = tempfile.mkdtemp(prefix="ashd-", dir="/tmp")  # short: Ray's socket paths are capped
    env = {**os.environ, "RAY_TMPDIR": folder}
    env.pop("RAY_ADDRESS", None)
    marks = [uuid.uuid4().hex, uuid.uuid4().hex]
    runs = []
    try:
        head = subprocess.run([*RAY, "start", "--head", "--temp-dir", f"{folder}/ray", "--num-cpus", "1",
                               "--include-dashboard=true", "--disable-usage-stats"], env=env,
                              capture_output=True, text=True, timeout=180, start_new_session=True)
        assert head.returncode == 0, head.stderr[-2000:]
        deadline, head_ports = time.monotonic() + 60, set()
        while not {6379, 52365} <= head_ports:  # its dashboard agent binds a little after `ray start` returns
            assert time.monotonic() < deadline, head_ports
            head_ports = listening_ports(head_processes(folder))
            time.sleep(0.2)
        for index, mark in enumerate(marks):
            (tmp_path / f"s{index}").mkdir()
            study = write_study(tmp_path / f"s{index}", corpus, steps=40, eval_every=20)
            runs.append(start_run(study, tmp_path / f"s{index}" / "s.duckdb", mark))
        seen: set[int] = set()
        while any(run.poll() is None for run in runs):
            seen |= listening_ports([pid for mark in marks for pid in marked(mark)])
            time.sleep(0.2)
        outputs = [run.communicate() for run in runs]
        assert [run.returncode for run in runs] == [0, 0], [err[-2000:] for _, err in outputs]
        for index in range(2):
            with A.open_store(tmp_path / f"s{index}" / "s.duckdb", read_only=True) as db:
                assert {r["status"] for r in db.trials().to_pylist()} == {"completed"}
        assert seen, "no port of the runs' Ray was seen"
        assert not seen & RAY_DEFAULT_PORTS and not seen & set(RAY_WORKER_RANGE) and not seen & head_ports
        assert {6379, 52365} <= listening_ports(head_processes(folder))  # the head was not disturbed
    finally:
        kill_sessions({run.pid for run in runs} | {session(pid) for pid in head_processes(folder)} - {None})
        stop_cluster(folder)
    # SIGKILLed, they are gone once reaped; one whose parent is gone can stay a zombie a while
    deadline = time.monotonic() + 30
    while [pid for pid in head_processes(folder) if not zombie(pid)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in head_processes(folder) if not zombie(pid)]


@pytest.fixture
def web_server(tmp_path):
    """`python -m http.server` on a free port: something that answers, but is not Ray."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not ports_taken({port}):
        assert time.monotonic() < deadline and server.poll() is None
        time.sleep(0.05)
    yield port
    server.kill()
    server.wait()


def test_run_against_a_port_that_is_not_ray_is_one_line_in_bounded_time(web_server, tiny_study, tmp_path):
    """`ray.init` waited forever on an HTTP server; now one line within 30 s, exit 2."""
    began = time.monotonic()
    done = subprocess.run([*CLI, "run", str(tiny_study), "--store", str(tmp_path / "s.duckdb"), "--address",
                           f"127.0.0.1:{web_server}"], capture_output=True, text=True, timeout=60)
    assert time.monotonic() - began < 30
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"error: 127.0.0.1:{web_server} is not a Ray cluster: it answered ")
    assert "a web server" in done.stderr and done.stderr.count("\n") == 1, done.stderr


@pytest.mark.parametrize("command", [["submit", "STUDY"], ["status", "--job", "j1"]], ids=["submit", "status"])
def test_a_url_that_is_not_a_ray_job_server_is_one_line_and_exit_2(command, web_server, tiny_study):
    args = [str(tiny_study) if part == "STUDY" else part for part in command]
    done = subprocess.run([*CLI, *args, "--address", f"http://127.0.0.1:{web_server}"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"error: http://127.0.0.1:{web_server} is not a Ray job server (asked for its "
                                  "Ray version: Version check returned 404)"), done.stderr
    assert done.stderr.count("\n") == 1 and "Ray 1.9" not in done.stderr


def test_an_embedded_ray_that_does_not_start_is_one_line_and_leaves_no_folder(monkeypatch):
    """On an overloaded machine Ray's servers can miss their start-up deadlines: one line that
    says so with the load, the log and what to do, instead of Ray's traceback; no folder left."""
    import ray

    from archsearch.errors import ArchsearchError
    from archsearch.execute import cluster

    made = []
    real_mkdtemp = cluster.tempfile.mkdtemp
    monkeypatch.setattr(cluster.tempfile, "mkdtemp", lambda **kw: made.append(real_mkdtemp(**kw)) or made[-1])
    monkeypatch.setattr(ray, "init", lambda *a, **k: (_ for _ in ()).throw(
        RuntimeError("Failed to start the GCS: it did not answer within 30 s\nstack")))
    with pytest.raises(ArchsearchError) as caught:
        cluster.start_ray(None, log="runs/s.duckdb.ray.log")
    assert str(caught.value).startswith("the embedded Ray did not start (load average ")
    assert "Failed to start the GCS: it did not answer within 30 s; try again when" in str(caught.value)
    assert str(caught.value).endswith("Ray's own messages are in runs/s.duckdb.ray.log")
    assert made and not Path(made[0]).exists()


def test_a_killed_trials_local_mirror_is_removed_by_the_next_trial_and_nothing_else_is(tmp_path):
    from archsearch.execute.task import MIRROR_PREFIX, MIRROR_STALE_S, mirror_folder

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead = int(gone.stdout)  # a process that has exited
    old = time.time() - 2 * MIRROR_STALE_S

    def folder(name: str, *, mtime: float) -> Path:
        path = tmp_path / name
        path.mkdir()
        (path / "step_00000010").mkdir()
        os.utime(path, (mtime, mtime))
        return path

    killed = folder(f"{MIRROR_PREFIX}{dead}-abc", mtime=old)
    fresh = folder(f"{MIRROR_PREFIX}{dead}-def", mtime=time.time())  # its pid may be another namespace's
    live = folder(f"{MIRROR_PREFIX}{os.getpid()}-ghi", mtime=old)
    unrelated = folder("archsearch-trial-notapid-x", mtime=old)
    elsewhere = folder("kept-target", mtime=old)
    link = tmp_path / f"{MIRROR_PREFIX}{dead}-lnk"
    link.symlink_to(elsewhere)

    made = Path(mirror_folder(str(tmp_path)))

    assert not killed.exists()
    assert fresh.is_dir() and live.is_dir() and unrelated.is_dir() and elsewhere.is_dir() and link.is_symlink()
    assert made.is_dir() and made.parent == tmp_path and made.name.startswith(f"{MIRROR_PREFIX}{os.getpid()}-")
