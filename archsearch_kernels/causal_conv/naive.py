"""Causal depthwise conv1d with an optional SiLU, reference form (the short conv of Mamba,
Mamba-2 and Gated DeltaNet; Dao AI Lab's causal-conv1d computes the same on CUDA).

    z[b, t, c] = bias[c] + sum_{j < W} weight[c, j] * x[b, t - (W - 1) + j, c]   (x = 0 before t = 0)
    y = silu(z) if silu else z

Dimensions: B batch, T time, C channels, W conv width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d_naive(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                        silu: bool = False) -> torch.Tensor:
    """The conv as torch's grouped conv1d over the left-padded sequence.

    Args:
        x: [B, T, C] input (any strides).
        weight: [C, W] one filter per channel (an nn.Conv1d(C, C, W, groups=C)'s weight[:, 0]).
        bias: [C], or None.
        silu: apply SiLU to the result.

    Returns:
        y [B, T, C] in x's dtype.
    """
    width = weight.shape[-1]
    # left padding only, so the conv is causal and torch counts exactly W MACs per output
    z_BCT = F.conv1d(F.pad(x.transpose(1, 2), (width - 1, 0)), weight[:, None, :], bias, groups=weight.shape[0])
    z_BTC = z_BCT.transpose(1, 2)
    return F.silu(z_BTC) if silu else z_BTC
