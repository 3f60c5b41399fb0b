"""The C++ CPU kernels' builds on a shared machine: named by everything they depend on (so two
Python environments never rebuild over each other's), built once by one process while the
others wait, never stuck on a lock a killed build left, and announced before they start."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from archsearch_kernels import cpu_cache

from archsearch.arch.spec import ArchSpec, LayerSpec
from archsearch.execute import preflight

ROOT = Path(__file__).resolve().parents[1]


def spec(mixer: str) -> ArchSpec:
    layer = LayerSpec(mixer=mixer, mlp="swiglu" if mixer == "attention" else "none", mlp_width=16)
    return ArchSpec(family="tiny", vocab_size=20, d_model=16, num_heads=2, layers=(layer,))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.delenv("ARCHSEARCH_KERNELS", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(preflight, "_no_cuda_here", lambda: True)
    return tmp_path


def fake_build(extension: str, isa: str = "AVX2") -> Path:
    name = cpu_cache.build_name(extension, isa)
    folder = cpu_cache.build_dir(name)
    folder.mkdir(parents=True)
    (folder / f"{name}.so").write_bytes(b"")
    return folder


@pytest.mark.parametrize("changed", ["sources", "torch", "torch_dir", "python", "python_include", "compiler"])
def test_each_input_of_a_build_changes_its_name(changed):
    """Two environments that differ in any one thing a build depends on (another venv's torch
    at another path, another Python, a source edit, another compiler) build under two names."""
    inputs = cpu_cache.build_inputs("elementwise")
    assert set(inputs) == {"sources", "torch", "torch_dir", "python", "python_include", "compiler"}
    other = {**inputs, changed: inputs[changed] + "-other"}
    assert cpu_cache.build_digest(other) != cpu_cache.build_digest(inputs)
    assert cpu_cache.build_name("elementwise", "AVX2", cpu_cache.build_digest(other)) != \
        cpu_cache.build_name("elementwise", "AVX2", cpu_cache.build_digest(inputs))


def test_the_name_follows_the_kernel_sources_and_this_environment(monkeypatch):
    inputs = cpu_cache.build_inputs("ssd")
    import torch

    assert inputs["torch"] == torch.__version__
    assert inputs["torch_dir"] == os.path.realpath(os.path.dirname(torch.__file__))
    monkeypatch.setenv("CXX", "g++")
    assert cpu_cache.build_inputs("ssd")["compiler"] == "g++"
    assert cpu_cache.build_digest(cpu_cache.build_inputs("ssd")) != cpu_cache.build_digest(inputs)


def test_an_edit_to_one_ops_source_renames_its_own_extension_only(tmp_path, monkeypatch):
    """A change to ssd/cpu.py (a docstring will do) rebuilds the SSD scan and nothing else; one to
    cpu_build.py (the prelude and flags every extension compiles with) rebuilds them all."""
    import shutil

    copy = tmp_path / "archsearch_kernels"
    shutil.copytree(cpu_cache.HERE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(cpu_cache, "HERE", copy)
    names = {name: cpu_cache.build_name(name, "AVX2") for name in cpu_cache.SOURCES}
    assert len(set(names.values())) == len(names)
    (copy / "ssd" / "cpu.py").write_text((copy / "ssd" / "cpu.py").read_text() + "\n# an edit\n")
    renamed = {name for name in names if cpu_cache.build_name(name, "AVX2") != names[name]}
    assert renamed == {"ssd"}
    (copy / "cpu_build.py").write_text((copy / "cpu_build.py").read_text() + "\n# an edit\n")
    assert all(cpu_cache.build_name(name, "AVX2") != names[name] for name in names)


def test_each_extension_digests_the_files_that_hold_its_kernels():
    """`SOURCES` (told without importing torch) names, for each extension, the op folders whose
    cpu.py registers a part of it: every registered C++ source is in one of its files."""
    from archsearch_kernels import cpu_build, dispatch  # noqa: F401  (imports every cpu.py)

    extensions = {extension.name: extension for extension in cpu_build._ALL}
    assert set(cpu_cache.SOURCES) <= set(extensions) and set(cpu_cache.SOURCES) == set(cpu_cache.EXTENSIONS)
    for name, folders in cpu_cache.SOURCES.items():
        texts = [(cpu_cache.HERE / folder / "cpu.py").read_text() for folder in folders]
        for op, part in extensions[name]._parts.items():
            assert any(part.source in text for text in texts), f"{name}: {op}'s source is in none of {folders}"


def test_a_build_is_found_in_its_own_folder_for_its_isa(cache):
    assert not cpu_cache.is_built("elementwise")
    folder = fake_build("elementwise")
    assert folder.parent == cache / "archsearch"
    assert cpu_cache.is_built("elementwise") and cpu_cache.is_built("elementwise", "AVX2")
    assert not cpu_cache.is_built("elementwise", "AVX512")  # another vector ISA's build is not this one
    assert not cpu_cache.is_built("selective_scan")


def test_a_run_builds_ahead_what_its_trials_need_and_nothing_once_built(cache):
    assert preflight.cpu_builds_missing([spec("attention")], address=None) == ["elementwise"]
    assert preflight.cpu_builds_missing([spec("mamba")], address=None) == ["elementwise", "selective_scan"]
    assert preflight.cpu_builds_missing([spec("mamba2")], address=None) == ["elementwise", "ssd"]
    assert preflight.cpu_builds_missing([spec("gated_deltanet")], address=None) == ["elementwise", "gated_delta"]
    assert preflight.cpu_builds_missing(None, address=None) == ["elementwise", "selective_scan", "ssd",
                                                                "gated_delta"]  # sampled
    fake_build("elementwise")
    assert preflight.cpu_builds_missing([spec("attention")], address=None) == []
    assert preflight.cpu_builds_missing([spec("mamba")], address=None) == ["selective_scan"]
    assert preflight.cpu_builds_missing([spec("mamba"), spec("mamba2")], address=None) == ["selective_scan", "ssd"]


def test_nothing_is_built_ahead_where_the_kernels_would_not_run_here(cache, monkeypatch):
    assert preflight.cpu_builds_missing(None, address="auto") == []  # a cluster's nodes build their own
    monkeypatch.setenv("ARCHSEARCH_KERNELS", "reference")
    assert preflight.cpu_builds_missing(None, address=None) == []
    monkeypatch.setenv("ARCHSEARCH_KERNELS", "auto")
    monkeypatch.setattr(preflight, "_no_cuda_here", lambda: False)  # a CUDA torch: Triton, not C++
    assert preflight.cpu_builds_missing(None, address=None) == []


def test_the_announced_duration_is_the_last_build_here(cache):
    assert cpu_cache.expected_seconds("elementwise") == (cpu_cache.FIRST_GUESS_S["elementwise"], False)
    cpu_cache.record_seconds("elementwise", 71.4)
    assert cpu_cache.expected_seconds("elementwise") == (71, True)


def lock_build(name: str, *, torch_dir: str | None, days_unused: float = 0) -> Path:
    """A build `name` in the cache as a process leaves it: its folder (with the inputs it was
    built from, `torch_dir` among them, where given) and its lock file, last used `days_unused` ago."""
    folder = cpu_cache.build_dir(name)
    folder.mkdir(parents=True)
    (folder / f"{name}.so").write_bytes(b"x" * 4096)
    if torch_dir is not None:
        (folder / cpu_cache.INPUTS_FILE).write_text(json.dumps({"torch_dir": torch_dir}))
    lock = folder.parent / f"{name}.lock"
    lock.write_text("process 4242")
    used = time.time() - days_unused * 86400
    os.utime(lock, (used, used))
    return folder


def test_a_new_build_removes_the_builds_no_environment_uses_and_keeps_the_rest(cache, tmp_path):
    """Builds whose torch folder is gone (a deleted venv) and builds no process has loaded for
    UNUSED_DAYS go; the one just built, those in use (recent, or their lock held) stay, one
    line says what went."""
    torch_here = str(tmp_path / "venv" / "torch")
    os.makedirs(torch_here)
    gone = str(tmp_path / "deleted-venv" / "torch")
    days = cpu_cache.UNUSED_DAYS
    builds = {"deleted_venv": lock_build("archsearch_a_avx2_1", torch_dir=gone),
              "unused": lock_build("archsearch_b_avx2_2", torch_dir=torch_here, days_unused=days + 1),
              "unused_unrecorded": lock_build("archsearch_c_avx2_3", torch_dir=None, days_unused=days + 1),
              "in_use": lock_build("archsearch_d_avx2_4", torch_dir=torch_here, days_unused=days - 1),
              "unrecorded": lock_build("archsearch_e_avx2_5", torch_dir=None),
              "held": lock_build("archsearch_f_avx2_6", torch_dir=gone),
              "just_built": lock_build("archsearch_g_avx2_7", torch_dir=gone)}
    lines = []
    with open(builds["held"].parent / "archsearch_f_avx2_6.lock") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a process loading it now
        removed = cpu_cache.remove_stale_builds(keep="archsearch_g_avx2_7", say=lines.append)
    assert sorted(removed) == ["archsearch_a_avx2_1", "archsearch_b_avx2_2", "archsearch_c_avx2_3"]
    left = {why for why, folder in builds.items() if folder.exists()}
    assert left == {"in_use", "unrecorded", "held", "just_built"}
    locks = sorted(p.name for p in (cache / "archsearch").glob("*.lock"))
    assert locks == [f"{name}.lock" for name in ("archsearch_d_avx2_4", "archsearch_e_avx2_5",
                                                    "archsearch_f_avx2_6", "archsearch_g_avx2_7")]
    assert lines == [f"archsearch: removed 3 C++ kernel builds no environment here uses any more (0.0 MiB) "
                     f"from {cache / 'archsearch'}"]
    # once no process holds it, the build of the deleted venv goes too
    assert cpu_cache.remove_stale_builds(keep="archsearch_g_avx2_7", say=lines.append) == ["archsearch_f_avx2_6"]
    assert cpu_cache.remove_stale_builds(keep="archsearch_g_avx2_7", say=lines.append) == [] and len(lines) == 2


def test_a_build_recorded_its_inputs_and_a_load_marks_it_used(cache):
    name = cpu_cache.build_name("elementwise", "AVX2")
    with cpu_cache.build_lock(name, say=print) as folder:
        cpu_cache.record_inputs("elementwise", folder)
    lock = folder.parent / f"{name}.lock"
    os.utime(lock, (0, 0))
    assert json.loads((folder / cpu_cache.INPUTS_FILE).read_text()) == cpu_cache.build_inputs("elementwise")
    with cpu_cache.build_lock(name, say=print):
        pass
    assert time.time() - lock.stat().st_mtime < 60


def test_a_process_waiting_on_a_build_lock_that_is_removed_takes_the_new_one(cache):
    """A process waits on a build's lock while another removes that build (holding the lock, as
    `remove_stale_builds` does): once it has the lock, the waiter must hold the file the name
    leads to now, so a third process cannot build beside it."""
    name = cpu_cache.build_name("elementwise", "AVX2")
    path = cpu_cache.build_dir(name).parent / f"{name}.lock"
    path.parent.mkdir(parents=True)
    remover = open(path, "a+")
    fcntl.flock(remover, fcntl.LOCK_EX)
    holding, done, lines = threading.Event(), threading.Event(), []

    def waiter():
        with cpu_cache.build_lock(name, say=lines.append):
            holding.set()
            done.wait(10)

    thread = threading.Thread(target=waiter)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not lines:  # it has opened the lock and waits
            assert time.monotonic() < deadline
            time.sleep(0.02)
        path.unlink()
        remover.close()
        assert holding.wait(10)
        with open(path, "a+") as third:
            with pytest.raises(BlockingIOError):
                fcntl.flock(third, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        done.set()
        thread.join()


def test_the_cache_holds_the_build_the_extension_loaded():
    """After the session's build (tests/conftest.py), `is_built` finds it under this ISA."""
    from archsearch_kernels import cpu_build

    if not cpu_build.ELEMENTWISE.available("rms_norm"):
        pytest.skip("the C++ kernels do not build here")
    assert cpu_cache.is_built("elementwise", cpu_build.capability())


PROBE = textwrap.dedent('''
    import sys
    import torch
    from archsearch_kernels import cpu_build

    SOURCE = "at::Tensor twice(const at::Tensor& x) { return x * 2; }"
    probe = cpu_build.Extension("probe")
    probe.add("twice", SOURCE, ["twice"], lambda m: None if torch.equal(m.twice(torch.ones(3)), torch.full((3,), 2.0))
              else "twice is wrong")
    assert probe.available("twice"), probe.build_error("twice")
    print("loaded", file=sys.stderr)
''')


def _start(root: Path, log: Path, **env: str) -> subprocess.Popen:
    environment = {**os.environ, "TORCH_EXTENSIONS_DIR": str(root), **env}
    if "CXX" not in env:
        environment.pop("CXX", None)
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-c", PROBE], cwd=ROOT, env=environment, stdout=out, stderr=out)


def _wait_for(log: Path, text: str, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


@pytest.mark.slow
def test_two_environments_build_once_each_and_a_killed_builds_lock_is_taken_over(tmp_path, monkeypatch):
    """On one cache (one machine's ~/.cache): a build in progress (this test holds its lock, and
    the lock file torch's builder writes) makes two processes of one environment wait, each
    saying for whom; the holder then dies without cleaning up (the lock released, torch's lock
    file left) and exactly one of them takes over, removes that file, saying so, and compiles,
    while the other loads its build. Another environment (another compiler) builds its own
    folder and leaves the first one's untouched; the first environment then loads without a
    compile. Checked by the build folders' files, not by time."""
    root = tmp_path / "cache"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    monkeypatch.delenv("CXX", raising=False)
    from archsearch_kernels import cpu_build

    name = cpu_cache.build_name("probe", cpu_build.capability())
    folder = cpu_cache.build_dir(name)
    folder.mkdir(parents=True)
    holder = open(folder.parent / f"{name}.lock", "w")
    fcntl.flock(holder, fcntl.LOCK_EX)
    holder.write("process 4242")
    holder.flush()
    (folder / "lock").write_text("")  # torch's FileBaton: every later torch build would wait on it forever

    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    first, second = (_start(root, log) for log in logs)
    try:
        for process, log in zip((first, second), logs):
            _wait_for(log, f"waiting for process 4242 that is building {name}", process)
        holder.close()  # the build "killed": the system releases its lock, torch's lock file stays
        assert first.wait(timeout=600) == 0 and second.wait(timeout=600) == 0, [log.read_text() for log in logs]
    finally:
        for process in (first, second):
            process.kill()
    texts = [log.read_text() for log in logs]
    assert all("loaded" in text for text in texts), texts
    assert sum(text.count("archsearch: compiling the C++ CPU kernels (probe)") for text in texts) == 1, texts
    assert sum(text.count("removed the lock file of an earlier build") for text in texts) == 1, texts
    assert not (folder / "lock").exists()
    (built,) = folder.glob(f"{name}*.so")
    stamp = built.stat().st_mtime_ns

    other_log = tmp_path / "other.log"
    other = _start(root, other_log, CXX="g++")
    assert other.wait(timeout=600) == 0, other_log.read_text()
    assert "compiling the C++ CPU kernels (probe)" in other_log.read_text()
    folders = sorted(p.name for p in (root / "archsearch").iterdir() if p.is_dir())
    assert len(folders) == 2 and name in folders  # its own folder beside the first environment's
    assert built.stat().st_mtime_ns == stamp

    again_log = tmp_path / "again.log"
    again = _start(root, again_log)
    assert again.wait(timeout=600) == 0, again_log.read_text()
    assert "compiling" not in again_log.read_text() and "loaded" in again_log.read_text()
    assert built.stat().st_mtime_ns == stamp
