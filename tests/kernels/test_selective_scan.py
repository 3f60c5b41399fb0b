"""Selective scan: the chunked form matches the reference loop, and the reference means what it says.

Dimensions: B batch, E inner channels, N state size, T time.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from archsearch_kernels.selective_scan import (
    selective_scan_chunked,
    selective_scan_naive,
)

from tests.kernels.conftest import assert_same_outputs_and_grads

ATOL = 1e-4
# arguments with a time axis (the last one); the rest are per channel or the state
TIME_ARGS = ("u", "delta", "B", "C", "z")
# the chunked form with short chunks, so the behaviour tests below cross chunk boundaries
BOTH = [
    pytest.param(selective_scan_naive, id="naive"),
    pytest.param(functools.partial(selective_scan_chunked, chunk_size=4), id="chunked"),
]


@dataclass(frozen=True)
class Shape:
    batch: int
    channels: int
    state_size: int
    seq_len: int
    chunk_size: int


SHAPES = [
    pytest.param(Shape(1, 3, 2, 1, 16), id="T1"),
    pytest.param(Shape(2, 5, 3, 7, 16), id="T7-below-one-chunk"),
    pytest.param(Shape(1, 4, 3, 63, 16), id="T63-ragged-last-chunk"),
    pytest.param(Shape(2, 5, 4, 64, 16), id="T64-whole-chunks"),
    pytest.param(Shape(2, 5, 3, 100, 32), id="T100-E5-N3"),
]


def make_inputs(shape: Shape, *, delta_offset: float = 0.0) -> dict[str, torch.Tensor]:
    """Leaf tensors for every argument, in the ranges a Mamba layer produces."""
    b, e, n, t = shape.batch, shape.channels, shape.state_size, shape.seq_len
    # Mamba's init: softplus(delta_bias) log-uniform in [1e-3, 1e-1]. Steps this small keep
    # the state alive across many chunks, so a wrong carry between chunks shows up.
    dt_E = torch.exp(torch.empty(e).uniform_(math.log(1e-3), math.log(1e-1)))
    inputs = {
        "u": torch.randn(b, e, t),
        "delta": 0.5 * torch.randn(b, e, t) + delta_offset,
        # S4D-real init: A = -(1..N) per channel, jittered so channels differ
        "A": -torch.arange(1, n + 1).float().repeat(e, 1) * (1 + 0.1 * torch.rand(e, n)),
        "B": torch.randn(b, n, t),
        "C": torch.randn(b, n, t),
        "D": torch.randn(e),
        "z": torch.randn(b, e, t),
        "delta_bias": torch.log(torch.expm1(dt_E)),
        "initial_state": torch.randn(b, e, n),
    }
    return {name: x.requires_grad_() for name, x in inputs.items()}


def run(scan, inputs: dict[str, torch.Tensor], **kwargs):
    """Call `scan` with every input and softplus, returning (y, last_state)."""
    return scan(**inputs, delta_softplus=True, return_last_state=True, **kwargs)


def assert_matches_naive(inputs, chunk_size, assert_close):
    """Forward, last state and the gradient of every input agree with the loop."""
    assert_same_outputs_and_grads(lambda **kw: run(selective_scan_naive, kw),
                                  lambda **kw: run(selective_scan_chunked, kw, chunk_size=chunk_size), inputs, ATOL)


@pytest.mark.parametrize("shape", SHAPES)
def test_chunked_matches_naive_forward_state_and_every_gradient(shape, assert_close):
    assert_matches_naive(make_inputs(shape), shape.chunk_size, assert_close)


def test_strong_decay_stays_finite_and_matches(assert_close):
    """delta near 100, A in [-3.3, -1]: log-decays of -100 to -330 a step, ~-20000 over a chunk."""
    shape = Shape(2, 5, 3, 100, 64)
    assert_matches_naive(make_inputs(shape, delta_offset=100.0), shape.chunk_size, assert_close)


@pytest.mark.parametrize("shape", SHAPES[1:3])
def test_optional_arguments_left_out(shape, assert_close):
    """No D, z, bias, softplus, initial state or chunk size: the same plain scan either way."""
    inputs = make_inputs(shape)
    bare = {name: inputs[name] for name in ("u", "A", "B", "C")}
    # without softplus delta must already be positive to decay
    bare["delta"] = F.softplus(inputs["delta"]).detach().requires_grad_()
    y_ref = selective_scan_naive(**bare)
    y_out = selective_scan_chunked(**bare)
    assert_close("y", y_ref, y_out, ATOL)
    leaves = list(bare.values())
    grads_ref = torch.autograd.grad(y_ref.sum(), leaves)
    grads_out = torch.autograd.grad(y_out.sum(), leaves)
    for name, grad_ref, grad_out in zip(bare, grads_ref, grads_out):
        assert_close(f"grad {name}", grad_ref, grad_out, ATOL)


@pytest.mark.parametrize("scan", BOTH)
def test_memoryless_state_gives_closed_form(scan, assert_close):
    """With A so negative that the state forgets each step, y_t = delta_t u_t <B_t, C_t> + D u_t."""
    b, e, n, t = 2, 5, 3, 9
    u, delta = torch.randn(b, e, t), F.softplus(torch.randn(b, e, t)) + 0.1
    A = torch.full((e, n), -1e4)
    B, C, D = torch.randn(b, n, t), torch.randn(b, n, t), torch.randn(e)
    expected = delta * u * (B * C).sum(1, keepdim=True) + D[:, None] * u
    assert_close("y", expected, scan(u, delta, A, B, C, D), ATOL)


@pytest.mark.parametrize("scan", BOTH)
def test_last_state_continues_the_scan(scan, assert_close):
    """Scanning T steps in one call equals scanning a prefix, then the rest from its last state."""
    inputs = {name: x.detach() for name, x in make_inputs(Shape(2, 5, 3, 37, 8)).items()}
    y_full, state_full = run(scan, inputs)
    split = 20
    first = {name: x[..., :split] if name in TIME_ARGS else x for name, x in inputs.items()}
    rest = {name: x[..., split:] if name in TIME_ARGS else x for name, x in inputs.items()}
    y_first, state_first = run(scan, first)
    y_rest, state_rest = run(scan, {**rest, "initial_state": state_first})
    assert_close("y", y_full, torch.cat([y_first, y_rest], dim=-1), ATOL)
    assert_close("last_state", state_full, state_rest, ATOL)


@pytest.mark.parametrize("scan", BOTH)
def test_low_precision_input_gives_low_precision_output(scan, assert_close):
    """Computed in fp32 inside, y comes back in u's dtype and the last state stays fp32."""
    inputs = {name: x.detach() for name, x in make_inputs(Shape(2, 5, 3, 7, 16)).items()}
    half = {name: x.bfloat16() for name, x in inputs.items()}
    y_half, state_half = run(scan, half)
    y_full, _ = run(scan, {name: x.float() for name, x in half.items()})
    assert y_half.dtype == torch.bfloat16 and state_half.dtype == torch.float32
    assert_close("y", y_full, y_half.float(), 1e-2)
