"""The DuckDB store: register, finish, fail, read back as Arrow, export Parquet."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

import archsearch as A
from archsearch.errors import StoreError


def trial_row(trial_id: str) -> dict:
    spec = {"family": "transformer", "layers": []}
    return dict(trial_id=trial_id, spec=spec, axes={"taper.shape": "cosine"}, seed=0, match="params",
                target=1000.0, params=1004, total_params=2000, flops_per_token=1e4, match_error=0.004,
                d_model=16, num_layers=2, recipe={"steps": 1}, data={"kind": "text"})


RESULT = dict(train_loss=2.0, val_loss=2.5, val_accuracy=0.25, steps=10, tokens=640, wall_time_s=1.0, tokens_per_s=640.0,
              curve=[dict(step=5, tokens=320, train_loss=3.0, val_loss=3.1, val_accuracy=0.1, lr=1e-3),
                     dict(step=10, tokens=640, train_loss=2.0, val_loss=2.5, val_accuracy=0.25, lr=1e-4)])


def test_round_trip(tmp_path):
    with A.open_store(tmp_path / "s.duckdb") as store:
        store.add_study(name="s", path="s.yaml", config={"name": "s"})
        store.add_trials("s", [trial_row("a"), trial_row("b")])
        store.finish("a", RESULT)
        store.fail("b", "ValueError: boom")
        assert store.completed_ids() == {"a"}
        rows = {r["trial_id"]: r for r in store.trials("s").to_pylist()}
        assert rows["a"]["status"] == "completed" and rows["a"]["val_loss"] == 2.5
        assert rows["b"]["status"] == "failed" and "boom" in rows["b"]["error"]
        assert rows["a"]["code_version"].startswith(A.__version__)
        assert store.metrics("s").num_rows == 2
        assert store.studies().to_pylist()[0]["completed"] == 1
        files = store.export_parquet(tmp_path / "pq")
    assert pq.read_table(tmp_path / "pq" / "trials.parquet").num_rows == 2
    assert len(files) == 4


def test_registering_again_keeps_finished_results(tmp_path):
    with A.open_store(tmp_path / "s.duckdb") as store:
        store.add_study(name="s", path="s.yaml", config={})
        store.add_trials("s", [trial_row("a")])
        store.finish("a", RESULT)
        store.add_trials("s", [trial_row("a")])
        assert store.trials("s").to_pylist()[0]["status"] == "completed"


def test_reading_a_missing_store_says_how_to_fix(tmp_path):
    with pytest.raises(StoreError, match="run a study first"):
        A.open_store(tmp_path / "none.duckdb", read_only=True)


def test_a_learning_rate_sweep_keeps_every_run_and_marks_the_best(tmp_path):
    with A.open_store(tmp_path / "s.duckdb") as store:
        store.add_study(name="s", path="s.yaml", config={})
        rows = [dict(trial_row(name), sweep_group="g1") for name in ("lo", "mid", "hi")]
        store.add_trials("s", rows + [trial_row("alone")])
        for name, loss in (("lo", 3.0), ("mid", 2.2), ("hi", 2.9), ("alone", 2.0)):
            store.finish(name, dict(RESULT, val_loss=loss))
        best = {r["trial_id"]: r["sweep_best"] for r in store.trials("s").to_pylist()}
    assert best == {"lo": False, "mid": True, "hi": False, "alone": None}


def test_a_store_from_another_schema_is_refused(tmp_path):
    import duckdb

    path = tmp_path / "old.duckdb"
    duckdb.connect(str(path)).execute("CREATE TABLE trials (trial_id VARCHAR)").close()
    with pytest.raises(StoreError, match="another version"):
        A.open_store(path)


def test_each_changed_version_of_a_study_is_kept(tmp_path):
    with A.open_store(tmp_path / "s.duckdb") as store:
        assert store.add_study(name="s", path="s.yaml", config={"seeds": [0]}, text="seeds: [0]\n") == 1
        assert store.add_study(name="s", path="s.yaml", config={"seeds": [0]}, text="seeds: [0]\n") == 1
        assert store.add_study(name="s", path="s.yaml", config={"seeds": [0, 1]}, text="seeds: [0, 1]\n") == 2
        versions = store.study_versions("s").to_pylist()
    assert [v["version"] for v in versions] == [1, 2]
    assert [v["text"] for v in versions] == ["seeds: [0]\n", "seeds: [0, 1]\n"]


def test_a_grown_grid_keeps_every_trial_id_it_had(tmp_path):
    """More axis values, another target or seed: the old trials keep their
    ids, so a rerun trains only the new ones."""
    (tmp_path / "space.yaml").write_text("name: s\naxes:\n  family: transformer\n  num_layers: [1, 2]\n"
                                         "model: {head_dim: 8}\n")
    study = tmp_path / "study.yaml"
    base = "name: g\nspace: space.yaml\nbudget: {targets: [%s], tolerance: 0.05}\nseeds: %s\n"
    study.write_text(base % ("20000", "[0]"))
    before = {t.trial_id for t in A.plan(A.load_study(study))}
    (tmp_path / "space.yaml").write_text("name: s\naxes:\n  family: transformer\n  num_layers: [1, 2, 3]\n"
                                         "model: {head_dim: 8}\n")
    study.write_text(base % ("20000, 40000", "[0, 1]"))
    after = {t.trial_id for t in A.plan(A.load_study(study))}
    assert before < after and len(after) == 3 * 2 * 2


def test_layer_profiles_replace_one_setting_and_keep_the_others(tmp_path):
    path = tmp_path / "s.duckdb"
    with A.open_store(path) as store:
        assert store.layer_profiles().num_rows == 0
        rows = [dict(setting={"mode": "noise"}, layer=i, metric="rho", value=0.5 + i) for i in range(3)]
        store.record_profile("a", "rho", rows + [dict(setting={"mode": "int8"}, layer=None, metric="spearman",
                                                      value=0.9)])
        store.record_profile("a", "rho", [dict(setting={"mode": "noise"}, layer=0, metric="rho", value=2.0)])
        got = store.layer_profiles("a", "rho").to_pylist()
    assert [(r["layer"], r["metric"], r["value"]) for r in got] == [(None, "spearman", 0.9), (0, "rho", 2.0)]
    assert '"mode"' in got[1]["setting"]


def test_a_store_made_before_layer_profiles_gains_the_table_on_first_write(tmp_path):
    path = tmp_path / "old.duckdb"
    with A.open_store(path) as store:
        store.db.execute("DROP TABLE layer_profiles")
    with A.open_store(path, read_only=True) as store:
        assert store.layer_profiles().num_rows == 0
    with A.open_store(path) as store:
        store.record_profile("a", "bi", [dict(layer=1, metric="bi", value=0.0)])
        assert store.layer_profiles(analysis="bi").num_rows == 1
