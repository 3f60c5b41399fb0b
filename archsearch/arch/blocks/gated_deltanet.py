"""Gated DeltaNet mixer: the gated delta rule between short convs and a gated RMSNorm.

Yang, Kautz & Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with Delta Rule",
https://arxiv.org/abs/2412.06464 (reference layer: fla-org/flash-linear-attention,
fla/layers/gated_deltanet.py; papers.md section 7). Per token and head:

    q, k, v = silu(causal depthwise conv_4(W_q x, W_k x, W_v x))       no conv bias
    q, k    = l2-normalised per head; q scaled by K^-1/2
    beta    = sigmoid(W_b x)                                            write strength
    g       = -exp(A_log) * softplus(W_a x + dt_bias);  alpha = exp(g) decay in (0, 1]
    S_t     = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T;  o_t = S_t q_t
    y       = W_o (RMSNorm_head(o) * silu(W_g x))

Options (``layer.options``), with defaults:
    num_heads   H = spec.num_heads
    head_k_dim  K = spec.head_dim
    head_v_dim  V = K
    d_conv      4       short conv width
    scan        "chunked" or "naive", the per-step reference (for tests)

Dimensions: B batch, T time, D model width, H heads, K key head dim, V value head dim,
X the concatenated q, k, v channels (2HK + HV).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from archsearch_kernels.dispatch import RMSNorm, gated_delta_rule, softplus, swiglu
from archsearch_kernels.gated_delta import gated_delta_rule_naive
from torch import nn

from archsearch.arch.blocks.gated_deltanet_counts import (  # the formulas, beside the module
    DeltaSizes,
    flops,
    mixing,
    params,
    sizes,
    state,
)
from archsearch.arch.blocks.mamba import causal_conv, inverse_softplus_dt
from archsearch.arch.spec import ArchSpec, LayerSpec

# "chunked": the Triton kernels on CUDA (chunked from 64 steps on, recurrent below), the C++ loop
# on float32 CPU tensors, the chunked PyTorch form elsewhere (archsearch_kernels.dispatch)
RULES = {"chunked": gated_delta_rule, "naive": gated_delta_rule_naive}


class GatedDeltaNet(nn.Module):
    """Gated DeltaNet mixer: [B, T, D] -> [B, T, D]. No biases in the projections."""

    def __init__(self, *, spec: ArchSpec, layer: LayerSpec):
        super().__init__()
        s = self.sizes = sizes(spec, layer)
        scan = layer.options.get("scan", "chunked")
        if scan not in RULES:
            raise ValueError(f"gated_deltanet: options['scan'] must be one of {sorted(RULES)}, got {scan!r}")
        self.rule = RULES[scan]
        h, hv = s.heads, s.heads * s.value
        self.qkv_proj = nn.Linear(s.d_model, s.qkv, bias=False)
        # fla keeps three ShortConvolutions; depthwise, one conv over the concatenation is the same map
        self.conv = nn.Conv1d(s.qkv, s.qkv, s.conv, groups=s.qkv, bias=False)
        self.ab_proj = nn.Linear(s.d_model, 2 * h, bias=False)  # decay (a) and write-strength (b) logits
        # A ~ U(0, 16) per head, and dt_bias with softplus(dt_bias) log-uniform in [1e-3, 1e-1], as in fla
        self.A_log = nn.Parameter(torch.empty(h).uniform_(0, 16).log())
        self.dt_bias = nn.Parameter(inverse_softplus_dt(h))
        for p in (self.A_log, self.dt_bias):
            p._no_weight_decay = True
        self.gate_proj = nn.Linear(s.d_model, hv, bias=False)
        self.norm = RMSNorm(s.value, eps=spec.norm_eps)  # nn.RMSNorm's parameters, the dispatched kernels
        self.out_proj = nn.Linear(hv, s.d_model, bias=False)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        s, (B, T, _) = self.sizes, x_BTD.shape
        H, K, V = s.heads, s.key, s.value
        # the short conv and its SiLU in the projection's [B, T, X] layout (one C++ pass on a
        # CPU); its [B, T, X] rows keep every elementwise op below on contiguous memory
        qkv_BTX = causal_conv(self.conv, self.qkv_proj(x_BTD), None, silu=True)
        qk_BTX, v_BTX = qkv_BTX.split([2 * H * K, H * V], dim=-1)
        # q and k l2-normalised in one call; the rule takes q unscaled, fla's kernel scales it by K^-1/2
        q_BTHK, k_BTHK = F.normalize(qk_BTX.view(B, T, 2, H, K), dim=-1).unbind(2)
        q_BTHK = q_BTHK * K**-0.5
        g_BTH, beta_BTH = self.gates(x_BTD)
        o_BTHV = self.rule(q_BTHK, k_BTHK, v_BTX.view(B, T, H, V), g_BTH, beta_BTH)
        # silu(gate) * RMSNorm(o): SwiGLU's product, fused on a CPU (C++) and on CUDA (Triton)
        o_BTHV = swiglu(self.gate_proj(x_BTD).view(B, T, H, V), self.norm(o_BTHV))
        return self.out_proj(o_BTHV.reshape(B, T, H * V))

    def gates(self, x_BTD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log decay g [B, T, H] (<= 0, so alpha = exp(g) is in (0, 1]) and write strength beta [B, T, H]."""
        a_BTH, b_BTH = self.ab_proj(x_BTD).float().chunk(2, dim=-1)
        g_BTH = -self.A_log.float().exp() * softplus(a_BTH, self.dt_bias)
        return g_BTH, torch.sigmoid(b_BTH)
