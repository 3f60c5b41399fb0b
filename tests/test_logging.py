"""A run sends each trained trial's config and curves to TensorBoard, W&B
(offline here) and MLflow (a file store here), named by study, arm and
trial; a backend asked for but not installed stops the run in one line; one
that breaks mid-run is dropped with a note, never the study."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import archsearch as A
from archsearch.cli import app
from archsearch.errors import SpecError
from archsearch.execute.logs import Loggers, LoggingError, arm_name, path_part, trial_loggers, with_log_to
from archsearch.space.running import Logging
from tests.conftest import TINY_SPACE, tiny_study_text

SHAPES = ("uniform", "cosine", "reverse")


def _installed(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def _study(folder: Path, corpus: Path, logging: str = "") -> Path:
    (folder / "space.yaml").write_text(TINY_SPACE)
    path = folder / "study.yaml"
    path.write_text(tiny_study_text(corpus=corpus) + logging)
    return path


def _corpus(folder: Path) -> Path:
    """The conftest corpus (12 small documents), for a module-scoped run."""
    folder.mkdir()
    words = "the quick brown fox jumps over the lazy dog while a small model learns to count".split()
    for i in range(12):
        (folder / f"doc{i:02d}.txt").write_text(" ".join(words[(i + j) % len(words)] for j in range(400)) + "\n")
    return folder


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory):
    """One `archsearch run` of the 3-trial tiny study with every backend that is installed:
    TensorBoard always (its folder moved by --log-to), W&B offline and MLflow (a file store)
    where they are."""
    pytest.importorskip("tensorboard")
    folder = tmp_path_factory.mktemp("logged")
    logging = f"logging:\n  tensorboard:\n    dir: {folder / 'not-here'}\n"
    if _installed("wandb"):
        logging += f"  wandb:\n    project: tests\n    mode: offline\n    dir: {folder}\n"
    if _installed("mlflow"):
        logging += f"  mlflow:\n    tracking_uri: file://{folder / 'mlruns'}\n"
    path = _study(folder, _corpus(folder / "corpus"), logging)
    store = folder / "s.duckdb"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for a database store unless told
        patch.setenv("WANDB_SILENT", "true")
        done = CliRunner().invoke(app, ["run", str(path), "--store", str(store), "--no-progress", "--report",
                                        str(folder / "report.html"), "--log-to", f"tensorboard={folder / 'tb'}"])
    assert done.exit_code == 0, done.output
    assert not (folder / "not-here").exists()  # --log-to tensorboard=DIR moved the study's folder
    with A.open_store(store, read_only=True) as db:
        trials = [{**row, "axes": json.loads(row["axes"])} for row in db.trials().to_pylist()]
        curves, train = {}, {}
        for row in db.metrics().to_pylist():
            curves.setdefault(row["trial_id"], []).append(row)
        for row in db.sql("SELECT * FROM train_points ORDER BY trial_id, step").to_pylist():
            train.setdefault(row["trial_id"], []).append(row)
    assert [t["status"] for t in trials] == ["completed"] * len(SHAPES)
    return folder, trials, curves, train


@pytest.mark.ray
@pytest.mark.slow
def test_tensorboard_holds_every_trials_curve_under_study_arm_and_trial(logged_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder, trials, curves, train = logged_run
    seen = set()
    for trial in trials:
        (run,) = (folder / "tb" / "tiny").glob(f"*/{trial['trial_id']}")
        assert run.parent.name.startswith(f"transformer,num_layers=2,taper.shape={trial['axes']['taper.shape']},")
        events = EventAccumulator(str(run))
        events.Reload()
        points = events.Scalars("eval/val_loss")
        curve = curves[trial["trial_id"]]
        assert [p.step for p in points] == [row["tokens"] for row in curve]
        assert [p.value for p in points] == pytest.approx([row["val_loss"] for row in curve], rel=1e-6)
        assert {"eval/train_loss", "eval/val_accuracy", "eval/lr"} <= set(events.Tags()["scalars"])
        losses = events.Scalars("train/train_loss")  # the training rows, every recipe.log_every steps
        assert train[trial["trial_id"]] and [p.step for p in losses] == [r["tokens"] for r in train[trial["trial_id"]]]
        assert [p.value for p in losses] == pytest.approx([r["train_loss"] for r in train[trial["trial_id"]]], rel=1e-6)
        config = events.Tensors("config")[0].tensor_proto.string_val[0].decode()
        assert json.loads(config.strip("`\n"))["trial_id"] == trial["trial_id"]
        status = events.Tensors("status")[0].tensor_proto.string_val[0].decode()
        assert status == "completed"
        seen.add(run.parent.name)
    assert len(seen) == len(SHAPES)  # one arm folder per taper shape


def _wandb_records(path: Path) -> list:
    """The records of a W&B run file: W&B's LevelDB-style log (a 7-byte file header, then
    32 KiB blocks of chunks, each with a 7-byte header: crc, length, type)."""
    from wandb.proto import wandb_internal_pb2

    data, records, pending, at = path.read_bytes(), [], b"", 7
    assert data[:4] == b":W&B"
    while at + 7 <= len(data):
        room = 32768 - at % 32768
        if room < 7:  # a block's tail too short for a header is padding
            at += room
            continue
        _, length, kind = struct.unpack("<IHB", data[at:at + 7])
        pending += data[at + 7:at + 7 + length]
        at += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
        elif kind == 0:
            break
    return records


@pytest.mark.ray
@pytest.mark.slow
def test_wandb_offline_has_a_run_per_trial_with_its_config_and_curve(logged_run):
    pytest.importorskip("wandb")
    folder, trials, curves, _ = logged_run
    for trial in trials:
        (path,) = (folder / "wandb").glob(f"offline-run-*-tiny-{trial['trial_id']}/run-*.wandb")
        records = _wandb_records(path)
        of = {kind: [getattr(r, kind) for r in records if r.WhichOneof("record_type") == kind]
              for kind in ("run", "history", "summary")}
        run = of["run"][0]
        assert run.run_group == "tiny" and run.project == "tests"
        assert run.job_type.startswith(f"transformer num_layers=2 taper.shape={trial['axes']['taper.shape']} ")
        assert run.display_name == f"{run.job_type}/{trial['trial_id'][:8]}"
        assert _items(run.config.update)["trial_id"] == trial["trial_id"]
        rows = [row for row in map(_items, (h.item for h in of["history"])) if "eval/val_loss" in row]
        curve = curves[trial["trial_id"]]
        assert [row["tokens"] for row in rows] == [point["tokens"] for point in curve]
        assert [row["eval/val_loss"] for row in rows] == pytest.approx([point["val_loss"] for point in curve])
        summary = {}
        for update in of["summary"]:
            summary.update(_items(update.update))
        assert summary["status"] == "completed" and summary["result/val_loss"] == pytest.approx(trial["val_loss"])


def _items(items) -> dict:
    """W&B's key/JSON items (a config, a history row, a summary) as a dict."""
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


@pytest.mark.ray
@pytest.mark.slow
def test_mlflow_has_a_finished_run_per_trial_tagged_by_study_arm_and_trial(logged_run):
    pytest.importorskip("mlflow")
    from mlflow import MlflowClient

    folder, trials, curves, _ = logged_run
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        client = MlflowClient(tracking_uri=f"file://{folder / 'mlruns'}")
        experiment = client.get_experiment_by_name("tiny")
        for trial in trials:
            (run,) = client.search_runs([experiment.experiment_id],
                                        filter_string=f"tags.`archsearch.trial_id` = '{trial['trial_id']}'")
            assert run.info.status == "FINISHED" and run.data.tags["archsearch.status"] == "completed"
            assert run.data.tags["archsearch.study"] == "tiny"
            assert run.data.tags["archsearch.arm"].startswith("transformer num_layers=2 taper.shape=")
            assert run.data.params["axes.taper.shape"] == trial["axes"]["taper.shape"]
            history = client.get_metric_history(run.info.run_id, "eval/val_loss")
            curve = curves[trial["trial_id"]]
            history = sorted((m.step, m.value) for m in history)
            assert [step for step, _ in history] == [row["tokens"] for row in curve]
            assert [value for _, value in history] == pytest.approx([row["val_loss"] for row in curve])
            assert run.data.metrics["result/val_loss"] == pytest.approx(trial["val_loss"])


class _Recording:
    def __init__(self):
        self.calls = []

    def start(self, trial, config):
        self.calls.append(("start", trial, config))

    def log(self, trial_id, kind, row):
        self.calls.append(("log", trial_id, kind, row))

    def end(self, trial_id, status, result):
        self.calls.append(("end", trial_id, status, result))

    def close(self):
        self.calls.append(("close",))


class _Broken(_Recording):
    def log(self, trial_id, kind, row):
        raise ConnectionError("the tracking server went away")


def test_a_backend_that_breaks_is_dropped_with_one_note_and_the_others_go_on():
    notes, kept, broken = [], _Recording(), _Broken()
    loggers = Loggers({"mlflow": broken, "tensorboard": kept}, warn=notes.append)
    loggers.start("trial", {"a": 1})
    for tokens in (64, 128):
        loggers.log("t1", "train", {"step": 1, "tokens": tokens, "train_loss": 2.0})
    loggers.end("t1", "completed", {"val_loss": 1.0})
    loggers.close()
    assert notes == ["logging to mlflow stopped: ConnectionError: the tracking server went away; "
                     "the store keeps every result"]
    assert [call[0] for call in kept.calls] == ["start", "log", "log", "end", "close"]
    assert [call[0] for call in broken.calls] == ["start"]


def test_a_backend_asked_for_but_missing_stops_the_run_with_its_install_line(monkeypatch, tmp_path, corpus):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now raises ImportError
    with pytest.raises(LoggingError, match=r"logging.wandb needs the wandb package: pip install 'archsearch\[wandb\]'"):
        trial_loggers(Logging.model_validate({"wandb": {}}), study="tiny")
    path = _study(tmp_path, corpus)
    store = tmp_path / "s.duckdb"
    done = CliRunner().invoke(app, ["run", str(path), "--store", str(store), "--log-to", "wandb", "--no-progress"])
    assert done.exit_code == 2, done.output
    assert done.output.strip() == "error: logging.wandb needs the wandb package: pip install 'archsearch[wandb]'"
    assert not store.exists()  # stopped before the store, the lock or Ray


@pytest.mark.parametrize(("section", "message"), [
    ("logging:\n  tensorbord: {}\n", "tensorbord"),
    ("logging:\n  wandb:\n    mode: onlin\n", "mode"),
    ("logging:\n  tensorboard:\n    dir: ''\n", "dir"),
], ids=["typo", "mode", "empty-dir"])
def test_a_wrong_logging_section_is_refused_naming_its_line(tmp_path, corpus, section, message):
    path = _study(tmp_path, corpus, section)
    with pytest.raises(SpecError) as caught:
        A.load_study(path)
    assert str(caught.value).startswith(f"{path}:") and message in str(caught.value)
    assert "logging" in str(caught.value)


def test_log_to_adds_a_backend_and_overrides_only_the_key_it_names():
    study = Logging.model_validate({"wandb": {"project": "mine", "mode": "offline"}, "tensorboard": {"dir": "tb"}})
    merged = with_log_to(study, ["wandb=other", "mlflow=file:///tmp/mlruns", "tensorboard"])
    assert merged.wandb.project == "other" and merged.wandb.mode == "offline"
    assert merged.mlflow.tracking_uri == "file:///tmp/mlruns" and merged.mlflow.experiment is None
    assert merged.tensorboard.dir == "tb"
    assert with_log_to(Logging(), ["tensorboard"]).tensorboard.dir == "runs"
    for bad, said in (("neptune", "unknown backend 'neptune'"), ("wandb=", "needs a value")):
        with pytest.raises(SpecError, match=said):
            with_log_to(Logging(), [bad])


def test_a_bad_log_to_exits_2_before_anything_runs(tmp_path, corpus):
    path = _study(tmp_path, corpus)
    done = CliRunner().invoke(app, ["run", str(path), "--store", str(tmp_path / "s.duckdb"), "--log-to", "neptune"])
    assert done.exit_code == 2 and "--log-to neptune: unknown backend 'neptune'" in done.output
    assert not (tmp_path / "s.duckdb").exists()


def test_arm_names_are_the_trials_axes_and_folder_safe(tiny_study):
    trials = A.plan(A.load_study(tiny_study))
    names = [arm_name(t) for t in trials]
    # a uniform taper's ratio is 1 whatever was written
    assert names == ["transformer num_layers=2 taper.shape=uniform taper.ratio=1.0",
                     "transformer num_layers=2 taper.shape=cosine taper.ratio=3.0",
                     "transformer num_layers=2 taper.shape=reverse taper.ratio=3.0"]
    assert path_part("hybrid hybrid.pattern=MA/MA x") == "hybrid,hybrid.pattern=MA_MA,x"


def test_tensorboard_logs_training_rows_under_train_and_ends_an_open_trial_as_interrupted(tiny_study, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trial = A.plan(A.load_study(tiny_study))[1]
    loggers = trial_loggers(Logging.model_validate({"tensorboard": {"dir": str(tmp_path / "tb")}}), study="tiny")
    loggers.start(trial, trial.to_dict())
    rows = [dict(step=step, tokens=64 * step, train_loss=5.0 - step / 10, lr=1e-3 * step, tokens_per_s=900.0 + step)
            for step in (1, 2, 3)]
    for row in rows:
        loggers.log(trial.trial_id, "train", row)
    loggers.close()
    (run,) = (tmp_path / "tb" / "tiny").glob(f"*/{trial.trial_id}")
    events = EventAccumulator(str(run))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"train/train_loss", "train/lr", "train/tokens_per_s"}
    points = events.Scalars("train/train_loss")
    assert [p.step for p in points] == [64, 128, 192]
    assert [p.value for p in points] == pytest.approx([4.9, 4.8, 4.7])
    assert events.Tensors("status")[0].tensor_proto.string_val[0] == b"interrupted"


def test_mlflow_goes_on_in_a_trials_run_when_it_starts_again(tiny_study, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = f"file://{tmp_path / 'mlruns'}"
    trial = A.plan(A.load_study(tiny_study))[0]
    logging = Logging.model_validate({"mlflow": {"tracking_uri": uri, "experiment": "mine"}})
    for tokens, status in ((64, "paused"), (128, "completed")):  # a promotion: paused at a rung, then on
        with trial_loggers(logging, study="tiny") as loggers:
            loggers.start(trial, trial.to_dict())
            loggers.log(trial.trial_id, "eval", dict(step=tokens // 64, tokens=tokens, val_loss=3.0 - tokens / 100))
            loggers.end(trial.trial_id, status, None)
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("mine").experiment_id])
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "eval/val_loss")] == \
        [(64, pytest.approx(2.36)), (128, pytest.approx(1.72))]
    assert run.data.tags["archsearch.status"] == "completed" and run.info.status == "FINISHED"


def test_an_mlflow_server_that_cannot_be_reached_stops_the_run_in_one_line(monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # MLflow's own retries take minutes
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    uri = "http://127.0.0.1:9"  # the discard port: nothing listens
    with pytest.raises(LoggingError, match=rf"^logging.mlflow: cannot open {uri}: ") as caught:
        trial_loggers(Logging.model_validate({"mlflow": {"tracking_uri": uri}}), study="tiny")
    assert "\n" not in str(caught.value)


def test_the_driver_logs_to_tensorboard_without_importing_torch_or_tensorflow(tiny_study, tmp_path):
    """The driver is torch-free: tensorboardX, say, would import torch (it does whenever installed)."""
    pytest.importorskip("tensorboard")
    import subprocess

    code = ("import sys, archsearch as A; from archsearch.execute.logs import trial_loggers;"
            "from archsearch.space.running import Logging;"
            f"loggers = trial_loggers(Logging(tensorboard={{'dir': {str(tmp_path)!r}}}), study='tiny');"
            f"trial = A.plan(A.load_study({str(tiny_study)!r}))[0]; loggers.start(trial, trial.to_dict());"
            "loggers.log(trial.trial_id, 'eval', dict(step=1, tokens=64, val_loss=2.0)); loggers.close();"
            "sys.exit(sorted({'torch', 'tensorflow'} & set(sys.modules)) or None)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert list(tmp_path.glob("tiny/*/*/events.out.tfevents.*"))
