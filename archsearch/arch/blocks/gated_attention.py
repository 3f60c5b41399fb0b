"""Gated attention: causal attention with a sigmoid gate on each head's output (position G1).

Qiu et al., "Gated Attention for Large Language Models", https://arxiv.org/abs/2505.06708
(reference code: qiuzh20/gated_attention, modeling_qwen3.py; papers.md section 7). The gate
logits come from the layer input through an enlarged Q projection; each head's SDPA output is
multiplied by sigmoid(gate) before the output projection:

    y = W_o flatten_heads(SDPA(q, k, v) * sigmoid(gate))

Options (``layer.options``):
    gate: "elementwise" (default; one gate per head channel, H*K values a token) or
          "headwise" (one gate per head, H values a token).

Dimensions: B batch, T time, D model width, H heads, K head dim (D = H*K), G gate values per
head (K elementwise, 1 headwise).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from archsearch_kernels.dispatch import rope_heads
from archsearch_kernels.rope import rope_tables
from torch import nn

from archsearch.arch.blocks.gated_attention_counts import (  # the formulas, beside the module
    GATES,
    flops,
    gate_width,
    mixing,
    params,
    state,
)
from archsearch.arch.spec import ArchSpec, LayerSpec


class GatedAttention(nn.Module):
    """Causal self-attention with an output gate: [B, T, D] -> [B, T, D]. No biases."""

    def __init__(self, *, spec: ArchSpec, layer: LayerSpec):
        super().__init__()
        d = spec.d_model
        self.num_heads, self.head_dim, self.theta = spec.num_heads, spec.head_dim, spec.rope_theta
        self.gate_width = gate_width(spec, layer)
        # the reference widens q_proj to carry the gate; Q, K, V and gate share one matmul here
        self.wqkvg = nn.Linear(d, 3 * d + self.num_heads * self.gate_width, bias=False)
        self.wo = nn.Linear(d, d, bias=False)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        B, T, D = x_BTD.shape
        H, K, G = self.num_heads, self.head_dim, self.gate_width
        qkv_BTX, gate_BTX = self.wqkvg(x_BTD).split([3 * D, H * G], dim=-1)
        cos_TK, sin_TK = rope_tables(T, K, self.theta, x_BTD.device)
        q_BHTK, k_BHTK, v_BHTK = rope_heads(qkv_BTX, H, cos_TK, sin_TK)
        y_BHTK = F.scaled_dot_product_attention(q_BHTK, k_BHTK, v_BHTK, is_causal=True)
        # G = 1 broadcasts one gate over the head's K channels
        gate_BHTG = gate_BTX.view(B, T, H, G).transpose(1, 2)
        y_BHTK = y_BHTK * torch.sigmoid(gate_BHTG)
        return self.wo(y_BHTK.transpose(1, 2).reshape(B, T, D))
