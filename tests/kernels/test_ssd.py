"""Mamba-2 SSD: the chunked form matches the reference loop, and the reference means what it says.

Dimensions: B batch, T time, H heads, P head dim, G groups, N state size.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pytest
import torch
from archsearch_kernels.ssd import ssd_chunked, ssd_naive

from tests.kernels.conftest import assert_same_outputs_and_grads

ATOL = 1e-4
# the chunked form with short chunks, so the behaviour tests below cross chunk boundaries
BOTH = [
    pytest.param(ssd_naive, id="naive"),
    pytest.param(functools.partial(ssd_chunked, chunk_size=4), id="chunked"),
]


@dataclass(frozen=True)
class Shape:
    batch: int
    seq_len: int
    heads: int
    head_dim: int
    groups: int
    state_size: int
    chunk_size: int


SHAPES = [
    pytest.param(Shape(1, 1, 2, 4, 1, 3, 16), id="T1"),
    pytest.param(Shape(2, 7, 3, 5, 1, 6, 16), id="T7-below-one-chunk"),
    pytest.param(Shape(1, 63, 4, 6, 2, 5, 16), id="T63-ragged-last-chunk-G2"),
    pytest.param(Shape(2, 64, 2, 4, 1, 4, 16), id="T64-whole-chunks"),
    pytest.param(Shape(2, 100, 6, 7, 3, 9, 64), id="T100-H6-G3-P7-N9-chunk64"),
]


def make_inputs(shape: Shape, *, dt_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Leaf tensors for every argument, in the ranges a Mamba-2 layer produces."""
    b, t, h, p, g, n = shape.batch, shape.seq_len, shape.heads, shape.head_dim, shape.groups, shape.state_size
    inputs = {
        "x": torch.randn(b, t, h, p),
        # dt ~ softplus around its init (1e-3..1e-1) and above; A = -(1..16) as mamba2 draws it
        "dt": torch.nn.functional.softplus(torch.randn(b, t, h) - 2.0) * dt_scale,
        "A": -torch.empty(h).uniform_(1, 16),
        "B": torch.randn(b, t, g, n),
        "C": torch.randn(b, t, g, n),
        "D": torch.randn(h),
        "initial_state": torch.randn(b, h, p, n),
    }
    return {name: x.requires_grad_() for name, x in inputs.items()}


def run(op, inputs: dict[str, torch.Tensor], **kwargs):
    """Call `op` with every input, returning (y, last_state)."""
    return op(**inputs, return_last_state=True, **kwargs)


def assert_matches_naive(inputs, chunk_size):
    """Forward, last state and the gradient of every input agree with the loop."""
    assert_same_outputs_and_grads(lambda **kw: run(ssd_naive, kw),
                                  lambda **kw: run(ssd_chunked, kw, chunk_size=chunk_size), inputs, ATOL)


@pytest.mark.parametrize("shape", SHAPES)
def test_chunked_matches_naive_forward_state_and_every_gradient(shape):
    assert_matches_naive(make_inputs(shape), shape.chunk_size)


def test_strong_decay_stays_finite_and_matches():
    """dt * A near -50 a step: exp(G) over a 64-step chunk is far below fp32's range."""
    shape = Shape(2, 100, 2, 6, 1, 7, 64)
    assert_matches_naive(make_inputs(shape, dt_scale=40.0), shape.chunk_size)


def test_without_initial_state_or_skip():
    shape = Shape(2, 37, 2, 5, 1, 6, 16)
    inputs = make_inputs(shape)
    del inputs["initial_state"], inputs["D"]
    assert_matches_naive(inputs, shape.chunk_size)


@pytest.mark.parametrize("op", BOTH)
def test_no_decay_no_skip_is_causal_linear_attention(op, assert_close):
    """A = 0: y_t = sum_{s<=t} (C_t . B_s) dt_s x_s, softmax-free attention with a causal mask."""
    inputs = {name: x.detach() for name, x in make_inputs(Shape(2, 9, 2, 3, 1, 4, 4)).items()}
    inputs["A"], inputs["D"] = torch.zeros_like(inputs["A"]), None
    del inputs["initial_state"]
    y, _ = run(op, inputs)
    scores_BTS = torch.einsum("btn,bsn->bts", inputs["C"][:, :, 0], inputs["B"][:, :, 0]).tril()
    expected = torch.einsum("bts,bshp->bthp", scores_BTS, inputs["dt"][..., None] * inputs["x"])
    assert_close("y", expected, y, ATOL)


@pytest.mark.parametrize("op", BOTH)
def test_zero_input_only_decays_the_state(op, assert_close):
    """x = 0: y_t = exp(A (dt_1 + ... + dt_t)) S_0 C_t, and the state decays by the same factor."""
    inputs = {name: x.detach() for name, x in make_inputs(Shape(2, 9, 4, 3, 2, 5, 4)).items()}
    inputs["x"] = torch.zeros_like(inputs["x"])
    y, state = run(op, inputs)
    decay_BTH = (inputs["dt"].cumsum(1) * inputs["A"]).exp()
    C_BTHN = inputs["C"].repeat_interleave(2, dim=2)
    expected = decay_BTH[..., None] * torch.einsum("bhpn,bthn->bthp", inputs["initial_state"], C_BTHN)
    assert_close("y", expected, y, ATOL)
    assert_close("last_state", decay_BTH[:, -1, :, None, None] * inputs["initial_state"], state, ATOL)


@pytest.mark.parametrize("op", BOTH)
def test_heads_read_their_own_group(op, assert_close):
    """With G = 2 and H = 4, heads 0-1 read group 0 and heads 2-3 group 1: changing group 1's
    B and C leaves the first two heads' outputs unchanged."""
    inputs = {name: x.detach() for name, x in make_inputs(Shape(1, 11, 4, 3, 2, 5, 4)).items()}
    y, _ = run(op, inputs)
    changed = dict(inputs, B=inputs["B"].clone(), C=inputs["C"].clone())
    changed["B"][:, :, 1] += 1.0
    changed["C"][:, :, 1] -= 1.0
    y_changed, _ = run(op, changed)
    assert_close("heads of group 0", y[:, :, :2], y_changed[:, :, :2], ATOL)
    assert (y[:, :, 2:] - y_changed[:, :, 2:]).abs().max() > 1e-2


@pytest.mark.parametrize("op", BOTH)
def test_last_state_continues_the_scan(op, assert_close):
    """Running T steps in one call equals running a prefix, then the rest from its last state."""
    inputs = {name: x.detach() for name, x in make_inputs(Shape(2, 37, 2, 5, 1, 6, 8)).items()}
    y_full, state_full = run(op, inputs)
    split = 20
    timed = ("x", "dt", "B", "C")
    first = {name: x[:, :split] if name in timed else x for name, x in inputs.items()}
    rest = {name: x[:, split:] if name in timed else x for name, x in inputs.items()}
    y_first, state_first = run(op, first)
    y_rest, state_rest = run(op, {**rest, "initial_state": state_first})
    assert_close("y", y_full, torch.cat([y_first, y_rest], dim=1), ATOL)
    assert_close("last_state", state_full, state_rest, ATOL)


@pytest.mark.parametrize("op", BOTH)
def test_low_precision_input_gives_low_precision_output(op, assert_close):
    """Computed in fp32 inside, y comes back in x's dtype and the last state stays fp32."""
    inputs = {name: x.detach() for name, x in make_inputs(Shape(2, 7, 3, 5, 1, 6, 16)).items()}
    half = {name: x.bfloat16() for name, x in inputs.items()}
    y_half, state_half = run(op, half)
    y_full, _ = run(op, {name: x.float() for name, x in half.items()})
    assert y_half.dtype == torch.bfloat16 and state_half.dtype == torch.float32
    assert_close("y", y_full, y_half.float(), 1e-2)


def test_heads_not_divisible_by_groups_is_refused():
    inputs = {name: x.detach() for name, x in make_inputs(Shape(1, 5, 3, 2, 1, 2, 4)).items()}
    inputs["B"] = inputs["C"] = torch.randn(1, 5, 2, 2)
    for op in (ssd_naive, ssd_chunked):
        with pytest.raises(ValueError, match="3 heads do not split evenly over 2 groups"):
            op(**inputs)
