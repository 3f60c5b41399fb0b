"""Rotary position embeddings on the fused q, k, v projection, reference form (Su et al.,
https://arxiv.org/abs/2104.09864, the half-split pairing of GPT-NeoX and Llama).

    (x1, x2) = (x[..., :K/2], x[..., K/2:]),   angle_{t,i} = t / theta^(2i/K)
    rope(x)_t = (x1 cos - x2 sin, x1 sin + x2 cos)

Dimensions: B batch, T time, H heads, K head dim (D = H*K); the projection's q, k, v stack on
an axis of 3 (2 for q and k).
"""

from __future__ import annotations

import torch


def rope_tables(seq_len: int, head_dim: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, each [T, K/2], for rotary position embeddings."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles_TK = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    return angles_TK.cos(), angles_TK.sin()


def apply_rope(x_BHTK: torch.Tensor, cos_TK: torch.Tensor, sin_TK: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., :K/2], x[..., K/2:]) by position-dependent angles; the tables
    broadcast against x without its last axis (a [T, 1, 1, K/2] table rotates [B, T, 2, H, K])."""
    half = x_BHTK.shape[-1] // 2
    x1, x2 = x_BHTK[..., :half].float(), x_BHTK[..., half:].float()
    out = torch.cat([x1 * cos_TK - x2 * sin_TK, x1 * sin_TK + x2 * cos_TK], dim=-1)
    return out.type_as(x_BHTK)


def rope_heads_naive(qkv: torch.Tensor, num_heads: int, cos: torch.Tensor, sin: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused projection as q, k, v per head, q and k rotated.

    q and k are rotated together in the projection's own [B, T, 2, H, K] layout, before the
    permute to heads: one pass of the rotation's elementwise ops over both, on rows whose last
    axis is contiguous, instead of one pass each over permuted views.

    Args:
        qkv: [B, T, 3*H*K] the projection's output (q, then k, then v; any strides with a unit
            last one, as a split of a wider projection gives).
        num_heads: H.
        cos: [T, K/2] from `rope_tables`.
        sin: [T, K/2].

    Returns:
        (q, k, v), each [B, H, T, K] in qkv's dtype (views or copies; only the values are the spec).
    """
    B, T, D3 = qkv.shape
    head_dim = D3 // (3 * num_heads)
    qkv_BT3HK = qkv.view(B, T, 3, num_heads, head_dim)
    qk_BT2HK = apply_rope(qkv_BT3HK[:, :, :2], cos[:, None, None], sin[:, None, None])
    q_BHTK, k_BHTK = qk_BT2HK.permute(2, 0, 3, 1, 4).unbind(0)
    return q_BHTK, k_BHTK, qkv_BT3HK[:, :, 2].transpose(1, 2)
