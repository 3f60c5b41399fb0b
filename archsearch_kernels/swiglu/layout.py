"""How SwiGLU's two inputs lie in memory: the halves of one fused projection, or not.

The gate_up projection's ``chunk(2, -1)`` gives gate and up as the two halves of one [..., 2F]
tensor. A kernel that knows this can take that tensor as its input and write the gradient of
the whole of it in one buffer, so autograd's concatenation of the halves' gradients (a pass
over 2F) never runs. Both fused forms (cpu.py, kernel.py) do.
"""

from __future__ import annotations

import math

import torch


def rows(x: torch.Tensor) -> torch.Tensor:
    """[..., F] -> [R, F] without a copy where the leading axes merge and F has unit stride."""
    x_RF = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])  # not -1: a zero width would be ambiguous
    return x_RF if x_RF.stride(-1) == 1 else x_RF.contiguous()


def halves_of(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor | None:
    """The [..., 2F] tensor whose first and second halves along the last axis are exactly gate
    and up (``gate, up = t.chunk(2, -1)``), or None when they are not."""
    base = gate._base
    if base is None or up._base is not base or base.dim() != gate.dim() or gate.shape != up.shape:
        return None
    width = gate.shape[-1]
    return base if (base.shape[:-1] == gate.shape[:-1] and base.shape[-1] == 2 * width
                    and gate.stride() == up.stride() == base.stride()
                    and gate.storage_offset() == base.storage_offset()
                    and up.storage_offset() == base.storage_offset() + width * base.stride(-1)) else None
