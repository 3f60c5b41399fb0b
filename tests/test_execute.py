"""The driver under load and under faults: readers while it writes, live
curves, dead workers, dead drivers, diverged trials, a private embedded Ray.

The Ray tests of this module share one embedded instance, started the way
``run_study`` starts its own; the driver-kill test runs ``archsearch`` in
subprocesses, each with its own.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from rich.console import Console

import archsearch as A
from archsearch.execute.driver import POINTS_EVERY_S
from archsearch.execute.progress import TrialProgress
from tests.conftest import TINY_SPACE, tiny_study_text

ROOT = Path(__file__).resolve().parents[1]


# progress (no Ray)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_off_a_terminal_progress_is_one_line_per_trial_and_a_heartbeat():
    out, clock = io.StringIO(), FakeClock()
    console = Console(file=out, force_terminal=False, width=80)
    with TrialProgress(total=2, console=console, heartbeat_s=0.5, clock=clock) as progress:
        progress.update(completed=0, running=2, failed=0)
        assert out.getvalue() == ""  # nothing due yet
        clock.now = 0.6
        progress.update(completed=0, running=2, failed=0)
        progress.finished(trial_id="abc123", label="transformer taper.shape=[/bold]", status="completed",
                          val_loss=2.34567, wall_s=1.25)
        clock.now = 0.8  # the trial line just printed counts as a sign of life
        progress.update(completed=1, running=1, failed=0)
        progress.finished(trial_id="def456", label="transformer", status="diverged", val_loss=float("nan"),
                          wall_s=0.5)
    lines = out.getvalue().splitlines()
    assert lines == ["0/2 trials done, 2 running, 0 failed, 1 s elapsed",
                     "trial abc123 transformer taper.shape=[/bold]: val_loss 2.3457 in 1.2s",
                     "trial def456 transformer: diverged (val_loss nan) in 0.5s"]
    assert "\x1b" not in out.getvalue()  # plain text for logs


def report(step: int, *, total: int = 100, tokens_per_step: int = 64, rate: float = 640.0, loss: float = 2.5,
           elapsed: float = 1.0) -> dict:
    return dict(step=step, total_steps=total, tokens=step * tokens_per_step, total_tokens=total * tokens_per_step,
                train_loss=loss, tokens_per_s=rate, elapsed_s=elapsed)


def test_the_heartbeat_says_where_each_running_trial_is_and_when_the_study_ends():
    out, clock = io.StringIO(), FakeClock()
    console = Console(file=out, force_terminal=False, width=80)
    with TrialProgress(total=4, console=console, heartbeat_s=10, clock=clock) as progress:
        progress.started("aaaa1111")
        progress.started("bbbb2222")
        progress.finished(trial_id="cccc3333", label="mamba", status="completed", val_loss=2.0, wall_s=20.0)
        # 90 steps of 64 tokens left at 640 tokens/s: 9 s; the other has not reported yet
        progress.reported("aaaa1111", report(10, loss=2.3456))
        clock.now = 11.0
        progress.update(completed=1, running=2, failed=0)
    lines = out.getvalue().splitlines()
    # remaining work: 9 s, 20 s (a typical trial's, not measured yet), one queued trial at 20 s; over 2 at once
    assert lines[1:] == ["1/4 trials done, 2 running, 0 failed, 11 s elapsed, ETA 24 s",
                         "  trial aaaa1111: step 10/100, loss 2.346, 640 tokens/s, ETA 9 s",
                         "  trial bbbb2222: starting"]


def test_the_eta_waits_for_a_measurement_and_never_undercuts_the_longest_trial():
    progress = TrialProgress(total=3, enabled=False)
    progress.started("a")
    assert progress.eta_s() is None  # nothing measured: no guess
    progress.reported("a", report(0, total=1000, rate=64.0, elapsed=0.0))
    assert progress.eta_s() == pytest.approx(3 * 1000.0 / 1)  # itself, then two queued trials like it, one at a time
    progress.started("b")
    progress.reported("b", report(990, total=1000, rate=64.0, elapsed=990.0))
    # two at once: (1000 + 10 + one queued at the mean of 1000 and 1000) / 2, at least the longest's 1000
    assert progress.eta_s() == pytest.approx(max((1000 + 10 + 1000) / 2, 1000))
    progress.stopped("b")
    assert "b" not in progress.live


def test_on_a_terminal_progress_draws_a_bar_and_disabled_prints_nothing():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with TrialProgress(total=3, console=console) as progress:
        progress.started("abcdef0123456789")
        progress.reported("abcdef0123456789", report(30, loss=1.875))
        progress.update(completed=2, running=1, failed=1)
    shown = out.getvalue()
    assert "3/3" in shown and "failed 1" in shown
    assert "abcdef01" in shown and "30/100" in shown and "loss 1.875" in shown  # the running trial's own bar
    quiet = io.StringIO()
    with TrialProgress(total=3, enabled=False, console=Console(file=quiet), heartbeat_s=0) as progress:
        progress.update(completed=1, running=0, failed=0)
        progress.finished(trial_id="a", label="x", status="completed", val_loss=1.0, wall_s=1.0)
    assert quiet.getvalue() == ""


def test_a_memory_size_reads_with_units_and_a_bad_one_names_the_field(tmp_path):
    from archsearch.space.running import Execution

    assert Execution(memory="2GiB").memory == 2 * 2**30
    assert Execution(memory="512MB").memory == 512_000_000
    (tmp_path / "space.yaml").write_text(TINY_SPACE)
    text = tiny_study_text(corpus=tmp_path).replace("max_parallel: 2", "max_parallel: 2\n  memory: lots")
    (tmp_path / "study.yaml").write_text(text)
    with pytest.raises(A.SpecError, match=r"study.yaml:\d+: execution.memory: .*4GiB"):
        A.load_study(tmp_path / "study.yaml")


def test_checkpoint_storage_resolves_a_folder_from_here_and_keeps_a_uri(tmp_path, monkeypatch):
    from archsearch.space.running import Execution

    monkeypatch.chdir(tmp_path)
    assert Execution().resolved_storage() is None
    assert Execution(storage="runs/ckpt").resolved_storage() == str(tmp_path.resolve() / "runs" / "ckpt")
    assert Execution(storage="s3://bucket/runs").resolved_storage() == "s3://bucket/runs"


@pytest.mark.parametrize(("per_trial", "max_parallel", "width"), [
    ({"CPU": 1, "GPU": 0, "memory": 0}, "auto", 8),
    ({"CPU": 2, "GPU": 0, "memory": 0}, "auto", 4),
    ({"CPU": 1, "GPU": 0.5, "memory": 0}, "auto", 4),  # fractions pack small trials onto the 2 GPUs
    ({"CPU": 1, "GPU": 0, "memory": 3 * 2**30}, "auto", 5),
    ({"CPU": 1, "GPU": 0, "memory": 0}, 3, 3),
], ids=["cpus", "two-cpus", "half-gpu", "memory", "fixed"])
def test_trials_at_once_are_what_the_cluster_fits(per_trial, max_parallel, width):
    from archsearch.execute.cluster import trials_at_once

    resources = {"CPU": 8.0, "GPU": 2.0, "memory": 16 * 2**30}
    assert trials_at_once(per_trial, resources, max_parallel=max_parallel) == width


def test_a_trial_the_cluster_cannot_fit_fails_before_it_waits_forever():
    from archsearch.execute.cluster import trials_at_once

    with pytest.raises(A.ArchsearchError, match=r"execution.gpus: each trial asks for 1 but the Ray cluster has 0"):
        trials_at_once({"CPU": 1, "GPU": 1, "memory": 0}, {"CPU": 2.0}, max_parallel="auto")


@pytest.mark.parametrize(("address", "auth", "warned"), [
    ("10.0.0.5:6379", None, True), ("ray://head.example:10001", None, True),
    ("10.0.0.5:6379", "token", False), ("127.0.0.1:6379", None, False), ("ray://localhost:10001", None, False),
], ids=["lan", "client", "token", "loopback", "client-loopback"])
def test_a_cluster_off_loopback_without_auth_gets_a_warning(address, auth, warned, monkeypatch, capsys):
    from archsearch.execute.cluster import _warn_if_open

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    if auth:
        monkeypatch.setenv("RAY_AUTH_MODE", auth)
    _warn_if_open(address)
    err = capsys.readouterr().err
    assert ("without authentication" in err) == warned
    assert err.count("\n") == int(warned)


# helpers for the Ray tests


def write_study(folder: Path, corpus: Path, *, shapes: str = "[uniform, cosine, reverse]", steps: int = 12,
                eval_every: int = 6, recipe: str = "", execution: str = "") -> Path:
    (folder / "space.yaml").write_text(TINY_SPACE.replace("[uniform, cosine, reverse]", shapes))
    text = tiny_study_text(corpus=corpus, steps=steps).replace("eval_every: 6", f"eval_every: {eval_every}")
    text = text.replace("recipe:\n", "recipe:\n" + textwrap.indent(recipe, "  ")) if recipe else text
    text = text.replace("max_parallel: 2\n", "max_parallel: 2\n" + textwrap.indent(execution, "  "))
    path = folder / "study.yaml"
    path.write_text(text)
    return path


def descendants(pid: int) -> list[int]:
    """Process ids under ``pid``, children first, read from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found, frontier = [], [pid]
    while frontier:
        children = parents.get(frontier.pop(), [])
        found += children
        frontier += children
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def stop_cluster(folder: str) -> None:
    """SIGKILL the Ray processes ``ray start --temp-dir`` started under
    ``folder`` (never `ray stop`, which stops every Ray on the machine), and remove it."""
    import shutil

    daemons = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and folder in cmdline(int(p.name))]
    for pid in {*daemons, *(child for pid in daemons for child in descendants(pid))}:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(folder, ignore_errors=True)


def snapshot(store: Path) -> tuple[dict, dict]:
    """Trials (result columns only: timing left out) and curves of a store."""
    with A.open_store(store, read_only=True) as db:
        trials = {r["trial_id"]: (r["status"], r["train_loss"], r["val_loss"], r["val_accuracy"], r["steps"],
                                  r["tokens"]) for r in db.trials().to_pylist()}
        curves: dict[str, list] = {}
        for r in db.metrics().to_pylist():
            curves.setdefault(r["trial_id"], []).append(
                (r["step"], r["tokens"], r["train_loss"], r["val_loss"], r["val_accuracy"], r["lr"]))
    return trials, curves


@pytest.fixture(scope="module")
def embedded_ray():
    """One private embedded Ray for the module, started as ``run_study`` starts its own."""
    import shutil

    import ray

    from archsearch.execute.cluster import start_ray

    folder = start_ray(None)
    yield folder
    ray.shutdown()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.ray
def test_embedded_ray_is_private_and_listens_on_loopback_only(embedded_ray):
    """`--address auto` from another shell looks under /tmp/ray; this
    instance lives in its own folder, and no socket of it (raylet, GCS,
    workers) listens beyond 127.0.0.1 (planted mutation: dropping the
    loopback setting in `start_ray` lists sockets on *)."""
    import ray

    assert ray._private.worker._global_node.get_session_dir_path().startswith(embedded_ray)
    ours = {os.getpid(), *descendants(os.getpid())}
    inodes = set()
    for pid in ours:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                listening.append(fields[1].split(":")[0])
    loopback = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}
    assert listening and set(listening) <= loopback, listening


@pytest.mark.ray
def test_a_diverged_trial_is_never_completed_best_or_on_the_front(embedded_ray, tmp_path, corpus):
    """The reproduction from the issue: lr 1.0, weight_decay 1e20, one step."""
    from typer.testing import CliRunner

    from archsearch.cli import app

    path = write_study(tmp_path, corpus, shapes="uniform", steps=1, eval_every=1,
                       recipe="lr: 1.0\nweight_decay: 1.0e20\n")
    path.write_text(path.read_text().replace("warmup_steps: 2", "warmup_steps: 0"))
    store = tmp_path / "s.duckdb"
    summary = A.run_study(A.load_study(path), store=store, show_progress=False)
    assert (summary.completed, summary.diverged, summary.failed) == (0, 1, 1)
    with A.open_store(store, read_only=True) as db:
        (row,) = db.trials().to_pylist()
    assert row["status"] == "diverged" and "nan" in row["error"] and row["val_loss"] is None

    def strict(text: str):
        return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in JSON output"))

    runner = CliRunner()
    # nothing completed: no front to draw, said in one line (an empty front read as a result before)
    front = runner.invoke(app, ["pareto", "--json", "--store", str(store)])
    assert front.exit_code == 2 and front.output.startswith("error: no row has a value for every objective")
    status = runner.invoke(app, ["status", "--json", "--store", str(store)])
    assert strict(status.output)["trials"][0]["status"] == "diverged"


@pytest.mark.ray
@pytest.mark.slow
def test_a_reader_in_another_process_sees_the_study_grow_without_lock_errors(embedded_ray, tmp_path, corpus,
                                                                           monkeypatch):
    """A second process reads the store throughout a run: never a lock
    error, and curves of trials still running grow point by point
    (planted mutation: writing eval points only in `finish` leaves no
    running trial with a curve). Each trial's worker waits, after its first
    and second evaluations, until the reader has seen that many points of it
    while it runs: how fast either side goes cannot decide the test."""
    from archsearch.execute import driver

    monkeypatch.setattr(driver, "POINTS_EVERY_S", 0.1)
    path = write_study(tmp_path, corpus, steps=160, eval_every=20)
    store = tmp_path / "s.duckdb"
    A.open_store(store).close()  # exists before the reader starts
    log, stop = tmp_path / "reads.jsonl", tmp_path / "stop"
    monkeypatch.setattr(driver, "_trial_task", waits_for_the_reader(str(log)))
    reader = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""\
        import json, os, sys, traceback
        import archsearch as A
        print("ready", flush=True)
        with open({str(log)!r}, "w") as out:
            while not os.path.exists({str(stop)!r}):
                try:
                    with A.open_store({str(store)!r}, read_only=True) as db:
                        status = {{r["trial_id"]: r["status"] for r in db.trials().to_pylist()}}
                        points = {{}}
                        for r in db.metrics().to_pylist():
                            points[r["trial_id"]] = points.get(r["trial_id"], 0) + 1
                    out.write(json.dumps({{"status": status, "points": points}}) + "\\n")
                except Exception as err:
                    out.write(json.dumps({{"error": traceback.format_exception_only(err)[-1]}}) + "\\n")
                out.flush()
        """)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert reader.stdout.readline().strip() == "ready"
        summary = A.run_study(A.load_study(path), store=store, show_progress=False)
    finally:
        stop.touch()
        reader.wait(timeout=60)
    assert summary.completed == 3
    reads = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["error"] for r in reads if "error" in r] == []
    live = [(trial, r["points"].get(trial, 0)) for r in reads for trial, s in r["status"].items() if s == "running"]
    growing = {trial for trial, n in live if n > 0}
    assert growing, "no running trial ever showed a curve"
    assert any(len({n for t, n in live if t == trial and n > 0}) > 1 for trial in growing)
    assert reads[-1]["points"]


def waits_for_the_reader(log: str):
    """The trial task, except that after its first and second evaluations it waits (up to five
    minutes) until the reader's ``log`` shows that many points of its trial while it runs."""

    def task(payload: dict):
        import json
        import time
        from pathlib import Path

        from archsearch.execute.task import _trial_task

        trial, evaluations = Path(payload["checkpoint_dir"]).name, 0
        for item in _trial_task(payload):
            yield item
            if item[0] != "eval" or evaluations >= 2:
                continue
            evaluations += 1
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                lines = Path(log).read_text().splitlines() if Path(log).exists() else []
                reads = [json.loads(line) for line in lines if line.endswith("}")]
                if any(r.get("status", {}).get(trial) == "running" and r["points"].get(trial, 0) >= evaluations
                       for r in reads):
                    break
                time.sleep(0.05)

    return task


@pytest.mark.ray
@pytest.mark.parametrize("storage", ["folder", "uri"])
def test_a_worker_killed_mid_trial_is_retried_from_its_checkpoint(embedded_ray, tmp_path, corpus, storage, capfd,
                                                                  monkeypatch):
    """The first attempt's worker SIGKILLs itself once its first checkpoint
    is in the study's storage (a shared folder, or a pyarrow URI the worker
    mirrors a local folder to): the trial is retried from that checkpoint,
    the store counts two attempts, its curve equals an uninterrupted run's,
    and the model loads from there (planted mutation: `pull` copying nothing
    restarts the retry at step 0). The kill is the worker's own, after a
    checkpoint it waited for: no race with a trial that could finish first."""
    from archsearch.execute import driver
    from archsearch.inspect import load_trained
    from archsearch.store import checkpoint_dir
    from archsearch.train import train_trial

    shared = tmp_path / "shared"  # execution.storage: what every node would reach
    location = shared if storage == "folder" else f"file://{shared}"
    path = write_study(tmp_path, corpus, shapes="uniform", steps=300, eval_every=50,
                       execution=f"storage: {location}\n")
    study = A.load_study(path)
    (trial,) = A.plan(study)
    store = tmp_path / "s.duckdb"
    folder = Path(str(checkpoint_dir(store, trial.trial_id, storage=location)).removeprefix("file://"))
    killed = tmp_path / "killed"  # written by the first attempt, just before it kills itself
    monkeypatch.setattr(driver, "_trial_task", dies_once_after_a_checkpoint(str(folder), str(killed)))
    summary = A.run_study(study, store=store, show_progress=True, heartbeat_s=1e9)
    assert killed.exists()
    # the second attempt started where the first one's checkpoint left it, not from step 0
    assert re.search(rf"trial {trial.trial_id}: attempt 2 resumes from step [1-9]\d*", capfd.readouterr().err)
    assert summary.completed == 1
    with A.open_store(store, read_only=True) as db:
        row = db.trials().to_pylist()[0]
        curve = db.metrics().to_pylist()
    assert row["status"] == "completed" and row["attempts"] == 2
    fresh = train_trial(spec=trial.spec, recipe=trial.recipe, data=trial.data, seed=trial.seed, threads=1)
    assert [r["step"] for r in curve] == [r["step"] for r in fresh.curve]
    assert [r["val_loss"] for r in curve] == pytest.approx([r["val_loss"] for r in fresh.curve], rel=1e-6)
    assert not (tmp_path / "s.duckdb.checkpoints").exists()
    assert load_trained(trial.trial_id, store=store)(fresh_tokens()).shape == (1, 8, 256)
    if storage == "uri":  # the killed attempt's local mirror is what a later trial's sweep removes
        from archsearch.execute import task

        left = list(Path(tempfile.gettempdir()).glob(f"{task.MIRROR_PREFIX}{killed.read_text()}-*"))
        assert len(left) == 1
        monkeypatch.setattr(task, "MIRROR_STALE_S", 0.0)
        assert left[0] in task.sweep_mirrors(tempfile.gettempdir()) and not left[0].exists()


def dies_once_after_a_checkpoint(folder: str, marker: str):
    """The trial task, except that its first attempt (no ``marker`` yet) SIGKILLs its own worker
    once a checkpoint is in ``folder``. A closure, so Ray ships it by value to the worker."""

    def task(payload: dict):
        import os
        import signal
        import time
        from pathlib import Path

        from archsearch.execute.task import _trial_task

        first = not Path(marker).exists()
        for item in _trial_task(payload):
            yield item
            if first and item[0] == "eval":
                deadline = time.monotonic() + 300
                while not list(Path(folder).glob("step-*/trainer.pt")) and time.monotonic() < deadline:
                    time.sleep(0.05)
                Path(marker).write_text(str(os.getpid()))  # the killed worker, whose mirror stays behind
                os.kill(os.getpid(), signal.SIGKILL)

    return task


@pytest.mark.ray
def test_a_worker_that_always_dies_is_tried_retries_plus_one_times(embedded_ray, tmp_path, corpus, monkeypatch):
    """``execution.retries: 2``: a trial whose worker dies on every attempt is started three
    times, each attempt counted in the store's ``attempts``, then ends failed, and the study
    ends. (Past six attempts the task stops dying and fails plainly, so a driver that retried
    without bound fails this test instead of hanging it.)"""
    from archsearch.execute import driver

    attempts = tmp_path / "attempts"
    attempts.mkdir()

    def always_dies(payload: dict):
        import os
        import uuid
        from pathlib import Path

        Path(attempts, uuid.uuid4().hex).touch()
        if len(list(Path(attempts).iterdir())) > 6:
            raise RuntimeError("retried past the bound")
        os._exit(1)
        yield  # a generator, as the trial task is

    monkeypatch.setattr(driver, "_trial_task", always_dies)
    path = write_study(tmp_path, corpus, shapes="uniform", execution="retries: 2\n")
    store = tmp_path / "s.duckdb"
    summary = A.run_study(A.load_study(path), store=store, show_progress=False)
    assert (summary.completed, summary.failed) == (0, 1)
    with A.open_store(store, read_only=True) as db:
        (row,) = db.trials().to_pylist()
    assert row["status"] == "failed" and row["attempts"] == 3 == len(list(attempts.iterdir()))
    assert row["error"].startswith("worker died 3 times")


def fresh_tokens():
    import torch

    return torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(0))


@pytest.mark.ray
def test_address_auto_never_joins_a_private_embedded_ray(embedded_ray, tiny_study, tmp_path):
    """This module's embedded Ray runs; `--address auto` with no cluster
    started by `ray start` fails in one line instead of joining it (Ray's
    own "auto" joins any Ray process it finds: the planted mutation of
    passing "auto" through to ray.init hangs here in another's instance)."""
    env = dict(os.environ, RAY_TMPDIR=str(tmp_path / "no-cluster-here"))
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "-m", "archsearch.cli", "run", str(tiny_study), "--store",
                           str(tmp_path / "s.duckdb"), "--address", "auto"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr  # the user's to fix: start a cluster, or drop --address
    assert done.stderr.startswith("error: --address auto: no cluster started with `ray start`"), done.stderr
    assert done.stderr.count("\n") == 1


@pytest.mark.ray
@pytest.mark.slow
def test_a_driver_killed_at_several_points_ends_as_an_uninterrupted_run(embedded_ray, tmp_path, corpus):
    """`archsearch run` is SIGKILLed (with its Ray) right after it registers
    the study, then mid-trial with points written, then after two trials
    finished; each `resume` picks up, and the store ends with the trials and
    curves of a run never interrupted. Off a terminal the output is one line
    per finished trial plus heartbeats."""
    # Trials long enough (2.7-3.0 s each on 2 cores) that their points reach the store while they
    # run: points are written at most POINTS_EVERY_S late, so a trial shorter than that can end
    # before any is written and leave no mid-trial moment to kill at.
    path = write_study(tmp_path, corpus, steps=600, eval_every=100)
    reference = tmp_path / "reference.duckdb"
    A.run_study(A.load_study(path), store=reference, show_progress=False)
    with A.open_store(reference, read_only=True) as db:
        trial_s = min(r["wall_time_s"] for r in db.trials().to_pylist())
    assert trial_s > 1.5 * POINTS_EVERY_S, f"trials of {trial_s:.2f} s are too short to kill mid-trial: raise steps"
    store = tmp_path / "killed.duckdb"
    env = dict(os.environ, ARCHSEARCH_HEARTBEAT_S="0.5")

    def start(command: str) -> tuple[subprocess.Popen, Path]:
        err = tmp_path / f"{command}-{time.monotonic_ns()}.log"
        process = subprocess.Popen([sys.executable, "-m", "archsearch.cli", command, str(path), "--store", str(store),
                                    "--report", str(tmp_path / "r.html")], cwd=ROOT, env=env,
                                   stdout=subprocess.DEVNULL, stderr=err.open("w"), start_new_session=True)
        return process, err

    def kill_when(process: subprocess.Popen, ready) -> None:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and process.poll() is None:
            if store.exists() and ready(*snapshot(store)):
                break
            time.sleep(0.05)
        assert process.poll() is None, "the run ended before the kill point"
        # The whole machine dies: the driver and every Ray process it started.
        for pid in [process.pid, *descendants(process.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.wait(timeout=30)

    def statuses(trials: dict) -> list[str]:
        return [t[0] for t in trials.values()]

    process, _ = start("run")
    kill_when(process, lambda trials, curves: len(trials) == 3)
    process, _ = start("resume")
    kill_when(process, lambda trials, curves: "running" in statuses(trials) and curves)
    trials, _ = snapshot(store)
    assert "interrupted" in statuses(trials)  # running trials of the dead driver
    process, _ = start("resume")
    kill_when(process, lambda trials, curves: statuses(trials).count("completed") >= 2)
    # Two workers: the third trial may finish beside the second, before the kill lands.
    left = sum(status != "completed" for status in statuses(snapshot(store)[0]))
    process, log = start("resume")
    assert process.wait(timeout=300) == 0
    assert snapshot(store) == snapshot(reference)

    def finished(lines: list[str]) -> list[str]:
        return [line for line in lines if line.startswith("trial ") and "val_loss" in line]

    lines = [line for path in tmp_path.glob("*.log") for line in path.read_text().splitlines()]
    assert len(finished(log.read_text().splitlines())) == left  # one line per trial this resume trained
    assert finished(lines), lines
    assert any(line.endswith("s elapsed") and "trials done" in line for line in lines), lines
    assert not any("\x1b[" in line for line in lines)


def test_a_second_run_on_a_busy_store_refuses_in_one_line_before_starting_ray(tiny_study, tmp_path):
    from typer.testing import CliRunner

    from archsearch.cli import app
    from archsearch.store import RunLock

    store = tmp_path / "s.duckdb"
    with RunLock(store, study="other"):
        result = CliRunner().invoke(app, ["run", str(tiny_study), "--store", str(store)])
    assert result.exit_code == 2
    assert result.output.startswith(f"error: {store} is being written by another run (study 'other', pid")
    assert result.output.count("\n") == 1


@pytest.mark.ray
@pytest.mark.slow
def test_address_auto_joins_a_cluster_started_with_ray_start(tiny_study, tmp_path):
    """A head started with `ray start` (its own temp folder, found through
    RAY_TMPDIR as `auto` would find /tmp/ray): the study runs on it, with the
    warning about its address being reachable without authentication.
    The cluster is stopped by the process ids of its processes."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="asrt-", dir="/tmp")  # short: Ray's socket paths are capped
    env = dict(os.environ, RAY_TMPDIR=folder, RAY_AUTH_MODE="disabled")
    env.pop("RAY_ADDRESS", None)
    ray_cli = [sys.executable, "-m", "ray.scripts.scripts"]
    try:
        subprocess.run([*ray_cli, "start", "--head", "--port", "0", "--temp-dir", f"{folder}/ray", "--num-cpus", "1",
                        "--include-dashboard", "false", "--disable-usage-stats"], env=env, check=True,
                       capture_output=True, timeout=120, start_new_session=True)
        store = tmp_path / "s.duckdb"
        done = subprocess.run([sys.executable, "-m", "archsearch.cli", "run", str(tiny_study), "--store", str(store),
                               "--address", "auto", "--report", str(tmp_path / "r.html")], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "without authentication" in done.stderr
        with A.open_store(store, read_only=True) as db:
            assert {r["status"] for r in db.trials().to_pylist()} == {"completed"}
    finally:
        stop_cluster(folder)


@pytest.mark.ray
@pytest.mark.slow
def test_a_trial_on_two_data_parallel_workers_trains_as_one_on_the_same_global_batch(embedded_ray, tmp_path,
                                                                                    corpus):
    """`execution.workers_per_trial: 2`: DDP over gloo, each worker on half of
    every batch; the curve after a few steps equals one worker's on the whole
    batch within 1e-4, and the store holds one row for the trial, written by
    rank 0 alone (planted mutation: dropping the world-size weight of each
    slice's loss in `_backward` halves the gradient and the losses part)."""
    from archsearch.train import train_trial

    path = write_study(tmp_path, corpus, shapes="uniform", steps=4, eval_every=1,
                       execution="workers_per_trial: 2\n")
    study = A.load_study(path)
    (trial,) = A.plan(study)
    store = tmp_path / "s.duckdb"
    summary = A.run_study(study, store=store, show_progress=False)
    with A.open_store(store, read_only=True) as db:
        rows, curve = db.trials().to_pylist(), db.metrics().to_pylist()
    assert summary.completed == 1, rows[0]["error"]
    assert len(rows) == 1 and rows[0]["status"] == "completed"
    alone = train_trial(spec=trial.spec, recipe=trial.recipe, data=trial.data, seed=trial.seed, threads=1)
    assert [r["step"] for r in curve] == [1, 2, 3, 4]
    for name in ("train_loss", "val_loss"):
        assert [r[name] for r in curve] == pytest.approx([r[name] for r in alone.curve], abs=1e-4)
    assert curve[-1]["val_loss"] < curve[0]["val_loss"] - 1e-3  # it learns, so the comparison means something


def test_workers_that_cannot_split_the_batch_are_refused_in_one_line(tmp_path, corpus):
    path = write_study(tmp_path, corpus, execution="workers_per_trial: 3\n")
    with pytest.raises(A.SpecError,
                       match=r"study.yaml:\d+: execution.workers_per_trial: 3 workers .* recipe.batch_size 4 evenly"):
        A.load_study(path)
