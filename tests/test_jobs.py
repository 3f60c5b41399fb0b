"""Ray Jobs: a study sent to a real two-node cluster (`ray start --head`
with the dashboard, and a second node with `ray start --address`), token
authentication on as Ray 2.59+ starts it, the cluster stopped by its
process ids (never `ray stop`: other Ray processes on the machine are
not ours)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

import archsearch as A
from tests.conftest import TINY_SPACE, tiny_study_text
from tests.test_execute import stop_cluster

ROOT = Path(__file__).resolve().parents[1]
RAY = [sys.executable, "-m", "ray.scripts.scripts"]
CLI = [sys.executable, "-m", "archsearch.cli"]


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def node_ports() -> list[str]:
    """Every port a node listens on, free ones: the defaults (52365 for the
    dashboard agent, ...) may belong to another Ray on this machine."""
    names = ("node-manager-port", "object-manager-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
             "metrics-export-port", "runtime-env-agent-port")
    return [f"--{name}={port}" for name, port in zip(names, free_ports(len(names)))]


@pytest.fixture(scope="module")
def cluster():
    """A head with the job server and a second node, 1 CPU each; yields (job server URL, env with the
    token, the GCS address on loopback)."""
    folder = tempfile.mkdtemp(prefix="asjb-", dir="/tmp")  # short: Ray's socket paths are capped
    token = uuid.uuid4().hex
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, RAY_TMPDIR=folder,
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("RAY_ADDRESS", None)
    gcs, dashboard, client = free_ports(3)
    common = ["--temp-dir", f"{folder}/ray", "--num-cpus", "1", "--disable-usage-stats"]
    try:
        head = subprocess.run([*RAY, "start", "--head", f"--port={gcs}", "--include-dashboard=true",
                               "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
                               f"--ray-client-server-port={client}", *node_ports(), *common],
                              env=env, capture_output=True, text=True, timeout=120, start_new_session=True)
        assert head.returncode == 0, head.stderr[-2000:]
        address = re.search(r"ray start --address='([^']+)'", head.stdout + head.stderr).group(1)
        second = subprocess.run([*RAY, "start", f"--address={address}", *node_ports(), *common], env=env,
                                capture_output=True, text=True, timeout=120, start_new_session=True)
        assert second.returncode == 0, second.stderr[-2000:]
        yield f"http://127.0.0.1:{dashboard}", env, f"127.0.0.1:{gcs}"
    finally:
        stop_cluster(folder)


def client_env(env: dict, **changes: str | None) -> dict:
    """The submitter's environment: the token at hand, RAY_AUTH_MODE unset (archsearch sets it)."""
    out = {k: v for k, v in env.items() if k not in ("RAY_AUTH_MODE", "RAY_TMPDIR")}
    for name, value in changes.items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = value
    return out


@pytest.fixture
def job_study(tmp_path, corpus) -> Path:
    """Two one-step trials; the corpus sits outside the study's folder, so it must travel with the job."""
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "space.yaml").write_text(TINY_SPACE.replace("[uniform, cosine, reverse]", "[uniform, cosine]"))
    text = tiny_study_text(corpus=corpus, steps=2).replace("eval_every: 6", "eval_every: 1")
    (folder / "study.yaml").write_text(text.replace("max_parallel: 2", "max_parallel: auto"))
    return folder / "study.yaml"


@pytest.mark.ray
@pytest.mark.slow
def test_a_study_submitted_as_a_job_runs_on_the_cluster_and_is_followed_to_its_end(cluster, job_study, tmp_path):
    """`submit --wait` prints the job id, follows the log to the end and exits
    0; the store on the cluster holds every trial completed; `status --job`
    says SUCCEEDED with the log's tail. The token came from $RAY_AUTH_TOKEN
    alone (planted mutation: not switching RAY_AUTH_MODE to token when a
    token is at hand fails with "Missing authentication token")."""
    url, env, _ = cluster
    store = tmp_path / "cluster.duckdb"
    done = subprocess.run([*CLI, "submit", str(job_study), "--address", url, "--store", str(store), "--wait",
                           "--set", "recipe.steps=1"], cwd=tmp_path, env=client_env(env), capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    job_id = done.stdout.splitlines()[0]
    assert job_id.startswith("archsearch-tiny-")
    assert re.search(r"^trial \w+ transformer .*val_loss", done.stderr, re.M), done.stderr[-3000:]
    assert done.stderr.rstrip().endswith(f"job {job_id}: SUCCEEDED")
    with A.open_store(store, read_only=True) as db:
        rows = db.trials().to_pylist()
    assert len(rows) == 2 and {r["status"] for r in rows} == {"completed"}
    assert {r["steps"] for r in rows} == {1}  # the --set override travelled with the study
    assert store.with_suffix(".html").exists()
    status = subprocess.run([*CLI, "status", "--job", job_id, "--address", url], env=client_env(env),
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith(f"job {job_id}: SUCCEEDED")
    assert "trial " in status.stdout


@pytest.mark.ray
@pytest.mark.slow
def test_a_failed_job_ends_wait_non_zero_and_a_bad_token_is_one_line(cluster, job_study, tmp_path):
    """A job whose run fails (its store cannot be written on the cluster):
    `--wait` exits 1 naming the job. A wrong token: one line saying where
    the token goes, exit 2 (the user's to fix), no traceback."""
    url, env, _ = cluster
    failed = subprocess.run([*CLI, "submit", str(job_study), "--address", url, "--store", "/proc/no/s.duckdb",
                             "--wait"], env=client_env(env), capture_output=True, text=True, timeout=240)
    assert failed.returncode == 1, failed.stderr[-3000:]
    job_id = failed.stdout.splitlines()[0]
    assert failed.stderr.splitlines()[-1].startswith(f"error: job {job_id} failed: ")
    wrong = subprocess.run([*CLI, "status", "--job", job_id, "--address", url],
                           env=client_env(env, RAY_AUTH_TOKEN=uuid.uuid4().hex), capture_output=True, text=True,
                           timeout=60)
    assert wrong.returncode == 2
    assert wrong.stderr.startswith(f"error: the job server at {url} refused the request"), wrong.stderr
    assert "ray get-auth-token" in wrong.stderr and wrong.stderr.count("\n") == 1


@pytest.mark.ray
@pytest.mark.slow
def test_joining_a_token_cluster_without_the_token_is_one_line_and_ray_keeps_its_lines_to_the_log(
        cluster, job_study, tmp_path):
    """`run --address` to a cluster with token authentication, no token at hand: Ray's core
    retries and prints a line a second (gcs_client.cc) to stderr; the user sees one line that
    says how to give the token and where Ray's own lines went, exit 2."""
    _, env, address = cluster
    store = tmp_path / "s.duckdb"
    home = tmp_path / "home"
    home.mkdir()
    done = subprocess.run([*CLI, "run", str(job_study), "--store", str(store), "--address", address],
                          env=client_env(env, RAY_AUTH_TOKEN=None, HOME=str(home)), capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.startswith(f"error: cannot join the Ray cluster at '{address}': "), done.stderr
    assert "set RAY_AUTH_MODE=token here" in done.stderr and "ray get-auth-token" in done.stderr
    assert done.stderr.rstrip().endswith(f"Ray's own messages are in {store}.ray.log")
    assert done.stderr.count("\n") == 1 and "gcs_client" not in done.stderr, done.stderr
    assert "gcs_client" in Path(f"{store}.ray.log").read_text()


# without a cluster


def test_the_staged_job_folder_holds_a_study_that_plans_the_same_trials_alone(job_study, tmp_path):
    """What travels: one self-contained study file (space inlined, --set
    applied), its corpus copied in, and this code with its kernels; loaded
    from there alone it plans the same models."""
    from archsearch.execute.jobs import STUDY_FILE, _staged

    study = A.load_study(job_study, overrides=["recipe.steps=3"])
    with _staged(study) as folder:
        moved = shutil.move(str(folder), tmp_path / "job")  # nothing outside it is needed
    staged = A.load_study(Path(moved) / STUDY_FILE)
    assert staged.recipe.steps == 3 and isinstance(staged.space, type(study.space))
    assert [(t.spec, t.params) for t in A.plan(staged)] == [(t.spec, t.params) for t in A.plan(study)]
    assert sorted(p.name for p in (Path(moved) / "data" / "0-corpus").iterdir()) == \
        sorted(p.name for p in Path(study.data.paths[0]).iterdir())
    assert (Path(moved) / "archsearch" / "cli.py").exists() and not list(Path(moved).rglob("__pycache__"))
    assert (Path(moved) / "archsearch_kernels" / "dispatch.py").exists()  # the models' ops travel too


@pytest.mark.parametrize(("store", "expected"), [
    ("/data/s.duckdb", "--store /data/s.duckdb --report /data/s.html"),
    ("runs/my s.duckdb", """--store "$HOME"/'runs/my s.duckdb' --report "$HOME"/'runs/my s.html'"""),
], ids=["absolute", "relative"])
def test_the_job_runs_archsearch_on_the_cluster_with_the_store_there(store, expected):
    from archsearch.execute.jobs import entrypoint

    assert entrypoint(store) == f"python -m archsearch.cli run study.yaml --address auto {expected}"


@pytest.mark.parametrize(("args", "message"), [
    (["submit", "STUDY", "--address", "http://127.0.0.1:PORT"], "error: cannot reach a Ray job server at "),
    (["submit", "STUDY", "--address", "ray://head:10001"], "error: --address 'ray://head:10001': give the "),
    (["status", "--job", "j1"], "error: --job j1: give the cluster's job server with --address"),
], ids=["unreachable", "ray-client-address", "status-without-address"])
def test_job_commands_fail_in_one_line(args, message, job_study, monkeypatch):
    from typer.testing import CliRunner

    from archsearch.cli import app

    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    (port,) = free_ports(1)
    args = [str(job_study) if a == "STUDY" else a.replace("PORT", str(port)) for a in args]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and result.output.startswith(message), result.output
    assert result.output.count("\n") == 1


def test_submit_log_to_travels_in_the_staged_study(job_study, tmp_path, monkeypatch):
    """`submit --log-to` adds the tracker to the study the job runs, as `run --log-to` does."""
    from typer.testing import CliRunner

    from archsearch.cli import app
    from archsearch.execute import jobs
    from archsearch.execute.jobs import STUDY_FILE, _staged

    sent = []

    def staged_study(study, *, address, store):
        with _staged(study) as folder:
            sent.append(A.load_study(shutil.move(str(folder), tmp_path / "job") / STUDY_FILE))
        return "archsearch-job-1"

    monkeypatch.setattr(jobs, "submit_study", staged_study)
    result = CliRunner().invoke(app, ["submit", str(job_study), "--address", "http://head:8265",
                                      "--log-to", "tensorboard=tb", "--log-to", "mlflow"])
    assert result.exit_code == 0, result.output
    (study,) = sent
    assert study.logging.tensorboard.dir == "tb" and study.logging.mlflow is not None
    assert study.logging.wandb is None
