"""Causal multi-head self-attention with RoPE (the Transformer++ mixer).

Dimensions: B batch, T time, D model width, H heads, K head dim (D = H*K).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from archsearch_kernels.dispatch import rope_heads
from archsearch_kernels.rope import rope_tables
from torch import nn

from archsearch.arch.blocks.attention_counts import (  # the formulas, beside the module
    flops,
    mixing,
    params,
    state,
)
from archsearch.arch.spec import ArchSpec, LayerSpec


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
        # rotary q and k in the projection's own layout: one C++ pass each way on a CPU
        # (archsearch_kernels/rope), the reference's few passes elsewhere
        cos_TK, sin_TK = rope_tables(T, self.head_dim, self.theta, x_BTD.device)
        q_BHTK, k_BHTK, v_BHTK = rope_heads(self.wqkv(x_BTD), self.num_heads, cos_TK, sin_TK)
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
