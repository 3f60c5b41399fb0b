"""Gated delta rule: the chunked form matches the reference loop, and the reference means what it says.

Dimensions: B batch, T time, H heads, K key dim, V value dim.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from archsearch_kernels.gated_delta import (
    gated_delta_rule_chunked,
    gated_delta_rule_naive,
)

from tests.kernels.conftest import assert_same_outputs_and_grads

ATOL = 1e-4
# the chunked form with short chunks, so the behaviour tests below cross chunk boundaries
BOTH = [
    pytest.param(gated_delta_rule_naive, id="naive"),
    pytest.param(functools.partial(gated_delta_rule_chunked, chunk_size=4), id="chunked"),
]


@dataclass(frozen=True)
class Shape:
    batch: int
    seq_len: int
    heads: int
    key_dim: int
    value_dim: int
    chunk_size: int | None


SHAPES = [
    pytest.param(Shape(1, 1, 2, 4, 3, 16), id="T1"),
    pytest.param(Shape(2, 7, 3, 5, 6, 16), id="T7-below-one-chunk"),
    pytest.param(Shape(1, 63, 2, 8, 5, 16), id="T63-ragged-last-chunk"),
    pytest.param(Shape(2, 64, 2, 4, 4, 16), id="T64-whole-chunks"),
    pytest.param(Shape(2, 100, 1, 6, 7, 64), id="T100-K6-V7-chunk64"),
    # chunk_size None: the default picked from K and V (16 here), ragged at T = 50
    pytest.param(Shape(2, 50, 3, 16, 16, None), id="T50-K16-default-chunk"),
]


def make_inputs(shape: Shape, *, g_offset: float = 0.0) -> dict[str, torch.Tensor]:
    """Leaf tensors for every argument, in the ranges a Gated DeltaNet layer produces."""
    b, t, h, k, v = shape.batch, shape.seq_len, shape.heads, shape.key_dim, shape.value_dim
    inputs = {
        "q": F.normalize(torch.randn(b, t, h, k), dim=-1),
        "k": F.normalize(torch.randn(b, t, h, k), dim=-1),
        "v": torch.randn(b, t, h, v),
        # log-decays mostly in [-0.2, 0]: the state lives across several chunks
        "g": F.logsigmoid(torch.randn(b, t, h) + 3.0) + g_offset,
        "beta": torch.sigmoid(torch.randn(b, t, h)),
        "initial_state": torch.randn(b, h, k, v),
    }
    return {name: x.requires_grad_() for name, x in inputs.items()}


def run(rule, inputs: dict[str, torch.Tensor], **kwargs):
    """Call `rule` with every input, returning (o, last_state)."""
    return rule(**inputs, return_last_state=True, **kwargs)


def assert_matches_naive(inputs, chunk_size, assert_close):
    """Forward, last state and the gradient of every input agree with the loop."""
    assert_same_outputs_and_grads(lambda **kw: run(gated_delta_rule_naive, kw),
                                  lambda **kw: run(gated_delta_rule_chunked, kw, chunk_size=chunk_size), inputs, ATOL)


@pytest.mark.parametrize("shape", SHAPES)
def test_chunked_matches_naive_forward_state_and_every_gradient(shape, assert_close):
    assert_matches_naive(make_inputs(shape), shape.chunk_size, assert_close)


def test_strong_decay_stays_finite_and_matches(assert_close):
    """g near -50 a step: exp(G) over a 64-step chunk is exp(-3200), far below fp32's range."""
    shape = Shape(2, 100, 2, 6, 7, 64)
    assert_matches_naive(make_inputs(shape, g_offset=-50.0), shape.chunk_size, assert_close)


def test_without_initial_state(assert_close):
    shape = Shape(2, 37, 2, 5, 6, 16)
    inputs = make_inputs(shape)
    del inputs["initial_state"]
    assert_matches_naive(inputs, shape.chunk_size, assert_close)


@pytest.mark.parametrize("rule", BOTH)
def test_full_write_then_read_with_the_same_key_returns_the_value(rule, assert_close):
    """beta = 1 and a unit key overwrite what the key maps to, whatever the decay: S_t k_t = v_t."""
    inputs = {name: x.detach() for name, x in make_inputs(Shape(2, 9, 3, 5, 4, 4)).items()}
    inputs["q"] = inputs["k"]
    inputs["beta"] = torch.ones_like(inputs["beta"])
    o, _ = run(rule, inputs)
    assert_close("o", inputs["v"], o, ATOL)


@pytest.mark.parametrize("rule", BOTH)
def test_no_write_only_decays_the_state(rule, assert_close):
    """beta = 0: o_t[v] = exp(g_1 + ... + g_t) * sum_k q_t[k] state_0[k, v] (state stored [K, V])."""
    inputs = {name: x.detach() for name, x in make_inputs(Shape(2, 9, 3, 5, 4, 4)).items()}
    inputs["beta"] = torch.zeros_like(inputs["beta"])
    o, state = run(rule, inputs)
    decay_BTH = inputs["g"].cumsum(1).exp()
    expected = decay_BTH[..., None] * torch.einsum("bthk,bhkv->bthv", inputs["q"], inputs["initial_state"])
    assert_close("o", expected, o, ATOL)
    assert_close("last_state", decay_BTH[:, -1, :, None, None] * inputs["initial_state"], state, ATOL)


@pytest.mark.parametrize("rule", BOTH)
def test_last_state_continues_the_rule(rule, assert_close):
    """Running T steps in one call equals running a prefix, then the rest from its last state."""
    inputs = {name: x.detach() for name, x in make_inputs(Shape(2, 37, 2, 5, 6, 8)).items()}
    o_full, state_full = run(rule, inputs)
    split = 20
    first = {name: x[:, :split] if name != "initial_state" else x for name, x in inputs.items()}
    rest = {name: x[:, split:] if name != "initial_state" else x for name, x in inputs.items()}
    o_first, state_first = run(rule, first)
    o_rest, state_rest = run(rule, {**rest, "initial_state": state_first})
    assert_close("o", o_full, torch.cat([o_first, o_rest], dim=1), ATOL)
    assert_close("last_state", state_full, state_rest, ATOL)


def test_gradients_come_back_in_each_input_dtype_and_layout():
    """bf16 leaves get bf16 gradients and a strided view (the layer's layout) the gradient of its
    own shape; the initial state's gradient is None when there is none."""
    shape = Shape(2, 21, 2, 5, 6, 8)
    inputs = {name: x.detach() for name, x in make_inputs(shape).items()}
    del inputs["initial_state"]
    leaves = {name: x.bfloat16().requires_grad_() for name, x in inputs.items()}
    o = gated_delta_rule_chunked(**leaves, chunk_size=8)
    o.float().sum().backward()
    assert all(x.grad is not None and x.grad.dtype == torch.bfloat16 for x in leaves.values())
    wide = torch.randn(2, 21, 2, 3 * 5).requires_grad_()
    q = wide[..., :5]  # a view with strides, as the layer hands q
    o = gated_delta_rule_chunked(q, **{n: x for n, x in inputs.items() if n != "q"}, chunk_size=8)
    o.sum().backward()
    assert wide.grad.shape == wide.shape and wide.grad[..., 5:].abs().max() == 0


@pytest.mark.parametrize("rule", BOTH)
def test_low_precision_input_gives_low_precision_output(rule, assert_close):
    """Computed in fp32 inside, o comes back in v's dtype and the last state stays fp32."""
    inputs = {name: x.detach() for name, x in make_inputs(Shape(2, 7, 3, 5, 6, 16)).items()}
    half = {name: x.bfloat16() for name, x in inputs.items()}
    o_half, state_half = run(rule, half)
    o_full, _ = run(rule, {name: x.float() for name, x in half.items()})
    assert o_half.dtype == torch.bfloat16 and state_half.dtype == torch.float32
    assert_close("o", o_full, o_half.float(), 1e-2)
