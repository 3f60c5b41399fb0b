"""RMSNorm, reference form (Zhang & Sennrich, https://arxiv.org/abs/1910.07467).

    y = x / sqrt(mean(x^2 over D) + eps) * weight

Dimensions: R rows (every leading axis flattened), D the normalised width.
"""

from __future__ import annotations

import torch


def rms_norm_naive(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last axis, in fp32 inside.

    Args:
        x: [..., D] input.
        weight: [D] scale.
        eps: added to the mean square before the square root.

    Returns:
        y [..., D] in x's dtype.
    """
    x_RD = x.float()
    rstd_R1 = torch.rsqrt(x_RD.pow(2).mean(-1, keepdim=True) + eps)
    return (x_RD * rstd_R1 * weight.float()).to(x.dtype)
