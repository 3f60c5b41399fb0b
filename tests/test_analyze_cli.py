"""`archsearch analyze ...` on tiny trials trained here (no Ray): rows shown and stored, user errors in one line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import archsearch as A
from archsearch.arch.spec import ArchSpec, LayerSpec
from archsearch.cli import app
from archsearch.space.schema import Recipe
from archsearch.space.training import TextData
from archsearch.store import checkpoint_dir
from archsearch.train import train_trial

STACK = ArchSpec(family="transformer", vocab_size=256, d_model=16, num_heads=2,
                 layers=tuple(LayerSpec(mlp_width=32) for _ in range(4)))
LOOPED = ArchSpec(family="looped", vocab_size=256, d_model=16, num_heads=2, structure="looped",
                  options={"loops": 3, "exit_gate": True, "inject": True}, layers=(LayerSpec(mlp_width=32),))


def trained(store, spec: ArchSpec, trial_id: str, corpus) -> None:
    """Train ``spec`` a few steps into the store's checkpoint folder and register it as completed."""
    recipe = Recipe(steps=8, batch_size=4, lr=3e-3, warmup_steps=2, eval_every=8, eval_batches=1).model_dump()
    data = TextData(paths=[str(corpus)], seq_len=16).model_dump()
    result = train_trial(spec=spec, recipe=recipe, data=data, seed=0, threads=1,
                         checkpoint_dir=checkpoint_dir(store, trial_id))
    row = dict(trial_id=trial_id, spec=spec.to_dict(), axes={}, seed=0, match="params", target=0.0,
               params=A.count_params(spec), total_params=A.count_params(spec), flops_per_token=0.0, match_error=0.0,
               d_model=spec.d_model, num_layers=spec.num_layers, recipe=recipe, data=data)
    with A.open_store(store) as db:
        db.add_study(name="s", path="s.yaml", config={})
        db.add_trials("s", [row])
        db.finish(trial_id, result.to_dict())


@pytest.fixture(scope="module")
def store(tmp_path_factory):

    folder = tmp_path_factory.mktemp("analyze")
    corpus = folder / "corpus"
    corpus.mkdir()
    words = "the quick brown fox jumps over the lazy dog while a small model learns to count".split()
    for i in range(6):
        (corpus / f"doc{i}.txt").write_text(" ".join(words[(i + j) % len(words)] for j in range(300)))
    path = folder / "s.duckdb"
    trained(path, STACK, "stack", corpus)
    trained(path, LOOPED, "looped", corpus)
    return path


def analyze(*args: str):
    return CliRunner().invoke(app, ["analyze", *args])


def stored(store, analysis: str) -> list[dict]:
    with A.open_store(store, read_only=True) as db:
        return db.layer_profiles("stack" if analysis != "exit" else "looped", analysis).to_pylist()


CALIB = ["--batches", "2", "--batch-size", "2"]


def test_rho_is_shown_and_stored_per_layer(store):
    result = analyze("rho", "stack", "--store", str(store), *CALIB)
    assert result.exit_code == 0, result.output
    assert "rho" in result.output and "predicted" in result.output
    rows = [r for r in stored(store, "rho") if r["metric"] == "rho"]
    assert sorted(r["layer"] for r in rows) == [0, 1, 2, 3] and all(r["value"] > 0 for r in rows)
    assert json.loads(rows[0]["setting"])["mode"] == "noise"


def test_prune_reports_each_ranking_and_keeps_the_per_layer_scores(store):
    result = analyze("prune", "stack", "--store", str(store), *CALIB, "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    points = {(r["setting"]["ranking"], r["setting"]["removed"]) for r in rows if r["metric"] == "perplexity"}
    assert points == {(by, k) for by in ("rho", "bi", "blend") for k in (0, 1, 2)}
    assert {r["metric"] for r in stored(store, "prune")} >= {"bi", "rho", "tokens_per_s", "dropped"}


def test_wanda_compares_the_schedules(store):
    result = analyze("wanda", "stack", "--store", str(store), "--sparsity", "0.5", *CALIB)
    assert result.exit_code == 0, result.output
    schedules = {json.loads(r["setting"])["schedule"] for r in stored(store, "wanda")}
    assert schedules == {"dense", "uniform", "depth"}


def test_probe_on_the_trial_and_a_baseline(store):
    result = analyze("probe", "stack", "--store", str(store), "--state", "hidden:0,hidden:4",
                     "--target", "lag:0", "--baseline", "stack", *CALIB, "--json")
    assert result.exit_code == 0, result.output
    scores = [r for r in json.loads(result.output) if r["metric"] == "score"]
    assert len(scores) == 2 and all(0 <= r["value"] <= 1 for r in scores)


def test_exit_curve_with_and_without_adaptation(store):
    result = analyze("exit", "looped", "--store", str(store), "--thresholds", "0.5,1.0", "--adapt-steps", "2",
                     *CALIB)
    assert result.exit_code == 0, result.output
    fractions = [r for r in stored(store, "exit") if r["metric"] == "loop_fraction"]
    assert {json.loads(r["setting"])["adapted"] for r in fractions} == {True, False}
    assert all(0 < r["value"] <= 1 for r in fractions) and len(fractions) == 6


@pytest.mark.parametrize("args, message", [
    (["prune", "looped"], "stack models only; this model is 'looped'"),
    (["exit", "stack"], "exit_gate=true"),
    (["rho", "nope"], "no trial nope in"),
    (["rho", "stack", "--mode", "fp4"], "unknown rho mode 'fp4'"),
    (["exit", "looped", "--thresholds", "0.5,2"], "must be in (0, 1]"),
    (["probe", "stack", "--state", "hidden:9"], "hidden:0 .. hidden:4"),
    (["prune", "stack", "--max-removed", "4"], "max_removed must be in 1 .. 3"),
    (["rho", "stack", "--noise", "0"], "noise must be > 0"),
    (["wanda", "stack", "--sparsity", "1.0"], "sparsity must be in [0, 1)"),
    (["rho", "stack", "--batches", "0"], "at least one batch"),
    (["wanda", "stack", "--spread", "2"], "spread must be in [-1, 1]"),
], ids=["prune-looped", "exit-stack", "unknown-trial", "unknown-mode", "bad-threshold", "bad-state",
        "remove-all", "no-noise", "full-sparsity", "no-batches", "bad-spread"])
def test_user_errors_are_one_line(store, args, message):
    result = analyze(*args[:2], "--store", str(store), *CALIB, *args[2:])
    assert result.exit_code == 2 and message in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_the_report_draws_rho_per_layer_and_perplexity_against_layers_removed(store, tmp_path):
    from archsearch_dashboards.report import write_report

    from archsearch.inspect.runs import Calibration, analyze_prune, analyze_rho

    calib = Calibration(batches=1, batch_size=2)
    analyze_rho("stack", store=store, calib=calib)
    analyze_prune("stack", store=store, max_removed=1, calib=calib)
    with A.open_store(store, read_only=True) as db:
        page = write_report(db, tmp_path / "r.html").read_text()
    assert "Error contraction: rho per layer" in page and "perplexity vs layers removed" in page
    assert "stack, by blend" in page


@pytest.mark.parametrize("command", ["rho", "prune", "wanda", "exit", "probe"])
def test_a_missing_store_is_said_before_torch_loads(command, tmp_path):
    """A wrong --store answers at once: the analysis (and torch, seconds on a busy machine) loads
    only for a trial that is there."""
    import subprocess
    import sys

    code = ("import sys; from typer.testing import CliRunner; from archsearch.cli import app; "
            f"r = CliRunner().invoke(app, ['analyze', '{command}', 'abc', '--store', '{tmp_path / 'nope.duckdb'}']); "
            "print(r.exit_code, 'torch' in sys.modules); print(r.output)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert out.splitlines()[0] == "2 False", out
    assert "no store at" in out
