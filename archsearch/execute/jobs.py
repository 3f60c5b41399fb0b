"""A study sent to a Ray cluster as a Ray job, and followed there.

``submit`` stages a folder the job runs in: the study resolved into one
self-contained file (its space inlined, ``--set`` overrides applied), copies
of the text files it reads, and the archsearch code that sent it, so the
cluster runs what was checked here. The job's entry point is ``archsearch
run`` with ``--address auto`` (the cluster the job runs on). The cluster
needs archsearch's dependencies (torch, duckdb, ...) installed.

Ray's token authentication: since Ray 2.59 ``ray start --head`` turns it
on, and the job server refuses a request without the cluster's token. When
``RAY_AUTH_MODE`` is unset and a token is at hand (``$RAY_AUTH_TOKEN``,
``~/.ray/auth_token`` or ``$RAY_AUTH_TOKEN_PATH``) the client sends it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from archsearch.errors import ArchsearchError, ClusterError
from archsearch.execute.cluster import LOOPBACK, _token_mode
from archsearch.space.schema import Study

STUDY_FILE = "study.yaml"
AUTH_HINT = ("the cluster uses token authentication: get its token on the head node with `ray get-auth-token` "
             "and put it in ~/.ray/auth_token or $RAY_AUTH_TOKEN here (RAY_AUTH_MODE=token is then set for you)")
# Terminal states of a Ray job, and the ones that count as success.
ENDED = ("SUCCEEDED", "FAILED", "STOPPED")
FOLLOW_EVERY_S = 1.0


def submit_study(study: Study, *, address: str, store: str, job_id: str | None = None) -> str:
    """Send ``study`` to the job server at ``address`` (http://HOST:8265); returns the job id.

    ``store`` is a path on the cluster's head node (where the job runs); a
    relative one is taken from the home folder there. The report lands
    beside it, with ``.html`` for its suffix.
    """
    client = _client(address)
    job_id = job_id or f"archsearch-{study.name}-{uuid.uuid4().hex[:8]}"
    with _staged(study) as folder:
        runtime_env = {"working_dir": str(folder), "excludes": ["__pycache__", "*.pyc"],
                       "env_vars": {"PYTHONUNBUFFERED": "1"}}
        return _asking(address, lambda: client.submit_job(
            entrypoint=entrypoint(store), submission_id=job_id, runtime_env=runtime_env,
            metadata={"archsearch_study": study.name}))


def entrypoint(store: str) -> str:
    """``archsearch run`` on the staged study, writing ``store`` on the cluster."""
    def on_cluster(path: Path) -> str:
        return shlex.quote(str(path)) if path.is_absolute() else '"$HOME"/' + shlex.quote(str(path))

    path = Path(store)
    command = ["python", "-m", "archsearch.cli", "run", STUDY_FILE, "--address", "auto"]
    return (f"{shlex.join(command)} --store {on_cluster(path)} "
            f"--report {on_cluster(path.with_suffix('.html'))}")


def job_state(address: str, job_id: str) -> tuple[str, str, str]:
    """A job's status (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED), Ray's message about it, and its log."""
    client = _client(address)
    info = _asking(address, lambda: client.get_job_info(job_id), job_id=job_id)
    log = _asking(address, lambda: client.get_job_logs(job_id), job_id=job_id)
    return str(info.status.value), info.message or "", log


def follow(address: str, job_id: str, *, echo: Callable[[str], None]) -> tuple[str, str]:
    """Echo a job's log as it grows until the job ends; its final status and message."""
    shown = 0
    while True:
        status, message, log = job_state(address, job_id)
        if len(log) > shown:
            echo(log[shown:])
            shown = len(log)
        if status in ENDED:
            return status, message
        time.sleep(FOLLOW_EVERY_S)


@contextmanager
def _staged(study: Study) -> Iterator[Path]:
    """The job's working directory, removed once Ray has uploaded it."""
    import archsearch
    import archsearch_kernels

    folder = Path(tempfile.mkdtemp(prefix="archsearch-job-"))
    try:
        # What the file and --set said (defaults stay the schema's), includes merged, the space inlined.
        config = study.model_dump(mode="json", exclude_unset=True, exclude={"include", "space"})
        config["space"] = study.space.model_dump(mode="json", exclude_unset=True, exclude={"include"})
        if study.execution.storage:
            config["execution"]["storage"] = study.execution.resolved_storage()
        data = config.setdefault("data", {})
        if data.get("kind") == "text" and data.get("paths"):
            data["paths"] = [_copy(Path(source), folder / "data" / f"{index}-{Path(source).name}")
                             for index, source in enumerate(data["paths"])]
        data.pop("cache_dir", None)  # a folder of this machine
        (folder / STUDY_FILE).write_text(yaml.safe_dump(config, sort_keys=False))
        # the code a trial runs (its models' ops among it), for a cluster without archsearch installed
        for package in (archsearch, archsearch_kernels):
            shutil.copytree(Path(package.__file__).parent, folder / package.__name__,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        try:  # the report of `run`; a cluster without archsearch installed lacks it otherwise
            import archsearch_dashboards

            shutil.copytree(Path(archsearch_dashboards.__file__).parent, folder / "archsearch_dashboards",
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        except ImportError:
            pass
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _copy(source: Path, target: Path) -> str:
    """A data file or folder copied into the job's folder; its path there, relative."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copy2(source, target)
    return str(target.relative_to(target.parents[1]))


def _client(address: str) -> Any:
    """A JobSubmissionClient for ``address``, sending the user's token when there is one."""
    parts = urlsplit(address if "://" in address else f"http://{address}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ClusterError(f"--address '{address}': give the cluster's job server as http://HOST:8265 "
                              "(the dashboard port `ray start --head` prints), not a ray:// or GCS address")
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError as err:
        raise ClusterError(f"Ray Jobs need ray's job client ({err}); install archsearch[cluster]") from None
    _use_token_if_available()
    if parts.hostname not in LOOPBACK and not _token_mode():
        print(f"warning: sending a job to {address} without authentication: anyone who can reach that port can "
              "run code on the cluster; start it with token authentication", file=sys.stderr)
    url = f"{parts.scheme}://{parts.netloc}"

    def connect() -> Any:
        try:
            return JobSubmissionClient(url)
        except (RuntimeError, ValueError) as err:  # it answered the version check, but not as Ray does
            answer = str(err).strip().split(". ")[0] or type(err).__name__
            raise ClusterError(f"{address} is not a Ray job server (asked for its Ray version: {answer}); give "
                               "the cluster's dashboard address, http://HEAD:8265, that `ray start --head "
                               "--include-dashboard=true` prints") from None

    return _asking(address, connect)


def _use_token_if_available() -> None:
    """RAY_AUTH_MODE=token when it is unset and the user's Ray config holds a token."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:  # a Ray from before token authentication
        return
    if AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True):
        os.environ["RAY_AUTH_MODE"] = "token"
        Config.initialize("")  # Ray caches the mode it read at import


def _asking(address: str, call: Callable[[], Any], *, job_id: str | None = None) -> Any:
    """``call`` to the job server, its failures as one line each."""
    from ray.exceptions import AuthenticationError

    try:
        return call()
    except AuthenticationError as err:
        reason = str(err).strip().splitlines()[0]
        hint = AUTH_HINT if _token_mode() or "RAY_AUTH_MODE" not in os.environ else \
            f"RAY_AUTH_MODE is '{os.environ['RAY_AUTH_MODE']}' here: set it to token (or unset it)"
        raise ClusterError(f"the job server at {address} refused the request ({reason}); {hint}") from None
    except ConnectionError:
        raise ClusterError(f"cannot reach a Ray job server at {address}; start the cluster with "
                              "`ray start --head --include-dashboard=true` (it needs ray[default] there) and give "
                              "its dashboard address, http://HOST:8265") from None
    except RuntimeError as err:
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if job_id is not None and ("404" in text or "does not exist" in text):
            raise ClusterError(f"no job '{job_id}' on the cluster at {address}; "
                                  "`ray job list --address ...` lists them") from None
        raise ArchsearchError(f"the job server at {address}: {text}") from None
