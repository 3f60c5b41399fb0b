"""The SSD Triton kernel agrees with the reference loop: output, last state and the gradient
of every input, fp32, at 1e-4.

On a machine without a GPU it runs in Triton's interpreter (TRITON_INTERPRET=1, set here
before triton is imported), on tiny shapes. Every buffer the kernel allocates starts as NaN
(the `triton_kernels` fixture), so an element left unwritten fails.

Planted mutation these tests catch (tried by hand): `_ssd_bwd` reading the decay of the
state gradient with the step's own state, `tl.sum(ds * s_t)` in place of `ds * s_prev`, in
d log a (all five shapes of test_kernel_matches_reference fail, on grad dt: grad dt comes before grad A).

Dimensions: B batch, T time, H heads, G groups, P head dim, N state size, L checkpoint interval.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch.nn.functional as F
from archsearch_kernels.ssd import ssd_naive, ssd_triton

from tests.kernels.conftest import assert_close, assert_same_outputs_and_grads

ATOL = 1e-4

SHAPES = [  # batch, time, heads, groups, head dim, state size, chunk, with an initial state, with D
    pytest.param((1, 1, 1, 1, 4, 4, 8, True, True), id="T1"),
    pytest.param((2, 5, 2, 1, 3, 5, 8, True, False), id="T5-below-one-chunk-R2-P3-N5"),
    pytest.param((2, 5, 2, 2, 3, 5, 8, False, True), id="T5-G2-zero-state"),
    pytest.param((1, 19, 4, 2, 5, 6, 8, True, True), id="T19-ragged-third-chunk-G2-R2"),
    pytest.param((1, 9, 3, 1, 70, 64, 4, False, False), id="P70-N64-two-P-blocks-R3-zero-state"),
]


def make_inputs(shape, device: str) -> dict[str, torch.Tensor]:
    b, t, h, g, p, n, _, initial_state, skip = shape
    inputs = dict(x=torch.randn(b, t, h, p), dt=F.softplus(torch.randn(b, t, h) - 1), A=-torch.rand(h) * 2 - 0.1,
                  B=torch.randn(b, t, g, n), C=torch.randn(b, t, g, n))
    if skip:
        inputs["D"] = torch.randn(h)
    if initial_state:
        inputs["initial_state"] = torch.randn(b, h, p, n)
    return {name: x.to(device).requires_grad_() for name, x in inputs.items()}


@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_matches_reference(shape, triton_kernels):
    chunk = shape[6]
    assert_same_outputs_and_grads(lambda **kw: ssd_naive(**kw, return_last_state=True),
                                  lambda **kw: ssd_triton(**kw, return_last_state=True, chunk_size=chunk),
                                  make_inputs(shape, triton_kernels), ATOL)


def test_output_alone_and_no_grad(triton_kernels):
    """Called as a model that needs no state calls it (y only) it returns y; under no_grad it
    saves nothing for a backward."""
    inputs = make_inputs((2, 7, 2, 1, 4, 4, 8, False, True), triton_kernels)
    with torch.no_grad():
        y = ssd_triton(**inputs)
    assert_close("y", ssd_naive(**inputs), y, ATOL)


def test_uneven_groups_are_refused(triton_kernels):
    inputs = make_inputs((1, 3, 3, 2, 4, 4, 8, False, False), triton_kernels)
    with pytest.raises(ValueError, match="do not split evenly"):
        ssd_triton(**inputs)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="bf16 on a GPU only: Triton's interpreter computes bf16 wrongly")
def test_bf16_inputs_match_fp32_reference(triton_kernels):
    """bf16 inputs, fp32 state inside: y in bf16 within bf16 rounding of the fp32 spec."""
    inputs = {name: x.detach().bfloat16() for name, x in make_inputs((2, 40, 4, 2, 16, 16, 16, True, True),
                                                                       triton_kernels).items()}
    ref = ssd_naive(**{name: x.float() for name, x in inputs.items()})
    y = ssd_triton(**inputs)
    assert y.dtype == torch.bfloat16
    assert_close("y", ref, y.float(), 3e-2)


def test_dispatch_takes_the_kernel_on_cuda_or_when_forced_and_chunked_elsewhere(monkeypatch):
    """auto: the C++ kernel on float32 CPU tensors (tests/kernels/test_ssd_cpu.py); ARCHSEARCH_KERNELS=triton
    forces the Triton kernel, reference the chunked form, and a kernel the preflight disabled is not taken."""
    from archsearch_kernels import dispatch

    monkeypatch.setenv(dispatch.DISABLE_VAR, "")
    taken = []
    monkeypatch.setattr(dispatch, "ssd_triton", lambda *a, **kw: taken.append("triton"))
    monkeypatch.setattr(dispatch.ssd_cpu_kernel, "ssd_cpu", lambda *a, **kw: taken.append("cpp"))
    monkeypatch.setattr(dispatch, "ssd_chunked", lambda *a, chunk_size, **kw: taken.append(f"chunked{chunk_size}"))
    x = torch.zeros(1, 3, 2, 4)
    for setting in ("auto", "triton", "reference"):
        monkeypatch.setenv(dispatch.MODE_VAR, setting)
        dispatch.ssd(x, None, None, None, None, chunk_size=16)
    monkeypatch.setenv(dispatch.MODE_VAR, "triton")
    dispatch.disable("ssd")
    dispatch.ssd(x=x)
    assert taken == ["cpp", "triton", "chunked16", "chunked64"]


def test_mamba2_model_is_the_same_with_the_kernel_on(monkeypatch, triton_kernels):
    """A Mamba-2 model's training loss and every parameter's gradient are the same through
    the SSD kernel (ARCHSEARCH_KERNELS=triton) as through the chunked PyTorch form, and the
    preflight lists `ssd` for it. This checks the routing; the kernel's maths is checked
    sharply by the tests above (a tiny model's gradients are small, so the planted mutation
    of the module docstring fails this one only narrowly)."""
    from archsearch_kernels import dispatch

    from archsearch.arch.blocks.mamba2 import Mamba2
    from archsearch.arch.model import build_model
    from archsearch.arch.spec import ArchSpec, LayerSpec
    from archsearch.arch.kernel_ops import kernels_used

    monkeypatch.setenv(dispatch.DISABLE_VAR, "")
    layer = LayerSpec(mixer="mamba2", mlp="none", options={"head_dim": 8, "d_state": 4, "n_groups": 2})
    spec = ArchSpec(family="mamba2", vocab_size=20, d_model=16, num_heads=2, layers=(layer,))
    assert "ssd" in kernels_used([spec])
    model = build_model(spec).to(triton_kernels)
    with torch.no_grad():  # steps above 1 and A -1: at the default init (dt ~ 0.01) decay barely matters
        for module in model.modules():
            if isinstance(module, Mamba2):
                module.dt_bias.fill_(1.0)
                module.A_log.zero_()
    tokens = torch.randint(0, 20, (2, 11), device=triton_kernels)
    real = dispatch.use_triton  # only the SSD kernel on: the others have their own tests
    monkeypatch.setattr(dispatch, "use_triton", lambda op, device: op == "ssd" and real(op, device))
    results = []
    for setting in ("reference", "triton"):
        monkeypatch.setenv(dispatch.MODE_VAR, setting)
        model.zero_grad()
        logits = model(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    assert_close("loss", results[0][0], results[1][0], ATOL)
    for name, grad in results[0][1].items():
        assert_close(f"grad {name}", grad, results[1][1][name], ATOL)


@pytest.mark.slow
def test_preflight_check_passes_the_kernel(triton_kernels):
    """The probe the preflight runs on a GPU (T 77: three checkpoint intervals, the last
    ragged; 4 heads over 2 groups), here in the interpreter: the kernel is not turned off
    (about 5 s). Fails on the planted mutation of the module docstring (grad dt)."""
    from archsearch_kernels import dispatch

    assert dispatch.check("ssd", triton_kernels) is None
