"""Shared fixtures: tiny studies on text the tests write themselves."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

# Triton reads TRITON_INTERPRET once, when it is first imported, and torch may
# import it from any test (torch.compile checks for it): set it for the whole
# session on a machine without an NVIDIA device, so the kernel tests always
# run in the interpreter whatever ran before them.
if not Path("/dev/nvidiactl").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# A suite started in the background of a non-interactive shell (`nohup pytest &`, a batch job)
# inherits SIGINT ignored, and so would every run the tests start: the tests that Ctrl-C a run
# would see it finish instead. A handler (unlike SIG_IGN) is reset to the default in a started
# program, whose Python then turns SIGINT into KeyboardInterrupt as it does under a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

TINY_SPACE = """\
name: tiny

axes:
  family: transformer
  num_layers: 2
  taper:
    shape: [uniform, cosine, reverse]
    ratio: 3.0
model:
  head_dim: 8
"""


def tiny_study_text(*, corpus: Path, targets: str = "[6000]", steps: int = 12) -> str:
    return textwrap.dedent(f"""\
        name: tiny
        space: space.yaml
        budget:
          targets: {targets}
          tolerance: 0.02
        data:
          kind: text
          paths: [{corpus}]
          seq_len: 16
        recipe:
          steps: {steps}
          batch_size: 4
          warmup_steps: 2
          eval_every: 6
          eval_batches: 2
        execution:
          max_parallel: 2
        """)


@pytest.fixture(autouse=True)
def _kernel_settings_restored():
    """The kernel settings (`ARCHSEARCH_KERNELS`, and the ops a preflight or `dispatch.disable`
    turned off, written straight into os.environ) are put back after every test, so one test's
    turned-off kernel never leaks into the next."""
    names = ("ARCHSEARCH_KERNELS", "ARCHSEARCH_KERNELS_DISABLE")
    before = {name: os.environ.get(name) for name in names}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True, scope="session")
def _cpu_kernels_built(request):
    """The C++ CPU kernels, built (or loaded from this environment's cache) once, before the
    first test, as a step of its own that says so: no test pays for a build it did not ask for,
    and the Ray workers and CLI subprocesses of later tests find the builds ready. Where the
    kernels do not run (a CUDA torch, ARCHSEARCH_KERNELS=reference), nothing is built."""
    from archsearch.execute import preflight

    missing = preflight.cpu_builds_missing(None, address=None)
    if not missing:
        return
    from archsearch_kernels.cpu_build import build_all

    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print(f"\nbuilding the C++ CPU kernels for this environment before the tests ({', '.join(missing)}):",
              file=sys.stderr, flush=True)
        build_all(only=missing)


@pytest.fixture(autouse=True, scope="session")
def _token_cache(tmp_path_factory):
    """Every corpus a test opens is cached under one session folder, never in ~/.cache.

    Set in the environment, so CLI subprocesses and Ray workers see it too.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ARCHSEARCH_CACHE", str(tmp_path_factory.mktemp("archsearch-cache")))
        yield


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A folder of small text documents."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    words = "the quick brown fox jumps over the lazy dog while a small model learns to count".split()
    for i in range(12):
        body = " ".join(words[(i + j) % len(words)] for j in range(400))
        (folder / f"doc{i:02d}.txt").write_text(body + "\n")
    return folder


@pytest.fixture
def tiny_study(tmp_path: Path, corpus: Path) -> Path:
    """A 3-trial study (3 taper shapes x 1 target) on the test corpus."""
    (tmp_path / "space.yaml").write_text(TINY_SPACE)
    path = tmp_path / "study.yaml"
    path.write_text(tiny_study_text(corpus=corpus))
    return path
