"""Every command that opens a store ends a store the user got wrong (none
there, not a DuckDB file, a folder, another schema version) or a study the
store does not hold in one line and exit 2, without a traceback.

Before StoreError was a user's error these exited 1 (and `--study nosuch`
showed an empty table or a misleading message); each case here fails then."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from tests.analysis_support import write_store

# name: the command's arguments; STORE and STUDY stand for the store and a study file
COMMANDS = {
    "status": ["status", "--store", "STORE"],
    "ls": ["ls", "--store", "STORE"],
    "fit": ["fit", "--store", "STORE"],
    "pareto": ["pareto", "--store", "STORE"],
    "compare": ["compare", "--baseline", "transformer", "--store", "STORE"],
    "report": ["report", "-o", "OUT/r.html", "--store", "STORE"],
    "export": ["export", "--parquet", "OUT/parquet", "--store", "STORE"],
    "dashboard": ["dashboard", "--store", "STORE"],
    "run": ["run", "STUDY", "--store", "STORE", "--no-progress"],
    "resume": ["resume", "STUDY", "--store", "STORE", "--no-progress"],
    "analyze-rho": ["analyze", "rho", "t0", "--store", "STORE"],
    "analyze-prune": ["analyze", "prune", "t0", "--store", "STORE"],
    "analyze-wanda": ["analyze", "wanda", "t0", "--store", "STORE"],
    "analyze-exit": ["analyze", "exit", "t0", "--store", "STORE"],
    "analyze-probe": ["analyze", "probe", "t0", "--store", "STORE"],
}
WITH_STUDY = ["status", "ls", "fit", "pareto", "compare", "report"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("stores")
    good = write_store(folder / "good.duckdb")
    newer = write_store(folder / "newer.duckdb")
    con = duckdb.connect(str(newer))
    con.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    con.close()
    junk = folder / "junk.duckdb"
    junk.write_text("study,val_loss\nscaling,3.1\n")
    (folder / "a-folder").mkdir()
    return {"good": good, "missing": folder / "none.duckdb", "not-duckdb": junk, "a-folder": folder / "a-folder",
            "newer-schema": newer}


def one_line(args: list[str], store: Path, study: Path, out: Path) -> str:
    """Run ``archsearch ARGS``; expect exit 2 and one line of error, no traceback; return that line."""
    swap = {"STORE": str(store), "STUDY": str(study)}
    result = CliRunner().invoke(app, [swap.get(a, a.replace("OUT", str(out))) for a in args])
    assert isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize("command, kind", [(c, k) for c in COMMANDS
                                            for k in ("missing", "not-duckdb", "a-folder", "newer-schema")
                                            if (c, k) != ("run", "missing")])  # run makes a new store
def test_a_store_it_cannot_read_is_one_line_and_exit_2(command, kind, stores, tiny_study, tmp_path):
    line = one_line(COMMANDS[command], stores[kind], tiny_study, tmp_path)
    assert str(stores[kind]) in line
    assert "--store" in line or "archsearch run" in line, line  # how to fix it


@pytest.mark.parametrize("command", WITH_STUDY)
def test_a_study_not_in_the_store_is_one_line_and_exit_2(command, stores, tiny_study, tmp_path):
    line = one_line([*COMMANDS[command], "--study", "scalin"], stores["good"], tiny_study, tmp_path)
    assert "study 'scalin' is not in" in line and "it holds 'scaling'; did you mean 'scaling'?" in line


def test_resume_of_a_study_the_store_lacks_says_to_run_it(stores, tiny_study, tmp_path):
    line = one_line(COMMANDS["resume"], stores["good"], tiny_study, tmp_path)
    assert "study 'tiny' is not in" in line and f"start it with `archsearch run {tiny_study}`" in line


def test_a_trial_not_in_the_store_is_one_line_and_exit_2(stores, tiny_study, tmp_path):
    line = one_line(["analyze", "rho", "t99", "--store", "STORE"], stores["good"], tiny_study, tmp_path)
    assert "no trial t99" in line


def test_a_cluster_address_of_the_wrong_form_is_one_line_and_exit_2(stores, tiny_study, tmp_path):
    """A ClusterError is the user's to fix, like a bad file (it exited 1 before)."""
    line = one_line(["run", "STUDY", "--store", str(tmp_path / "new.duckdb"), "--address", "head-node",
                     "--no-progress"], stores["good"], tiny_study, tmp_path)
    assert line == "error: Ray address 'head-node' is not auto, host:port or ray://host:port"
