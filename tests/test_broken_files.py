"""The corpus of broken study files in tests/broken/: each ends in one line
naming file, line and field with a hint, exit code 2, no traceback.

Each file says what it expects in its first lines: ``# expect: <text>`` and,
where a field is to blame, ``# field: <dotted field>``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_errors import run_cli

CORPUS = sorted((Path(__file__).parent / "broken").glob("*.yaml"))


def expectations(path: Path) -> dict[str, str]:
    head = path.read_bytes()[:400].decode("utf-8", "replace")
    return dict(re.findall(r"^# (expect|field): (.+)$", head, flags=re.M))


def test_the_corpus_is_large_enough():
    assert len(CORPUS) >= 30


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_broken_file_fails_in_one_clear_line(path):
    expected = expectations(path)
    result = run_cli("plan", str(path))
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert "Traceback" not in result.stderr
    assert expected["expect"] in line, line
    assert path.name in line or "nowhere.yaml" in line, line
    if "field" in expected:
        assert f": {expected['field']}: " in line, line
        assert re.search(r"\.yaml:\d+: ", line), f"no line number in: {line}"
