"""Selective scan, C++ CPU kernel: equal to the reference loop, used by dispatch where it builds,
and the PyTorch path where it does not.

The first run on a machine compiles the kernel (about a minute; cached after that, per
machine). Dimensions: B batch, T time, D model width, E inner channels, N state size.
"""

from __future__ import annotations

import shutil
import warnings

import pytest
import torch
import torch.nn.functional as F
from archsearch_kernels import dispatch
from archsearch_kernels.selective_scan import cpu, selective_scan_naive

from archsearch.arch.blocks.mamba import Mamba
from archsearch.arch.spec import ArchSpec, LayerSpec
from tests.kernels.conftest import assert_close, assert_same_outputs_and_grads
from tests.kernels.test_selective_scan import ATOL, SHAPES, Shape, make_inputs, run


@pytest.fixture(scope="module", autouse=True)
def built():
    """The kernel, built (or loaded from the cache) once; a test failure, not a skip, when a
    compiler exists and the build or its self-check fails."""
    if not cpu.available():
        if shutil.which("c++") or shutil.which("g++"):
            pytest.fail(f"the C++ selective scan did not build although a compiler exists: {cpu.build_error()}")
        pytest.skip("no C++ compiler on this machine")


@pytest.fixture(autouse=True)
def clean_setting(monkeypatch):
    monkeypatch.delenv(dispatch.MODE_VAR, raising=False)
    # set, not deleted: monkeypatch then restores the variable after the test, although
    # dispatch.disable writes os.environ directly
    monkeypatch.setenv(dispatch.DISABLE_VAR, "")


def assert_matches_naive(inputs):
    assert_same_outputs_and_grads(lambda **kw: run(selective_scan_naive, kw),
                                  lambda **kw: run(cpu.selective_scan_cpu, kw), inputs, ATOL)


@pytest.mark.parametrize("shape", [*SHAPES, pytest.param(Shape(3, 70, 16, 33, 0), id="E70-four-groups-of-lanes-and-a-part-N16")])
def test_matches_naive_forward_state_and_every_gradient(shape):
    assert_matches_naive(make_inputs(shape))


def test_strong_decay_stays_finite_and_matches():
    """delta near 100: log-decays of -100 to -330 a step, where exp underflows to 0."""
    assert_matches_naive(make_inputs(Shape(2, 5, 3, 40, 0), delta_offset=100.0))


def test_optional_arguments_left_out():
    """No D, z, bias, softplus or initial state: the plain scan, forward and gradients."""
    inputs = make_inputs(Shape(2, 5, 3, 7, 0))
    bare = {name: inputs[name] for name in ("u", "A", "B", "C")}
    bare["delta"] = F.softplus(inputs["delta"]).detach().requires_grad_()
    y_ref, y_out = selective_scan_naive(**bare), cpu.selective_scan_cpu(**bare)
    assert_close("y", y_ref, y_out, ATOL)
    leaves = list(bare.values())
    grads_ref, grads_out = torch.autograd.grad(y_ref.sum(), leaves), torch.autograd.grad(y_out.sum(), leaves)
    for name, g_ref, g_out in zip(bare, grads_ref, grads_out):
        assert_close(f"grad {name}", g_ref, g_out, ATOL)


@pytest.mark.parametrize("left_out", ["D", "z"])
def test_the_skip_or_the_gate_alone(left_out):
    """The kernel takes D u and silu(z) at the readout: each works without the other."""
    inputs = make_inputs(Shape(2, cpu.LANES + 3, 4, 11, 0))
    del inputs[left_out]
    assert_matches_naive(inputs)


def test_zero_step_keeps_the_state_exactly():
    """delta = 0 (a skipped token, looped early exit): exp(0 * A) = 1 and nothing is written,
    so the state after a run of such steps is bit-for-bit the state before them."""
    inputs = {name: x.detach() for name, x in make_inputs(Shape(2, 5, 3, 12, 0)).items()}
    inputs["delta"] = inputs["delta"].clone()
    inputs["delta"][..., 6:] = 0.0
    del inputs["delta_bias"]
    _, state_all = cpu.selective_scan_cpu(**inputs, return_last_state=True)
    prefix = {name: x[..., :6] if name in ("u", "delta", "B", "C", "z") else x for name, x in inputs.items()}
    _, state_prefix = cpu.selective_scan_cpu(**prefix, return_last_state=True)
    assert torch.equal(state_all, state_prefix)


def test_strided_views_as_a_mamba_layer_passes_them():
    """u, delta, z as [B, E, T] views of [B, T, E] (the kernel's own layout, not copied); B and C as
    views of one [B, T, R + 2N] projection."""
    b, e, n, t = 2, cpu.LANES + 6, 4, 9
    inputs = make_inputs(Shape(b, e, n, t, 0))
    u, delta, z = (inputs[k].detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
                   for k in ("u", "delta", "z"))
    proj = torch.randn(b, t, 3 + 2 * n, requires_grad=True)
    B, C = proj[..., 3:3 + n].transpose(1, 2), proj[..., 3 + n:].transpose(1, 2)
    rest = {k: inputs[k] for k in ("A", "D", "delta_bias", "initial_state")}
    outs = []
    for scan in (selective_scan_naive, cpu.selective_scan_cpu):
        y, last = scan(u, delta, B=B, C=C, z=z, **rest, delta_softplus=True, return_last_state=True)
        outs.append((y, last, *torch.autograd.grad((y * y).sum() + last.sum(), [u, delta, z, proj])))
    for name, ref, got in zip(["y", "last_state", "grad u", "grad delta", "grad z", "grad proj"], *outs):
        assert_close(name, ref, got, ATOL)


def test_low_precision_input_gives_low_precision_output():
    inputs = {name: x.detach().bfloat16() for name, x in make_inputs(Shape(2, 5, 3, 7, 0)).items()}
    y, state = run(cpu.selective_scan_cpu, inputs)
    assert y.dtype == torch.bfloat16 and state.dtype == torch.float32
    y_full, _ = run(cpu.selective_scan_cpu, {name: x.float() for name, x in inputs.items()})
    assert_close("y", y_full, y.float(), 1e-2)


def mamba_layer() -> Mamba:
    layer = LayerSpec(mixer="mamba", mlp_width=0, options={"d_state": 5})
    return Mamba(spec=ArchSpec(family="mamba", vocab_size=16, d_model=24, num_heads=3, layers=(layer,)), layer=layer)


def test_mamba_layer_with_skipped_tokens_is_the_same_on_the_cpp_and_pytorch_paths(monkeypatch):
    """A Mamba layer under auto takes the C++ kernel on a CPU; with a skip mask (exited tokens
    of a looped model) its output, last state and every gradient equal the chunked path's."""
    module = mamba_layer()
    x_BTD = torch.randn(3, 41, 24)
    skip_BT = torch.rand(3, 41) < 0.3
    skip_BT[0, -5:] = True
    calls = []
    real = cpu.selective_scan_cpu
    monkeypatch.setattr(cpu, "selective_scan_cpu", lambda *a, **k: calls.append(1) or real(*a, **k))
    results = {}
    for setting in ("reference", "auto"):
        monkeypatch.setenv(dispatch.MODE_VAR, setting)
        x = x_BTD.clone().requires_grad_()
        y, state = module(x, skip_BT=skip_BT, return_last_state=True)
        leaves = [x, *module.parameters()]
        results[setting] = (y, state, *torch.autograd.grad((y * y).sum() + state.sum(), leaves))
    assert len(calls) == 1  # auto took the kernel, reference did not
    names = ["y", "last_state", "grad x", *(f"grad {n}" for n, _ in module.named_parameters())]
    for name, ref, got in zip(names, results["reference"], results["auto"]):
        assert_close(name, ref, got, ATOL)


def test_a_failed_build_falls_back_to_pytorch_with_a_warning(monkeypatch):
    """Simulated: the compiler fails. auto warns once and runs the chunked form; cpp raises;
    the kernel is not retried in this process."""
    monkeypatch.setattr(cpu.SCAN, "_state", {})
    attempts = []

    def broken_build():
        attempts.append(1)
        raise RuntimeError("Error building extension 'archsearch_selective_scan'\ng++: fatal error: killed")

    monkeypatch.setattr(cpu.SCAN, "_compile", broken_build)
    inputs = {name: x.detach() for name, x in make_inputs(Shape(2, 5, 3, 9, 0)).items()}
    with pytest.warns(RuntimeWarning, match="C\\+\\+ CPU kernel is not used .*killed.*chunked PyTorch"):
        assert not dispatch.use_cpp("selective_scan", "cpu")
    assert "killed" in cpu.build_error()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning, no second build
        y = dispatch.selective_scan(**inputs, delta_softplus=True)
    assert_close("y", selective_scan_naive(**inputs, delta_softplus=True), y, ATOL)
    assert len(attempts) == 1
    monkeypatch.setenv(dispatch.MODE_VAR, "cpp")
    with pytest.raises(RuntimeError, match="not available here: RuntimeError: g\\+\\+: fatal error: killed"):
        dispatch.selective_scan(**inputs, delta_softplus=True)


def test_a_build_that_disagrees_with_the_reference_is_not_used(monkeypatch):
    """A miscompiled kernel (simulated: its forward returns y + 1) fails the check before first use."""
    module = cpu.load()

    class Wrong:
        def scan_forward(self, *args):
            y, last = module.scan_forward(*args)
            return y + 1, last

        def scan_backward(self, *args):
            return module.scan_backward(*args)

    monkeypatch.setattr(cpu.SCAN, "_state", {})
    monkeypatch.setattr(cpu.SCAN, "_compile", Wrong)
    with pytest.warns(RuntimeWarning, match="y differs from the reference"):
        assert not cpu.available()


def test_settings_choose_the_path(monkeypatch):
    assert dispatch.use_cpp("selective_scan", "cpu")
    assert not dispatch.use_cpp("selective_scan", "meta")
    assert not dispatch.use_cpp("linear_cross_entropy", "cpu")  # no C++ kernel for it
    for setting in ("reference", "triton"):
        monkeypatch.setenv(dispatch.MODE_VAR, setting)
        assert not dispatch.use_cpp("selective_scan", "cpu")
    monkeypatch.setenv(dispatch.MODE_VAR, "cpp")
    assert dispatch.use_cpp("selective_scan", "cpu")
    dispatch.disable("selective_scan")
    assert not dispatch.use_cpp("selective_scan", "cpu")
