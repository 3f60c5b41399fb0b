"""Where trials run: a private embedded Ray, or a cluster it joins, and
how many trials fit on it at once.

The embedded instance is private to its run: its session files live in a
temporary folder of its own (so ``--address auto`` from another shell never
finds it), every server listens on 127.0.0.1 only, on a port the system
chose free as it started (so it runs beside a ``ray start --head`` on Ray's
default ports, or beside another run), and its workers run at the driver's
priority (Ray's own default renices them to 15, which on a busy machine
leaves a trial a few percent of a core). The run removes that folder when it
ends; a driver killed outright cannot, so each folder names its driver
(``OWNER``) and the next embedded start removes those whose driver is gone.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from archsearch.errors import ArchsearchError, ClusterError
from archsearch.execute.process import signals_kept

LOOPBACK = ("127.0.0.1", "localhost", "::1")
PREFIX = "asray-"
OWNER = "owner.json"  # in each embedded Ray's folder: the driver that made it (host, pid, when it started)


def start_ray(address: str | None, *, log: str | None = None) -> str | None:
    """Start a private embedded Ray (returns its folder) or join ``address`` (returns None).

    ``log``: where Ray's native output goes while the run lasts (`process.native_output_to`),
    named in the errors of a cluster that cannot be joined."""
    import ray

    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    quiet = dict(include_dashboard=False, logging_level="ERROR", log_to_driver=False, configure_logging=True)
    if address not in (None, "local"):
        if address == "auto":
            address = _recorded_cluster()
        _check_reachable(address)
        _check_speaks_grpc(address)
        _warn_if_open(address)
        try:
            with signals_kept():
                ray.init(address=address, **quiet)
        except ConnectionError as err:
            hint = ("check the token (`ray get-auth-token` on the head node prints the cluster's) and that the "
                    "cluster runs; or leave out --address to run locally" if _token_mode() else
                    "if it uses token authentication (what `ray start --head` turns on since Ray 2.59), set "
                    "RAY_AUTH_MODE=token here, with its token (`ray get-auth-token` on the head node prints it) in "
                    "~/.ray/auth_token or $RAY_AUTH_TOKEN")
            where = f"; Ray's own messages are in {log}" if log else ""
            raise ClusterError(f"cannot join the Ray cluster at '{address}': {str(err).splitlines()[0]}; "
                                  f"{hint}{where}") from None
        return None
    # Session files in a folder of our own: `ray.init("auto")` looks for a
    # cluster under /tmp/ray and so never joins this one. Short prefix: Ray
    # puts unix sockets in it, whose paths are capped near 107 bytes.
    parent = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
    remove_dead_folders(parent)
    folder = tempfile.mkdtemp(prefix=PREFIX, dir=parent)
    try:
        claim(folder)
        with _loopback_only(), _only_what_a_local_run_needs(), signals_kept():
            # workers at the raylet's niceness, which is the driver's, not Ray's default 15
            ray.init(address="local", _temp_dir=folder, _system_config={"worker_niceness": 0}, **quiet)
    except BaseException as err:  # Ctrl-C while it starts, too: nothing of it outlives the run
        ray.shutdown()
        shutil.rmtree(folder, ignore_errors=True)
        if isinstance(err, Exception) and not isinstance(err, ArchsearchError):
            # on an overloaded machine Ray's servers can miss their start-up deadlines
            load = f" (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
            where = f"; Ray's own messages are in {log}" if log else ""
            text = str(err).strip().splitlines()
            raise ArchsearchError(f"the embedded Ray did not start{load}: {text[0] if text else type(err).__name__}; "
                                  f"try again when the machine is less busy, or lower --max-parallel{where}") from None
        raise
    return folder


def _recorded_cluster() -> str:
    """What ``--address auto`` joins: $RAY_ADDRESS, or the cluster ``ray
    start`` recorded on this machine. Never Ray's own fallback for "auto",
    which joins any Ray process it finds running: another run's embedded one."""
    from ray._private.utils import read_ray_address

    found = os.environ.get("RAY_ADDRESS") or read_ray_address()
    if not found:
        raise ClusterError("--address auto: no cluster started with `ray start` on this machine and RAY_ADDRESS "
                              "is unset; start one with `ray start --head`, give its HOST:PORT, or leave out "
                              "--address to run locally")
    return found


def claim(folder: str) -> None:
    """Mark ``folder`` as this process's: ``remove_dead_folders`` keeps it while it runs."""
    owner = dict(host=socket.gethostname(), pid=os.getpid(), started=_started(os.getpid()))
    part = os.path.join(folder, f"{OWNER}.part")
    with open(part, "w") as out:
        json.dump(owner, out)
    os.replace(part, os.path.join(folder, OWNER))  # whole or absent: a half-written one is never read


def remove_dead_folders(parent: str) -> list[str]:
    """Remove the embedded Ray folders under ``parent`` whose driver provably
    no longer runs: one of ours (this user's, this host's) whose marker names
    a process id that is gone or now belongs to a process started at another
    time. A folder without a readable marker (another version's, one being
    made) or whose driver cannot be looked up is kept. Returns those removed."""
    removed = []
    host, uid = socket.gethostname(), os.getuid()
    if _started(os.getpid()) is None:  # no /proc here: no driver can be proven gone
        return removed
    try:
        entries = [e for e in os.scandir(parent) if e.name.startswith(PREFIX)]
    except OSError:
        return removed
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != uid:
                continue
            with open(os.path.join(entry.path, OWNER)) as marker:
                owner = json.load(marker)
            if owner["host"] != host or owner["started"] is None or _started(int(owner["pid"])) == owner["started"]:
                continue
        except (OSError, ValueError, KeyError, TypeError):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    return removed


def _started(pid: int) -> str | None:
    """When process ``pid`` started: this boot's id and the clock ticks from
    boot to its start (field 22 of /proc/PID/stat), which a later process
    given the same id differs in. None where that cannot be read (no such
    process, or no /proc), so a marker holding None proves nothing."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # after the command name, which may hold ')'
        with open("/proc/sys/kernel/random/boot_id") as boot:
            return f"{boot.read().strip()}:{fields[19]}"
    except (OSError, IndexError):
        return None


@contextmanager
def _loopback_only() -> Iterator[None]:
    """Ray binds every server to the node address, which on Linux is the
    machine's network address, and turns a given 127.0.0.1 into it. Its
    single-machine mode (the default on macOS and Windows) uses 127.0.0.1:
    the variable switches it on for the processes Ray starts, the constant
    for this one, which read it when ray was imported."""
    from ray._private import ray_constants

    variable = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    saved_env, saved_flag = os.environ.get(variable), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[variable] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = saved_env


# Ray's servers whose port a local node fixes unless told otherwise (the dashboard agent's 52365,
# taken by whichever Ray starts first); 0 asks each to bind a port the system picks free
_PORTS = ("gcs_server_port", "node_manager_port", "object_manager_port", "metrics_agent_port",
          "metrics_export_port", "dashboard_agent_listen_port", "runtime_env_agent_port",
          "min_worker_port", "max_worker_port")


@contextmanager
def _only_what_a_local_run_needs() -> Iterator[None]:
    """A private single-node Ray without the processes such a run never uses:
    the autoscaler's monitor (one fixed node never scales) and the log monitor
    (workers' logs are not sent to the driver), each also held for a second
    on shutdown; and the minimal dashboard (no web UI is served), which Ray
    otherwise chooses by importing aiohttp and co in the driver. Measured in
    benchmarks/bench_fixed.py. Every port of it is one the system picks free
    (`_PORTS`; min and max worker port 0: each worker binds a free one).
    Ray offers none of these in ``ray.init``, so its own switches are set
    while it starts."""
    from ray._private import parameter, utils

    saved_params, saved_check = parameter.RayParams.__init__, utils.get_dashboard_dependency_error

    def params(self, *args, **kwargs) -> None:
        saved_params(self, *args, **kwargs)
        self.no_monitor, self.include_log_monitor = True, False
        for name in _PORTS:
            setattr(self, name, 0)

    parameter.RayParams.__init__ = params
    utils.get_dashboard_dependency_error = lambda: ImportError("a local run serves no dashboard")
    try:
        yield
    finally:
        parameter.RayParams.__init__, utils.get_dashboard_dependency_error = saved_params, saved_check


def per_trial(execution: Any) -> dict[str, float]:
    """What Ray reserves for each trial (CPUs default to its torch threads)."""
    return {"CPU": execution.cpus or execution.threads_per_trial, "GPU": execution.gpus,
            "memory": execution.memory or 0}


_FIELDS = {"CPU": "cpus", "GPU": "gpus", "memory": "memory"}


def trials_at_once(per_trial: dict[str, float], resources: dict[str, float], *, max_parallel: int | str) -> int:
    """Trials at once: ``max_parallel``, or with "auto" as many as the
    cluster's resources fit. Raises when not even one trial fits, since Ray
    would wait for such a task forever."""
    fits = []
    for name, need in per_trial.items():
        if need:
            have = resources.get(name, 0)
            if have < need:
                unit = " bytes" if name == "memory" else ""
                raise ClusterError(f"execution.{_FIELDS[name]}: each trial asks for {need:g}{unit} but the Ray "
                                      f"cluster has {have:g}{unit} in all; lower it or add nodes that have it")
            fits.append(int(have // need))
    if max_parallel != "auto":
        return int(max_parallel)
    return max(1, min(fits or [1]))



def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail in one line when nothing listens at a cluster address: Ray itself
    retries for minutes before giving up."""
    host, port = _host_port(address)
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as err:
        raise ClusterError(f"cannot reach a Ray cluster at {address} ({err}); start one with "
                              "`ray start --head` there, or leave out --address to run locally") from None


# HTTP/2's client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, its client
# server) answers with a SETTINGS frame of its own, frame type 4 in the header's fourth byte
_H2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def _check_speaks_grpc(address: str, timeout: float = 5.0) -> None:
    """Fail in one line when what listens at a cluster address is not Ray (an HTTP server, a
    job server's dashboard port): ``ray.init`` would wait on it forever. Ray's GCS speaks gRPC,
    which answers HTTP/2's greeting within milliseconds. Not checked with Ray's TLS on."""
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return
    host, port = _host_port(address)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as conn:
            conn.sendall(_H2_HELLO)
            answer = conn.recv(64)
    except OSError as err:
        answer, why = b"", f"it did not answer Ray's handshake ({err})"
    else:
        first = answer[:40].decode("ascii", "replace").split("\n")[0].strip()
        why = "it closed the connection" if not answer else f"it answered '{first}', not as Ray's gRPC server does"
    if len(answer) >= 9 and answer[3] == 4:
        return
    web = answer.startswith((b"HTTP/", b"<"))
    hint = (" (a web server; if it is a Ray dashboard, --address wants its cluster's GCS address, HOST:6379 "
            "by default, and `archsearch submit` the http:// one)" if web else "")
    raise ClusterError(f"{address} is not a Ray cluster: {why}{hint}; give the address `ray start --head` "
                          "printed, or leave out --address to run locally")


def _host_port(address: str) -> tuple[str, str]:
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"Ray address '{address}' is not auto, host:port or ray://host:port")
    return host.strip("[]"), port


def _warn_if_open(address: str) -> None:
    """A cluster reached over the network without Ray's token authentication
    runs whatever anyone who can reach its port sends it."""
    host, _ = _host_port(address)
    if host not in LOOPBACK and not _token_mode():
        print(f"warning: joining the Ray cluster at {address} without authentication: anyone who can reach "
              "that port can run code on the cluster; start it with token authentication and set "
              "RAY_AUTH_MODE=token here", file=sys.stderr)


def _token_mode() -> bool:
    return os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
