"""A small study end to end: plan -> embedded Ray -> DuckDB -> report."""

from __future__ import annotations

import json
import re

import pytest
from archsearch_dashboards.report import write_report

import archsearch as A
from archsearch.execute import run_study

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
    """The report of a real run: its six views and plotly.js inline (nothing
    fetched), one table row per completed trial, best first, with the store's
    params and losses, and "yes" on exactly the trials a hand computation puts
    on the (val_loss, params) front. tests/test_report.py adds the sweep-best
    filter. Fails on the mutations ``reverse=True`` in ``_table``'s sort (worst
    first) and ``r['params']`` -> ``r['total_params']`` in its cells."""
    from tests.test_report import on_front_by_hand, trials_table

    study, store, _, _ = finished
    with A.open_store(store, read_only=True) as db:
        path = write_report(db, tmp_path / "r.html", study=study.name)
        rows = [r for r in db.trials(study.name).to_pylist() if r["status"] == "completed"]
    page = path.read_text()
    assert page.count('class="plotly-graph-div"') == 7  # report.views
    assert not re.search(r"<script[^>]+src=\"http", page)  # nothing fetched from the network
    for shape in ("uniform", "cosine", "reverse"):
        assert f"taper.shape={shape}" in page
    table = trials_table(page)
    by_id = {r["trial_id"]: r for r in rows}
    assert len(table) == len(rows) == 3 and {row["trial"] for row in table} == set(by_id)
    assert [row["trial"] for row in table] == [r["trial_id"] for r in sorted(rows, key=lambda r: r["val_loss"])]
    for row in table:
        stored = by_id[row["trial"]]
        assert row["params"] == f"{stored['params']:,}" and row["val loss"] == f"{stored['val_loss']:.4f}"
        assert row["taper.shape"] == json.loads(stored["axes"])["taper.shape"]
    assert {row["trial"] for row in table if row["front"] == "yes"} == on_front_by_hand(rows)


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


def test_a_preempted_trial_resumes_from_its_checkpoint(tmp_path, corpus):
    """Stop a trial at its second evaluation (as a preemption would), then
    run the study: the trial picks up the checkpoint the driver points it at
    (training's own tests show a resume is exact; here the saved weights are
    nudged, so only a run that really resumed can end elsewhere than a fresh
    one); the trained model reloads from the store."""
    import torch

    from archsearch.inspect import load_trained
    from archsearch.store import checkpoint_dir
    from archsearch.train import train_trial
    from tests.conftest import TINY_SPACE, tiny_study_text

    (tmp_path / "space.yaml").write_text(TINY_SPACE.replace("shape: [uniform, cosine, reverse]", "shape: uniform"))
    (tmp_path / "study.yaml").write_text(tiny_study_text(corpus=corpus))
    study = A.load_study(tmp_path / "study.yaml")
    (trial,) = A.plan(study)
    store = tmp_path / "s.duckdb"
    folder = checkpoint_dir(store, trial.trial_id)

    class Preempted(Exception):
        pass

    def stop(row):  # the second evaluation: the first one's checkpoint is on disk
        if row["step"] > 6:
            raise Preempted

    with pytest.raises(Preempted):
        train_trial(spec=trial.spec, recipe=trial.recipe, data=trial.data, seed=trial.seed, checkpoint_dir=folder,
                    on_eval=stop)
    from safetensors.torch import load_file, save_file

    (saved,) = folder.glob("step-*/model.safetensors")
    weights = load_file(saved)
    save_file({name: w + 0.05 * torch.randn_like(w) for name, w in weights.items()}, saved)
    fresh = train_trial(spec=trial.spec, recipe=trial.recipe, data=trial.data, seed=trial.seed)
    run_study(study, store=store, show_progress=False)
    with A.open_store(store, read_only=True) as db:
        row = db.trials().to_pylist()[0]
    assert row["status"] == "completed" and row["val_loss"] != fresh.val_loss
    model = load_trained(trial.trial_id, store=store)
    tokens = torch.randint(0, 256, (1, 8))
    assert model(tokens).shape == (1, 8, 256)


def test_an_unreachable_cluster_fails_fast_in_one_line(tiny_study, tmp_path):
    from archsearch.errors import ArchsearchError

    with pytest.raises(ArchsearchError, match="cannot reach a Ray cluster at 127.0.0.1:1"):
        run_study(A.load_study(tiny_study), store=tmp_path / "s.duckdb", address="127.0.0.1:1",
                  show_progress=False)
