"""docs/findings/*.md: every generated table equals what tools/findings_tables.py makes of the
results committed in docs/findings/data/, and every verdict follows docs/findings/README.md's rule."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_tool():
    spec = importlib.util.spec_from_file_location("findings_tables", ROOT / "tools" / "findings_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_findings_table_agrees_with_the_committed_data(capsys):
    tool = load_tool()
    assert tool.main(["--check"]) == 0, capsys.readouterr().out
    pages = [p for p in (ROOT / "docs" / "findings").glob("*.md") if "<!-- table " in p.read_text()]
    assert {p.stem for p in pages} >= {"tlm_taper", "persistent_memory"}
    for page in pages:
        assert (ROOT / "docs" / "findings" / "data" / page.stem / "trials.parquet").is_file(), page.stem


def test_a_changed_number_on_a_page_is_caught(tmp_path, monkeypatch, capsys):
    tool = load_tool()
    findings = tmp_path / "docs" / "findings"
    shutil.copytree(ROOT / "docs" / "findings" / "data", findings / "data")
    page = (ROOT / "docs" / "findings" / "persistent_memory.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| ") and " ± " in line)
    edited = row.replace(row.split(" | ")[2], row.split(" | ")[2] + "0", 1)
    (findings / "persistent_memory.md").write_text(page.replace(row, edited))
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    monkeypatch.setattr(tool, "FINDINGS", findings)
    assert tool.main(["--check"]) == 1
    assert "stale: docs/findings/persistent_memory.md" in capsys.readouterr().out
    assert tool.main([]) == 0  # rewriting puts the data's numbers back
    assert tool.main(["--check"]) == 0
    assert (findings / "persistent_memory.md").read_text() == page


def row(difference, low, high, p_holm):
    return SimpleNamespace(difference=difference, low=low, high=high, p_holm=p_holm)


@pytest.mark.parametrize("claim, diff, low, high, p_holm, effect, expected", [
    ("lower", -0.05, -0.08, -0.02, 0.01, None, "held"),
    ("lower", 0.05, 0.02, 0.08, 0.01, None, "contradicted"),
    ("higher", 0.05, 0.02, 0.08, 0.01, None, "held"),
    ("lower", -0.05, -0.08, -0.02, 0.20, None, "inconclusive"),  # excludes zero, not after Holm
    ("lower", -0.01, -0.03, 0.01, 0.40, 0.70, "not supported"),  # the paper's 0.7 lies far outside
    ("lower", -0.01, -0.03, 0.01, 0.40, 0.02, "inconclusive"),  # a 0.02 effect still fits
    ("higher", 0.01, -0.01, 0.03, 0.40, 0.70, "not supported"),
    ("lower", 0.03, 0.01, 0.05, 0.20, 0.10, "not supported"),  # wrong side, not significant, size excluded
])
def test_the_verdict_rule(claim, diff, low, high, p_holm, effect, expected):
    tool = load_tool()
    assert tool.verdict(row(diff, low, high, p_holm), claim=claim, effect=effect) == expected
    assert tool.verdict(row(diff, low, high, p_holm), claim=None, effect=effect) == "—"
