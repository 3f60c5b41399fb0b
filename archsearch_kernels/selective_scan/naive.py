"""Mamba-1 selective scan, reference form: one step of the recurrence per time step.

This file is the spec. `chunked.py` must match it (forward, last state and every
gradient); see tests/kernels/test_selective_scan.py.

Dimensions: B batch, E inner channels (expand * d_model), N state size per channel, T time.

    u, delta : [B, E, T]     input and step size
    A        : [E, N]        continuous-time state matrix (diagonal; negative, -exp(A_log))
    B, C     : [B, N, T]     input and output matrices, data-dependent, shared by all channels
    D        : [E]           skip connection
    z        : [B, E, T]     output gate: y * silu(z)
    state h  : [B, E, N]

Recurrence (Gu & Dao, https://arxiv.org/abs/2312.00752, Algorithm 2; zero-order hold on A,
Euler step on B, as in the mamba_ssm reference):

    delta_t = softplus(delta_t + delta_bias)           (bias and softplus optional)
    h_t     = exp(delta_t * A) * h_{t-1} + delta_t * B_t * u_t
    y_t     = <h_t, C_t>_N + D * u_t
    out_t   = y_t * silu(z_t)                           (gate optional)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def selective_scan_naive(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
    *,
    initial_state: torch.Tensor | None = None,
    return_last_state: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Selective scan written as a loop over time, in fp32.

    Args:
        u: [B, E, T] input.
        delta: [B, E, T] step size before `delta_bias` and softplus.
        A: [E, N] state matrix (real; negative for a decaying state).
        B: [B, N, T] input matrix.
        C: [B, N, T] output matrix.
        D: [E] skip weight, or None for no skip.
        z: [B, E, T] gate, or None for no gate.
        delta_bias: [E] added to delta before the softplus, or None.
        delta_softplus: apply softplus to delta (after the bias).
        initial_state: [B, E, N] state before the first step; zeros if None.
        return_last_state: also return the state after the last step.

    Returns:
        y [B, E, T] in u's dtype, or (y, last_state) with last_state [B, E, N] in fp32
        (kept in fp32 because it is carried on to the next call during cached inference).
    """
    out_dtype = u.dtype
    u_BET, delta_BET, A_EN = u.float(), delta.float(), A.float()
    B_BNT, C_BNT = B.float(), C.float()
    if delta_bias is not None:
        delta_BET = delta_BET + delta_bias.float()[:, None]
    if delta_softplus:
        delta_BET = F.softplus(delta_BET)
    batch, channels, _ = u_BET.shape
    state_size = A_EN.shape[1]

    decay_BTEN = torch.exp(torch.einsum("bet,en->bten", delta_BET, A_EN))
    input_BTEN = torch.einsum("bet,bnt,bet->bten", delta_BET, B_BNT, u_BET)
    if initial_state is None:
        h_BEN = u_BET.new_zeros(batch, channels, state_size)
    else:
        h_BEN = initial_state.float()

    # unbind once rather than index [:, t] each step: the backward of T separate index ops
    # would build T full-size zero gradients, which makes the reference's backward O(T^2)
    steps = zip(decay_BTEN.unbind(1), input_BTEN.unbind(1), C_BNT.unbind(2))
    ys = []
    for decay_BEN, input_BEN, C_BN in steps:
        h_BEN = decay_BEN * h_BEN + input_BEN
        ys.append(torch.einsum("ben,bn->be", h_BEN, C_BN))
    y_BET = torch.stack(ys, dim=-1)

    if D is not None:
        y_BET = y_BET + u_BET * D.float()[:, None]
    if z is not None:
        y_BET = y_BET * F.silu(z.float())
    y_BET = y_BET.to(out_dtype)
    return (y_BET, h_BEN) if return_last_state else y_BET
