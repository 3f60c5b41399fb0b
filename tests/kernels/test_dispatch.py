"""The one kernel setting: which path models take, and the preflight that turns a broken kernel off.

Triton runs in its interpreter here (no GPU), so `ARCHSEARCH_KERNELS=triton` exercises the same
model code a CUDA run takes. Dimensions: B batch, T time, V vocabulary.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from archsearch_kernels import dispatch

from archsearch.arch.model import build_model
from archsearch.arch.spec import ArchSpec, LayerSpec
from archsearch.data import Batch
from archsearch.train.loop import training_loss
from tests.kernels.conftest import assert_close


@pytest.fixture(autouse=True)
def clean_setting(monkeypatch):
    monkeypatch.delenv(dispatch.MODE_VAR, raising=False)
    # set, not deleted: monkeypatch then restores the variable after the test, although
    # dispatch.disable writes os.environ directly
    monkeypatch.setenv(dispatch.DISABLE_VAR, "")


def tiny_spec(mixer: str, mlp: str) -> ArchSpec:
    layer = LayerSpec(mixer=mixer, mlp=mlp, mlp_width=24 if mlp != "none" else 0,
                      options={"d_state": 4} if mixer == "mamba" else {})
    return ArchSpec(family="tiny", vocab_size=50, d_model=16, num_heads=2, layers=(layer, layer))


def test_auto_takes_pytorch_on_cpu_and_a_bad_setting_is_named(monkeypatch):
    assert not dispatch.use_triton("rms_norm", "cpu")
    assert dispatch.use_triton("rms_norm", "cuda") == dispatch.triton_installed()
    monkeypatch.setenv(dispatch.MODE_VAR, "reference")
    assert not dispatch.use_triton("rms_norm", "cuda")
    monkeypatch.setenv(dispatch.MODE_VAR, "fast")
    with pytest.raises(ValueError, match="ARCHSEARCH_KERNELS='fast': must be one of auto, triton, cpp, reference"):
        dispatch.use_triton("rms_norm", "cpu")


def test_auto_leaves_out_on_cuda_a_kernel_measured_slower_than_its_pytorch_path(monkeypatch):
    """The SSD kernel lost to the chunked PyTorch form on an H200: auto runs that form on CUDA,
    and ARCHSEARCH_KERNELS=triton still takes the kernel."""
    monkeypatch.setattr(dispatch, "triton_installed", lambda: True)
    assert dispatch.SLOWER_ON_GPU == {"ssd"}
    assert not dispatch.use_triton("ssd", "cuda") and dispatch.use_triton("selective_scan", "cuda")
    monkeypatch.setenv(dispatch.MODE_VAR, "triton")
    assert dispatch.use_triton("ssd", "cuda")


@pytest.mark.parametrize("mixer, mlp, kernel, seq_len",
                         [("attention", "swiglu", "swiglu_triton", 9),
                          ("mamba", "none", "selective_scan_triton", 9),
                          ("gated_deltanet", "none", "gated_delta_rule_triton", 9),
                          ("gated_deltanet", "none", "gated_delta_rule_chunked_triton", 20)],
                         ids=["transformer", "mamba", "gated-deltanet-short", "gated-deltanet-chunked"])
def test_model_loss_and_gradients_are_the_same_with_kernels_on(mixer, mlp, kernel, seq_len, monkeypatch,
                                                               triton_kernels):
    """A training loss through every kernel (RMSNorm, SwiGLU or the scan, fused linear + CE)
    equals the PyTorch path's, and so does every parameter's gradient. The gated delta rule's
    switch to the chunked kernel is lowered to 16 steps so a 20-step sequence takes it (one
    chunk of 32, 12 steps padded) while the interpreter stays quick; 9 steps still take the
    recurrent kernel. Several chunks are tested in test_gated_delta_triton.py."""
    pytest.importorskip("triton")
    monkeypatch.setattr(dispatch, "CHUNKED_FROM", 16)
    model = build_model(tiny_spec(mixer, mlp)).to(triton_kernels)
    tokens = torch.randint(0, 50, (2, seq_len))
    targets = torch.randint(0, 50, (2, seq_len))
    targets[0, :3] = -100
    batch = Batch(inputs=tokens.to(triton_kernels), targets=targets.to(triton_kernels))
    results = {}
    for setting in ("reference", "triton"):
        monkeypatch.setenv(dispatch.MODE_VAR, setting)
        calls = []
        if setting == "triton":  # the kernels really ran
            for name in ("rms_norm_triton", "linear_cross_entropy_triton", kernel):
                real = getattr(dispatch, name)
                monkeypatch.setattr(dispatch, name, lambda *a, _real=real, _name=name, **k: calls.append(_name)
                                    or _real(*a, **k))
        model.zero_grad()
        loss = training_loss(model, batch)
        loss.backward()
        results[setting] = (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
        if setting == "triton":
            assert {"rms_norm_triton", "linear_cross_entropy_triton", kernel} <= set(calls)
    assert_close("loss", results["reference"][0], results["triton"][0], 1e-5)
    for name, grad in results["reference"][1].items():
        assert_close(f"grad {name}", grad, results["triton"][1][name], 1e-4)


def test_preflight_turns_a_wrong_kernel_off_and_the_op_falls_back(monkeypatch, triton_kernels):
    """A kernel that computes the wrong thing, and one that cannot compile, are both caught,
    named, and disabled; ops that pass stay on; the disabled op then runs PyTorch."""
    monkeypatch.setenv(dispatch.MODE_VAR, "triton")

    def broken(*args, **kwargs):
        raise RuntimeError("PTX assembly aborted\nmore detail")

    monkeypatch.setitem(dispatch.PAIRS, "swiglu", (lambda gate, up: gate * up, dispatch.PAIRS["swiglu"][1]))
    monkeypatch.setitem(dispatch.PAIRS, "linear_cross_entropy", (broken, dispatch.PAIRS["linear_cross_entropy"][1]))
    failures = dispatch.preflight(["rms_norm", "swiglu", "linear_cross_entropy"], triton_kernels)
    assert set(failures) == {"swiglu", "linear_cross_entropy"}
    assert "output differs from the reference" in failures["swiglu"]
    assert failures["linear_cross_entropy"].endswith("RuntimeError: PTX assembly aborted")
    assert dispatch.disabled() == {"swiglu", "linear_cross_entropy"}
    assert dispatch.use_triton("rms_norm", triton_kernels) and not dispatch.use_triton("swiglu", triton_kernels)
    monkeypatch.setattr(dispatch, "swiglu_triton", broken)
    gate, up = torch.randn(3, 5), torch.randn(3, 5)
    assert torch.equal(dispatch.swiglu(gate, up), torch.nn.functional.silu(gate) * up)


def test_gated_delta_rule_takes_the_chunked_kernel_on_long_sequences(monkeypatch):
    """From CHUNKED_FROM steps on the chunked kernel runs, below it the recurrent one; a long
    sequence whose chunked kernel the preflight turned off takes the recurrent kernel, and with
    both off the PyTorch path."""
    calls = []
    for name in ("gated_delta_rule_triton", "gated_delta_rule_chunked_triton", "gated_delta_rule_chunked"):
        monkeypatch.setattr(dispatch, name, lambda *a, _name=name, **k: calls.append(_name))

    def taken(seq_len: int) -> str:
        calls.clear()
        qkv = torch.zeros(1, seq_len, 1, 4)
        dispatch.gated_delta_rule(qkv, qkv, qkv, None, None)
        return calls[0]

    monkeypatch.setenv(dispatch.MODE_VAR, "triton")
    assert taken(dispatch.CHUNKED_FROM) == "gated_delta_rule_chunked_triton"
    assert taken(dispatch.CHUNKED_FROM - 1) == "gated_delta_rule_triton"
    dispatch.disable("gated_delta_rule_chunked")
    assert taken(dispatch.CHUNKED_FROM) == "gated_delta_rule_triton"
    dispatch.disable("gated_delta_rule")
    assert taken(dispatch.CHUNKED_FROM) == "gated_delta_rule_chunked"
    monkeypatch.setenv(dispatch.DISABLE_VAR, "")
    monkeypatch.setenv(dispatch.MODE_VAR, "reference")
    assert taken(dispatch.CHUNKED_FROM) == "gated_delta_rule_chunked"


def test_preflight_checks_nothing_that_would_not_run_triton(monkeypatch):
    monkeypatch.setitem(dispatch.PAIRS, "rms_norm", (None, None))  # would fail if it were called
    assert dispatch.preflight(["rms_norm"], "cpu") == {}


def test_study_preflight_records_the_failure_in_the_store(tmp_path, monkeypatch, triton_kernels):
    """The driver's preflight checks only the ops the planned models use, warns, and the store
    keeps {op: why} for the study; a study whose kernels all pass records {}."""
    from archsearch.arch.kernel_ops import kernels_used
    from archsearch.execute.preflight import preflight_kernels
    from archsearch.store import open_store

    monkeypatch.setenv(dispatch.MODE_VAR, "triton")
    specs = [tiny_spec("attention", "swiglu"), tiny_spec("attention", "swiglu")]
    assert kernels_used(specs) == ["linear_cross_entropy", "rms_norm", "rope_heads", "swiglu"]
    assert "selective_scan" in kernels_used([tiny_spec("mamba", "none")])
    assert {"gated_delta_rule", "gated_delta_rule_chunked"} <= set(kernels_used([tiny_spec("gated_deltanet", "none")]))
    wrong = (lambda gate, up: gate * up, dispatch.PAIRS["swiglu"][1])
    monkeypatch.setitem(dispatch.PAIRS, "swiglu", wrong)
    # the scan is not used by these models: a broken scan kernel must not be checked or disabled
    monkeypatch.setitem(dispatch.PAIRS, "selective_scan", (None, None))
    monkeypatch.setitem(dispatch.PAIRS, "gated_delta_rule", (None, None))
    monkeypatch.setitem(dispatch.PAIRS, "gated_delta_rule_chunked", (None, None))
    warnings = []
    with open_store(tmp_path / "s.duckdb") as db:
        failures = preflight_kernels("tiny", db, specs, device=triton_kernels, warn=warnings.append)
        assert set(failures) == {"swiglu"} and db.kernel_preflight("tiny") == failures
        assert warnings == [f"warning: {failures['swiglu']}; using the PyTorch path for it"]
        assert dispatch.disabled() == {"swiglu"}
        assert preflight_kernels("other", db, specs, device=triton_kernels, warn=warnings.append) == {}
        assert db.kernel_preflight("other") == {}


def test_a_bad_setting_stops_the_study_before_any_trial(tmp_path, monkeypatch):
    """The driver's preflight reads the setting first, so a typo ends `run` with one line
    (a ValueError, exit 2 in the CLI) instead of failing every trial in its worker."""
    from archsearch.execute.preflight import preflight_kernels

    monkeypatch.setenv(dispatch.MODE_VAR, "fast")
    with pytest.raises(ValueError, match="must be one of auto, triton, cpp, reference"):
        preflight_kernels("tiny", db=None, specs=[tiny_spec("attention", "swiglu")], device="cpu")


@pytest.mark.slow
def test_preflight_passes_both_gated_delta_kernels(triton_kernels):
    """The probe the preflight runs on a GPU (T 77: two chunks, the last ragged), here through
    the interpreter: both gated delta kernels agree with the reference in output and every
    gradient, so neither is turned off on a device where they work (about 30 s on 2 busy cores)."""
    assert dispatch.check("gated_delta_rule_chunked", triton_kernels) is None
    assert dispatch.check("gated_delta_rule", triton_kernels) is None
