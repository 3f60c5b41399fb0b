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


@pytest.fixture(name="assert_close")
def assert_close_fixture():
    """The shared tolerance helper, as a fixture so test modules need not import conftest."""
    return assert_close


@pytest.fixture(autouse=True)
def seed():
    """Every kernel test starts from the same random state."""
    torch.manual_seed(0)
