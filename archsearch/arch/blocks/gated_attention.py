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
from torch import nn

from archsearch.arch.blocks.attention import apply_rope, rope_tables
from archsearch.arch.blocks.attention import mixing as attention_mixing
from archsearch.arch.spec import ArchSpec, LayerSpec

GATES = ("elementwise", "headwise")


def gate_width(spec: ArchSpec, layer: LayerSpec) -> int:
    """Gate values per head, G: K for an elementwise gate, 1 for a headwise one."""
    gate = layer.options.get("gate", "elementwise")
    if gate not in GATES:
        raise ValueError(f"gated attention: options['gate'] must be one of {GATES}, got {gate!r}")
    return spec.head_dim if gate == "elementwise" else 1


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
        q_BHTK, k_BHTK, v_BHTK = qkv_BTX.view(B, T, 3, H, K).permute(2, 0, 3, 1, 4).unbind(0)
        cos_TK, sin_TK = rope_tables(T, K, self.theta, x_BTD.device)
        q_BHTK, k_BHTK = apply_rope(q_BHTK, cos_TK, sin_TK), apply_rope(k_BHTK, cos_TK, sin_TK)
        y_BHTK = F.scaled_dot_product_attention(q_BHTK, k_BHTK, v_BHTK, is_causal=True)
        # G = 1 broadcasts one gate over the head's K channels
        gate_BHTG = gate_BTX.view(B, T, H, G).transpose(1, 2)
        y_BHTK = y_BHTK * torch.sigmoid(gate_BHTG)
        return self.wo(y_BHTK.transpose(1, 2).reshape(B, T, D))


def params(spec: ArchSpec, layer: LayerSpec) -> int:
    """Q, K, V and output projections 4 D^2, plus the gate projection D * H * G
    (+D^2 elementwise when H*K = D, +D*H headwise)."""
    return 4 * spec.d_model**2 + spec.d_model * spec.num_heads * gate_width(spec, layer)


def mixing(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> float:
    """QK^T and AV over the causal context, as for plain attention: 2 * T * D.
    The sigmoid and the gate product are elementwise and not counted."""
    return attention_mixing(spec, layer, seq_len)


def flops(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> float:
    """Forward FLOPs per token: 2 per projection weight (gate included) plus the attention mixing."""
    return 2 * params(spec, layer) + mixing(spec, layer, seq_len)


def state(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> int:
    """The KV cache, as for plain attention: a key and a value of width D per token seen
    (the gate is computed from the current token and is not kept)."""
    return 2 * seq_len * spec.d_model
