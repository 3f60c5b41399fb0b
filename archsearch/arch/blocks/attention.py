"""Causal multi-head self-attention with RoPE (the Transformer++ mixer).

Dimensions: B batch, T time, D model width, H heads, K head dim (D = H*K);
the fused projection's q, k, v stack on an axis of 3 (2 for q and k).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from archsearch.arch.blocks.attention_counts import (  # the formulas, beside the module
    flops,
    mixing,
    params,
    state,
)
from archsearch.arch.spec import ArchSpec, LayerSpec


def rope_tables(seq_len: int, head_dim: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, each [T, K/2], for rotary position embeddings."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles_TK = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    return angles_TK.cos(), angles_TK.sin()


def heads_with_rope(qkv_BT3D: torch.Tensor, num_heads: int, theta: float
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused projection's [B, T, 3*D] as q, k, v [B, H, T, K] each, q and k rotated.

    q and k are rotated together in the projection's own [B, T, 2, H, K] layout, before the
    permute to heads: one pass of the rotation's elementwise ops over both, on rows whose last
    axis is contiguous, instead of one pass each over permuted views: the same numbers bit for
    bit, and the mixer's forward and backward 1.36x (d 128) and 1.49x (d 512) faster on a CPU
    (docs/performance.md, Transformer++ against Hugging Face Llama)."""
    B, T, D3 = qkv_BT3D.shape
    head_dim = D3 // (3 * num_heads)
    qkv_BT3HK = qkv_BT3D.view(B, T, 3, num_heads, head_dim)
    cos_TK, sin_TK = rope_tables(T, head_dim, theta, qkv_BT3D.device)
    qk_BT2HK = apply_rope(qkv_BT3HK[:, :, :2], cos_TK[:, None, None], sin_TK[:, None, None])
    q_BHTK, k_BHTK = qk_BT2HK.permute(2, 0, 3, 1, 4).unbind(0)
    return q_BHTK, k_BHTK, qkv_BT3HK[:, :, 2].transpose(1, 2)


def apply_rope(x_BHTK: torch.Tensor, cos_TK: torch.Tensor, sin_TK: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., :K/2], x[..., K/2:]) by position-dependent angles; the tables
    broadcast against x without its last axis (a [T, 1, 1, K/2] table rotates [B, T, 2, H, K])."""
    half = x_BHTK.shape[-1] // 2
    x1, x2 = x_BHTK[..., :half].float(), x_BHTK[..., half:].float()
    out = torch.cat([x1 * cos_TK - x2 * sin_TK, x1 * sin_TK + x2 * cos_TK], dim=-1)
    return out.type_as(x_BHTK)


class Attention(nn.Module):
    """Causal self-attention: [B, T, D] -> [B, T, D]. No biases."""

    def __init__(self, *, spec: ArchSpec, layer: LayerSpec):
        super().__init__()
        d = spec.d_model
        self.num_heads, self.head_dim, self.theta = spec.num_heads, spec.head_dim, spec.rope_theta
        self.wqkv = nn.Linear(d, 3 * d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)

    def forward(self, x_BTD: torch.Tensor, *, skip_BT: torch.Tensor | None = None,
                cache: dict | None = None) -> torch.Tensor:
        """``cache`` (a looped group's, one dict per layer, kept across loops)
        holds the keys and values of the previous loop; tokens marked in
        ``skip_BT`` (exited) keep those, so later tokens read an exited
        token's keys and values as they were at its exit loop."""
        B, T, D = x_BTD.shape
        q_BHTK, k_BHTK, v_BHTK = heads_with_rope(self.wqkv(x_BTD), self.num_heads, self.theta)
        if cache is not None:
            if skip_BT is not None and "k" in cache:
                frozen_B1T1 = skip_BT[:, None, :, None]
                k_BHTK = torch.where(frozen_B1T1, cache["k"], k_BHTK)
                v_BHTK = torch.where(frozen_B1T1, cache["v"], v_BHTK)
            cache["k"], cache["v"] = k_BHTK, v_BHTK
        # fast path; attention_reference below is the same computation written out
        y_BHTK = F.scaled_dot_product_attention(q_BHTK, k_BHTK, v_BHTK, is_causal=True)
        return self.wo(y_BHTK.transpose(1, 2).reshape(B, T, D))


def attention_reference(q_BHTK: torch.Tensor, k_BHTK: torch.Tensor, v_BHTK: torch.Tensor) -> torch.Tensor:
    """Causal softmax attention written out; the spec SDPA must match."""
    T = q_BHTK.shape[2]
    scores_BHTT = q_BHTK @ k_BHTK.transpose(-1, -2) / q_BHTK.shape[-1] ** 0.5
    future_TT = torch.ones(T, T, dtype=torch.bool, device=q_BHTK.device).triu(1)
    return scores_BHTT.masked_fill(future_TT, float("-inf")).softmax(-1) @ v_BHTK
