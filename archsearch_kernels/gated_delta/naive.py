"""Gated delta rule (Gated DeltaNet), reference form: one step of the recurrence per time step.

This file is the spec. `chunked.py` must match it (forward, last state and every
gradient); see tests/kernels/test_gated_delta.py.

Dimensions: B batch, T time, H heads, K key/query head dim, V value head dim.

    q, k  : [B, T, H, K]   queries and keys (the layer l2-normalises them per head)
    v     : [B, T, H, V]   values
    g     : [B, T, H]      log of the decay gate, g = log(alpha) <= 0
    beta  : [B, T, H]      write strength in (0, 1)
    state : [B, H, K, V]   S transposed (see below)

Recurrence (Yang, Kautz & Hatamizadeh, https://arxiv.org/abs/2412.06464; papers.md
section 7), per head, with the state a V x K matrix S that maps keys to values:

    S_t = alpha_t * S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T
    o_t = S_t q_t

Read as the delta rule: decay the memory, look up the value it holds for k_t, and move it a
fraction beta_t of the way toward v_t:

    S'  = alpha_t S_{t-1};   S_t = S' + beta_t (v_t - S' k_t) k_t^T

Layout: the state is stored as S^T, [B, H, K, V] (one row per key dimension), the layout of
flash-linear-attention's `final_state`, so states can be handed between the two. In that
layout the readout is o_t[v] = sum_k q_t[k] * state_t[k, v].

No query scaling is applied: o_t = S_t q_t exactly; callers scale q themselves.
"""

from __future__ import annotations

import torch


def gated_delta_rule_naive(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    return_last_state: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Gated delta rule written as a loop over time, in fp32.

    Args:
        q: [B, T, H, K] queries.
        k: [B, T, H, K] keys (unit norm keeps the update a contraction).
        v: [B, T, H, V] values.
        g: [B, T, H] log decay, alpha_t = exp(g_t); g <= 0 for a decaying state.
        beta: [B, T, H] write strength.
        initial_state: [B, H, K, V] state before the first step (S^T); zeros if None.
        return_last_state: also return the state after the last step.

    Returns:
        o [B, T, H, V] in v's dtype, or (o, last_state) with last_state [B, H, K, V] in fp32.
    """
    out_dtype = v.dtype
    q_BTHK, k_BTHK, v_BTHV = q.float(), k.float(), v.float()
    alpha_BTH, beta_BTH = g.float().exp(), beta.float()
    batch, _, heads, key_dim = q_BTHK.shape
    value_dim = v_BTHV.shape[-1]
    if initial_state is None:
        state_BHKV = q_BTHK.new_zeros(batch, heads, key_dim, value_dim)
    else:
        state_BHKV = initial_state.float()

    steps = zip(q_BTHK.unbind(1), k_BTHK.unbind(1), v_BTHV.unbind(1), alpha_BTH.unbind(1), beta_BTH.unbind(1))
    outs = []
    for q_BHK, k_BHK, v_BHV, alpha_BH, beta_BH in steps:
        state_BHKV = alpha_BH[..., None, None] * state_BHKV
        recalled_BHV = torch.einsum("bhkv,bhk->bhv", state_BHKV, k_BHK)
        correction_BHV = beta_BH[..., None] * (v_BHV - recalled_BHV)
        state_BHKV = state_BHKV + torch.einsum("bhk,bhv->bhkv", k_BHK, correction_BHV)
        outs.append(torch.einsum("bhkv,bhk->bhv", state_BHKV, q_BHK))
    o_BTHV = torch.stack(outs, dim=1).to(out_dtype)
    return (o_BTHV, state_BHKV) if return_last_state else o_BTHV
