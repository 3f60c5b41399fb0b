"""Gated delta rule, chunked (WY / UT-transform) form: the maths of naive.py as matmuls per chunk.

Same signature and return as `gated_delta_rule_naive` (plus a `chunk_size` keyword), pure
PyTorch, fp32 inside, with a hand-written backward (`_ChunkedRule`): autograd of the forward
graph kept a dozen [L, L] tensors per chunk and ran a backward op for every forward op, which
made this form slower than transformers' `torch_chunk_gated_delta_rule`. The algorithm is the
one of Yang et al., https://arxiv.org/abs/2406.06484 (DeltaNet) and
https://arxiv.org/abs/2412.06464 (gated), derived here in this repo's state layout.

Dimensions: B batch, T time, H heads, K key dim, V value dim, J number of chunks,
L chunk length (T is padded up to J*L), X any trailing size (here V + K), N = B*H.

Derivation, for one head and one chunk, with S the [K, V] state (as stored) entering it.
Write the step-l update as S_l = alpha_l S_{l-1} + k_l w_l^T, where
w_l = beta_l (v_l - alpha_l S_{l-1}^T k_l) is what the delta rule writes. With
G_l = g_1 + ... + g_l (log-decay from the chunk start, <= 0) and gamma_l = exp(G_l):

    S_l = gamma_l S + sum_{s<=l} exp(G_l - G_s) k_s w_s^T                    (1)

Put (1) at l-1 into w_l:

    w_l + sum_{s<l} beta_l exp(G_l - G_s) (k_l . k_s) w_s = beta_l v_l - beta_l gamma_l S^T k_l

a unit lower-triangular system A W = diag(beta) V - diag(beta gamma) K S, A = I + M, so

    W = U - Wk S,   [U, Wk] = X = A^-1 R,   R = [diag(beta) V, diag(beta gamma) K]

U and Wk do not depend on S: they are found for all chunks at once, through A^-1 from one
batched triangular solve. Only the short loop over chunks needs S, and only for two matmuls:

    W_j = U_j - Wk_j S_j,   S_{j+1} = gamma_L S_j + Kd_j^T W_j      (Kd = k exp(G_L - G))

after which the output of every chunk is one batched expression:

    O = Qd S + P W,   Qd = q gamma,   P = (q k^T) * D,   D_ls = exp(G_l - G_s) (s <= l, else 0)

Backward (dO given, dS_J the last state's gradient). The loop runs back over chunks:

    dW_j = P_j^T dO_j + Kd_j dS_{j+1},   dS_j = Qd_j^T dO_j + gamma_L dS_{j+1} - Wk_j^T dW_j

and the rest is batched over chunks again: dQd = dO S^T, dP = dO W^T, dKd = W dS_{j+1}^T,
dgamma_L = <S_j, dS_{j+1}>, dX = [dW, -dW S^T], dR = A^-T dX, dM = -strict_lower(dR X^T);
then through M = beta (k k^T) * D, P = (q k^T) * D, D = exp(G_l - G_s), the exp(G) factors
and G = cumsum(g).

Stability: every exponent is a difference G_l - G_s with s <= l (masked to -inf before the
exp above the diagonal), or G itself, all <= 0 when g <= 0.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F


def default_chunk_size(key_dim: int, value_dim: int) -> int:
    """Steps per chunk when the caller names none: half the head size, 16 to 64.

    Per token the [L, L] products inside a chunk cost O(L (K + V)) and the state updates
    O(K V / L), so short heads want short chunks: with K = V = 16 on a CPU, L = 64 ran well
    behind 16 and 32 (docs/performance.md).
    """
    return min(64, max(16, (1 << (max(key_dim, value_dim) - 1).bit_length()) // 2))


def gated_delta_rule_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    return_last_state: bool = False,
    chunk_size: int | None = None,
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
        chunk_size: steps per chunk; None picks it from K and V (`default_chunk_size`).
            Only speed depends on it.

    Returns:
        o [B, T, H, V] in v's dtype, or (o, last_state) with last_state [B, H, K, V] in fp32.
    """
    chunk_len = min(chunk_size or default_chunk_size(q.shape[-1], v.shape[-1]), q.shape[1])
    o_BTHV, state_BHKV = _ChunkedRule.apply(q, k, v, g, beta, initial_state, chunk_len)
    o_BTHV = o_BTHV.to(v.dtype)
    return (o_BTHV, state_BHKV) if return_last_state else o_BTHV


def _to_chunks(x_BTHX: torch.Tensor, chunk_len: int) -> torch.Tensor:
    """[B, T, H, X] -> [B, H, J, L, X] in fp32, contiguous, T zero-padded up to J*L.

    Padded steps get k = 0, beta = 0 and g = 0: no decay and no write, so they leave the
    state as it was after step T and the last state needs no special case.
    """
    pad = -x_BTHX.shape[1] % chunk_len
    x_BTHX = F.pad(x_BTHX.float(), (0, 0, 0, 0, 0, pad)) if pad else x_BTHX.float()
    return x_BTHX.unflatten(1, (-1, chunk_len)).permute(0, 3, 1, 2, 4).contiguous()


def _from_chunks(x_BHJLX: torch.Tensor, seq_len: int, dtype: torch.dtype) -> torch.Tensor:
    """[B, H, J, L, X] -> [B, T, H, X], contiguous, the padding dropped."""
    return x_BHJLX.flatten(2, 3).transpose(1, 2)[:, :seq_len].to(dtype, memory_format=torch.contiguous_format)


def _at(x_BHJYX: torch.Tensor, j: int) -> torch.Tensor:
    """Chunk j of every (batch, head) as one batch of matrices: [B, H, J, Y, X] -> [B*H, Y, X], a view."""
    return x_BHJYX[:, :, j].flatten(0, 1)


def _decay(G_BHJL: torch.Tensor) -> torch.Tensor:
    """D [B, H, J, L, L]: exp(G_l - G_s) on and below the diagonal, exactly 0 above it."""
    chunk_len = G_BHJL.shape[-1]
    above_LL = torch.ones(chunk_len, chunk_len, dtype=torch.bool, device=G_BHJL.device).triu(1)
    return (G_BHJL[..., :, None] - G_BHJL[..., None, :]).masked_fill_(above_LL, float("-inf")).exp_()


class _ChunkedRule(torch.autograd.Function):
    """(q, k, v, g, beta, S_0 or None, L) as `gated_delta_rule_chunked` takes them -> (o [B, T, H, V]
    fp32, S_T [B, H, K, V]).

    The chunked layout [B, H, J, L, X] is made and undone inside, so autograd keeps no node per
    copy. Saves the chunk-local products the forward made anyway and the state entering each
    chunk ([B, H, J, K, V], small); the backward follows the module docstring.
    """

    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state, chunk_len):
        batch, seq_len, heads, key_dim = q.shape
        value_dim = v.shape[-1]
        q_BHJLK, k_BHJLK, v_BHJLV = (_to_chunks(x, chunk_len) for x in (q, k, v))
        beta_BHJL = _to_chunks(beta[..., None], chunk_len)[..., 0]
        # log-decay from the chunk start up to and including each step; <= 0 and small in size
        # because it never runs past one chunk, so differences of it keep their precision
        G_BHJL = _to_chunks(g[..., None], chunk_len)[..., 0].cumsum(-1)
        if initial_state is None:
            state_BHKV = q_BHJLK.new_zeros(batch, heads, key_dim, value_dim)
        else:
            state_BHKV = initial_state.float()
        D_BHJLL = _decay(G_BHJL)
        kk_BHJLL = k_BHJLK @ k_BHJLK.mT
        # M's strictly lower part; the solve is told the diagonal is 1 and reads nothing above it
        M_BHJLL = beta_BHJL[..., None] * kk_BHJLL * D_BHJLL
        gamma_BHJL = G_BHJL.exp()
        R_BHJLX = torch.cat([beta_BHJL[..., None] * v_BHJLV, (beta_BHJL * gamma_BHJL)[..., None] * k_BHJLK], -1)
        # A^-1 itself, by one solve against the identity: then X and the backward's A^-T dX are
        # matmuls, which on a CPU beat two solves against [L, V + K] right-hand sides
        eye_BHJLL = torch.eye(M_BHJLL.shape[-1], device=M_BHJLL.device).expand_as(M_BHJLL)
        Ainv_BHJLL = torch.linalg.solve_triangular(M_BHJLL, eye_BHJLL, upper=False, unitriangular=True)
        X_BHJLX = Ainv_BHJLL @ R_BHJLX
        U_BHJLV, Wk_BHJLK = X_BHJLX.split([value_dim, X_BHJLX.shape[-1] - value_dim], dim=-1)
        # everything the chunk loop needs that does not depend on the state, for all chunks at once
        qk_BHJLL = q_BHJLK @ k_BHJLK.mT
        P_BHJLL = qk_BHJLL * D_BHJLL
        to_end_BHJL = (G_BHJL[..., -1:] - G_BHJL).exp()
        Kd_BHJLK = k_BHJLK * to_end_BHJL[..., None]
        chunk_decay_BHJ = gamma_BHJL[..., -1]

        W_BHJLV = torch.empty_like(U_BHJLV)
        states_BHJKV = state_BHKV.new_empty(*Kd_BHJLK.shape[:3], *state_BHKV.shape[-2:])
        # the loop runs on [B*H, ...] views of chunk j, five ops a chunk (baddbmm fuses the adds)
        chunk_decay_JN11 = chunk_decay_BHJ.flatten(0, 1).T[..., None, None]
        state_NKV = state_BHKV.reshape(-1, key_dim, value_dim)
        for j in range(Kd_BHJLK.shape[2]):
            _at(states_BHJKV, j).copy_(state_NKV)
            # what the delta rule writes at each step, now that the state entering the chunk is known
            W_NLV = torch.baddbmm(_at(U_BHJLV, j), _at(Wk_BHJLK, j), state_NKV, alpha=-1)
            _at(W_BHJLV, j).copy_(W_NLV)  # (baddbmm's out= into this strided view ran 5x slower)
            state_NKV = torch.baddbmm(chunk_decay_JN11[j] * state_NKV, _at(Kd_BHJLK, j).mT, W_NLV)
        state_BHKV = state_NKV.view(batch, heads, key_dim, value_dim)
        Qd_BHJLK = q_BHJLK * gamma_BHJL[..., None]
        o_BHJLV = Qd_BHJLK @ states_BHJKV + P_BHJLL @ W_BHJLV
        ctx.save_for_backward(q_BHJLK, k_BHJLK, v_BHJLV, beta_BHJL, gamma_BHJL, to_end_BHJL, D_BHJLL, Ainv_BHJLL,
                              kk_BHJLL, qk_BHJLL, P_BHJLL, X_BHJLX, W_BHJLV, states_BHJKV, Qd_BHJLK, Kd_BHJLK)
        ctx.seq_len, ctx.chunk_len = seq_len, chunk_len
        ctx.dtypes = [x.dtype for x in (q, k, v, g, beta)]
        ctx.state_dtype = None if initial_state is None else initial_state.dtype
        return _from_chunks(o_BHJLV, seq_len, torch.float32), state_BHKV

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do_BTHV, dlast_BHKV):
        (q_BHJLK, k_BHJLK, v_BHJLV, beta_BHJL, gamma_BHJL, to_end_BHJL, D_BHJLL, Ainv_BHJLL,
         kk_BHJLL, qk_BHJLL, P_BHJLL, X_BHJLX, W_BHJLV, states_BHJKV, Qd_BHJLK, Kd_BHJLK) = ctx.saved_tensors
        value_dim = v_BHJLV.shape[-1]
        Wk_BHJLK = X_BHJLX[..., value_dim:]
        chunk_decay_BHJ = gamma_BHJL[..., -1]
        do_BHJLV = _to_chunks(do_BTHV, ctx.chunk_len)

        # the loop back over chunks: dW_j and the gradient of the state entering each chunk
        PtdO_BHJLV = P_BHJLL.mT @ do_BHJLV
        QdtdO_BHJKV = Qd_BHJLK.mT @ do_BHJLV
        dW_BHJLV = torch.empty_like(W_BHJLV)
        dnext_BHJKV = torch.empty_like(states_BHJKV)  # gradient of the state leaving chunk j
        chunk_decay_JN11 = chunk_decay_BHJ.flatten(0, 1).T[..., None, None]
        dstate_NKV = dlast_BHKV.float().reshape(-1, *dlast_BHKV.shape[-2:])
        for j in reversed(range(W_BHJLV.shape[2])):
            _at(dnext_BHJKV, j).copy_(dstate_NKV)
            dW_NLV = torch.baddbmm(_at(PtdO_BHJLV, j), _at(Kd_BHJLK, j), dstate_NKV)
            _at(dW_BHJLV, j).copy_(dW_NLV)
            dstate_NKV = torch.baddbmm(torch.addcmul(_at(QdtdO_BHJKV, j), chunk_decay_JN11[j], dstate_NKV),
                                       _at(Wk_BHJLK, j).mT, dW_NLV, alpha=-1)
        dstate_BHKV = dstate_NKV.view_as(dlast_BHKV)

        # the rest is batched over chunks
        dQd_BHJLK = do_BHJLV @ states_BHJKV.mT
        dP_BHJLL = do_BHJLV @ W_BHJLV.mT
        dKd_BHJLK = W_BHJLV @ dnext_BHJKV.mT
        dchunk_decay_BHJ = (states_BHJKV * dnext_BHJKV).sum((-1, -2))
        dX_BHJLX = torch.cat([dW_BHJLV, -(dW_BHJLV @ states_BHJKV.mT)], -1)
        # X = A^-1 R with A unit lower-triangular: dR = A^-T dX, dA = -dR X^T on A's strictly lower part
        dR_BHJLX = Ainv_BHJLL.mT @ dX_BHJLX
        dM_BHJLL = (dR_BHJLX @ X_BHJLX.mT).tril_(-1).neg_()
        dRv_BHJLV, dRk_BHJLK = dR_BHJLX.split([value_dim, dR_BHJLX.shape[-1] - value_dim], dim=-1)

        # M = beta (k k^T) * D and P = (q k^T) * D
        dMD_BHJLL = dM_BHJLL * D_BHJLL
        dMDkk_BHJLL = dMD_BHJLL * kk_BHJLL
        dMk_BHJLL = beta_BHJL[..., None] * dMD_BHJLL  # the gradient of k k^T
        dPD_BHJLL = dP_BHJLL * D_BHJLL
        dq_BHJLK = dQd_BHJLK * gamma_BHJL[..., None] + dPD_BHJLL @ k_BHJLK
        dk_BHJLK = (dMk_BHJLL + dMk_BHJLL.mT) @ k_BHJLK + dPD_BHJLL.mT @ q_BHJLK
        dk_BHJLK += dKd_BHJLK * to_end_BHJL[..., None] + dRk_BHJLK * (beta_BHJL * gamma_BHJL)[..., None]
        dv_BHJLV = dRv_BHJLV * beta_BHJL[..., None]
        dRk_k_BHJL = (dRk_BHJLK * k_BHJLK).sum(-1)
        dbeta_BHJL = (dRv_BHJLV * v_BHJLV).sum(-1) + dRk_k_BHJL * gamma_BHJL + dMDkk_BHJLL.sum(-1)

        # G enters through D_ls = exp(G_l - G_s), gamma = exp(G) and exp(G_L - G)
        dlogD_BHJLL = beta_BHJL[..., None] * dMDkk_BHJLL + dPD_BHJLL * qk_BHJLL
        dgamma_BHJL = (dQd_BHJLK * q_BHJLK).sum(-1) + beta_BHJL * dRk_k_BHJL
        dto_end_BHJL = (dKd_BHJLK * k_BHJLK).sum(-1) * to_end_BHJL
        dG_BHJL = dlogD_BHJLL.sum(-1) - dlogD_BHJLL.sum(-2) + dgamma_BHJL * gamma_BHJL - dto_end_BHJL
        dG_BHJL[..., -1] += dto_end_BHJL.sum(-1) + dchunk_decay_BHJ * chunk_decay_BHJ
        # G = cumsum(g) within the chunk: dg_l = sum of dG over steps l and later
        dg_BHJL = dG_BHJL - dG_BHJL.cumsum(-1) + dG_BHJL.sum(-1, keepdim=True)
        grads = [_from_chunks(x, ctx.seq_len, dtype) for x, dtype in
                 zip((dq_BHJLK, dk_BHJLK, dv_BHJLV, dg_BHJL[..., None], dbeta_BHJL[..., None]), ctx.dtypes)]
        grads[3:] = [x[..., 0] for x in grads[3:]]
        dinitial = None if ctx.state_dtype is None else dstate_BHKV.to(ctx.state_dtype)
        return *grads, dinitial, None
