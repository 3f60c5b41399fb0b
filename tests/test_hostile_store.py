"""Hostile stores: a store reached through another name (a symlink, a hard link, ``..``), a
``--store`` that is not a file (a named pipe, a device, a socket, or a store whose write-ahead
log is one), a damaged store (truncated, overwritten) and a store on a full disk.

Each ends in one line that names the store and the fix, exit 2, no traceback, inside the
time and memory limits of the hostile study corpus (``in_limits``), and changes nothing
stored. A second run through another name of a store that a run writes is refused, and a
reader through any name sees that run's trials as running.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

import archsearch as A
from archsearch.errors import StoreError, StoreFullError
from archsearch.store import RunLock, run_alive
from archsearch.store.runlock import lock_paths
from tests.analysis_support import write_store
from tests.test_hostile_files import assert_one_clean_line, run_limited
from tests.test_store import trial_row

# the commands that read a store, as in tests/test_user_errors.py (STORE: the hostile one)
READERS = {
    "status": ["status", "--store", "STORE"],
    "status-json": ["status", "--store", "STORE", "--json"],
    "fit": ["fit", "--store", "STORE"],
    "pareto": ["pareto", "--store", "STORE"],
    "compare": ["compare", "--baseline", "transformer", "--store", "STORE"],
    "report": ["report", "-o", "OUT/r.html", "--store", "STORE"],
    "export": ["export", "--parquet", "OUT/parquet", "--store", "STORE"],
    "analyze-rho": ["analyze", "rho", "t0", "--store", "STORE"],
}


def cli(args: list[str], store: Path, out: Path) -> tuple[int, str]:
    return run_limited(*[str(store) if a == "STORE" else a.replace("OUT", str(out)) for a in args])


def names(kind: str, real: Path) -> Path:
    """Another name of the store ``real``: a symlink, a hard link, or a path through ``..``."""
    other = real.parent / "elsewhere"
    other.mkdir(exist_ok=True)
    if kind == "symlink":
        (other / "link.duckdb").symlink_to(real)
        return other / "link.duckdb"
    if kind == "hardlink":
        os.link(real, other / "hard.duckdb")
        return other / "hard.duckdb"
    return other / ".." / real.name  # dot-dot


def snapshot(path: Path) -> dict:
    with A.open_store(path, read_only=True) as db:
        return {table: db.sql(f"SELECT * FROM {table} ORDER BY ALL").to_pylist()
                for table in ("studies", "trials", "metrics", "study_trials")}


# 1. the store's identity


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "dot-dot"])
def test_a_second_run_through_another_name_of_the_store_refuses(kind, tmp_path):
    real = tmp_path / "s.duckdb"
    with A.open_store(real) as db:
        db.add_study(name="s", path="s.yaml", config={})
    other = names(kind, real)
    for first, second in ((real, other), (other, real)):
        with RunLock(first, study="first"):
            with pytest.raises(StoreError, match=r"being written by another run \(study 'first', pid \d+"):
                with RunLock(second, study="second", wait_s=0.1):
                    pass
        with RunLock(second, study="second"):  # free again once the first is done
            pass


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "dot-dot"])
def test_readers_through_another_name_see_live_trials_as_running(kind, tmp_path):
    real = tmp_path / "s.duckdb"
    with A.open_store(real) as db:
        db.add_study(name="s", path="s.yaml", config={})
        db.add_trials("s", [trial_row("a")])
    other = names(kind, real)
    with RunLock(real, study="s"):
        A.open_store(real).mark_running("a")
        assert run_alive(other)
        with A.open_store(other, read_only=True) as reader:
            assert reader.trials("s").column("status").to_pylist() == ["running"]
            assert reader.studies().to_pylist()[0]["running"] == 1
    with A.open_store(other, read_only=True) as reader:  # the run is gone: what it left is interrupted
        assert reader.trials("s").column("status").to_pylist() == ["interrupted"]


def test_a_run_leaves_no_lock_file_in_the_machines_temporary_folder(tmp_path):
    """The inode-keyed lock lives while the run does; the run removes it as it ends."""
    store = tmp_path / "s.duckdb"
    with A.open_store(store) as db:
        db.add_study(name="s", path="s.yaml", config={})
    shared = lock_paths(store)[1]
    with RunLock(store, study="s"):
        assert shared.is_file() and run_alive(store)
    assert not shared.exists() and not run_alive(store)


def test_a_run_removes_the_lock_files_killed_runs_left_and_keeps_those_held(tmp_path, monkeypatch):
    """A run killed by SIGKILL cannot remove its inode-keyed lock; the next run on any store
    removes it as it starts, and leaves alone the one a live run holds."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    stores = [tmp_path / f"{name}.duckdb" for name in ("killed", "live", "next")]
    for store in stores:
        with A.open_store(store) as db:
            db.add_study(name="s", path="s.yaml", config={})
    killed, live, following = stores
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, signal
        from archsearch.store import RunLock
        RunLock({str(killed)!r}, study="killed").__enter__()
        print("held", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """)], stdout=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp_path / "tmp")})
    assert holder.stdout.readline() == "held\n"
    holder.wait(30)
    left = lock_paths(killed)[1]
    assert left.is_file() and not run_alive(killed)
    with RunLock(live, study="live"):
        assert not left.exists()  # removed by the run on another store
        with RunLock(following, study="next"):
            assert lock_paths(live)[1].is_file() and run_alive(live)
    assert list((tmp_path / "tmp" / "archsearch-locks").iterdir()) == []


def test_a_run_that_waited_on_a_removed_lock_file_takes_the_one_its_name_leads_to(tmp_path):
    """A run through a hard link waits on the inode-keyed lock the first run holds; the first
    run ends and removes that file. The waiting run must hold the lock the name leads to now,
    so a third run through the store's own name is refused rather than let in beside it."""
    real = tmp_path / "s.duckdb"
    with A.open_store(real) as db:
        db.add_study(name="s", path="s.yaml", config={})
    hard = names("hardlink", real)
    first = RunLock(real, study="first").__enter__()
    holding, done = threading.Event(), threading.Event()

    def second():
        with RunLock(hard, study="second", wait_s=10):
            holding.set()
            done.wait(10)

    waiter = threading.Thread(target=second)
    waiter.start()
    time.sleep(0.3)  # the second run has its own name's lock and polls the shared one
    assert not holding.is_set()
    first.__exit__(None, None, None)
    assert holding.wait(10)
    try:
        with pytest.raises(StoreError, match=r"being written by another run \(study 'second'"):
            with RunLock(real, study="third", wait_s=0.1):
                pass
    finally:
        done.set()
        waiter.join()
    assert not lock_paths(real)[1].exists()


def test_run_through_a_symlink_to_a_busy_store_is_one_line_and_changes_nothing(tiny_study, tmp_path):
    real = write_store(tmp_path / "s.duckdb")
    link = names("symlink", real)
    before = snapshot(real)
    with RunLock(real, study="other"):
        code, stderr = cli(["run", str(tiny_study), "--store", "STORE", "--no-progress"], link, tmp_path)
    line = assert_one_clean_line(code, stderr, expect="is being written by another run (study 'other'",
                                 name=str(link), line_number=False)
    assert "--store" in line
    assert snapshot(real) == before


def test_a_store_opened_through_a_symlink_keeps_its_log_beside_the_file(tmp_path):
    """DuckDB names its write-ahead log after the path it opens: through a symlink's name a
    second log would sit beside the link, and a reader through the real name would miss it."""
    real = tmp_path / "s.duckdb"
    link = names("symlink", real)
    with A.open_store(link) as db:
        assert db.file == str(real.resolve())
        db.add_study(name="s", path="s.yaml", config={})
    assert not (link.parent / "link.duckdb.wal").exists()


# 2. what the store is


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _device(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _socket(path: Path) -> None:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()  # the socket file stays


def _log_fifo(path: Path) -> None:
    write_store(path)
    os.mkfifo(f"{path}.wal")


NOT_A_FILE = {"fifo": (_fifo, "is a named pipe"), "device": (_device, "is a device"),
              "socket": (_socket, "is a socket"), "log-fifo": (_log_fifo, "is a named pipe")}


# analyze imports torch before it opens the store: seconds on a busy machine, near the 8 s limit,
# so it is left out here; it opens the store through the same open_store
@pytest.mark.parametrize("command", [*[c for c in READERS if not c.startswith("analyze")], "run", "resume"])
@pytest.mark.parametrize("kind", list(NOT_A_FILE))
def test_a_store_that_is_not_a_file_is_refused_without_blocking(kind, command, tiny_study, tmp_path):
    make, expect = NOT_A_FILE[kind]
    store = tmp_path / "odd.duckdb"
    make(store)
    args = READERS.get(command) or [command, str(tiny_study), "--store", "STORE", "--no-progress"]
    code, stderr = cli(args, store, tmp_path)
    line = assert_one_clean_line(code, stderr, expect=expect, name=str(store), line_number=False)
    assert "--store" in line


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_lock_that_is_not_a_file_is_refused(kind, tmp_path):
    store = tmp_path / "s.duckdb"
    NOT_A_FILE[kind][0](Path(f"{store}.lock"))
    with pytest.raises(StoreError, match=r"cannot lock store .*s\.duckdb: its lock .*s\.duckdb\.lock"):
        with RunLock(store, study="s", wait_s=0.1):
            pass
    assert not run_alive(store)


# 3. a damaged store


def _truncated(path: Path, keep: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:keep])


def _overwritten(path: Path, at: int) -> None:
    with path.open("r+b") as file:
        file.seek(at)
        file.write(bytes(range(256)) * 16)


DAMAGES = {"truncated-in-header": lambda p: _truncated(p, 5000),
           "truncated-past-header": lambda p: _truncated(p, 300_000),
           "truncated-halfway": lambda p: _truncated(p, p.stat().st_size // 2),
           "header-overwritten": lambda p: _overwritten(p, 0),
           "block-overwritten": lambda p: _overwritten(p, 12288),
           "data-overwritten": lambda p: _overwritten(p, 798720)}


@pytest.fixture(scope="module")
def good_store(tmp_path_factory) -> Path:
    return write_store(tmp_path_factory.mktemp("good") / "good.duckdb")


# analyze imports torch (seconds on a busy machine, near the 8 s limit): left out as above
@pytest.mark.parametrize("command", [c for c in READERS if not c.startswith("analyze")])
@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_store_is_one_line_naming_it(damage, command, good_store, tmp_path):
    store = tmp_path / "damaged.duckdb"
    shutil.copy(good_store, store)
    DAMAGES[damage](store)
    before = store.read_bytes()
    code, stderr = cli(READERS[command], store, tmp_path)
    if damage == "data-overwritten" and "damaged" not in stderr:  # a block this command never reads
        assert "Traceback" not in stderr and code in (0, 2), stderr
        return
    line = assert_one_clean_line(code, stderr, expect="is damaged or not a DuckDB file", name=str(store),
                                 line_number=False)
    assert "restore it from a copy or from its Parquet export" in line
    assert store.read_bytes() == before


# 3. a full disk: a small tmpfs in a user namespace of its own (no root needed)

FULL_DISK_SCRIPT = textwrap.dedent("""\
    import os, sys
    sys.path.insert(0, {root!r})
    from pathlib import Path
    import archsearch as A
    from archsearch.errors import StoreFullError
    from tests.test_store import trial_row
    disk = Path(sys.argv[1])
    store = A.open_store(disk / "s.duckdb")
    store.add_study(name="s", path="s.yaml", config={{}})
    store.add_trials("s", [trial_row("a"), trial_row("b")])
    with open(disk / "filler", "wb") as filler:  # every byte left on the disk
        try:
            while True:
                filler.write(b"x" * 65536)
                filler.flush()
        except OSError:
            pass
    result = dict(train_loss=2.0, val_loss=2.0, val_accuracy=0.5, steps=10, tokens=100, wall_time_s=1.0,
                  tokens_per_s=100.0, curve=[dict(step=s, tokens=s, train_loss=2.0, val_loss=2.0,
                                                   val_accuracy=0.5, lr=1e-3) for s in range(200)])
    try:
        store.finish("a", result)
        print("no error")
    except StoreFullError as err:
        print("full:", err)
    os.remove(disk / "filler")
    with A.open_store(disk / "s.duckdb", read_only=True) as db:
        print("statuses:", sorted(db.trials("s").column("status").to_pylist()))
    """)


DISK = "/mnt"  # the tmpfs is mounted over it inside the namespace only


def in_small_tmpfs(args: list[str], size: str = "4m", timeout: float = 120) -> subprocess.CompletedProcess:
    """``args`` (a command, with DISK for the mounted folder) in a user and mount namespace of
    its own with a tmpfs of ``size`` mounted; skips the test where namespaces are not allowed."""
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("unshare --user --mount is not allowed here (no small tmpfs to fill)")
    command = " ".join(["mount -t tmpfs -o size=" + size, "tmpfs", DISK, "&&",
                        *[f"'{a}'" if a != "DISK" else DISK for a in args]])
    return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", command],
                          capture_output=True, text=True, timeout=timeout)


def test_a_write_to_a_full_disk_is_one_line_and_loses_nothing_written_before(tmp_path):
    script = tmp_path / "full.py"
    script.write_text(FULL_DISK_SCRIPT.format(root=str(Path(__file__).resolve().parents[1])))
    done = in_small_tmpfs([sys.executable, str(script), "DISK"])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("full: cannot write store ") and "No space left on device" in lines[0], lines
    assert "free space on it, then resume" in lines[0] and "\n" not in lines[0]
    assert lines[1] == "statuses: ['planned', 'planned']"  # the failed transaction left nothing half-written


def test_run_on_a_full_disk_stops_in_one_line_with_the_resume_command(tiny_study, tmp_path):
    """The disk fills before the run's first write: one line, exit 2, the command to continue."""
    fill = tmp_path / "fill.sh"
    fill.write_text(f"cd {tmp_path} && {sys.executable} -c 'import archsearch as A; A.open_store(\"'$1'/s.duckdb\")' && "
                    "(dd if=/dev/zero of=$1/filler bs=64k 2>/dev/null; true) && "
                    f"{sys.executable} -m archsearch.cli run {tiny_study} --store $1/s.duckdb --no-progress\n")
    done = in_small_tmpfs(["sh", str(fill), "DISK"])
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "No space left on device" in lines[0] and "free space on it, then resume" in lines[0], lines
    assert lines[0].endswith(f"then resume: archsearch resume {tiny_study} --store {DISK}/s.duckdb"), lines


FILLER = textwrap.dedent("""\
    import sys, time
    from pathlib import Path
    import archsearch as A
    store = Path(sys.argv[1])
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # until the run has finished a trial
        try:
            with A.open_store(store, read_only=True) as db:
                if db.sql("SELECT count(*) AS n FROM trials WHERE status = 'completed'").column("n")[0].as_py():
                    break
        except Exception:  # not made yet, or busy
            pass
        time.sleep(0.2)
    with open(store.parent / "filler", "wb") as out:  # then every byte left on the disk
        try:
            while True:
                out.write(b"x" * 65536)
                out.flush()
        except OSError:
            pass
    """)


@pytest.mark.ray
@pytest.mark.slow
def test_a_disk_that_fills_mid_run_stops_it_cleanly_and_resume_finishes(tiny_study, tmp_path):
    """The disk fills after the first trial: the run ends in one line with the resume command,
    nothing it wrote before is lost, and the resume (space freed) trains the rest."""
    (tmp_path / "filler.py").write_text(FILLER)
    # trials of a few seconds each, so the disk fills while the second one trains
    longer = "--set recipe.steps=400 --set recipe.eval_every=100"
    again = f"archsearch resume {tiny_study} --store {DISK}/s.duckdb {longer} --max-parallel 1"
    script = tmp_path / "go.sh"
    script.write_text(textwrap.dedent(f"""\
        cd {tmp_path}
        {sys.executable} -m archsearch.cli run {tiny_study} --store {DISK}/s.duckdb {longer} --max-parallel 1 \\
            --no-progress 2> run.err > run.out &
        run=$!
        {sys.executable} filler.py {DISK}/s.duckdb
        wait $run; echo "run $?"
        rm -f {DISK}/filler
        {sys.executable} -m archsearch.cli resume {tiny_study} --store {DISK}/s.duckdb {longer} --max-parallel 1 \\
            --no-progress > resume.out 2> resume.err; echo "resume $?"
        {sys.executable} -c "import archsearch as A; print(sorted(A.open_store('{DISK}/s.duckdb', read_only=True)
            .trials('tiny').column('status').to_pylist()))"
        """))
    done = in_small_tmpfs(["sh", str(script)], size="64m", timeout=600)
    lines = done.stdout.splitlines()
    assert lines[:2] == ["run 2", "resume 0"], (done.stdout, done.stderr, (tmp_path / "run.err").read_text())
    stopped = (tmp_path / "run.err").read_text().strip().splitlines()
    assert len(stopped) == 1 and "Traceback" not in stopped[0], stopped
    assert "No space left on device" in stopped[0] and stopped[0].endswith(f"then resume: {again}"), stopped
    assert lines[2] == str(["completed"] * len(A.plan(A.load_study(tiny_study))))
    assert " 0 failed" in (tmp_path / "resume.out").read_text()


def test_a_store_on_a_read_only_disk_is_read_and_not_written(tiny_study, good_store, tmp_path):
    """Reading commands open the store read-only and work; run says the disk cannot be written."""
    script = tmp_path / "ro.sh"
    script.write_text(textwrap.dedent(f"""\
        cd {tmp_path}
        cp {good_store} {DISK}/s.duckdb
        mount -o remount,ro {DISK}
        {sys.executable} -m archsearch.cli status --store {DISK}/s.duckdb > /dev/null; echo "status $?"
        {sys.executable} -m archsearch.cli run {tiny_study} --store {DISK}/s.duckdb --no-progress 2> run.err
        echo "run $?"
        """))
    done = in_small_tmpfs(["sh", str(script)], size="16m")
    assert done.stdout.split("\n")[:2] == ["status 0", "run 2"], (done.stdout, done.stderr)
    line = (tmp_path / "run.err").read_text()
    assert line.count("\n") == 1 and "Read-only file system" in line and "Traceback" not in line, line
    assert "pass --store a path this user can write" in line
