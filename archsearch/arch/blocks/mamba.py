"""Mamba-1 mixer: selective state-space scan between a causal conv and a SiLU output gate.

Gu & Dao, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces",
https://arxiv.org/abs/2312.00752 (reference: state-spaces/mamba, modules/mamba_simple.py;
papers.md section 3.4). Per token:

    x, z  = in_proj(x)                          D -> 2E
    u     = silu(causal depthwise conv_k(x))    with bias
    dt, B, C = x_proj(u)                        E -> r + 2N (data-dependent step and matrices)
    delta = softplus(dt_proj(dt) + dt_bias)     r -> E
    h_t   = exp(delta_t A) h_{t-1} + delta_t B_t u_t,   A = -exp(A_log)
    y     = out_proj((C_t h_t + D u_t) * silu(z))      E -> D

Options (``layer.options``), with defaults:
    d_state  N = 16        state size per channel
    expand   2             E = int(expand * D)
    d_conv   k = 4         conv width
    dt_rank  r = ceil(D/16)
    scan     "chunked"     or "naive", the per-step reference (for tests)

Dimensions: B batch, T time, D model width, E inner width, N state size, R dt rank.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from archsearch_kernels.dispatch import causal_conv1d, selective_scan, softplus
from archsearch_kernels.selective_scan import selective_scan_naive
from torch import nn

from archsearch.arch.blocks.mamba_counts import (  # the formulas, beside the module
    MambaSizes,
    flops,
    mixing,
    params,
    sizes,
    state,
)
from archsearch.arch.spec import ArchSpec, LayerSpec

# "chunked": the Triton kernel on CUDA, the chunked PyTorch form elsewhere (archsearch_kernels.dispatch)
SCANS = {"chunked": selective_scan, "naive": selective_scan_naive}


def inverse_softplus_dt(size: int, *, dt_min: float = 1e-3, dt_max: float = 1e-1, floor: float = 1e-4) -> torch.Tensor:
    """dt_bias such that softplus(dt_bias) is log-uniform in [dt_min, dt_max] (floored), as in mamba."""
    dt = torch.exp(torch.rand(size) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)).clamp(min=floor)
    # softplus^-1(dt) = log(exp(dt) - 1), written to stay accurate for small dt
    return dt + torch.log(-torch.expm1(-dt))


class Mamba(nn.Module):
    """Mamba-1 mixer: [B, T, D] -> [B, T, D].

    ``forward(x, skip_BT=mask)`` treats tokens with ``mask`` True as absent (a looped
    model's exited tokens, papers.md 3.3): they never enter the conv window of later
    tokens, their step size is 0 so the state passes through them untouched
    (exp(0 * A) = 1, nothing written), and their output is 0.
    """

    def __init__(self, *, spec: ArchSpec, layer: LayerSpec):
        super().__init__()
        s = self.sizes = sizes(spec, layer)
        scan = layer.options.get("scan", "chunked")
        if scan not in SCANS:
            raise ValueError(f"mamba: options['scan'] must be one of {sorted(SCANS)}, got {scan!r}")
        self.scan = SCANS[scan]
        self.in_proj = nn.Linear(s.d_model, 2 * s.inner, bias=False)
        self.conv = nn.Conv1d(s.inner, s.inner, s.conv, groups=s.inner, bias=True)
        self.x_proj = nn.Linear(s.inner, s.dt_rank + 2 * s.state, bias=False)
        # dt_proj's bias is its own parameter (mamba passes it to the scan as delta_bias):
        # the stack's init_weights zeroes every Linear bias, which would undo its init
        self.dt_proj = nn.Linear(s.dt_rank, s.inner, bias=False)
        # mamba's dt init: uniform in +-dt_rank^-0.5, kept by the model's init pass
        nn.init.uniform_(self.dt_proj.weight, -s.dt_rank**-0.5, s.dt_rank**-0.5)
        self.dt_proj.keep_init = True
        self.dt_bias = nn.Parameter(inverse_softplus_dt(s.inner))
        # S4D-real: A[e, n] = -(n + 1)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, s.state + 1, dtype=torch.float32)).repeat(s.inner, 1))
        self.D = nn.Parameter(torch.ones(s.inner))
        for p in (self.dt_bias, self.A_log, self.D):
            p._no_weight_decay = True
        self.out_proj = nn.Linear(s.inner, s.d_model, bias=False)

    def forward(self, x_BTD: torch.Tensor, *, skip_BT: torch.Tensor | None = None,
                return_last_state: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, D] -> y [B, T, D]; with ``return_last_state`` also the SSM state [B, E, N] (fp32)
        after the last step. ``skip_BT``: bool [B, T], True for tokens to treat as absent."""
        s = self.sizes
        x_BTE, z_BTE = self.in_proj(x_BTD).chunk(2, dim=-1)
        u_BTE = self.causal_conv(x_BTE, skip_BT, silu=True)
        dt_BTR, B_BTN, C_BTN = self.x_proj(u_BTE).split([s.dt_rank, s.state, s.state], dim=-1)
        delta_BTE = softplus(self.dt_proj(dt_BTR), self.dt_bias)
        if skip_BT is not None:
            delta_BTE = delta_BTE.masked_fill(skip_BT[..., None], 0.0)
        A_EN = -torch.exp(self.A_log.float())
        y_BET, state_BEN = self.scan(u_BTE.transpose(1, 2), delta_BTE.transpose(1, 2), A_EN,
                                     B_BTN.transpose(1, 2), C_BTN.transpose(1, 2), self.D.float(),
                                     z_BTE.transpose(1, 2), return_last_state=True)
        y_BTD = self.out_proj(y_BET.transpose(1, 2))
        if skip_BT is not None:
            y_BTD = y_BTD.masked_fill(skip_BT[..., None], 0.0)
        return (y_BTD, state_BEN) if return_last_state else y_BTD

    def causal_conv(self, x_BTE: torch.Tensor, skip_BT: torch.Tensor | None, *, silu: bool = False) -> torch.Tensor:
        """The depthwise causal conv over [B, T, E], skipping ``skip_BT`` tokens (``causal_conv``)."""
        return causal_conv(self.conv, x_BTE, skip_BT, silu=silu)


def causal_conv(conv: nn.Conv1d, x_BTE: torch.Tensor, skip_BT: torch.Tensor | None, *,
                silu: bool = False) -> torch.Tensor:
    """Depthwise ``conv`` over each step and the k-1 steps before it, then SiLU if `silu`:
    [B, T, E] -> [B, T, E] (the dispatched op: one C++ pass each way on a CPU).

    With ``skip_BT``, kept tokens are packed to the front (in order), convolved and put
    back, so a kept token's window holds the k-1 kept tokens before it, as a cached
    decoder that never fed the skipped ones would see. Skipped tokens get 0.
    """
    if skip_BT is None:
        return causal_conv1d(x_BTE, conv.weight[:, 0], conv.bias, silu)
    x_BET = x_BTE.transpose(1, 2)
    width = conv.kernel_size[0]
    # left padding only, so the conv is causal and torch counts exactly k MACs per output
    order_BT = torch.argsort(skip_BT.to(torch.int8), dim=1, stable=True)
    index_BET = order_BT[:, None, :].expand_as(x_BET)
    packed_BET = conv(F.pad(x_BET.gather(2, index_BET), (width - 1, 0)))
    out_BET = torch.zeros_like(packed_BET).scatter(2, index_BET, packed_BET)
    out_BTE = out_BET.masked_fill(skip_BT[:, None, :], 0.0).transpose(1, 2)
    return F.silu(out_BTE) if silu else out_BTE  # silu(0) = 0: skipped tokens stay 0

