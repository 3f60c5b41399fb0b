"""A step size from its pre-activation: softplus(x + bias), the reference form.

    dt = softplus(x + bias) = log(1 + exp(x + bias))   (x + bias itself above 20, as F.softplus)

Mamba's delta, Mamba-2's per-head dt and GPN's decay rate all take this form, with the bias
per channel (the last axis). Dimensions: C channels, every leading axis kept.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def softplus_naive(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """softplus(x + bias) in fp32.

    Args:
        x: [..., C] pre-activation.
        bias: [C] per-channel bias.

    Returns:
        [..., C] float32.
    """
    return F.softplus(x.float() + bias.float())
