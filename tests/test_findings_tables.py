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


def test_the_committed_results_name_no_folder_of_a_machine_and_read_the_documented_data():
    """An export names its data by name and checksum (``export --portable``), and every
    checksum is one of the files the findings README says how to download."""
    import duckdb

    readme = (ROOT / "docs" / "findings" / "README.md").read_text()
    for folder in sorted((ROOT / "docs" / "findings" / "data").iterdir()):
        files = folder / "data_files.parquet"
        assert files.is_file(), f"{folder.name}: export it with --portable"
        for name, size, digest in duckdb.sql(f"SELECT * FROM '{files}'").fetchall():
            assert digest is not None and f"`{digest}`" in readme, (folder.name, name)
            assert f"({size:,} bytes)" in readme, (folder.name, name)
        for table in folder.glob("*.parquet"):
            relation = duckdb.sql(f"SELECT * FROM '{table}'")
            for column, kind in zip(relation.columns, relation.types):
                if str(kind) in ("VARCHAR", "JSON"):
                    found = duckdb.sql(f"SELECT count(*) FROM '{table}' WHERE regexp_matches("
                                       f"CAST(\"{column}\" AS VARCHAR), '(^|[\"\\s])/[A-Za-z]')").fetchall()[0][0]
                    assert found == 0, (table.relative_to(ROOT), column)


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


@pytest.mark.parametrize("text, label, expected", [
    (None, "cosine", None),
    ("0.03", "linear", 0.03),  # one size for every arm
    ("cosine:0.03,step_late:0.015", "cosine", 0.03),
    ("cosine:0.03,step_late:0.015", "step_late", 0.015),
    ("cosine:0.03,step_late:0.015", "linear", None),  # an arm the page gives no size for
    ("cosine:0.03", "family=x cosine", 0.03),  # a word of the label
])
def test_the_papers_effect_is_one_size_or_one_per_arm(text, label, expected):
    options = {} if text is None else {"effect": text}
    assert load_tool().effect_of(label, options) == expected


def write_results(folder: Path, trials: list[dict], profiles: list[dict]):
    """A Parquet export of a store with ``trials`` of study ``s`` and their ``layer_profiles`` rows."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True)
    base = {"status": "completed", "sweep_group": None, "sweep_best": False, "match": "params", "target": 1000.0,
            "params": 1000, "train_loss": 1.0, "val_loss": 1.0, "created_at": 0}
    pq.write_table(pa.Table.from_pylist([{**base, **t, "axes": json.dumps(t["axes"])} for t in trials]),
                   folder / "trials.parquet")
    pq.write_table(pa.Table.from_pylist([{"study": "s", "trial_id": t["trial_id"]} for t in trials]),
                   folder / "study_trials.parquet")
    pq.write_table(pa.Table.from_pylist([dict(p, setting=json.dumps(p["setting"]), created_at=0) for p in profiles]),
                   folder / "layer_profiles.parquet")


def test_tables_of_an_analysis_read_its_layer_profiles(tmp_path, monkeypatch):
    """``analysis=prune``: a row per trial and setting, the setting's keys as axes (the calibration's
    seed left out), ``log_`` metrics logged, ``where`` keeping the rows it names."""
    import math

    tool = load_tool()
    findings = tmp_path / "docs" / "findings"
    trials = [{"trial_id": f"t{s}", "family": "gdn", "seed": s, "axes": {"family": "gdn"}} for s in range(4)]
    profiles = []
    for s in range(4):
        for ranking, ppl in (("bi", 10.0 + s), ("rho", (10.0 + s) * (1.5 + 0.01 * s))):
            for removed in (1, 2):
                setting = {"ranking": ranking, "removed": removed, "seed": 0, "batches": 4}
                profiles.append({"trial_id": f"t{s}", "analysis": "prune", "setting": setting, "layer": None,
                                 "metric": "perplexity", "value": ppl * removed})
                profiles.append({"trial_id": f"t{s}", "analysis": "prune", "setting": setting, "layer": 3,
                                 "metric": "dropped", "value": 1.0})
        profiles.append({"trial_id": f"t{s}", "analysis": "rho", "setting": {"mode": "noise", "seed": 0},
                         "layer": 0, "metric": "rho", "value": 2.0})
        for threshold, ppl in ((None, 3.0), (0.5, 3.1 + 0.01 * s)):
            profiles.append({"trial_id": f"t{s}", "analysis": "exit", "setting": {"threshold": threshold},
                             "layer": None, "metric": "perplexity", "value": ppl})
    write_results(findings / "data" / "page", trials, profiles)
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    monkeypatch.setattr(tool, "FINDINGS", findings)

    rows = tool.completed("page", "s", analysis="prune", metrics=("log_perplexity",), where="removed:2").to_pylist()
    assert len(rows) == 8 and all(r["seed"] in range(4) for r in rows)
    bi = next(r for r in rows if r["trial_id"] == "t1" and '"bi"' in r["axes"])
    assert bi["log_perplexity"] == pytest.approx(math.log(22.0))
    assert '"seed"' not in bi["axes"] and '"removed": 2' in bi["axes"]

    lines = tool.compare_table("page", {"study": "s", "analysis": "prune", "metric": "log_perplexity",
                                        "baseline": "bi", "by": "ranking", "within": "removed", "lower": "rho"})
    assert len(lines) == 4  # head, rule, one row per number removed
    assert all("| rho | 4 |" in line and line.endswith("| lower | contradicted |") for line in lines[2:])
    per_layer = tool.arms_table("page", {"study": "s", "analysis": "rho", "by": "family,layer", "metrics": "rho"})
    assert per_layer[2].startswith("| gdn 0 | 4 | 1,000 | 2.0000 ± 0.0000 |")
    exits = tool.compare_table("page", {"study": "s", "analysis": "exit", "metric": "perplexity", "by": "threshold",
                                        "baseline": "none", "where": "threshold:none|0.5"})
    assert len(exits) == 3 and exits[2].startswith("| 0.5 | 4 | +0.1150 ")  # every loop run reads "none"
    single = tool.arms_table("page", {"study": "s", "analysis": "rho", "by": "family,seed", "metrics": "rho"})
    assert single[2] == "| gdn 0 | 1 | 1,000 | 2.0000 ± — |"  # one seed: no interval
    with pytest.raises(ValueError, match="where removed:9"):
        tool.completed("page", "s", analysis="prune", metrics=("perplexity",), where="removed:9")
