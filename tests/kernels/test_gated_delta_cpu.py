"""Gated delta rule, C++ CPU kernel: equal to the reference loop (forward, last state and every
gradient), used by dispatch where it builds.

Dimensions: B batch, T time, H heads, K key dim, V value dim.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from archsearch_kernels import dispatch
from archsearch_kernels.gated_delta import cpu, gated_delta_rule_chunked, gated_delta_rule_naive

from tests.kernels.conftest import assert_close, assert_same_outputs_and_grads
from tests.kernels.test_gated_delta import ATOL, SHAPES, Shape, make_inputs, run


@pytest.fixture(scope="module", autouse=True)
def built():
    """The kernel, built (or loaded from the cache) once; a test failure, not a skip, when a
    compiler exists and the build or its self-check fails."""
    if not cpu.available():
        if shutil.which("c++") or shutil.which("g++"):
            pytest.fail(f"the C++ gated delta rule did not build although a compiler exists: {cpu.build_error()}")
        pytest.skip("no C++ compiler on this machine")


@pytest.fixture(autouse=True)
def clean_setting(monkeypatch):
    monkeypatch.delenv(dispatch.MODE_VAR, raising=False)
    monkeypatch.setenv(dispatch.DISABLE_VAR, "")


@pytest.fixture(params=["rows", "lanes"])
def walk(request, monkeypatch):
    """Each test once per walk of the kernel, whatever the shape would choose."""
    monkeypatch.setattr(cpu, "by_lanes", lambda *sizes: request.param == "lanes")
    return request.param


def assert_matches_naive(inputs):
    assert_same_outputs_and_grads(lambda **kw: run(gated_delta_rule_naive, kw),
                                  lambda **kw: run(cpu.gated_delta_rule_cpu, kw), inputs, ATOL)


@pytest.mark.parametrize("shape", [*SHAPES,
                                   pytest.param(Shape(2, 2 * cpu.SPAN + 5, 3, 9, 5, None), id="T37-three-spans-K9-V5"),
                                   pytest.param(Shape(1, cpu.SPAN, 2, 16, 16, None), id="T16-one-whole-span"),
                                   pytest.param(Shape(3, cpu.SPAN + 7, 7, 16, 16, None), id="21-pairs-K16")])
def test_matches_naive_forward_state_and_every_gradient(shape, walk):
    assert_matches_naive(make_inputs(shape))


def test_strong_decay_stays_finite_and_matches(walk):
    """Log-decays near -30 a step, where the state forgets everything between steps."""
    assert_matches_naive(make_inputs(Shape(2, 40, 2, 6, 5, None), g_offset=-30.0))


def test_without_initial_state(walk):
    inputs = make_inputs(Shape(2, 21, 3, 4, 6, None))
    bare = {name: inputs[name] for name in ("q", "k", "v", "g", "beta")}
    o_ref, o_out = gated_delta_rule_naive(**bare), cpu.gated_delta_rule_cpu(**bare)
    assert_close("o", o_ref, o_out, ATOL)
    leaves = list(bare.values())
    for name, g_ref, g_out in zip(bare, torch.autograd.grad(o_ref.square().sum(), leaves),
                                  torch.autograd.grad(o_out.square().sum(), leaves)):
        assert_close(f"grad {name}", g_ref, g_out, ATOL)


def test_low_precision_input_gives_low_precision_output():
    inputs = {name: x.detach().bfloat16() for name, x in make_inputs(Shape(2, 9, 2, 4, 3, None)).items()}
    o, state = run(cpu.gated_delta_rule_cpu, inputs)
    assert o.dtype == torch.bfloat16 and state.dtype == torch.float32
    o_full, _ = run(cpu.gated_delta_rule_cpu, {name: x.float() for name, x in inputs.items()})
    assert_close("o", o_full, o.float(), 1e-2)


def test_dispatch_takes_the_cpp_kernel_on_float32_cpu_and_the_chunked_form_otherwise(monkeypatch):
    """Under auto a float32 CPU call runs the compiled loop; under reference, or on bfloat16, the chunked form."""
    inputs = {name: x.detach() for name, x in make_inputs(Shape(1, 5, 2, 3, 4, None)).items()}
    calls = []
    kernel = cpu.gated_delta_rule_cpu
    monkeypatch.setattr(cpu, "gated_delta_rule_cpu", lambda *a, **kw: calls.append(1) or kernel(*a, **kw))
    o_cpp = dispatch.gated_delta_rule(**inputs)
    assert calls == [1] and torch.allclose(o_cpp, gated_delta_rule_naive(**inputs), atol=ATOL)
    dispatch.gated_delta_rule(*(inputs[name].bfloat16() for name in ("q", "k", "v")), inputs["g"], inputs["beta"])
    assert calls == [1]
    monkeypatch.setenv(dispatch.MODE_VAR, "reference")
    assert_close("o", gated_delta_rule_chunked(**inputs), dispatch.gated_delta_rule(**inputs), ATOL)
    assert calls == [1]


def test_an_empty_sequence_passes_the_state_through(walk):
    """T = 0: no output, the last state is the initial one, and its gradient passes back unchanged."""
    inputs = make_inputs(Shape(2, 0, 3, 4, 5, None))
    o, last = run(cpu.gated_delta_rule_cpu, inputs)
    assert o.shape == (2, 0, 3, 5) and torch.equal(last, inputs["initial_state"])
    d_last = torch.randn_like(last)
    (grad,) = torch.autograd.grad((last * d_last).sum(), [inputs["initial_state"]])
    assert torch.equal(grad, d_last)


def test_the_lane_walk_takes_small_heads_with_a_group_of_pairs():
    """Lanes where a head's state is small and the pairs fill a group; rows otherwise."""
    assert cpu.by_lanes(8, 8, 16, 16) and cpu.by_lanes(1, cpu.LANES, 32, 32)
    assert not cpu.by_lanes(1, cpu.LANES - 1, 16, 16)
    assert not cpu.by_lanes(8, 8, 48, 48)
