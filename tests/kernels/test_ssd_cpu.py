"""Mamba-2 SSD scan, C++ CPU kernel: equal to the reference loop (forward, last state and every
gradient, outputs poisoned with NaN), used by dispatch where it builds.

Dimensions: B batch, T time, H heads, P head dim, G groups, N state size.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from archsearch_kernels import dispatch
from archsearch_kernels.ssd import cpu, ssd_chunked, ssd_naive

from tests.kernels.conftest import assert_close, assert_same_outputs_and_grads, poison_empty
from tests.kernels.test_ssd import ATOL, SHAPES, Shape, make_inputs, run


@pytest.fixture(scope="module", autouse=True)
def built():
    """The kernel, built (or loaded from the cache) once; a test failure, not a skip, when a
    compiler exists and the build or its self-check fails."""
    if not cpu.available():
        if shutil.which("c++") or shutil.which("g++"):
            pytest.fail(f"the C++ SSD scan did not build although a compiler exists: {cpu.build_error()}")
        pytest.skip("no C++ compiler on this machine")


@pytest.fixture(autouse=True)
def clean_setting(monkeypatch):
    monkeypatch.delenv(dispatch.MODE_VAR, raising=False)
    monkeypatch.setenv(dispatch.DISABLE_VAR, "")


def assert_matches_naive(inputs):
    assert_same_outputs_and_grads(lambda **kw: run(ssd_naive, kw), lambda **kw: run(cpu.ssd_cpu, kw), inputs, ATOL)


# the kernel's products take several vectors at once (four of 16 floats with AVX-512, two of 8 with
# AVX2), then one: P 19 is a vector and a part of one, N 67 several vectors, one of a part and padding;
# P 64, N 128 is Mamba-2's default head
WIDE = [pytest.param(Shape(2, cpu.CHUNK + 3, 4, 19, 2, 67, 0), id="a-chunk-and-a-part-P19-N67"),
        pytest.param(Shape(1, 2 * cpu.CHUNK + 1, 2, 64, 1, 128, 0), id="two-chunks-and-a-step-P64-N128")]


@pytest.mark.parametrize("shape", [*SHAPES, *WIDE, pytest.param(Shape(2, 2 * cpu.CHUNK + 5, 4, 9, 2, 7, 0),
                                                                id="three-chunks-ragged-H4-G2-P9-N7")])
def test_matches_naive_forward_state_and_every_gradient(shape, monkeypatch):
    """Every output buffer the kernel allocates starts as NaN: an element it does not write fails."""
    inputs = make_inputs(shape)
    poison_empty(monkeypatch)
    assert_matches_naive(inputs)


@pytest.mark.parametrize("shape", [Shape(2, 40, 3, 5, 1, 6, 0), Shape(1, 40, 2, 19, 1, 67, 0)],
                         ids=["P5-N6", "P19-N67"])
def test_strong_decay_stays_finite_and_matches(shape, monkeypatch):
    """dt x 30: log-decays of -30 to -500 a step, where exp underflows to 0."""
    inputs = make_inputs(shape, dt_scale=30.0)
    poison_empty(monkeypatch)
    assert_matches_naive(inputs)


def test_reads_views_of_one_wide_tensor_in_place(monkeypatch):
    """x, B and C as a Mamba-2 layer passes them: column slices of the conv's output, whose rows
    are contiguous and far apart; the kernel reads them with their strides."""
    b, t, h, p, g, n = 2, 37, 4, 19, 2, 67
    wide = torch.randn(b, t, h * p + 2 * g * n + 3)
    x, B, C = wide[..., :h * p], wide[..., h * p:h * p + g * n], wide[..., h * p + g * n:-3]
    inputs = {name: value.detach() for name, value in make_inputs(Shape(b, t, h, p, g, n, 0)).items()}
    inputs.update(x=x.unflatten(-1, (h, p)), B=B.unflatten(-1, (g, n)), C=C.unflatten(-1, (g, n)))
    assert not inputs["x"].is_contiguous() and inputs["x"].stride(-1) == 1
    inputs = {name: value.requires_grad_() for name, value in inputs.items()}
    poison_empty(monkeypatch)
    assert_matches_naive(inputs)


def test_without_initial_state_or_skip():
    inputs = make_inputs(Shape(2, 21, 4, 3, 2, 5, 0))
    bare = {name: inputs[name] for name in ("x", "dt", "A", "B", "C")}
    y_ref, y_out = ssd_naive(**bare), cpu.ssd_cpu(**bare)
    assert_close("y", y_ref, y_out, ATOL)
    leaves = list(bare.values())
    for name, g_ref, g_out in zip(bare, torch.autograd.grad(y_ref.sum(), leaves),
                                  torch.autograd.grad(y_out.sum(), leaves)):
        assert_close(f"grad {name}", g_ref, g_out, ATOL)


def test_low_precision_input_gives_low_precision_output():
    inputs = {name: x.detach().bfloat16() for name, x in make_inputs(Shape(2, 9, 2, 4, 1, 3, 0)).items()}
    y, state = run(cpu.ssd_cpu, inputs)
    assert y.dtype == torch.bfloat16 and state.dtype == torch.float32
    y_full, _ = run(cpu.ssd_cpu, {name: x.float() for name, x in inputs.items()})
    assert_close("y", y_full, y.float(), 1e-2)


def test_dispatch_takes_the_cpp_kernel_on_cpu_and_the_chunked_form_when_told(monkeypatch):
    """Under auto a float32 CPU call runs the compiled kernel; under reference the chunked form."""
    inputs = {name: x.detach() for name, x in make_inputs(Shape(1, 5, 2, 3, 1, 4, 0)).items()}
    calls = []
    kernel = cpu.ssd_cpu
    monkeypatch.setattr(cpu, "ssd_cpu", lambda *a, **kw: calls.append(1) or kernel(*a, **kw))
    y_cpp = dispatch.ssd(**inputs)
    assert calls == [1]
    monkeypatch.setenv(dispatch.MODE_VAR, "reference")
    assert_close("y", ssd_chunked(**inputs), dispatch.ssd(**inputs), ATOL)
    assert calls == [1] and torch.allclose(y_cpp, ssd_naive(**inputs), atol=ATOL)


def test_an_empty_sequence_passes_the_state_through():
    """T = 0: no output, the last state is the initial one, and its gradient passes back unchanged."""
    inputs = make_inputs(Shape(2, 0, 4, 3, 2, 5, 0))
    y, last = run(cpu.ssd_cpu, inputs)
    assert y.shape == (2, 0, 4, 3) and torch.equal(last, inputs["initial_state"])
    d_last = torch.randn_like(last)
    (grad,) = torch.autograd.grad((last * d_last).sum(), [inputs["initial_state"]])
    assert torch.equal(grad, d_last)
