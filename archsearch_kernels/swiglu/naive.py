"""SwiGLU's gating product, reference form (Shazeer, https://arxiv.org/abs/2002.05202).

    h = silu(gate) * up = gate * sigmoid(gate) * up

The projections around it stay matmuls; only this elementwise part is fused, which saves
the two [.., F] intermediates (silu(gate) and its product) forward and backward.
Dimensions: F the MLP width, every leading axis kept.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def swiglu_naive(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in fp32 inside.

    Args:
        gate: [..., F] gate pre-activation.
        up: [..., F] the linear branch, same shape.

    Returns:
        h [..., F] in gate's dtype.
    """
    return (F.silu(gate.float()) * up.float()).to(gate.dtype)
