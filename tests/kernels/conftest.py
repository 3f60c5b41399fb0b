"""Shared pieces for the kernel tests: one tolerance rule and a fixed seed for every test."""

from __future__ import annotations

import pytest
import torch


def assert_close(name: str, ref: torch.Tensor, out: torch.Tensor, atol: float) -> None:
    """Fail unless `out` is finite and max|ref - out| <= atol * max(1, max|ref|).

    The bound is absolute for tensors of order one and relative to the largest entry for
    bigger ones (gradients summed over batch and time), where fp32 rounding grows with the
    values. The message reports the max abs diff so a near miss is visible.
    """
    assert ref.shape == out.shape, f"{name}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    ref64, out64 = ref.detach().double(), out.detach().double()
    assert torch.isfinite(out64).all(), f"{name}: output has NaN or inf"
    max_abs_diff = (ref64 - out64).abs().max().item() if ref.numel() else 0.0
    scale = max(1.0, ref64.abs().max().item()) if ref.numel() else 1.0
    assert max_abs_diff <= atol * scale, (
        f"{name}: max abs diff {max_abs_diff:.3e} exceeds {atol:.1e} * {scale:.3g} (max |ref|)"
    )


def assert_same_outputs_and_grads(ref_fn, out_fn, inputs: dict[str, torch.Tensor], atol: float) -> None:
    """``ref_fn(**inputs)`` and ``out_fn(**inputs)`` each return (output, last_state): both
    agree, and so does the gradient of every input under one random cotangent."""
    out_ref, state_ref = ref_fn(**inputs)
    out_new, state_new = out_fn(**inputs)
    assert_close("output", out_ref, out_new, atol)
    assert_close("last_state", state_ref, state_new, atol)
    d_out, d_state = torch.randn_like(out_ref), torch.randn_like(state_ref)
    leaves = list(inputs.values())
    grads_ref = torch.autograd.grad((out_ref * d_out).sum() + (state_ref * d_state).sum(), leaves)
    grads_new = torch.autograd.grad((out_new * d_out).sum() + (state_new * d_state).sum(), leaves)
    for name, grad_ref, grad_new in zip(inputs, grads_ref, grads_new):
        assert_close(f"grad {name}", grad_ref, grad_new, atol)


@pytest.fixture(name="assert_close")
def assert_close_fixture():
    """The shared tolerance helper, as a fixture so test modules need not import conftest."""
    return assert_close


@pytest.fixture(autouse=True)
def seed():
    """Every kernel test starts from the same random state."""
    torch.manual_seed(0)


def poison_empty(monkeypatch) -> None:
    """Fill every buffer from torch.empty / empty_like with NaN, so an element a kernel forgets
    to write shows up as NaN in the agreement check (the kernels allocate their outputs there)."""
    empty, empty_like = torch.empty, torch.empty_like

    def poisoned(make):
        def make_poisoned(*args, **kwargs):
            out = make(*args, **kwargs)
            return out.fill_(float("nan")) if out.is_floating_point() else out
        return make_poisoned

    monkeypatch.setattr(torch, "empty", poisoned(empty))
    monkeypatch.setattr(torch, "empty_like", poisoned(empty_like))


@pytest.fixture
def triton_kernels(monkeypatch):
    """Run Triton kernels on this machine: on a CPU through Triton's interpreter, with every
    buffer from torch.empty / empty_like filled with NaN (`poison_empty`). Skips when triton
    is not installed.

    TRITON_INTERPRET is read when triton is first imported, so the kernel test modules set it
    at their top, before anything imports triton.
    """
    pytest.importorskip("triton")
    poison_empty(monkeypatch)
    return "cuda" if torch.cuda.is_available() else "cpu"
