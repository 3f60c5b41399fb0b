"""Mamba-2 SSD scan, reference form: one step of the recurrence per time step.

This file is the spec. `chunked.py` must match it (forward, last state and every
gradient); see tests/kernels/test_ssd.py.

Dimensions: B batch, T time, H heads, P head dim, G groups, N state size. Heads are split
evenly over groups: head h reads group h // (H / G).

    x      : [B, T, H, P]   input (the conv'd, SiLU'd x channels, split into heads)
    dt     : [B, T, H]      step size, already positive (the layer applies bias and softplus)
    A      : [H]            one scalar per head, negative (-exp(A_log))
    B, C   : [B, T, G, N]   input and output matrices, shared by the heads of a group
    D      : [H]            skip connection
    state  : [B, H, P, N]   the layout of mamba_ssm's ssm_state

Recurrence (Dao & Gu, "Transformers are SSMs", https://arxiv.org/abs/2405.21060, section 3;
papers.md 3.5), per head h:

    a_t = exp(dt_t * A_h)                              scalar decay in (0, 1]
    S_t = a_t S_{t-1} + dt_t * x_t B_t^T               [P, N]
    y_t = S_t C_t + D_h x_t                            [P]

Unlike Mamba-1 the decay is one scalar per head and step, which is what lets the chunked
form write the same map as masked matmuls.
"""

from __future__ import annotations

import torch


def heads_of_groups(x_BTGN: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, T, G, N] -> [B, T, H, N]: each group's rows repeated for the H / G heads it serves."""
    groups = x_BTGN.shape[2]
    if heads % groups:
        raise ValueError(f"ssd: {heads} heads do not split evenly over {groups} groups")
    return x_BTGN.repeat_interleave(heads // groups, dim=2)


def ssd_naive(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    *,
    initial_state: torch.Tensor | None = None,
    return_last_state: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """SSD written as a loop over time, in fp32.

    Args:
        x: [B, T, H, P] input.
        dt: [B, T, H] step size (positive).
        A: [H] per-head decay rate (negative for a decaying state).
        B: [B, T, G, N] input matrix.
        C: [B, T, G, N] output matrix.
        D: [H] skip weight, or None for no skip.
        initial_state: [B, H, P, N] state before the first step; zeros if None.
        return_last_state: also return the state after the last step.

    Returns:
        y [B, T, H, P] in x's dtype, or (y, last_state) with last_state [B, H, P, N] in fp32.
    """
    out_dtype = x.dtype
    x_BTHP, dt_BTH, A_H = x.float(), dt.float(), A.float()
    batch, _, heads, head_dim = x_BTHP.shape
    B_BTHN, C_BTHN = heads_of_groups(B.float(), heads), heads_of_groups(C.float(), heads)
    if initial_state is None:
        S_BHPN = x_BTHP.new_zeros(batch, heads, head_dim, B.shape[-1])
    else:
        S_BHPN = initial_state.float()

    decay_BTH = torch.exp(dt_BTH * A_H)
    input_BTHP = dt_BTH[..., None] * x_BTHP
    # unbind once rather than index [:, t] each step (an O(T^2) backward otherwise)
    steps = zip(decay_BTH.unbind(1), input_BTHP.unbind(1), B_BTHN.unbind(1), C_BTHN.unbind(1))
    ys = []
    for decay_BH, input_BHP, B_BHN, C_BHN in steps:
        S_BHPN = decay_BH[..., None, None] * S_BHPN + input_BHP[..., None] * B_BHN[:, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", S_BHPN, C_BHN))
    y_BTHP = torch.stack(ys, dim=1)

    if D is not None:
        y_BTHP = y_BTHP + x_BTHP * D.float()[:, None]
    y_BTHP = y_BTHP.to(out_dtype)
    return (y_BTHP, S_BHPN) if return_last_state else y_BTHP
