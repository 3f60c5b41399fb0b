"""The Triton kernels agree with their PyTorch references: forward and every gradient.

On a machine without a GPU they run in Triton's interpreter (TRITON_INTERPRET=1, set here
before triton is imported) on tiny shapes, in fp32 only: the interpreter multiplies bf16
`tl.dot` inputs wrongly, so bf16 agreement is left to a GPU run (benchmarks/bench_kernels_gpu.py).
Every buffer a kernel allocates starts as NaN (the `triton_kernels` fixture), so an element
left unwritten fails. Shapes include non-power-of-two widths and lengths shorter than one
block. Planted mutations that these tests catch: dropping the scan backward's
`dh = dh * a` (six scan tests fail); masking out one channel's store of d delta (fails on
NaN, "grad delta: output has NaN or inf"); the gated delta backward without `ds = alpha * ds`
(all five fail); cross-entropy gradients for ignored rows (`row_scale = scale`, two fail);
RMSNorm's dx without its mean term (four fail); SwiGLU's d gate without the sigmoid's
derivative (four fail). Dimensions: R rows, D width, F MLP width, N tokens, V vocabulary, B E N T as in the scan.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from archsearch_kernels.gated_delta import gated_delta_rule_naive, gated_delta_rule_triton
from archsearch_kernels.linear_cross_entropy import (
    linear_cross_entropy_naive,
    linear_cross_entropy_triton,
)
from archsearch_kernels.rmsnorm import rms_norm_naive, rms_norm_triton
from archsearch_kernels.selective_scan import selective_scan_naive, selective_scan_triton
from archsearch_kernels.swiglu import swiglu_naive, swiglu_triton

from tests.kernels.conftest import assert_close, assert_same_outputs_and_grads

ATOL = 1e-4


def leaves(device: str, **tensors: torch.Tensor) -> dict[str, torch.Tensor]:
    return {name: x.to(device).requires_grad_() for name, x in tensors.items()}


def assert_grads_agree(ref: torch.Tensor, out: torch.Tensor, inputs: dict[str, torch.Tensor]) -> None:
    """Outputs agree, and so do the gradients of every input under one random cotangent."""
    assert_close("output", ref, out, ATOL)
    cotangent = torch.randn_like(ref)
    grads_ref = torch.autograd.grad((ref * cotangent).sum(), list(inputs.values()))
    grads_out = torch.autograd.grad((out * cotangent).sum(), list(inputs.values()))
    for name, grad_ref, grad_out in zip(inputs, grads_ref, grads_out):
        assert_close(f"grad {name}", grad_ref, grad_out, ATOL)


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 5, 33), (4, 130), (0, 8)],
                         ids=["R1-D1", "R3-D7", "R10-D33", "R4-D130", "R0-no-rows"])
def test_rms_norm_matches_reference(shape, triton_kernels):
    inputs = leaves(triton_kernels, x=3 * torch.randn(shape), weight=1 + torch.randn(shape[-1]))
    assert_grads_agree(rms_norm_naive(**inputs, eps=1e-5), rms_norm_triton(**inputs, eps=1e-5), inputs)


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 3, 1030), (2, 0)], ids=["R1-F1", "R3-F7", "R6-F1030-two-blocks", "F0"])
def test_swiglu_matches_reference(shape, triton_kernels):
    inputs = leaves(triton_kernels, gate=2 * torch.randn(shape), up=torch.randn(shape))
    assert_grads_agree(swiglu_naive(**inputs), swiglu_triton(**inputs), inputs)


@pytest.mark.parametrize("width", [9, 1030], ids=["F9", "F1030-two-blocks"])
def test_swiglu_reads_the_halves_of_one_projection(width, triton_kernels, monkeypatch):
    """gate and up as the two halves of one [.., 2F] tensor (strided views, not copies): the
    packed path runs, and writes the whole tensor's gradient in one buffer."""
    from archsearch_kernels.swiglu import kernel

    packed = []
    real = kernel._SwiGLUPacked.apply
    monkeypatch.setattr(kernel._SwiGLUPacked, "apply", lambda *a: packed.append(1) or real(*a))
    fused = leaves(triton_kernels, gate_up=torch.randn(2, 5, 2 * width))
    ref = swiglu_naive(*fused["gate_up"].chunk(2, dim=-1))
    out = swiglu_triton(*fused["gate_up"].chunk(2, dim=-1))
    assert packed == [1]
    assert_grads_agree(ref, out, fused)


LINEAR_CE_SHAPES = [
    pytest.param((1, 4, 7, None), id="N1-V7"),
    pytest.param((13, 8, 37, 5), id="N13-V37-ragged-chunks"),
    pytest.param((9, 6, 1500, 4), id="N9-V1500-two-vocab-blocks"),
]


@pytest.mark.parametrize("shape", LINEAR_CE_SHAPES)
def test_linear_cross_entropy_matches_reference(shape, triton_kernels):
    tokens, width, vocab, chunk = shape
    targets = torch.randint(0, vocab, (tokens,))
    targets[::3] = -100  # every third row unscored
    targets[-1] = vocab - 1  # the last class, at the edge of the last vocabulary block
    inputs = leaves(triton_kernels, x=torch.randn(tokens, width), weight=torch.randn(vocab, width))
    targets = targets.to(triton_kernels)
    ref = linear_cross_entropy_naive(**inputs, targets=targets)
    out = linear_cross_entropy_triton(**inputs, targets=targets, chunk_size=chunk)
    assert_grads_agree(ref, out, inputs)


def test_linear_cross_entropy_without_grad_gives_the_loss(triton_kernels):
    x, weight = torch.randn(2, 3, 8, device=triton_kernels), torch.randn(11, 8, device=triton_kernels)
    targets = torch.randint(0, 11, (2, 3), device=triton_kernels)
    with torch.no_grad():
        assert_close("loss", linear_cross_entropy_naive(x, weight, targets),
                     linear_cross_entropy_triton(x, weight, targets, chunk_size=4), ATOL)


SCAN_SHAPES = [  # batch, channels, state size, time, chunk
    pytest.param((1, 3, 2, 1, 4), id="T1"),
    pytest.param((2, 5, 3, 7, 16), id="T7-below-one-chunk"),
    pytest.param((1, 4, 5, 13, 4), id="T13-ragged-last-chunk-N5"),
    pytest.param((1, 130, 3, 6, 4), id="E130-two-channel-blocks"),
    pytest.param((2, 5, 4, 64, 16), id="T64-whole-chunks"),
    pytest.param((1, 6, 3, 100, 32), id="T100-default-sized-state"),
]


def scan_inputs(shape, device: str) -> dict[str, torch.Tensor]:
    b, e, n, t, _ = shape
    return leaves(device, u=torch.randn(b, e, t), delta=0.5 * torch.randn(b, e, t),
                  A=-torch.rand(e, n) * 2 - 0.1, B=torch.randn(b, n, t), C=torch.randn(b, n, t),
                  D=torch.randn(e), z=torch.randn(b, e, t), delta_bias=torch.randn(e) - 1,
                  initial_state=torch.randn(b, e, n))


@pytest.mark.parametrize("shape", SCAN_SHAPES)
def test_selective_scan_matches_reference(shape, triton_kernels):
    def run(scan, **kwargs):
        return lambda **inputs: scan(**inputs, delta_softplus=True, return_last_state=True, **kwargs)

    assert_same_outputs_and_grads(run(selective_scan_naive), run(selective_scan_triton, chunk_size=shape[-1]),
                                  scan_inputs(shape, triton_kernels), ATOL)


def test_selective_scan_skipped_tokens_keep_the_state(triton_kernels):
    """delta = 0 at a skipped token (no softplus, no bias, as the Mamba block passes it):
    the kernel's last state equals a scan over the kept tokens alone, and agrees with the
    reference in every gradient."""
    inputs = {name: x.detach() for name, x in scan_inputs((2, 5, 3, 11, 4), triton_kernels).items()}
    del inputs["delta_bias"], inputs["z"]
    keep_T = torch.tensor([1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0], dtype=torch.bool, device=triton_kernels)
    inputs["delta"] = torch.nn.functional.softplus(inputs["delta"]) * keep_T
    inputs = {name: x.requires_grad_() for name, x in inputs.items()}
    _, last = selective_scan_triton(**inputs, return_last_state=True, chunk_size=4)
    kept = {name: x[..., keep_T] if name in ("u", "delta", "B", "C") else x for name, x in inputs.items()}
    _, last_kept = selective_scan_naive(**kept, return_last_state=True)
    assert_close("last_state", last_kept, last, ATOL)

    def run(scan, **kwargs):
        return lambda **kw: scan(**kw, return_last_state=True, **kwargs)

    assert_same_outputs_and_grads(run(selective_scan_naive), run(selective_scan_triton, chunk_size=4), inputs, ATOL)


def test_selective_scan_optional_arguments_left_out(triton_kernels):
    """No D, z, bias, softplus or initial state: y alone, and its gradients."""
    full = scan_inputs((2, 5, 3, 9, 4), triton_kernels)
    bare = {name: full[name] for name in ("u", "delta", "A", "B", "C")}
    assert_grads_agree(selective_scan_naive(**bare), selective_scan_triton(**bare, chunk_size=4), bare)


GDR_SHAPES = [  # batch, time, heads, key dim, value dim, chunk
    pytest.param((1, 1, 1, 4, 4, 4), id="T1"),
    pytest.param((2, 7, 2, 5, 3, 16), id="T7-below-one-chunk-K5-V3"),
    pytest.param((1, 13, 2, 8, 6, 4), id="T13-ragged-last-chunk"),
    pytest.param((1, 5, 1, 16, 300, 4), id="V300-two-value-blocks"),
]


@pytest.mark.parametrize("shape", GDR_SHAPES)
def test_gated_delta_rule_matches_reference(shape, triton_kernels):
    b, t, h, k, v, chunk = shape
    inputs = leaves(triton_kernels, q=torch.randn(b, t, h, k),
                    k=torch.nn.functional.normalize(torch.randn(b, t, h, k), dim=-1), v=torch.randn(b, t, h, v),
                    g=torch.nn.functional.logsigmoid(2 + torch.randn(b, t, h)), beta=torch.rand(b, t, h),
                    initial_state=torch.randn(b, h, k, v))

    def run(rule, **kwargs):
        return lambda **kw: rule(**kw, return_last_state=True, **kwargs)

    assert_same_outputs_and_grads(run(gated_delta_rule_naive), run(gated_delta_rule_triton, chunk_size=chunk),
                                  inputs, ATOL)


def test_gated_delta_rule_without_initial_state(triton_kernels):
    b, t, h, k, v = 2, 9, 2, 4, 5
    inputs = leaves(triton_kernels, q=torch.randn(b, t, h, k), k=torch.nn.functional.normalize(torch.randn(b, t, h, k), dim=-1),
                    v=torch.randn(b, t, h, v), g=-torch.rand(b, t, h), beta=torch.rand(b, t, h))
    assert_grads_agree(gated_delta_rule_naive(**inputs), gated_delta_rule_triton(**inputs, chunk_size=4), inputs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 kernels are checked on a GPU only (the interpreter's bf16 is wrong)")
def test_bf16_on_a_gpu_matches_the_fp32_reference():
    """In bf16 each kernel stays within bf16 rounding of the fp32 reference, forward and gradients."""
    torch.manual_seed(0)
    dev, bf16 = "cuda", torch.bfloat16

    def pair(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        low = x.to(dev, bf16).requires_grad_()
        return low, low.detach().float().requires_grad_()

    cases = {
        "rms_norm": (rms_norm_naive, rms_norm_triton, [torch.randn(4, 77, 300), torch.randn(300)]),
        "swiglu": (swiglu_naive, swiglu_triton, [torch.randn(4, 77, 300), torch.randn(4, 77, 300)]),
    }
    for name, (reference, kernel, tensors) in cases.items():
        pairs = [pair(x) for x in tensors]
        low = kernel(*(p[0] for p in pairs))
        high = reference(*(p[1] for p in pairs))
        assert_close(f"{name} output", high, low.float(), 3e-2)
        grads_low = torch.autograd.grad(low.float().sum(), [p[0] for p in pairs])
        grads_high = torch.autograd.grad(high.sum(), [p[1] for p in pairs])
        for i, (g_high, g_low) in enumerate(zip(grads_high, grads_low)):
            assert_close(f"{name} grad {i}", g_high, g_low.float(), 5e-2)
