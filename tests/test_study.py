"""A small study end to end: plan -> embedded Ray -> DuckDB -> report."""

from __future__ import annotations

import json
import re

import pytest

import archsearch as A
from archsearch.execute import run_study
from archsearch_dashboards.report import write_report

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One 3-trial study run twice into one store."""
    import ray

    from tests.conftest import TINY_SPACE, tiny_study_text

    folder = tmp_path_factory.mktemp("study")
    corpus = folder / "corpus"
    corpus.mkdir()
    for i in range(8):
        (corpus / f"doc{i}.txt").write_text(("lorem ipsum dolor sit amet " * 60) + str(i))
    (folder / "space.yaml").write_text(TINY_SPACE)
    (folder / "study.yaml").write_text(tiny_study_text(corpus=corpus))
    study = A.load_study(folder / "study.yaml")
    store = folder / "results.duckdb"
    first = run_study(study, store=store, show_progress=False)
    assert not ray.is_initialized()  # the embedded instance is shut down after the study
    second = run_study(study, store=store, show_progress=False)
    return study, store, first, second


def test_every_trial_completes_into_the_store(finished):
    study, store, first, _ = finished
    assert (first.planned, first.completed, first.failed, first.skipped) == (3, 3, 0, 0)
    with A.open_store(store, read_only=True) as db:
        rows = db.trials(study.name).to_pylist()
        metrics = db.metrics(study.name).to_pylist()
    assert {r["status"] for r in rows} == {"completed"}
    planned = {t.trial_id: t for t in A.plan(study)}
    for row in rows:
        trial = planned[row["trial_id"]]
        assert row["params"] == trial.params and row["match_error"] == pytest.approx(trial.match_error)
        assert json.loads(row["axes"]) == trial.axes
        assert row["val_loss"] < 5.545 and row["tokens"] == 12 * 4 * 16
        assert row["code_version"].startswith(A.__version__)
    assert len(metrics) == 3 * 2  # evaluations at steps 6 and 12


def test_running_again_trains_nothing(finished):
    _, _, _, second = finished
    assert (second.skipped, second.completed, second.failed) == (3, 0, 0)


def test_report_is_self_contained_html(finished, tmp_path):
    study, store, _, _ = finished
    with A.open_store(store, read_only=True) as db:
        path = write_report(db, tmp_path / "r.html", study=study.name)
    page = path.read_text()
    assert "Plotly.newPlot" in page or "plotly" in page.lower()
    assert not re.search(r"<script[^>]+src=\"http", page)  # nothing fetched from the network
    for shape in ("uniform", "cosine", "reverse"):
        assert f"taper.shape={shape}" in page
    assert "Pareto front" in page


def test_failed_trials_are_recorded_and_retried_next_run(tmp_path, corpus):
    from tests.conftest import TINY_SPACE, tiny_study_text

    (tmp_path / "space.yaml").write_text(TINY_SPACE.replace("shape: [uniform, cosine, reverse]", "shape: uniform"))
    # more context than the corpus holds: every attempt fails inside the worker
    text = tiny_study_text(corpus=corpus).replace("seq_len: 16", "seq_len: 60000")
    (tmp_path / "study.yaml").write_text(text)
    study = A.load_study(tmp_path / "study.yaml")
    store = tmp_path / "s.duckdb"
    summary = run_study(study, store=store, show_progress=False)
    assert (summary.completed, summary.failed) == (0, 1)
    with A.open_store(store, read_only=True) as db:
        row = db.trials().to_pylist()[0]
    assert row["status"] == "failed" and "seq_len" in row["error"] and row["attempts"] == 1
    again = run_study(study, store=store, show_progress=False)
    assert (again.skipped, again.failed) == (0, 1)
    with A.open_store(store, read_only=True) as db:
        assert db.trials().to_pylist()[0]["attempts"] == 2
