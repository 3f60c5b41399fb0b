"""studies/zoo_smoke.yaml: one small trial of every family trains through Ray
and the report shows them side by side."""

from __future__ import annotations

from pathlib import Path

import pytest
from archsearch_dashboards.report import write_report

import archsearch as A
from archsearch.execute import run_study
from archsearch.space.schema import FAMILIES

pytestmark = [pytest.mark.slow, pytest.mark.ray]

ROOT = Path(__file__).resolve().parents[1]


def test_every_family_trains_and_is_reported(tmp_path):
    study = A.load_study(ROOT / "studies" / "zoo_smoke.yaml")
    assert {t.spec.family for t in A.plan(study)} == set(FAMILIES)
    summary = run_study(study, store=tmp_path / "zoo.duckdb", show_progress=False)
    assert (summary.completed, summary.failed) == (len(FAMILIES), 0)
    with A.open_store(tmp_path / "zoo.duckdb", read_only=True) as db:
        rows = db.trials(study.name).to_pylist()
        page = write_report(db, tmp_path / "zoo.html", study=study.name).read_text()
    for row in rows:
        assert row["val_loss"] < 5.0, row["family"]  # chance on bytes is 5.55
    assert "Side by side" in page
    for family in FAMILIES:
        assert f"family={family}" in page
