"""The command line as a user meets it: run, resume, status/ls, pareto,
report, export, their one-line errors, Ctrl-C and a killed run, at 80
columns. In-process through typer's runner, or as a subprocess where a
signal is sent."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import archsearch as A
from archsearch.cli import app
from tests.conftest import TINY_SPACE

# rich markup in a value once crashed every table
SPACE = TINY_SPACE.replace("model:", "derived:\n  note: \"'[/bold]'\"\nmodel:")


def write_study(folder: Path, *, steps: int = 2, eval_every: int = 1, max_parallel: int = 2) -> Path:
    """A 3-trial study (3 taper shapes) on a few small text files in ``folder``."""
    corpus = folder / "corpus"
    corpus.mkdir(exist_ok=True)
    for i in range(6):
        (corpus / f"doc{i}.txt").write_text(" ".join(f"word{(i * 7 + j) % 23}" for j in range(300)))
    (folder / "space.yaml").write_text(SPACE)
    path = folder / "study.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: tiny
        space: space.yaml
        budget: {{targets: [6000], tolerance: 0.02}}
        data: {{kind: text, paths: [corpus], seq_len: 16}}
        recipe: {{steps: {steps}, batch_size: 4, warmup_steps: 1, eval_every: {eval_every}, eval_batches: 1}}
        execution: {{max_parallel: {max_parallel}, threads_per_trial: 1}}
        """))
    return path


def invoke(*args, width: int = 80):
    """``archsearch ARGS`` in this process, ``width`` columns wide."""
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": str(width)})


def one_line_error(result, code: int, *fragments: str) -> None:
    assert result.exit_code == code, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """One `archsearch run` into a store in a folder that does not exist yet,
    from a working directory of its own (where the default report goes)."""
    folder = tmp_path_factory.mktemp("cli")
    study = write_study(folder)
    store = folder / "runs" / "new" / "a.duckdb"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        result = invoke("run", study, "--store", store)
    return folder, study, store, result


@pytest.fixture
def filled(tmp_path):
    """A store holding the study's three planned trials as completed, written
    directly (no Ray), for the commands that only read."""
    study = write_study(tmp_path)
    store = tmp_path / "s.duckdb"
    trials = A.plan(A.load_study(study))
    with A.open_store(store) as db:
        db.add_study(name="tiny", path=str(study), config={})
        db.add_trials("tiny", [t.to_dict() for t in trials])
        for i, t in enumerate(trials):
            db.finish(t.trial_id, dict(train_loss=2.0, val_loss=2.0 + i, val_accuracy=0.5, steps=2, tokens=128,
                                       wall_time_s=1.0, tokens_per_s=12345.0, curve=[]))
    return study, store, trials


# without Ray

def test_version_and_help_name_no_types_of_flags():
    result = invoke("--version")
    assert result.exit_code == 0 and re.fullmatch(rf"archsearch {re.escape(A.__version__)}(\+\S+)?\n", result.output)
    for command in ("", "plan", "run", "resume", "status", "ls", "pareto", "report", "export", "schema"):
        result = invoke(*command.split(), "--help")
        assert result.exit_code == 0 and "<bool>" not in result.output, command
    assert "--json" in invoke("plan", "--help").output and "--wide" in invoke("status", "--help").output


def test_plan_prints_markup_in_values_literally_at_80_columns(tmp_path):
    result = invoke("plan", write_study(tmp_path))
    assert result.exit_code == 0, result.output
    assert "note=[/bold]" in result.output
    assert max(map(len, result.output.splitlines())) <= 80


def test_resume_without_a_store_or_without_the_study_says_so(tmp_path, filled):
    study = write_study(tmp_path)
    one_line_error(invoke("resume", study, "--store", tmp_path / "none.duckdb"), 2,
                   f"no store at {tmp_path / 'none.duckdb'}; nothing to resume", f"archsearch run {study}")
    _, store, _ = filled
    other = tmp_path / "other"
    other.mkdir()
    renamed = write_study(other)
    renamed.write_text(renamed.read_text().replace("name: tiny", "name: other", 1))
    one_line_error(invoke("resume", renamed, "--store", store), 2, f"study 'other' is not in {store}")


def test_report_and_export_to_unwritable_paths_fail_in_one_line(filled, tmp_path):
    """Both printed a traceback (PermissionError, NotADirectoryError)."""
    _, store, _ = filled
    one_line_error(invoke("report", "--store", store, "-o", "/proc/x.html"), 2, "cannot write the report /proc/x.html")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    one_line_error(invoke("export", "--store", store, "--parquet", blocker / "x"), 2,
                   f"cannot write Parquet files to {blocker / 'x'}")
    one_line_error(invoke("export", "--store", store, "--parquet", "/etc/passwd/x"), 2, "/etc/passwd/x")
    one_line_error(invoke("export", "--store", store, "--portable", "--hf", "abc", tmp_path / "m"), 2,
                   "--portable goes with --parquet DIR")


def test_an_unwritable_report_path_is_refused_before_the_work(filled, monkeypatch):
    """The report took its seconds of fitting first and only then found it could not write."""
    import archsearch_dashboards.report as report

    _, store, _ = filled
    monkeypatch.setattr(report, "write_report", lambda *a, **k: pytest.fail("the report was computed"))
    one_line_error(invoke("report", "--store", store, "-o", "/proc/x.html"), 2, "cannot write the report /proc/x.html",
                   "/proc cannot be written to")
    one_line_error(invoke("report", "--store", store, "-o", "/etc/passwd/r.html"), 2, "/etc/passwd is not a folder")


def test_report_defaults_to_the_path_run_writes(filled, tmp_path, monkeypatch):
    """One default for `report` and `run`: reports/STUDY.html (report wrote ./report.html)."""
    _, store, _ = filled
    monkeypatch.chdir(tmp_path)
    result = invoke("report", "--store", store)
    # stdout only: what it is doing, past a second on a busy machine, goes to stderr
    assert result.exit_code == 0 and result.stdout.strip() == "report: reports/tiny.html"
    assert "<table" in (tmp_path / "reports" / "tiny.html").read_text()


def test_pareto_table_and_json_agree(filled):
    _, store, trials = filled
    # val_loss rises with the trial's index while params are equal: only the first is on the front
    as_json = invoke("pareto", "--store", store, "--json")
    assert as_json.exit_code == 0
    assert [row["trial_id"] for row in json.loads(as_json.output)["front"]] == [trials[0].trial_id]
    table = invoke("pareto", "--store", store)
    # the table names trials by their first 8 characters
    assert table.exit_code == 0 and trials[0].trial_id[:8] in table.output and trials[1].trial_id[:8] not in table.output
    assert max(map(len, table.output.splitlines())) <= 80


# with Ray

@pytest.mark.ray
def test_run_creates_the_store_folder_and_writes_the_default_report(ran):
    folder, _, store, result = ran
    assert result.exit_code == 0, result.output
    assert store.exists() and (folder / "reports" / "tiny.html").exists()
    assert "tiny: 3 trials planned, 0 already done, 3 trained, 0 failed" in result.output
    assert "best trial" in result.output and "report: reports/tiny.html" in result.output
    # the summary fits 80 columns; progress lines (stderr, one per trial for logs) may run longer
    assert max(map(len, result.stdout.splitlines())) <= 80


@pytest.mark.ray
def test_resume_after_a_finished_run_trains_nothing(ran):
    _, study, store, _ = ran
    result = invoke("resume", study, "--store", store)
    assert result.exit_code == 0, result.output
    assert "3 trials planned, 3 already done, 0 trained" in result.output


@pytest.mark.ray
@pytest.mark.parametrize("command", ["status", "ls"])
def test_status_lists_every_trial_at_80_columns(ran, command):
    _, study, store, _ = ran
    result = invoke(command, "--store", store)
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()[1:]) <= 80 and "…" not in result.output
    rows = [line.split() for line in result.output.splitlines()]
    for trial in A.plan(A.load_study(study)):
        row = next(r for r in rows if r and r[0] == trial.trial_id[:8])
        assert trial.axes["taper.shape"] in row and "completed" in row
    data = json.loads(invoke(command, "--store", store, "--json").output)
    assert {t["status"] for t in data["trials"]} == {"completed"} and len(data["trials"]) == 3


@pytest.mark.ray
def test_pareto_report_and_export_read_the_run(ran, tmp_path):
    import pyarrow.parquet as pq

    _, _, store, _ = ran
    front = json.loads(invoke("pareto", "--store", store, "--json").output)["front"]
    assert front and all(row["status"] == "completed" for row in front)
    result = invoke("report", "--store", store, "-o", tmp_path / "r.html")
    assert result.exit_code == 0 and (tmp_path / "r.html").exists()
    result = invoke("export", "--store", store, "--parquet", tmp_path / "pq")
    assert result.exit_code == 0, result.output
    assert pq.read_table(tmp_path / "pq" / "trials.parquet").num_rows == 3
    from archsearch.store.schema import TABLES

    assert len(result.output.split()) == len(TABLES)  # one line per table written


# signals: `archsearch run` as a subprocess in a session of its own

def _start(*args, cwd: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "archsearch.cli", *map(str, args)], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            env={**os.environ, "COLUMNS": "80", **(env or {})})


def _wait_for_checkpoint(store: Path, trial_id: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until ``trial_id`` has saved a checkpoint: it is training."""
    from archsearch.store import checkpoint_dir

    folder = checkpoint_dir(store, trial_id)
    deadline = time.monotonic() + timeout
    while not any(folder.glob("step-*")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no trial started training"
        time.sleep(0.05)


def _completed(store: Path) -> set[str]:
    """The trials ``store`` holds as completed (read-only: a running run's writer waits its turn)."""
    with A.open_store(store, read_only=True) as db:
        return {r["trial_id"] for r in db.sql("SELECT trial_id FROM trials WHERE status = 'completed'").to_pylist()}


def _wait_for_completed(store: Path, trial_id: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until the run ``proc`` has stored ``trial_id`` as completed."""
    deadline = time.monotonic() + timeout
    while trial_id not in _completed(store):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"trial {trial_id} was never stored as completed"
        time.sleep(0.05)


def _end_session(proc: subprocess.Popen) -> None:
    """SIGKILL whatever is left of the session ``proc`` leads (Ray's processes), by id."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == proc.pid:  # the session id
            try:
                os.kill(int(stat.parent.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


def _store_rows(store: Path) -> tuple[list[str], list[str], list[tuple]]:
    with A.open_store(store, read_only=True) as db:
        trials = db.sql("SELECT trial_id, status FROM trials").to_pylist()
        linked = db.sql("SELECT trial_id FROM study_trials").column("trial_id").to_pylist()
        metrics = [(r["trial_id"], r["step"]) for r in db.sql("SELECT trial_id, step FROM metrics").to_pylist()]
    assert {t["status"] for t in trials} == {"completed"}
    return sorted(t["trial_id"] for t in trials), sorted(linked), sorted(metrics)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize(("signame", "whole_group", "code"), [
    ("SIGINT", True, 130),    # Ctrl-C: the terminal signals the whole foreground group
    ("SIGTERM", False, 143),  # timeout, systemd, Slurm, Kubernetes: the process alone
    ("SIGHUP", False, 129),   # the terminal or ssh session closed
])
def test_a_signal_mid_trial_exits_with_the_exact_resume_command(signame, whole_group, code, tmp_path):
    """Ctrl-C, SIGTERM and SIGHUP mid-trial end a run alike: the trials it stopped are
    `interrupted` in the store, the last line is the command that finishes the study, the exit
    status is 128 + the signal, and no native stack dump (Ray's failure handler answers SIGTERM
    with one) reaches the terminal. After SIGTERM the resumed store equals an uninterrupted run's."""
    study = write_study(tmp_path, steps=400, eval_every=20, max_parallel=1)
    store = tmp_path / "runs" / "s.duckdb"
    (first, *_) = A.plan(A.load_study(study))
    proc = _start("run", study, "--store", store, "--max-parallel", 1, cwd=tmp_path)
    try:
        _wait_for_checkpoint(store, first.trial_id, proc)
        number = getattr(signal, signame)
        os.killpg(proc.pid, number) if whole_group else proc.send_signal(number)
        _, err = proc.communicate(timeout=120)
    finally:
        _end_session(proc)
    assert proc.returncode == code, err
    expected = f"archsearch resume {shlex.quote(str(study))} --store {shlex.quote(str(store))} --max-parallel 1"
    assert err.strip().splitlines()[-1].endswith(f"continue with: {expected}"), err
    assert "SIGTERM received" not in err and "PC: @" not in err and "***" not in err, err
    with A.open_store(store, read_only=True) as db:
        statuses = {r["trial_id"]: r["status"] for r in db.sql("SELECT trial_id, status FROM trials").to_pylist()}
    assert statuses[first.trial_id] == "interrupted"
    # the printed command is the one that finishes the study
    resume = subprocess.run([sys.executable, "-m", "archsearch.cli", *shlex.split(expected)[1:]], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert resume.returncode == 0, resume.stderr
    assert _store_rows(store)[0] == sorted(t.trial_id for t in A.plan(A.load_study(study)))
    if signame == "SIGTERM":
        clean = tmp_path / "clean.duckdb"
        assert invoke("run", study, "--store", clean, "--report", tmp_path / "clean.html").exit_code == 0
        assert _store_rows(store)[2] == _store_rows(clean)[2]


@pytest.mark.ray
def test_a_second_process_sees_where_a_running_trial_is(tmp_path):
    """While a trial trains (long before its first evaluation), `status` in another process
    shows its step of how many, its latest training loss and an ETA; `status --json` gives the
    same as numbers, the store holds its training-loss curve, and the piped heartbeat says it."""
    study = write_study(tmp_path, steps=20000, eval_every=20000, max_parallel=1)
    store = tmp_path / "s.duckdb"
    proc = _start("run", study, "--store", store, cwd=tmp_path, env={"ARCHSEARCH_HEARTBEAT_S": "1"})
    try:
        deadline, seen = time.monotonic() + 180, None
        while seen is None:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no running trial reported its progress"
            time.sleep(0.5)
            found = subprocess.run([sys.executable, "-m", "archsearch.cli", "status", "--store", str(store), "--json"],
                                   capture_output=True, text=True, timeout=60)
            if found.returncode != 0:  # the run has not created the store yet
                continue
            running = [t for t in json.loads(found.stdout)["trials"] if t.get("progress", {}).get("step", 0) > 20]
            seen = running[0] if running else None
        at = seen["progress"]
        assert at["total_steps"] == 20000 and 0 < at["step"] < 20000 and seen["status"] == "running"
        assert 0 < at["train_loss"] < 6 and at["tokens_per_s"] > 0 and at["tokens"] == at["step"] * 4 * 16
        shown = subprocess.run([sys.executable, "-m", "archsearch.cli", "status", "--store", str(store)],
                               capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "80"})
        line = next(line for line in shown.stdout.splitlines() if line.startswith(f"  trial {seen['trial_id'][:8]}"))
        assert re.search(r"step \d+/20000, loss \d\.\d{3}, [\d.]+k? tokens/s, ETA [\d.]+ (s|min|h)", line), line
        with A.open_store(store, read_only=True) as db:
            curve = db.train_points([seen["trial_id"]])
        assert len(curve) >= 2 and [r["step"] for r in curve[:2]] == [10, 20]  # recipe.log_every's default
        # the store can hold a report before the run's next heartbeat line prints it: wait for
        # a few heartbeats (1 s each) so the piped output has caught up with what status saw
        time.sleep(3)
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        _end_session(proc)
    assert re.search(rf"^  trial {seen['trial_id']}: step \d+/20000, loss", err, re.MULTILINE), err
    assert re.search(r"trials done, 1 running, 0 failed, \d+ s elapsed, ETA", err), err


@pytest.mark.ray
@pytest.mark.slow
def test_a_killed_run_resumes_to_the_store_an_uninterrupted_run_writes(tmp_path):
    """SIGKILL (no cleanup at all) while the second trial trains, then
    `resume`: the store holds every planned trial once, completed, with one
    metrics row per evaluation, the same rows as a run never interrupted."""
    study = write_study(tmp_path, steps=300, eval_every=20, max_parallel=1)
    store = tmp_path / "killed.duckdb"
    trials = A.plan(A.load_study(study))
    proc = _start("run", study, "--store", store, cwd=tmp_path)
    try:
        _wait_for_checkpoint(store, trials[1].trial_id, proc)
        # the run's writer thread stores a finished trial a moment after the next one starts:
        # kill once the first trial's result is in the store, else resume rightly trains it again
        _wait_for_completed(store, trials[0].trial_id, proc)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        _end_session(proc)
    done = len(_completed(store))  # 1, or 2 on a machine slow enough that the second trial finished
    resumed = subprocess.run([sys.executable, "-m", "archsearch.cli", "resume", str(study), "--store", str(store)],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ,
                                                                                              "COLUMNS": "80"})
    assert resumed.returncode == 0, resumed.stderr
    assert done in (1, 2) and f"{done} already done, {3 - done} trained, 0 failed" in resumed.stdout
    clean = tmp_path / "clean.duckdb"
    assert invoke("run", study, "--store", clean, "--report", tmp_path / "clean.html").exit_code == 0
    ids, linked, metrics = _store_rows(store)
    assert ids == linked == sorted(t.trial_id for t in trials)
    assert metrics == _store_rows(clean)[2] and len(metrics) == len(set(metrics)) == 3 * 300 // 20
