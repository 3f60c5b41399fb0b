"""Where the C++ CPU kernels' builds live, what names them, and the lock that builds each once.

Told without importing torch, so that a run's driver (which needs no torch on a CPU) can ask
`is_built` and build ahead what is missing.

A build is named by everything that makes it differ (`build_inputs`): its kernels' C++ sources
and flags (the files that hold them, and no other op's), torch's version and the folder its
headers come from, Python's version and headers, and the compiler. Two virtual environments on one machine (each
with its own torch) therefore each build once into folders of their own, instead of rebuilding
over each other's, and a torch upgrade or a source change builds anew under a new name.

Builds live under torch's extension cache (``TORCH_EXTENSIONS_DIR``, default
``~/.cache/torch_extensions``), in ``archsearch/NAME/``. `build_lock` serialises the processes
building one name with an advisory lock (``NAME.lock`` beside the folder) that the system
releases when its holder exits, however it exits: a second process waits for the first and then
loads its build; a lock file that torch's own builder left behind when a build was killed is
removed by the next build, with a line that says so.

The lock file is rewritten each time a process loads its build, so its modification time says
when the build was last used. Each new build removes the builds that no environment can load any
more (the torch folder they were compiled against is gone: a deleted venv or checkout) or that
none has loaded for `UNUSED_DAYS` days, one line naming how many and the space freed
(`remove_stale_builds`): a machine that many venvs and checkouts come and go on keeps the builds
in use and not every build ever made.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
# every C++ extension, by what its ops are (for the lines that announce a build)
EXTENSIONS = {"elementwise": "RMSNorm, SwiGLU, rotary heads, causal conv, softplus", "selective_scan": "Mamba's scan",
              "ssd": "Mamba-2's SSD scan", "gated_delta": "Gated DeltaNet's delta rule"}
# the op folders whose cpu.py each extension compiles: a build's name digests these and cpu_build.py
# alone, so editing one op's file rebuilds its own extension only (tests/test_cpu_builds.py holds this
# to what each cpu.py registers)
SOURCES = {"elementwise": ("causal_conv", "rmsnorm", "rope", "softplus", "swiglu"), "selective_scan": ("selective_scan",),
           "ssd": ("ssd",), "gated_delta": ("gated_delta",)}
# each extension's expected build time where none was measured here yet (2 idle cores, seconds)
FIRST_GUESS_S = {"elementwise": 40, "selective_scan": 40, "ssd": 40, "gated_delta": 40}
TIMES_FILE = "build_times.json"  # in the cache's archsearch folder: how long each extension's last build took
INPUTS_FILE = "inputs.json"  # in each build's folder: its `build_inputs`, to tell when its environment is gone
UNUSED_DAYS = 30  # a build that no process has loaded for this long is removed by the next build


def build_inputs(extension: str) -> dict[str, str]:
    """What a build of `extension` depends on beside the CPU's vector ISA (in its name apart):
    its sources and flags (a digest of cpu_build.py and the cpu.py of each of its ops, `SOURCES`),
    torch's version and package folder (its headers and libraries), Python's version and header
    folder, the compiler."""
    digest = hashlib.sha256()
    for path in [HERE / "cpu_build.py", *(HERE / folder / "cpu.py" for folder in SOURCES.get(extension, ()))]:
        digest.update(path.relative_to(HERE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "none"
    spec = importlib.util.find_spec("torch")  # finds the package without importing it
    torch_dir = os.path.realpath(next(iter(spec.submodule_search_locations or []), "")) if spec else ""
    return {"sources": digest.hexdigest(), "torch": torch_version, "torch_dir": torch_dir,
            "python": sys.version.split()[0], "python_include": sysconfig.get_paths()["include"],
            "compiler": os.environ.get("CXX", "c++")}


def build_digest(inputs: dict[str, str]) -> str:
    """A short digest of one extension's `build_inputs`."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:12]


def build_name(extension: str, isa: str, digest: str | None = None) -> str:
    """The module name `extension` compiles under for the vector `isa` in this environment."""
    return f"archsearch_{extension}_{isa.lower()}_{digest or build_digest(build_inputs(extension))}"


def extensions_root() -> Path:
    """torch's extension cache: ``TORCH_EXTENSIONS_DIR``, else the user cache's torch_extensions."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not root:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(cache, "torch_extensions")
    return Path(os.path.realpath(root))


def build_dir(name: str) -> Path:
    """The folder a build named `name` compiles into."""
    return extensions_root() / "archsearch" / name


def is_built(extension: str, isa: str = "*") -> bool:
    """Whether this environment's build of `extension` (for `isa`, any by default) is in the cache."""
    name = build_name(extension, isa)
    return any(glob.glob(str(build_dir(name) / f"{name}*.so")))


def expected_seconds(extension: str) -> tuple[int, bool]:
    """How long a build of `extension` should take here: the last build's time on this machine
    (True), else a first guess for 2 idle cores (False)."""
    try:
        times = json.loads((extensions_root() / "archsearch" / TIMES_FILE).read_text())
        return max(1, round(float(times[extension]))), True
    except (OSError, ValueError, KeyError, TypeError):
        return FIRST_GUESS_S.get(extension, 60), False


def record_seconds(extension: str, seconds: float) -> None:
    """Keep how long `extension`'s build took, for the next announcement (best effort)."""
    path = extensions_root() / "archsearch" / TIMES_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        times = json.loads(path.read_text()) if path.exists() else {}
        times = {**(times if isinstance(times, dict) else {}), extension: round(seconds, 1)}
        part = path.with_name(f"{path.name}.{os.getpid()}")
        part.write_text(json.dumps(times, sort_keys=True))
        os.replace(part, path)
    except (OSError, ValueError):
        pass


def record_inputs(extension: str, folder: Path) -> None:
    """Keep, in a new build's `folder`, what it was built from (best effort), for `remove_stale_builds`."""
    try:
        (folder / INPUTS_FILE).write_text(json.dumps(build_inputs(extension), sort_keys=True))
    except OSError:
        pass


def _open_lock(path: Path, *, say: Callable[[str], None], name: str):
    """The lock file `path` opened and held: waiting, with a line, while another process holds it,
    and opening it again if a process removed it meanwhile (`remove_stale_builds`)."""
    while True:
        lock = open(path, "a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            say(f"archsearch: waiting for {holder} that is building {name}")
            began = time.monotonic()
            fcntl.flock(lock, fcntl.LOCK_EX)
            say(f"archsearch: that build ended after {time.monotonic() - began:.0f} s; loading it")
        if _names(path, lock.fileno()):
            return lock
        lock.close()


def _names(path: Path, fd: int) -> bool:
    """Whether `path` still names the file open on `fd`."""
    try:
        named = os.stat(path)
    except OSError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


@contextmanager
def build_lock(name: str, *, say: Callable[[str], None]) -> Iterator[Path]:
    """Hold the lock of build `name` (waiting, with a line, while another process holds it);
    yields its build folder, rid of a lock file a killed build left there."""
    folder = build_dir(name)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _open_lock(folder.parent / f"{name}.lock", say=say, name=name) as lock:
        folder.mkdir(exist_ok=True)
        lock.seek(0)
        lock.truncate()
        lock.write(f"process {os.getpid()}")
        lock.flush()
        # torch's builder marks a build in progress with this file and waits while it exists; we
        # hold the lock, so no build of this name runs: one that is there was left by a killed build
        stale = folder / "lock"
        if stale.exists():
            stale.unlink(missing_ok=True)
            say(f"archsearch: removed the lock file of an earlier build of {name} that was killed part-way")
        yield folder


def remove_stale_builds(*, keep: str, say: Callable[[str], None]) -> list[str]:
    """Remove every build in the cache, `keep` and those a process holds apart, that no environment
    can load any more (the torch folder in its `INPUTS_FILE` is gone) or that no process has loaded
    for `UNUSED_DAYS` days (its lock file's age); one line says how many and the space freed.
    Each is removed while its lock is held, so a process that opened the lock meanwhile finds the
    name gone once it has the lock, and opens the new one. Returns the names removed."""
    root = extensions_root() / "archsearch"
    removed, freed = [], 0
    oldest = time.time() - UNUSED_DAYS * 86400
    for path in sorted(root.glob("archsearch_*.lock")):
        name = path.name[:-len(".lock")]
        folder = root / name
        if name == keep:
            continue
        try:
            lock = open(path, "a+")
        except OSError:  # another user's cache folder, or gone
            continue
        with lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # refused while a process builds or loads it
            except OSError:
                continue
            if not _names(path, lock.fileno()) or not (os.fstat(lock.fileno()).st_mtime < oldest
                                                       or _environment_gone(folder)):
                continue
            freed += _size(folder)
            shutil.rmtree(folder, ignore_errors=True)
            path.unlink(missing_ok=True)
            removed.append(name)
    if removed:
        say(f"archsearch: removed {len(removed)} C++ kernel build{'s' * (len(removed) > 1)} no environment here "
            f"uses any more ({freed / 2**20:.1f} MiB) from {root}")
    return removed


def _size(folder: Path) -> int:
    """The bytes of the files under `folder` (0 where it cannot be read)."""
    total = 0
    for base, _, files in os.walk(folder):
        for file in files:
            try:
                total += os.lstat(os.path.join(base, file)).st_size
            except OSError:
                pass
    return total


def _environment_gone(folder: Path) -> bool:
    """Whether the build in `folder` was compiled against a torch folder that no longer exists."""
    try:
        torch_dir = json.loads((folder / INPUTS_FILE).read_text())["torch_dir"]
    except (OSError, ValueError, KeyError, TypeError):  # a build from before its inputs were kept: age alone
        return False
    return bool(torch_dir) and not os.path.isdir(torch_dir)


__all__ = ["EXTENSIONS", "SOURCES", "build_digest", "build_dir", "build_inputs", "build_lock", "build_name",
           "expected_seconds", "extensions_root", "is_built", "record_inputs", "record_seconds",
           "remove_stale_builds"]
