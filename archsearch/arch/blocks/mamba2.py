"""Mamba-2 mixer: the SSD scan (scalar decay per head) between a short conv and a gated RMSNorm.

Dao & Gu, "Transformers are SSMs: Generalized Models and Efficient Algorithms Through
Structured State Space Duality", https://arxiv.org/abs/2405.21060 (reference layer:
state-spaces/mamba, modules/mamba2.py; papers.md section 3.5). Per token:

    z, xBC, dt = in_proj(x)                          D -> E + (E + 2GN) + H
    x, B, C    = silu(causal depthwise conv_k(xBC))  with bias
    dt         = softplus(dt + dt_bias)               one step size per head
    S_t        = exp(dt_t A_h) S_{t-1} + dt_t x_t B_t^T,   A_h = -exp(A_log_h)   per head, [P, N]
    y_t        = S_t C_t + D_h x_t
    out        = out_proj(RMSNorm_G(y * silu(z)))    E -> D

The norm follows mamba2.py's default (norm_before_gate=False): the gate multiplies first
and the product is normalised over each group's E/G channels.

Options (``layer.options``), with defaults (mamba2.py's, except where said):
    d_state     N = 128     state size per head and group
    expand      2           inner width E ~ expand * D (see below)
    head_dim    P = 64      channels per head; H = E / P heads
    n_groups    G = 1       B and C are shared by the H / G heads of a group
    d_conv      k = 4       conv width
    chunk_size  64          steps per chunk of the SSD block decomposition (speed only)
    scan        "chunked"   or "naive", the per-step reference (for tests)

Inner width: E = P * max(1, round(expand * D / P)), the multiple of P nearest expand * D.
mamba2.py asserts expand * D divisible by P instead; rounding lets the budget solver try any
width without the block refusing it, and gives the same E whenever the assert would pass.

Dimensions: B batch, T time, D model width, E inner width, H heads, P head dim, G groups,
N state size, X the conv'd channels (E + 2GN).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from archsearch_kernels.dispatch import rms_norm, softplus, ssd, swiglu
from archsearch_kernels.ssd import ssd_naive
from torch import nn

from archsearch.arch.blocks.mamba import causal_conv, inverse_softplus_dt
from archsearch.arch.blocks.mamba2_counts import (  # the formulas, beside the module
    Mamba2Sizes,
    flops,
    mixing,
    params,
    sizes,
    state,
)
from archsearch.arch.spec import ArchSpec, LayerSpec

# "chunked": the Triton kernel on CUDA, the chunked PyTorch form elsewhere (archsearch_kernels.dispatch)
SCANS = {"chunked": ssd, "naive": ssd_naive}


class Mamba2(nn.Module):
    """Mamba-2 mixer: [B, T, D] -> [B, T, D]. No biases in the projections.

    ``forward(x, skip_BT=mask)`` treats tokens with ``mask`` True as absent, as Mamba-1
    does (a looped model's exited tokens): kept out of later tokens' conv windows, dt = 0
    so the state passes through them untouched, output 0.
    """

    def __init__(self, *, spec: ArchSpec, layer: LayerSpec):
        super().__init__()
        s = self.sizes = sizes(spec, layer)
        scan = layer.options.get("scan", "chunked")
        if scan not in SCANS:
            raise ValueError(f"mamba2: options['scan'] must be one of {sorted(SCANS)}, got {scan!r}")
        if s.heads % s.groups:
            raise ValueError(f"mamba2: {s.heads} heads do not split evenly over n_groups={s.groups}")
        self.scan = SCANS[scan]
        if scan == "chunked":  # the chunk length changes speed, never the result
            self.scan = functools.partial(ssd, chunk_size=layer.options.get("chunk_size", 64))
        self.in_proj = nn.Linear(s.d_model, s.in_proj, bias=False)
        self.conv = nn.Conv1d(s.conv_channels, s.conv_channels, s.conv, groups=s.conv_channels, bias=True)
        # A ~ U(1, 16) per head and softplus(dt_bias) log-uniform in [1e-3, 1e-1], as in mamba2.py
        self.A_log = nn.Parameter(torch.empty(s.heads).uniform_(1, 16).log())
        self.dt_bias = nn.Parameter(inverse_softplus_dt(s.heads))
        self.D = nn.Parameter(torch.ones(s.heads))
        for p in (self.A_log, self.dt_bias, self.D):
            p._no_weight_decay = True
        self.norm_weight = nn.Parameter(torch.ones(s.inner))
        self.norm_eps = spec.norm_eps
        self.out_proj = nn.Linear(s.inner, s.d_model, bias=False)

    def forward(self, x_BTD: torch.Tensor, *, skip_BT: torch.Tensor | None = None,
                return_last_state: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, D] -> y [B, T, D]; with ``return_last_state`` also the SSM state [B, H, P, N]
        (fp32) after the last step. ``skip_BT``: bool [B, T], True for tokens to treat as absent."""
        s, (batch, seq_len, _) = self.sizes, x_BTD.shape
        E, G, N = s.inner, s.groups, s.state
        z_BTE, xBC_BTX, dt_BTH = self.in_proj(x_BTD).split([E, s.conv_channels, s.heads], dim=-1)
        x_BTE, B_BTX, C_BTX = causal_conv(self.conv, xBC_BTX, skip_BT, silu=True).split([E, G * N, G * N], dim=-1)
        dt_BTH = softplus(dt_BTH, self.dt_bias)
        if skip_BT is not None:
            dt_BTH = dt_BTH.masked_fill(skip_BT[..., None], 0.0)
        A_H = -torch.exp(self.A_log.float())
        y_BTHP, state_BHPN = self.scan(x_BTE.view(batch, seq_len, s.heads, s.head_dim), dt_BTH, A_H,
                                       B_BTX.view(batch, seq_len, G, N), C_BTX.view(batch, seq_len, G, N),
                                       self.D.float(), return_last_state=True)
        y_BTD = self.out_proj(self.gated_norm(y_BTHP.reshape(batch, seq_len, E), z_BTE))
        if skip_BT is not None:
            y_BTD = y_BTD.masked_fill(skip_BT[..., None], 0.0)
        return (y_BTD, state_BHPN) if return_last_state else y_BTD

    def gated_norm(self, y_BTE: torch.Tensor, z_BTE: torch.Tensor) -> torch.Tensor:
        """RMSNorm(y * silu(z)) over each group's E/G channels, then the per-channel weight.

        The gate is SwiGLU's product, and with one group (the default) the norm is a plain
        RMSNorm with the weight: both go through the dispatched kernels (C++ on a CPU, Triton on
        CUDA), where the composite ops took about a tenth of a CPU training step."""
        gated_BTE = swiglu(z_BTE, y_BTE)
        if self.sizes.groups == 1:
            return rms_norm(gated_BTE, self.norm_weight, self.norm_eps)
        gated_BTGX = gated_BTE.unflatten(-1, (self.sizes.groups, -1))
        return F.rms_norm(gated_BTGX, gated_BTGX.shape[-1:], eps=self.norm_eps).flatten(-2) * self.norm_weight
