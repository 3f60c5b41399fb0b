"""The DuckDB store: register, finish, fail, read back as Arrow, export Parquet."""

from __future__ import annotations

import hashlib
import json

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
    assert [f.stem for f in files] == ["studies", "study_versions", "trials", "study_trials", "metrics", "train_points",
                                       "trial_rungs", "search_proposals", "fidelity_ladders", "layer_profiles"]


def test_a_portable_export_names_no_folder_of_this_machine_and_checks_its_data(tmp_path, monkeypatch):
    here, away = tmp_path / "project", tmp_path / "scratch's"  # a quote in a path must not break the SQL
    (here / "data").mkdir(parents=True)
    away.mkdir()
    (here / "data" / "a.txt").write_bytes(b"abc")
    (away / "b.txt").write_bytes(b"")
    inside, outside = str(here / "data" / "a.txt"), str(away / "b.txt")
    gone = str(tmp_path / "gone" / "c.txt")
    data = {"kind": "text", "paths": [inside, outside, gone], "cache_dir": str(away / "cache")}
    with A.open_store(tmp_path / "s.duckdb") as store:
        store.add_study(name="s", path=str(here / "studies" / "s.yaml"), config={"data": data})
        store.add_trials("s", [dict(trial_row("a"), data=data)])
        store.finish("a", RESULT)
        monkeypatch.chdir(here)
        files = store.export_parquet(tmp_path / "pq", portable=True)
        plain = store.export_parquet(tmp_path / "plain")
    assert files[-1].name == "data_files.parquet" and len(plain) == len(files) - 1
    text = "".join(str(pq.read_table(f).to_pylist()) for f in files)
    assert str(tmp_path) not in text  # every path of this machine is gone, JSON or not
    trial = pq.read_table(tmp_path / "pq" / "trials.parquet").to_pylist()[0]
    assert json.loads(trial["data"])["paths"] == ["data/a.txt", "b.txt", "c.txt"]
    assert json.loads(trial["data"])["cache_dir"] == "cache"
    assert pq.read_table(tmp_path / "pq" / "studies.parquet").to_pylist()[0]["path"] == "studies/s.yaml"
    assert pq.read_table(tmp_path / "pq" / "data_files.parquet").to_pylist() == [
        {"name": "data/a.txt", "bytes": 3, "sha256": hashlib.sha256(b"abc").hexdigest()},
        {"name": "b.txt", "bytes": 0, "sha256": hashlib.sha256(b"").hexdigest()},
        {"name": "c.txt", "bytes": None, "sha256": None}]
    assert inside in str(pq.read_table(tmp_path / "plain" / "trials.parquet").to_pylist())  # the default keeps them


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


def test_a_finished_trial_lands_whole_or_not_at_all(tmp_path, monkeypatch):
    """Row and curve are one transaction: a failure while writing the curve
    leaves the trial unfinished, with no curve (planted mutation: committing
    the row before the curve leaves it `completed` without one)."""
    from archsearch.store import writes

    with A.open_store(tmp_path / "s.duckdb") as store:
        store.add_study(name="s", path="s.yaml", config={})
        store.add_trials("s", [trial_row("a")])

        def broken(trial_id, row):
            raise OSError("disk gone")

        monkeypatch.setattr(writes, "_metric_row", broken)
        with pytest.raises(OSError):
            store.finish("a", RESULT)
        monkeypatch.undo()
        assert store.trials("s").to_pylist()[0]["status"] == "planned"
        assert store.metrics("s").num_rows == 0


def test_points_of_a_training_trial_are_readable_and_replaced_by_its_curve(tmp_path):
    with A.open_store(tmp_path / "s.duckdb") as store:
        store.add_study(name="s", path="s.yaml", config={})
        store.add_trials("s", [trial_row("a")])
        store.mark_running("a")
        store.add_points([("a", RESULT["curve"][0])])
        assert [r["step"] for r in store.metrics("s").to_pylist()] == [5]
        store.add_points([("a", RESULT["curve"][0])])  # a retried attempt reports the step again
        store.finish("a", RESULT)
        assert [r["step"] for r in store.metrics("s").to_pylist()] == [5, 10]


@pytest.mark.parametrize("loss", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_a_non_finite_final_loss_is_diverged_never_completed(tmp_path, loss):
    import json

    with A.open_store(tmp_path / "s.duckdb") as store:
        store.add_study(name="s", path="s.yaml", config={})
        store.add_trials("s", [dict(trial_row(n), sweep_group="g") for n in ("good", "bad")])
        store.finish("good", dict(RESULT, val_loss=3.0))
        curve = [dict(RESULT["curve"][0]), dict(RESULT["curve"][1], val_loss=loss)]
        assert store.finish("bad", dict(RESULT, val_loss=loss, curve=curve)) == "diverged"
        rows = {r["trial_id"]: r for r in store.trials("s").to_pylist()}
        assert store.completed_ids() == {"good"}
        assert rows["bad"]["status"] == "diverged" and f"val_loss is {loss}" in rows["bad"]["error"]
        assert rows["good"]["sweep_best"] and not rows["bad"]["sweep_best"]
        assert store.studies().to_pylist()[0]["diverged"] == 1
        text = json.dumps({"trials": store.trials("s").to_pylist(), "metrics": store.metrics("s").to_pylist()},
                          default=str, allow_nan=False)  # raises on NaN or inf
    assert "diverged" in text


def test_a_store_and_a_read_only_store_work_side_by_side_in_one_process(tmp_path):
    """Issue 8 item 15: open_store(...) then a read-only open (as
    inspect.load_trained does) used to raise duckdb's 'different configuration'."""
    with A.open_store(tmp_path / "s.duckdb") as writer:
        writer.add_study(name="s", path="s.yaml", config={})
        with A.open_store(tmp_path / "s.duckdb", read_only=True) as reader:
            writer.add_trials("s", [trial_row("a")])
            assert reader.trials("s").num_rows == 1


def test_a_reader_waits_out_another_process_writing(tmp_path, monkeypatch):
    """A write lock held by another process delays a read instead of failing it. The holder
    lets go only once the reader has met its lock and backed off (its first wait), so the read
    always waits, and never by a sleep that a loaded machine could outlast."""
    import subprocess
    import sys

    from archsearch.store import duck

    path = tmp_path / "s.duckdb"
    with A.open_store(path) as store:
        store.add_study(name="s", path="s.yaml", config={})
    holder = subprocess.Popen([sys.executable, "-c", (
        "import duckdb, sys\n"
        f"con = duckdb.connect({str(path)!r})\n"
        "print('held', flush=True)\n"
        "sys.stdin.readline()\n"
        "con.close()\n"
        "print('released', flush=True)\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    waits: list[float] = []
    real_sleep = duck.time.sleep

    def back_off(seconds: float) -> None:
        if not waits:  # the reader met the lock: now let the holder go
            holder.stdin.write("go\n")
            holder.stdin.flush()
            assert holder.stdout.readline().strip() == "released"
        waits.append(seconds)
        real_sleep(seconds)

    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(duck.time, "sleep", back_off)
        with A.open_store(path, read_only=True) as reader:
            assert reader.studies().num_rows == 1
        assert waits, "the reader never met the holder's lock"
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(timeout=30)


def test_running_trials_of_a_dead_run_read_as_interrupted(tmp_path):
    from archsearch.store import RunLock

    path = tmp_path / "s.duckdb"
    with A.open_store(path) as store:
        store.add_study(name="s", path="s.yaml", config={})
        store.add_trials("s", [trial_row("a")])
        with RunLock(path, study="s"):
            store.mark_running("a")
            assert store.trials("s").to_pylist()[0]["status"] == "running"
        # the run is gone (its lock with it): what it left running is interrupted
        assert store.trials("s").to_pylist()[0]["status"] == "interrupted"
        assert store.studies().to_pylist()[0]["interrupted"] == 1
        with RunLock(path, study="s"):
            assert store.mark_interrupted() == 1


def test_a_second_run_on_a_store_refuses_in_one_line(tmp_path):
    from archsearch.store import RunLock

    path = tmp_path / "s.duckdb"
    with RunLock(path, study="first"):
        with pytest.raises(StoreError, match=r"being written by another run \(study 'first', pid \d+") as err:
            with RunLock(path, study="second", wait_s=0.1):
                pass
    assert "\n" not in str(err.value)
    with RunLock(path, study="second"):  # free again once the first is done
        pass


def test_two_stores_never_share_checkpoint_folders(tmp_path):
    from archsearch.store import checkpoint_dir

    assert checkpoint_dir(tmp_path / "cp.duckdb", "t") != checkpoint_dir(tmp_path / "cp.db", "t")
    shared = tmp_path / "shared"
    one = checkpoint_dir(tmp_path / "a" / "cp.duckdb", "t", storage=shared)
    other = checkpoint_dir(tmp_path / "b" / "cp.duckdb", "t", storage=shared)
    assert one != other and one.is_relative_to(shared) and one.name == "t"


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


def test_an_interrupted_query_reaches_the_caller_as_keyboard_interrupt(tmp_path, monkeypatch):
    """Ctrl-C during a DuckDB statement comes back from DuckDB as "Query
    interrupted"; the store turns it into the KeyboardInterrupt the CLI
    answers with exit 130 and the resume command."""
    store = A.open_store(tmp_path / "s.duckdb")
    with pytest.raises(KeyboardInterrupt):
        with store.transaction() as con:
            con.execute("SELECT 1")
            raise RuntimeError("Query interrupted")
    with pytest.raises(RuntimeError, match="other"):
        with store.transaction():
            raise RuntimeError("other")
    assert store.trials().num_rows == 0  # the store is still usable
