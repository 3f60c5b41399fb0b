"""How a run starts and ends its Ray: shut down with nothing left running or
on disk, the driver's kernel settings carried to workers that started before
them, and no torch in the driver of a CPU run.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import archsearch as A
from tests.test_execute import ROOT, write_study


def marked(mark: str) -> list[str]:
    """Command lines of the processes whose environment holds ``mark`` (all a run started inherit it)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and mark.encode() in (entry / "environ").read_bytes():
                found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("ending", ["finished", "interrupted while Ray starts"])
def test_a_run_leaves_no_ray_process_or_folder_behind(ending, tmp_path, corpus):
    """`archsearch run` ends (its trials done, or Ctrl-C while Ray starts) and
    none of the processes it started (GCS, raylet, agents, workers) outlives
    it, nor its private Ray's folder. Planted mutations: leaving out the
    folder's removal after `ray.shutdown` fails the finished run; leaving out
    the clean-up of a start that was interrupted fails the other."""
    path = write_study(tmp_path, corpus, steps=2, eval_every=1)
    store, name, value = tmp_path / "s.duckdb", "ARCHSEARCH_TEST_RUN", uuid.uuid4().hex
    process = subprocess.Popen([sys.executable, "-m", "archsearch.cli", "run", str(path), "--store", str(store),
                                "--report", str(tmp_path / "r.html")], cwd=ROOT, env=dict(os.environ, **{name: value}),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline, gcs = time.monotonic() + 120, []
    while time.monotonic() < deadline and not gcs and process.poll() is None:
        gcs = [line for line in marked(f"{name}={value}") if "gcs_server" in line]
        time.sleep(0.05)
    assert gcs, process.stderr.read()
    folder = Path(re.search(r"--log_dir=(/\S*?/asray-[^/]+)/", gcs[0]).group(1))
    if ending != "finished":
        process.send_signal(signal.SIGINT)
    code = process.wait(timeout=300)
    stderr = process.stderr.read()
    if ending == "finished":
        assert code == 0, stderr
    else:
        assert code == 130 and "interrupted; finished trials are saved" in stderr, stderr
    assert marked(f"{name}={value}") == []
    assert not folder.exists()


@pytest.fixture(scope="module")
def ray_started_first():
    """A private Ray started before anything below changes the environment (a
    notebook's own ``ray.init``, or a cluster's nodes, started before the run)."""
    import shutil

    import ray

    from archsearch.execute.cluster import start_ray

    folder = start_ray(None)
    yield
    ray.shutdown()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.ray
def test_a_kernel_the_preflight_turned_off_is_off_in_workers_started_before_it(ray_started_first, tmp_path,
                                                                               corpus, monkeypatch):
    """The preflight turns a broken kernel off through an environment
    variable, which a worker started before it or on another node never sees:
    the trial's task takes the driver's settings with it (planted mutation:
    not applying them in the task leaves the worker's variable unset)."""
    from archsearch.execute import driver
    from archsearch_kernels import dispatch

    def preflight(study_name, db, specs):
        dispatch.disable("swiglu")  # what a failed check does
        return {"swiglu": "swiglu: failed its check"}

    monkeypatch.delenv(dispatch.DISABLE_VAR, raising=False)
    monkeypatch.setattr(driver, "preflight_kernels", preflight)
    seen, original = tmp_path / "seen.txt", driver._trial_task

    def noting(payload):
        for item in original(payload):  # what the worker's environment holds while the trial trains
            seen.write_text(os.environ.get(dispatch.DISABLE_VAR, "<unset>"))
            yield item

    monkeypatch.setattr(driver, "_trial_task", noting)
    path = write_study(tmp_path, corpus, shapes="[uniform]", steps=1, eval_every=1)
    try:
        summary = A.run_study(A.load_study(path), store=tmp_path / "s.duckdb", show_progress=False)
    finally:
        os.environ.pop(dispatch.DISABLE_VAR, None)
    assert summary.completed == 1
    assert seen.read_text() == "swiglu"


def test_on_a_cpu_build_of_torch_the_preflight_records_no_failure_without_importing_torch(tmp_path):
    """Nothing runs Triton without CUDA, which a CPU build of torch never has:
    the driver records an empty preflight and never imports torch (1-4 s of
    its start; planted mutation: dropping that shortcut imports it)."""
    import textwrap

    from archsearch.execute import preflight
    from archsearch_kernels import dispatch

    assert (preflight.MODE_VAR, preflight.DISABLE_VAR) == (dispatch.MODE_VAR, dispatch.DISABLE_VAR)
    code = textwrap.dedent("""\
        import importlib.metadata, sys
        importlib.metadata.version = lambda name: "2.13.0+cpu"
        from archsearch.execute.preflight import preflight_kernels
        from archsearch.store import open_store
        with open_store(sys.argv[1]) as db:
            print(preflight_kernels("tiny", db, None), db.kernel_preflight("tiny"), "torch" in sys.modules)
        """)
    env = {k: v for k, v in os.environ.items() if k not in (dispatch.MODE_VAR, dispatch.DISABLE_VAR)}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s.duckdb")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["{}", "{}", "False"], done.stderr
