"""The docs' runnable examples run: the guide from an empty folder to a fitted
study, and the README's Python snippet. A block preceded by ``<!-- runnable
-->`` runs (``<!-- runnable: fails -->``: must fail in one line, exit 2); a
block preceded by ``<!-- file: PATH -->`` is written to PATH first."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"<!-- (runnable(?:: fails)?|file: [^ ]+) -->\n```(\w+)\n(.*?)```", re.S)


def blocks(page: Path) -> list[tuple[str, str, str]]:
    """(marker, language, body) of every marked block, in page order."""
    return BLOCK.findall(page.read_text())


def run_block(marker: str, language: str, body: str, cwd: Path) -> None:
    if marker.startswith("file: "):
        target = cwd / marker.removeprefix("file: ")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(body)
        return
    if language == "python":
        # as after the README's install, which brings no pandas (the test extras do)
        hidden = "import sys\nsys.modules['pandas'] = None\n"
        done = subprocess.run([sys.executable, "-c", hidden + body], cwd=cwd, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, f"{body}\n{done.stderr}"
        return
    for line in (l for l in body.splitlines() if l.strip() and not l.startswith("#")):
        words = shlex.split(line)
        assert words[0] == "archsearch", line
        done = subprocess.run([sys.executable, "-m", "archsearch.cli", *words[1:]], cwd=cwd, capture_output=True,
                              text=True, timeout=600)
        if marker == "runnable: fails":
            assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, (line, done.stderr)
        else:
            assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"


def test_the_guide_marks_its_examples():
    found = blocks(ROOT / "docs" / "guide.md")
    assert sum(m.startswith("file:") for m, _, _ in found) == 2
    assert sum(m.startswith("runnable") for m, _, _ in found) >= 8


@pytest.mark.slow
@pytest.mark.ray
def test_the_guide_runs_from_an_empty_folder(tmp_path):
    for marker, language, body in blocks(ROOT / "docs" / "guide.md"):
        run_block(marker, language, body, tmp_path)
    assert (tmp_path / "reports" / "mine.html").exists()


@pytest.mark.slow
@pytest.mark.ray
def test_the_readmes_python_snippet_runs(tmp_path):
    for folder in ("studies", "spaces"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    found = [b for b in blocks(ROOT / "README.md") if b[1] == "python"]
    assert found, "the README's Python API block is marked runnable"
    # the store the snippet reads: the quickstart itself, at a few steps
    run_block("runnable", "bash", "archsearch run studies/quickstart.yaml --set recipe.steps=10 "
                                  "--set recipe.eval_every=5 --set recipe.warmup_steps=2", tmp_path)
    for marker, language, body in found:
        run_block(marker, language, body, tmp_path)
