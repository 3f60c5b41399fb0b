"""The chunked (WY form) Triton kernels of the gated delta rule agree with the reference loop:
output, last state and the gradient of every input, fp32, at 1e-4.

On a machine without a GPU they run in Triton's interpreter (TRITON_INTERPRET=1, set here
before triton is imported), on tiny shapes; bf16 is checked on a GPU only (the interpreter
multiplies bf16 `tl.dot` inputs wrongly). Every buffer the kernels allocate starts as NaN
(the `triton_kernels` fixture), so an element left unwritten fails.

Planted mutations these tests catch (each tried by hand): `_bwd_states` without the
`exp(G_end) * ds` decay of the state gradient (six fail, on grad k or grad initial_state);
`_bwd_chunk` without the UT inverse's log-decay term (`d_log = dM * ...`) in dG (five fail,
on grad g); `_fwd_states` storing each chunk's state after the chunk instead of before it
(seven fail, on the output).

Dimensions: B batch, T time, H heads, K key dim, V value dim, L chunk length.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch.nn.functional as F
from archsearch_kernels.gated_delta import gated_delta_rule_chunked_triton, gated_delta_rule_naive

from tests.kernels.conftest import assert_close, assert_same_outputs_and_grads

ATOL = 1e-4

SHAPES = [  # batch, time, heads, key dim, value dim, chunk, with an initial state
    pytest.param((1, 1, 1, 4, 4, 16, True), id="T1"),
    pytest.param((2, 7, 2, 5, 3, 16, True), id="T7-below-one-chunk-K5-V3-H2"),
    pytest.param((2, 7, 2, 5, 3, 16, False), id="T7-below-one-chunk-zero-state"),
    pytest.param((1, 37, 3, 8, 6, 16, True), id="T37-ragged-third-chunk-H3"),
    pytest.param((1, 20, 1, 20, 70, 16, False), id="K20-V70-two-value-blocks-zero-state"),
    pytest.param((1, 70, 1, 4, 5, 64, False), id="T70-chunk64-ragged-zero-state"),
]


def make_inputs(shape, device: str, *, g_offset: float = 0.0) -> dict[str, torch.Tensor]:
    b, t, h, k, v, _, initial_state = shape
    inputs = dict(q=torch.randn(b, t, h, k), k=F.normalize(torch.randn(b, t, h, k), dim=-1),
                  v=torch.randn(b, t, h, v), g=F.logsigmoid(2 + torch.randn(b, t, h)) + g_offset,
                  beta=torch.rand(b, t, h))
    if initial_state:
        inputs["initial_state"] = torch.randn(b, h, k, v)
    return {name: x.to(device).requires_grad_() for name, x in inputs.items()}


def assert_matches_reference(inputs: dict[str, torch.Tensor], chunk: int) -> None:
    def run(rule, **kwargs):
        return lambda **kw: rule(**kw, return_last_state=True, **kwargs)

    assert_same_outputs_and_grads(run(gated_delta_rule_naive), run(gated_delta_rule_chunked_triton, chunk_size=chunk),
                                  inputs, ATOL)


@pytest.mark.parametrize("shape", SHAPES)
def test_chunked_kernel_matches_reference(shape, triton_kernels):
    assert_matches_reference(make_inputs(shape, triton_kernels), shape[5])


def test_strong_decay_stays_finite_and_matches(triton_kernels):
    """g near -50 a step: exp(G) over a chunk falls far below fp32's range; every exponent the
    kernels take is a difference G_l - G_s (s <= l) or G itself, so nothing overflows."""
    shape = (1, 40, 2, 6, 7, 32, True)
    assert_matches_reference(make_inputs(shape, triton_kernels, g_offset=-50.0), shape[5])


def test_output_alone_and_no_grad(triton_kernels):
    """Called as the models call it (o only) it returns o; under no_grad it needs no backward."""
    inputs = make_inputs((2, 19, 2, 8, 8, 16, False), triton_kernels)
    with torch.no_grad():
        o = gated_delta_rule_chunked_triton(**inputs, chunk_size=16)
    assert_close("o", gated_delta_rule_naive(**inputs), o, ATOL)


def test_chunk_size_must_be_a_power_of_two_tile():
    inputs = make_inputs((1, 4, 1, 4, 4, 16, False), "cpu")
    with pytest.raises(ValueError, match="chunk_size must be 16, 32, 64 or 128, got 24"):
        gated_delta_rule_chunked_triton(**inputs, chunk_size=24)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="bf16 kernels are checked on a GPU only (the interpreter's bf16 tl.dot is wrong)")
def test_bf16_on_a_gpu_matches_the_fp32_reference():
    """bf16 q, k, v, beta (fp32 g, as the layer makes it): within bf16 rounding of the fp32 reference."""
    torch.manual_seed(0)
    fp32 = make_inputs((2, 300, 4, 64, 64, 64, True), "cuda")
    low = {name: (x.detach().bfloat16() if name in ("q", "k", "v", "beta") else x.detach()).requires_grad_()
           for name, x in fp32.items()}
    high = {name: x.detach().float().requires_grad_() for name, x in low.items()}
    o_low, s_low = gated_delta_rule_chunked_triton(**low, return_last_state=True)
    o_high, s_high = gated_delta_rule_naive(**high, return_last_state=True)
    assert_close("output", o_high, o_low.float(), 3e-2)
    assert_close("last_state", s_high, s_low, 3e-2)
    grads_low = torch.autograd.grad(o_low.float().sum() + s_low.sum(), list(low.values()))
    grads_high = torch.autograd.grad(o_high.sum() + s_high.sum(), list(high.values()))
    for name, g_high, g_low in zip(low, grads_high, grads_low):
        assert_close(f"grad {name}", g_high, g_low.float(), 5e-2)


@pytest.mark.slow
def test_kernels_compile_for_an_h100_within_its_shared_memory():
    """The interpreter cannot see what a GPU refuses; compiled ahead of time for sm_90 (no GPU
    needed), every kernel at the model's sizes (K = V = 128, bf16) fits in a block's 227 KB of
    shared memory in chunks of 64, and in 100 KB in the default chunks of 32; a tighter limit is
    reported as a failure naming the kernels."""
    pytest.importorskip("triton")
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "compile_gated_delta_sm90.py"
    fits = subprocess.run([sys.executable, str(script), "--chunk", "64"], capture_output=True, text=True)
    assert fits.returncode == 0, fits.stderr[-2000:]
    assert [line.split()[0] for line in fits.stdout.splitlines()[1:]] == [
        "_fwd_prepare", "_fwd_states", "_fwd_output", "_bwd_states", "_bwd_chunk"]
    default = subprocess.run([sys.executable, str(script), "--shared-kb", "100"], capture_output=True, text=True)
    assert default.returncode == 0 and " L 32 " in default.stdout, default.stdout + default.stderr[-2000:]
    tight = subprocess.run([sys.executable, str(script), "--chunk", "64", "--shared-kb", "100"], capture_output=True,
                           text=True)
    assert tight.returncode == 1
    assert "over 100.0 KB of shared memory: _fwd_states, _bwd_states, _bwd_chunk" in tight.stderr
