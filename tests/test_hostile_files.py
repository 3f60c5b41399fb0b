"""The corpus of hostile and odd inputs in tests/hostile/: each ends in one
line naming the file (and line and field where there is one), exit code 2, no
traceback, within a few seconds and a bounded amount of memory.

Each file says what it expects in its first lines, as tests/broken does:
``# expect: <text>`` and, where a field is to blame, ``# field: <dotted field>``;
``# names: <text>`` where the line names another file than the case.
``# make: NAME KIND`` lines ask the test to create ``NAME`` beside the copied
file first, as one of ``MAKERS`` (a named pipe, a symlink to /dev/zero, a
symlink loop, a folder, 100,000 nested lists in 1 MB, an include fan-out).

Every case runs ``archsearch plan`` in a forked child under a time limit and
an address-space limit of 1 GB above what the test process already maps, so
a reader that hangs on a pipe or reads /dev/zero fails the test instead of
the machine.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import resource
import shutil
from pathlib import Path

import pytest

CORPUS = sorted((Path(__file__).parent / "hostile").glob("*.yaml"))
TIME_LIMIT_S = 8  # each case takes well under a second; this catches a hang
MEMORY_LIMIT = 1 << 30  # bytes of address space a case may add


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _loop(path: Path) -> None:
    partner = path.with_name(path.name + ".partner")
    path.symlink_to(partner.name)
    partner.symlink_to(path.name)


def _folder(path: Path) -> None:
    path.mkdir()
    (path / "inside.yaml").write_text("name: inside\n")


def _nested(path: Path) -> None:
    depth = 100_000
    path.write_text("name: deep\nspace: " + "[" * depth + "]" * depth + "\n")  # 200 kB of brackets


def _nested_1mb(path: Path) -> None:
    depth = 499_990
    path.write_text("name: deep\naxes: " + "[" * depth + "]" * depth + "\n")  # 1 MB


def _fanout(path: Path) -> None:
    """Ten includes per file, seven levels: ten million reads if nothing caps them."""
    levels, width = 7, 10
    for level in range(levels):
        for index in range(width):
            body = ""
            if level + 1 < levels:
                body = "include: [" + ", ".join(f"f{level + 1}_{j}.yaml" for j in range(width)) + "]\n"
            (path.parent / f"f{level}_{index}.yaml").write_text(body + f"k{level}_{index}: 1\n")
    path.write_text("include: [" + ", ".join(f"f0_{j}.yaml" for j in range(width)) + "]\n")


MAKERS = {"fifo": _fifo, "dev_zero": _dev_zero, "loop": _loop, "folder": _folder, "nested": _nested,
          "nested_1mb": _nested_1mb, "fanout": _fanout}


def expectations(path: Path) -> tuple[dict[str, str], list[tuple[str, str]]]:
    head = path.read_bytes()[:600].decode("utf-8", "replace")
    return dict(re.findall(r"^# (expect|field|names): (.+)$", head, flags=re.M)), re.findall(
        r"^# make: (\S+) (\S+)$", head, flags=re.M)


def _child(target, args: tuple, send) -> None:
    pages = int(Path("/proc/self/statm").read_text().split()[0])
    mapped = pages * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (mapped + MEMORY_LIMIT, resource.RLIM_INFINITY))
    try:
        send.send(("ok", target(*args)))
    except BaseException as err:  # noqa: BLE001 - the parent reports whatever escaped
        send.send(("raised", (type(err).__name__, str(err)[:500])))


def in_limits(target, *args):
    """``target(*args)`` in a forked child limited in time and added memory: ("ok", its value)
    or ("raised", (exception name, message)); fails the test if the child hangs or dies."""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(target, args, send))
    child.start()
    send.close()
    outcome = receive.recv() if receive.poll(TIME_LIMIT_S) else None
    child.join(1)
    if child.is_alive():
        child.kill()
        child.join()
    assert outcome is not None, f"{target.__name__}{args} ran past {TIME_LIMIT_S} s or died (exit {child.exitcode})"
    return outcome


def _cli(*args: str) -> tuple[int, str]:
    from tests.test_errors import run_cli

    result = run_cli(*args)
    return result.returncode, result.stderr


def run_limited(*args: str) -> tuple[int, str]:
    """``archsearch ARGS`` in a forked child limited in time and memory: (exit code, stderr)."""
    import archsearch.cli  # noqa: F401  (imported once here; each child inherits it)
    import archsearch.planner  # noqa: F401

    status, value = in_limits(_cli, *args)
    return value if status == "ok" else (-1, "Traceback: {}: {}".format(*value))


def assert_one_clean_line(code: int, stderr: str, *, expect: str, name: str, field: str | None = None,
                          line_number: bool = True) -> str:
    assert code == 2, stderr
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    line = lines[0]
    assert expect in line, line
    assert name in line, line
    if field is not None:
        assert f": {field}: " in line, line
        if line_number:
            assert re.search(r":\d+: ", line), f"no line number in: {line}"
    return line


def test_the_corpus_is_large_enough():
    assert len(CORPUS) >= 25


@pytest.mark.parametrize("case", CORPUS, ids=[p.stem for p in CORPUS])
def test_hostile_file_fails_in_one_clear_line(case, tmp_path):
    expected, makes = expectations(case)
    study = tmp_path / case.name
    shutil.copy(case, study)
    for name, kind in makes:
        MAKERS[kind](tmp_path / name)
    code, stderr = run_limited("plan", str(study))
    assert_one_clean_line(code, stderr, expect=expected["expect"], name=expected.get("names", case.name),
                          field=expected.get("field"))


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "loop", "folder", "nested_1mb", "fanout"])
def test_the_study_path_itself_may_be_hostile(kind, tmp_path):
    """`archsearch plan X` where X is a pipe, /dev/zero, a loop, a folder, a deep file or a fan-out."""
    study = tmp_path / "study.yaml"
    MAKERS[kind](study)
    expect = {"fifo": "is a named pipe", "dev_zero": "is a device", "loop": "is a symlink loop",
              "folder": "is a directory", "nested_1mb": "nest deeper than", "fanout": "more than 64 files"}[kind]
    code, stderr = run_limited("plan", str(study))
    assert_one_clean_line(code, stderr, expect=expect, name=study.name if kind != "fanout" else ".yaml:",
                          line_number=False)


def test_unquoted_exponents_are_numbers(tmp_path):
    """YAML 1.1 reads 3e-3 and 1e9 as text; a study means numbers, so they load as numbers
    while the same values in quotes are refused (the corpus's quoted_* cases)."""
    import archsearch as A

    study = tmp_path / "study.yaml"
    study.write_text("name: exponents\nspace:\n  axes:\n    num_layers: 2\n    taper:\n      ratio: 2e0\n"
                     "budget:\n  targets: [2e4, 30_000]\n  tolerance: 5e-2\n"
                     "recipe:\n  lr: 3e-3\n  tokens: 1e9\n")
    loaded = A.load_study(study)
    assert loaded.recipe.lr == 0.003 and loaded.recipe.tokens == 10**9
    assert loaded.budget.target_list() == [20000.0, 30000.0] and loaded.budget.tolerance == 0.05
    assert loaded.space.axes.taper.ratio.values == [2.0]


def test_the_docs_state_the_limits_the_code_holds():
    from archsearch.space import _yaml, expand, load

    text = (Path(__file__).resolve().parents[1] / "docs" / "spaces.md").read_text()
    section = text[text.index("## Limits"):text.index("## Budgets")]
    for value in (_yaml.MAX_FILE_BYTES, _yaml.MAX_DEPTH, _yaml.MAX_VALUES, load.MAX_INCLUDE_DEPTH,
                  load.MAX_INCLUDE_READS, expand.MAX_POINTS, expand.MAX_TRIALS):
        assert f"{value:,}" in section, f"docs/spaces.md Limits does not give {value:,}"


def test_the_memory_limit_bites():
    """The harness itself: a case that takes 2 GB fails inside the child instead of succeeding."""
    status, value = in_limits(bytearray, 2 << 30)
    assert (status, value[0]) == ("raised", "MemoryError")


def test_a_valid_study_plans_in_the_same_harness(tmp_path):
    """The positive control: the harness and ``plan`` succeed on a study that is fine, so the
    corpus's failures are the files', not the harness's."""
    study = tmp_path / "study.yaml"
    study.write_text("name: fine\nspace:\n  axes:\n    num_layers: 2\nbudget:\n  targets: [5.0e+4]\n"
                     "  tolerance: 0.05\n")
    code, stderr = run_limited("plan", str(study))
    assert code == 0 and "Traceback" not in stderr, stderr
