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
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from archsearch_kernels.ssd import ssd_chunked, ssd_naive
from torch import nn

from archsearch.arch.blocks.mamba import causal_conv, inverse_softplus_dt
from archsearch.arch.spec import ArchSpec, LayerSpec

SCANS = {"chunked": ssd_chunked, "naive": ssd_naive}


@dataclass(frozen=True)
class Mamba2Sizes:
    """The resolved widths of one Mamba-2 layer."""

    d_model: int
    inner: int  # E = H P
    heads: int  # H
    head_dim: int  # P
    groups: int  # G
    state: int  # N
    conv: int  # k

    @property
    def conv_channels(self) -> int:
        """Channels through the conv: x, B and C, E + 2GN."""
        return self.inner + 2 * self.groups * self.state

    @property
    def in_proj(self) -> int:
        """in_proj outputs: z, x, B, C and dt, 2E + 2GN + H."""
        return self.inner + self.conv_channels + self.heads


def sizes(spec: ArchSpec, layer: LayerSpec) -> Mamba2Sizes:
    """Widths from ``layer.options`` and their defaults."""
    options, d = layer.options, spec.d_model
    head_dim = options.get("head_dim", 64)
    heads = max(1, round(options.get("expand", 2) * d / head_dim))
    return Mamba2Sizes(d_model=d, inner=heads * head_dim, heads=heads, head_dim=head_dim,
                       groups=options.get("n_groups", 1), state=options.get("d_state", 128),
                       conv=options.get("d_conv", 4))


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
            self.scan = functools.partial(ssd_chunked, chunk_size=layer.options.get("chunk_size", 64))
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
        x_BTE, B_BTX, C_BTX = F.silu(causal_conv(self.conv, xBC_BTX, skip_BT)).split([E, G * N, G * N], dim=-1)
        dt_BTH = F.softplus(dt_BTH.float() + self.dt_bias.float())
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
        """RMSNorm(y * silu(z)) over each group's E/G channels, then the per-channel weight."""
        gated_BTGX = (y_BTE * F.silu(z_BTE)).unflatten(-1, (self.sizes.groups, -1))
        normed_BTE = F.rms_norm(gated_BTGX, gated_BTGX.shape[-1:], eps=self.norm_eps).flatten(-2)
        return normed_BTE * self.norm_weight


def params(spec: ArchSpec, layer: LayerSpec) -> int:
    """in_proj D(2E + 2GN + H) + conv k(E + 2GN) + its bias (E + 2GN) + A_log, dt_bias and D
    (3H) + the norm weight E + out_proj E D."""
    s = sizes(spec, layer)
    d, e, x, h = s.d_model, s.inner, s.conv_channels, s.heads
    return d * s.in_proj + s.conv * x + x + 3 * h + e + e * d


def mixing(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> float:
    """The recurrence's multiply-adds on each head's [P, N] state per token: 5 H P N = 5 E N.

    Per (channel, state) pair: (dt x) * B (1), decay * S + input (2) and the readout S C (2).
    Mamba-1 counts 6 E N: its decay exp(delta A) is one more product per pair, here it is one
    scalar per head. Per-channel and per-head work (dt x, the D skip, the gate, the norm) and
    the exp and softplus are left out, as activations are everywhere else. The chunked form
    does more arithmetic for fewer sequential steps; this counts the recurrence. Independent
    of seq_len.
    """
    s = sizes(spec, layer)
    return 5.0 * s.inner * s.state


def flops(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> float:
    """Forward FLOPs per token: 2 (D(2E + 2GN + H) + E D) for the projections, 2k(E + 2GN)
    for the conv, plus the scan's ``mixing``."""
    s = sizes(spec, layer)
    weights = s.d_model * s.in_proj + s.inner * s.d_model
    return 2.0 * weights + 2.0 * s.conv * s.conv_channels + mixing(spec, layer, seq_len)


def state(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> int:
    """Each head's [P, N] SSM state, H P N = E N, plus the conv's last k-1 inputs
    (E + 2GN)(k-1); independent of seq_len."""
    s = sizes(spec, layer)
    return s.inner * s.state + s.conv_channels * (s.conv - 1)
