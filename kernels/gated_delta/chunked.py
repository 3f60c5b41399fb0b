"""Gated delta rule, chunked (WY / UT-transform) form: the maths of naive.py as matmuls per chunk.

Same signature and return as `gated_delta_rule_naive` (plus a `chunk_size` keyword), pure
PyTorch, fp32 inside, differentiated by autograd. The algorithm is the one of Yang et al.,
https://arxiv.org/abs/2406.06484 (DeltaNet) and https://arxiv.org/abs/2412.06464 (gated),
derived here in this repo's state layout.

Dimensions: B batch, T time, H heads, K key dim, V value dim, J number of chunks,
L chunk length (T is padded up to J*L), X any trailing size (here V + K).

Derivation, for one head and one chunk, with S the [K, V] state (as stored) entering it.
Write the step-l update as S_l = alpha_l S_{l-1} + k_l w_l^T, where
w_l = beta_l (v_l - alpha_l S_{l-1}^T k_l) is what the delta rule writes. With
G_l = g_1 + ... + g_l (log-decay from the chunk start, <= 0) and gamma_l = exp(G_l):

    S_l = gamma_l S + sum_{s<=l} exp(G_l - G_s) k_s w_s^T                    (1)

Put (1) at l-1 into w_l:

    w_l + sum_{s<l} beta_l exp(G_l - G_s) (k_l . k_s) w_s = beta_l v_l - beta_l gamma_l S^T k_l

a unit lower-triangular system (I + M) W = diag(beta) V - diag(beta gamma) K S, so

    W = U - Wk S,   U = (I + M)^-1 diag(beta) V,   Wk = (I + M)^-1 diag(beta gamma) K

U and Wk do not depend on S: they are found for all chunks at once by one batched
triangular solve. Only the short loop over chunks needs S:

    O     = diag(gamma) Q S + (Q K^T * decay) W       (decay_ls = exp(G_l - G_s), s <= l)
    S_end = gamma_L S + (K * exp(G_L - G))^T W

Stability: every exponent is a difference G_l - G_s with s <= l (masked to -inf before the
exp above the diagonal), or G itself, all <= 0 when g <= 0.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def gated_delta_rule_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    return_last_state: bool = False,
    chunk_size: int = 64,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Gated delta rule in chunks of `chunk_size` steps; matches `gated_delta_rule_naive`.

    Args:
        q: [B, T, H, K] queries.
        k: [B, T, H, K] keys (unit norm keeps the update a contraction).
        v: [B, T, H, V] values.
        g: [B, T, H] log decay, alpha_t = exp(g_t); g <= 0 for a decaying state.
        beta: [B, T, H] write strength.
        initial_state: [B, H, K, V] state before the first step (S^T); zeros if None.
        return_last_state: also return the state after the last step.
        chunk_size: steps per chunk (default 64); only speed depends on it.

    Returns:
        o [B, T, H, V] in v's dtype, or (o, last_state) with last_state [B, H, K, V] in fp32.
    """
    out_dtype = v.dtype
    batch, seq_len, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    chunk_len = min(chunk_size, seq_len)
    num_chunks = math.ceil(seq_len / chunk_len)

    # Padded steps get k = 0, beta = 0 and g = 0: no decay and no write, so they leave the
    # state as it was after step T and the last state needs no special case.
    pad = num_chunks * chunk_len - seq_len

    def chunks(x_BTHX: torch.Tensor) -> torch.Tensor:
        """[B, T, H, X] -> [B, H, J, L, X] in fp32."""
        x_BTHX = F.pad(x_BTHX.float(), (0, 0, 0, 0, 0, pad))
        return x_BTHX.unflatten(1, (num_chunks, chunk_len)).permute(0, 3, 1, 2, 4)

    q_BHJLK, k_BHJLK, v_BHJLV = chunks(q), chunks(k), chunks(v)
    g_BHJL, beta_BHJL = chunks(g[..., None])[..., 0], chunks(beta[..., None])[..., 0]

    # log-decay from the chunk start up to and including each step; <= 0 and small in size
    # because it never runs past one chunk, so differences of it keep their precision
    G_BHJL = g_BHJL.cumsum(-1)
    causal_LL = torch.ones(chunk_len, chunk_len, dtype=torch.bool, device=q.device).tril()
    log_decay_BHJLL = (G_BHJL[..., :, None] - G_BHJL[..., None, :]).masked_fill(~causal_LL, float("-inf"))
    decay_BHJLL = log_decay_BHJLL.exp()

    # UT transform: the strictly lower-triangular M, then U and Wk by one triangular solve;
    # I + M has a unit diagonal by construction, so the solve never divides
    kk_BHJLL = k_BHJLK @ k_BHJLK.transpose(-1, -2)
    M_BHJLL = (beta_BHJL[..., None] * kk_BHJLL * decay_BHJLL).tril(-1)
    eye_LL = torch.eye(chunk_len, device=q.device)
    gamma_BHJL = G_BHJL.exp()
    rhs_BHJLX = torch.cat([beta_BHJL[..., None] * v_BHJLV, (beta_BHJL * gamma_BHJL)[..., None] * k_BHJLK], dim=-1)
    solved_BHJLX = torch.linalg.solve_triangular(M_BHJLL + eye_LL, rhs_BHJLX, upper=False, unitriangular=True)
    U_BHJLV, Wk_BHJLK = solved_BHJLX.split([value_dim, key_dim], dim=-1)

    # everything the chunk loop needs that does not depend on the state, for all chunks at once
    qk_BHJLL = (q_BHJLK @ k_BHJLK.transpose(-1, -2)) * decay_BHJLL
    q_decayed_BHJLK = q_BHJLK * gamma_BHJL[..., None]
    k_to_end_BHJLK = k_BHJLK * (G_BHJL[..., -1:] - G_BHJL).exp()[..., None]
    chunk_decay_BHJ = gamma_BHJL[..., -1]

    if initial_state is None:
        state_BHKV = q_BHJLK.new_zeros(batch, heads, key_dim, value_dim)
    else:
        state_BHKV = initial_state.float()
    per_chunk = zip(
        U_BHJLV.unbind(2),
        Wk_BHJLK.unbind(2),
        qk_BHJLL.unbind(2),
        q_decayed_BHJLK.unbind(2),
        k_to_end_BHJLK.unbind(2),
        chunk_decay_BHJ.unbind(2),
    )
    outs = []
    for U_BHLV, Wk_BHLK, qk_BHLL, q_decayed_BHLK, k_to_end_BHLK, chunk_decay_BH in per_chunk:
        # what the delta rule writes at each step, now that the state entering the chunk is known
        W_BHLV = U_BHLV - Wk_BHLK @ state_BHKV
        outs.append(q_decayed_BHLK @ state_BHKV + qk_BHLL @ W_BHLV)
        state_BHKV = chunk_decay_BH[..., None, None] * state_BHKV + k_to_end_BHLK.transpose(-1, -2) @ W_BHLV
    o_BHJLV = torch.stack(outs, dim=2)
    o_BTHV = o_BHJLV.flatten(2, 3).transpose(1, 2)[:, :seq_len].to(out_dtype)
    return (o_BTHV, state_BHKV) if return_last_state else o_BTHV
