"""`archsearch bench`: a training step timed per planned architecture, MFU against a matmul timed
beside it, and the Hugging Face equivalents built with the same configuration."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from archsearch.arch.spec import ArchSpec, LayerSpec
from archsearch.cli import app
from archsearch.train import bench


def invoke(*args: str):
    return CliRunner().invoke(app, ["bench", *map(str, args)])


def test_bench_reports_each_planned_trial(tiny_study):
    result = invoke(tiny_study, "--json", "--rounds", "2", "--no-hf", "--batch-size", "2")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    rows = report["rows"]
    # every model runs RMSNorm, which has a C++ kernel: "on" and "off" for each trial on a CPU
    assert [(row["trial"], row["kernels"]) for row in rows] == [(t, k) for t in range(3) for k in ("on", "off")]
    import archsearch as A

    plan = A.plan(A.load_study(tiny_study))
    for row, trial in zip(rows, [trial for trial in plan for _ in ("on", "off")]):
        assert row["trial_id"] == trial.trial_id and row["params"] == trial.total_params
        assert row["tokens_per_s"] == pytest.approx(2 * 16 / (row["step_ms"] / 1e3))
        # MFU is the step's training FLOP/s over the matmul's, both measured here
        achieved = row["tokens_per_s"] * trial.flops_per_token
        assert row["mfu"] == pytest.approx(achieved / (report["matmul_tflops"] * 1e12))
        assert row["peak_mb"] > 4 * 4 * trial.total_params / 2**20  # weights, grads, AdamW moments and more


def test_bench_one_trial_and_the_errors_a_user_can_make(tiny_study):
    result = invoke(tiny_study, "--trial", "1", "--rounds", "1", "--no-hf")
    assert result.exit_code == 0, result.output
    assert "median of 1 rounds" in result.output and "%" in result.output  # the MFU cell
    result = invoke(tiny_study, "--trial", "3")
    assert result.exit_code == 2 and "--trial 3: the study plans 3 trials, numbered 0 to 2" in result.output
    result = invoke(tiny_study, "--kernels", "fast")
    assert result.exit_code == 2 and "choose on, off, both or auto" in result.output


def test_bench_kernels_on_a_cpu_where_the_cpp_kernels_do_not_build(tiny_study, monkeypatch):
    """Simulated failed build: the default times "off" only, and asking for "on" (which would
    time the PyTorch path twice) is an error that says why."""
    from archsearch_kernels import cpu_build

    def broken():
        raise RuntimeError("g++: fatal error: killed")

    monkeypatch.setattr(cpu_build.ELEMENTWISE, "_state", {})
    monkeypatch.setattr(cpu_build.ELEMENTWISE, "_compile", broken)
    with pytest.warns(RuntimeWarning):
        result = invoke(tiny_study, "--json", "--trial", "0", "--rounds", "1", "--no-hf", "--batch-size", "2")
    assert result.exit_code == 0, result.output
    assert [row["kernels"] for row in json.loads(result.output)["rows"]] == ["off"]
    result = invoke(tiny_study, "--kernels", "on", "--trial", "0")
    assert result.exit_code == 2 and "none that these trials run builds here (rms_norm: RuntimeError: g++: fatal " \
        "error: killed" in result.output


def test_rounds_interleave_every_configuration(monkeypatch):
    """Round r times the matmul and every configuration once before round r + 1 starts, so a
    slow spell on the machine falls on all of them."""
    order = []

    def config(name):
        return bench._Config(row=dict(trial=0, trial_id=name, family="f", impl="archsearch", kernels="off",
                                      compile="-", params=1),
                             model=torch.nn.Linear(1, 1), step=lambda: order.append(name), tokens=1, flops=1.0)

    monkeypatch.setattr(bench, "_configs", lambda *a, **k: [config("a"), config("b")])
    monkeypatch.setattr(bench, "_matmul_step", lambda device, dtype: (lambda: order.append("matmul"), 1.0))
    bench.bench_trials([], [], rounds=2, warmup=1, device="cpu")
    assert order == ["a", "b"] + ["matmul", "a", "b"] * 3  # first the untimed memory count


def test_a_compiled_row_beside_each_eager_one(tiny_study):
    """--compile times the same trial as torch.compile(model) next to eager: same parameters,
    its own timings and the first (compiling) step kept out of the rounds. The eager backend
    only traces, so the test stays fast; inductor is what docs/performance.md measures."""
    result = invoke(tiny_study, "--json", "--trial", "0", "--rounds", "1", "--no-hf", "--batch-size", "2",
                    "--compile", "eager", "--kernels", "off")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    eager, compiled = report["rows"]
    assert (eager["compile"], compiled["compile"], report["compile"]) == ("-", "eager", "eager")
    assert eager["params"] == compiled["params"] and eager["trial_id"] == compiled["trial_id"]
    assert eager["compile_s"] == 0.0 and compiled["compile_s"] >= 0.0 and compiled["step_ms"] > 0
    result = invoke(tiny_study, "--trial", "0", "--compile", "fast")
    assert result.exit_code == 2 and "--compile 'fast': choose one of inductor, aot_eager, eager" in result.output


def test_the_ratio_to_hugging_face_is_the_median_of_per_round_ratios():
    """Round by round, so a slow spell that hits one round hits both sides of its ratio: the
    per-round ratios 3, 1, 5 give 3, where the ratio of the medians (4 / 2) would give 2."""
    def config(impl):
        return bench._Config(row=dict(trial=0, impl=impl), model=torch.nn.Linear(1, 1), step=lambda: None,
                             tokens=1, flops=1.0)

    configs = [config("archsearch"), config("hf-llama")]
    times = [[1.0, 4.0, 2.0], [3.0, 4.0, 10.0]]
    assert bench._vs_hf(configs, times, 0) == 3.0
    assert bench._vs_hf(configs, times, 1) is None
    assert bench._vs_hf(configs[:1], times[:1], 0) is None


def uniform_spec(mixer: str, mlp: str, width: int) -> ArchSpec:
    layer = LayerSpec(mixer=mixer, mlp=mlp, mlp_width=width)
    return ArchSpec(family="t", vocab_size=64, d_model=32, num_heads=4, layers=(layer,) * 3)


@pytest.mark.parametrize("mixer, mlp, width, impl", [("attention", "swiglu", 40, "hf-llama"),
                                                     ("mamba", "none", 0, "hf-mamba")], ids=["llama", "mamba"])
def test_hugging_face_equivalent_has_the_same_parameters(mixer, mlp, width, impl):
    """The configuration carried over is the whole model: every parameter counted the same."""
    pytest.importorskip("transformers")
    from archsearch.arch.model import build_model

    spec = uniform_spec(mixer, mlp, width)
    name, hf_model = bench.hf_equivalent(spec, seq_len=16)
    assert name == impl
    ours = sum(p.numel() for p in build_model(spec).parameters())
    assert sum(p.numel() for p in hf_model.parameters()) == ours


def test_gated_deltanet_twin_is_our_model_with_transformers_rule():
    """A Gated DeltaNet stack's twin runs transformers' chunked rule in every layer on the same
    weights: the same loss and the same gradient of every weight as ours, to 1e-4."""
    pytest.importorskip("transformers")
    from archsearch.arch.model import build_model
    from archsearch.data import Batch
    from archsearch.train.loop import training_loss

    spec = ArchSpec(family="gdn", vocab_size=64, d_model=32, num_heads=2,
                    layers=(LayerSpec(mixer="gated_deltanet", mlp="swiglu", mlp_width=40),) * 2)
    torch.manual_seed(0)
    ours = build_model(spec)
    torch.manual_seed(0)
    name, twin = bench.hf_equivalent(spec, seq_len=70)
    assert name == "hf-gdn-rule"
    assert {m.rule for m in twin.modules() if hasattr(m, "rule")} == {bench._transformers_gated_delta_rule}
    tokens = torch.randint(0, 64, (2, 71), generator=torch.Generator().manual_seed(1))
    batch = Batch(inputs=tokens[:, :-1], targets=tokens[:, 1:])
    losses = []
    for model in (ours, twin):
        loss = training_loss(model, batch)
        loss.backward()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)
    for (name, p_ours), p_twin in zip(ours.named_parameters(), twin.parameters()):
        assert torch.equal(p_ours, p_twin), name
        torch.testing.assert_close(p_twin.grad, p_ours.grad, atol=1e-4, rtol=1e-4, msg=name)


def test_no_equivalent_for_uneven_widths_or_other_structures():
    spec = uniform_spec("attention", "swiglu", 40)
    uneven = ArchSpec(family="t", vocab_size=64, d_model=32, num_heads=4,
                      layers=(LayerSpec(mlp_width=40), LayerSpec(mlp_width=48)))
    assert bench.hf_equivalent(uneven, seq_len=16) is None
    from dataclasses import replace

    assert bench.hf_equivalent(replace(spec, structure="looped"), seq_len=16) is None


def test_cpu_step_memory_counts_saved_activations():
    """The memory count grows with what the step saves for backward: 4x the batch, about 4x the
    activations on top of the same weight state."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    state_mb = 4 * sum(p.numel() for p in model.parameters()) * 4 / 2**20
    small, large = torch.randn(32, 64), torch.randn(128, 64)
    mb_small = bench._cpu_step_mb(model, lambda: model(small).sum().backward())
    mb_large = bench._cpu_step_mb(model, lambda: model(large).sum().backward())
    assert (mb_large - state_mb) == pytest.approx(4 * (mb_small - state_mb), rel=0.05)


@pytest.mark.slow
def test_the_prepared_gpu_script_runs_end_to_end_in_the_interpreter(tmp_path):
    """benchmarks/bench_kernels_gpu.py is run for the first time on a lent GPU with minutes of
    budget: here it runs at toy sizes on the CPU, every kernel through Triton's interpreter, and
    each kernel agrees with the PyTorch path it is timed against."""
    pytest.importorskip("triton")
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_kernels_gpu.py"
    out = tmp_path / "rows.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    subprocess.run([sys.executable, str(script), "--device", "cpu", "--dtype", "float32", "--batch", "1", "--seq-len", "8",
                    "--d-model", "16", "--vocab", "50", "--repeats", "1", "--json", str(out)], check=True, env=env,
                   capture_output=True)
    rows = json.loads(out.read_text())["rows"]
    kernels = {row["op"]: row for row in rows if row["impl"] == "triton"}
    assert set(kernels) == {"rms_norm", "swiglu", "linear_cross_entropy_V50", "selective_scan", "gated_delta_rule",
                            "gated_delta_rule_T8", "ssd"}
    far = {op: row["rel_error_vs_reference"] for op, row in kernels.items() if not row["rel_error_vs_reference"] < 1e-4}
    assert not far, f"Triton kernels off their PyTorch path: {far}"
    gdr_others = [row for row in rows if row["impl"] in ("triton-chunk64", "triton-recurrent")]
    assert len(gdr_others) == 3
    far = {row["impl"]: row["rel_error_vs_reference"] for row in gdr_others if not row["rel_error_vs_reference"] < 1e-4}
    assert not far, f"the other delta-rule kernels off their PyTorch path: {far}"


def test_a_peer_kernel_that_raises_is_a_row_and_the_bench_goes_on(capsys):
    """flash-linear-attention refused an H200 with an exception in its backward; the bench
    reports such a peer and times the others instead of ending there."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_kernels_gpu.py"
    spec = importlib.util.spec_from_file_location("bench_kernels_gpu", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def refuses(x):
        raise RuntimeError("not on this GPU\nsecond line")

    rows: list[dict] = []
    inputs = dict(x=torch.randn(4, 8, requires_grad=True))
    module.bench_op("double", {"ours": lambda x: 2 * x, "peer": refuses, "torch": lambda x: x + x}, inputs, 1, rows)
    assert rows[0] == dict(op="double", impl="peer", error="RuntimeError: not on this GPU")
    assert [row["impl"] for row in rows[1:]] == ["ours", "torch"] and rows[1]["rel_error_vs_reference"] == 0
    assert "peer           failed: RuntimeError: not on this GPU" in capsys.readouterr().out


def test_on_a_cpu_a_mamba_trial_is_timed_with_and_without_its_cpp_scan(tmp_path, corpus, monkeypatch):
    """On a CPU, "on" is what a trial runs: Mamba's scan through the C++ kernel (where it
    builds); "off" the PyTorch chunked form. Both rows by default. Timing "on" with the
    reference setting (the bench before) fails here: the C++ scan is never called."""
    from archsearch_kernels import dispatch
    from archsearch_kernels.selective_scan import cpu

    from tests.conftest import tiny_study_text

    if not cpu.available():
        pytest.skip("the C++ selective scan does not build here")
    (tmp_path / "space.yaml").write_text("name: m\naxes:\n  family: mamba\n  num_layers: 2\nmodel:\n  head_dim: 8\n")
    (tmp_path / "study.yaml").write_text(tiny_study_text(corpus=corpus, targets="[8000]"))
    calls = []
    real = cpu.selective_scan_cpu

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(dispatch.selective_scan_cpu_kernel, "selective_scan_cpu", counted)
    result = invoke(tmp_path / "study.yaml", "--json", "--rounds", "1", "--no-hf", "--batch-size", "2")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["rows"]
    assert sorted(row["kernels"] for row in rows) == ["off", "on"]
    assert calls
