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
    """[B, T, H, X] -> [J, B, H, L, X] in fp32, contiguous, T zero-padded up to J*L.

    Chunk-major, so chunk j of every (batch, head) is one contiguous [B*H, L, X] block: the
    loops over chunks then read and write (``out=``) whole blocks, with no copy per chunk.

    Padded steps get k = 0, beta = 0 and g = 0: no decay and no write, so they leave the
    state as it was after step T and the last state needs no special case.
    """
    pad = -x_BTHX.shape[1] % chunk_len
    x_BTHX = F.pad(x_BTHX.float(), (0, 0, 0, 0, 0, pad)) if pad else x_BTHX.float()
    return x_BTHX.unflatten(1, (-1, chunk_len)).permute(1, 0, 3, 2, 4).contiguous()


def _from_chunks(x_JBHLX: torch.Tensor, seq_len: int, dtype: torch.dtype) -> torch.Tensor:
    """[J, B, H, L, X] -> [B, T, H, X], contiguous, the padding dropped."""
    return x_JBHLX.permute(1, 0, 3, 2, 4).flatten(1, 2)[:, :seq_len].to(dtype, memory_format=torch.contiguous_format)


def _at(x_JBHYX: torch.Tensor, j: int) -> torch.Tensor:
    """Chunk j of every (batch, head) as one batch of matrices: [J, B, H, Y, X] -> [B*H, Y, X], a view."""
    return x_JBHYX[j].flatten(0, 1)


def _decay(G_JBHL: torch.Tensor) -> torch.Tensor:
    """D [J, B, H, L, L]: exp(G_l - G_s) on and below the diagonal, exactly 0 above it."""
    chunk_len = G_JBHL.shape[-1]
    above_LL = torch.ones(chunk_len, chunk_len, dtype=torch.bool, device=G_JBHL.device).triu(1)
    return (G_JBHL[..., :, None] - G_JBHL[..., None, :]).masked_fill_(above_LL, float("-inf")).exp_()


class _ChunkedRule(torch.autograd.Function):
    """(q, k, v, g, beta, S_0 or None, L) as `gated_delta_rule_chunked` takes them -> (o [B, T, H, V]
    fp32, S_T [B, H, K, V]).

    The chunked layout [J, B, H, L, X] (chunk-major) is made and undone inside, so autograd keeps no node per
    copy. Saves the chunk-local products the forward made anyway and the state entering each
    chunk ([J, B, H, K, V], small); the backward follows the module docstring.
    """

    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state, chunk_len):
        batch, seq_len, heads, key_dim = q.shape
        value_dim = v.shape[-1]
        q_JBHLK, k_JBHLK, v_JBHLV = (_to_chunks(x, chunk_len) for x in (q, k, v))
        beta_JBHL = _to_chunks(beta[..., None], chunk_len)[..., 0]
        # log-decay from the chunk start up to and including each step; <= 0 and small in size
        # because it never runs past one chunk, so differences of it keep their precision
        G_JBHL = _to_chunks(g[..., None], chunk_len)[..., 0].cumsum(-1)
        if initial_state is None:
            state_BHKV = q_JBHLK.new_zeros(batch, heads, key_dim, value_dim)
        else:
            state_BHKV = initial_state.float()
        D_JBHLL = _decay(G_JBHL)
        kk_JBHLL = k_JBHLK @ k_JBHLK.mT
        # M's strictly lower part; the solve is told the diagonal is 1 and reads nothing above it
        M_JBHLL = beta_JBHL[..., None] * kk_JBHLL * D_JBHLL
        gamma_JBHL = G_JBHL.exp()
        R_JBHLX = torch.cat([beta_JBHL[..., None] * v_JBHLV, (beta_JBHL * gamma_JBHL)[..., None] * k_JBHLK], -1)
        # A^-1 itself, by one solve against the identity: then X and the backward's A^-T dX are
        # matmuls, which on a CPU beat two solves against [L, V + K] right-hand sides
        eye_JBHLL = torch.eye(M_JBHLL.shape[-1], device=M_JBHLL.device).expand_as(M_JBHLL)
        Ainv_JBHLL = torch.linalg.solve_triangular(M_JBHLL, eye_JBHLL, upper=False, unitriangular=True)
        X_JBHLX = Ainv_JBHLL @ R_JBHLX
        U_JBHLV, Wk_JBHLK = X_JBHLX.split([value_dim, X_JBHLX.shape[-1] - value_dim], dim=-1)
        # everything the chunk loop needs that does not depend on the state, for all chunks at once
        qk_JBHLL = q_JBHLK @ k_JBHLK.mT
        P_JBHLL = qk_JBHLL * D_JBHLL
        to_end_JBHL = (G_JBHL[..., -1:] - G_JBHL).exp()
        Kd_JBHLK = k_JBHLK * to_end_JBHL[..., None]
        chunk_decay_JBH = gamma_JBHL[..., -1]

        num_chunks = Kd_JBHLK.shape[0]
        W_JBHLV = U_JBHLV.new_empty(U_JBHLV.shape)
        states_JBHKV = state_BHKV.new_empty(num_chunks, *state_BHKV.shape)  # the state entering each chunk
        # the loop runs on contiguous [B*H, ...] blocks of chunk j, writing its results in place:
        # three ops a chunk (baddbmm fuses the adds)
        chunk_decay_JN11 = chunk_decay_JBH.flatten(1, 2)[..., None, None]
        _at(states_JBHKV, 0).copy_(state_BHKV.reshape(-1, key_dim, value_dim))
        for j in range(num_chunks):
            state_NKV = _at(states_JBHKV, j)
            # what the delta rule writes at each step, now that the state entering the chunk is known
            W_NLV = torch.baddbmm(_at(U_JBHLV, j), _at(Wk_JBHLK, j), state_NKV, alpha=-1, out=_at(W_JBHLV, j))
            leaving = _at(states_JBHKV, j + 1) if j + 1 < num_chunks else None
            state_NKV = torch.baddbmm(chunk_decay_JN11[j] * state_NKV, _at(Kd_JBHLK, j).mT, W_NLV, out=leaving)
        state_BHKV = state_NKV.view(batch, heads, key_dim, value_dim)
        Qd_JBHLK = q_JBHLK * gamma_JBHL[..., None]
        o_JBHLV = Qd_JBHLK @ states_JBHKV + P_JBHLL @ W_JBHLV
        ctx.save_for_backward(q_JBHLK, k_JBHLK, v_JBHLV, beta_JBHL, gamma_JBHL, to_end_JBHL, D_JBHLL, Ainv_JBHLL,
                              kk_JBHLL, qk_JBHLL, P_JBHLL, X_JBHLX, W_JBHLV, states_JBHKV, Qd_JBHLK, Kd_JBHLK)
        ctx.seq_len, ctx.chunk_len = seq_len, chunk_len
        ctx.dtypes = [x.dtype for x in (q, k, v, g, beta)]
        ctx.state_dtype = None if initial_state is None else initial_state.dtype
        return _from_chunks(o_JBHLV, seq_len, torch.float32), state_BHKV

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do_BTHV, dlast_BHKV):
        (q_JBHLK, k_JBHLK, v_JBHLV, beta_JBHL, gamma_JBHL, to_end_JBHL, D_JBHLL, Ainv_JBHLL,
         kk_JBHLL, qk_JBHLL, P_JBHLL, X_JBHLX, W_JBHLV, states_JBHKV, Qd_JBHLK, Kd_JBHLK) = ctx.saved_tensors
        value_dim = v_JBHLV.shape[-1]
        Wk_JBHLK = X_JBHLX[..., value_dim:]
        chunk_decay_JBH = gamma_JBHL[..., -1]
        do_JBHLV = _to_chunks(do_BTHV, ctx.chunk_len)

        # the loop back over chunks: dW_j and the gradient of the state entering each chunk
        PtdO_JBHLV = P_JBHLL.mT @ do_JBHLV
        QdtdO_JBHKV = Qd_JBHLK.mT @ do_JBHLV
        num_chunks = W_JBHLV.shape[0]
        dW_JBHLV = torch.empty_like(W_JBHLV)
        dnext_JBHKV = torch.empty_like(states_JBHKV)  # gradient of the state leaving chunk j
        chunk_decay_JN11 = chunk_decay_JBH.flatten(1, 2)[..., None, None]
        _at(dnext_JBHKV, num_chunks - 1).copy_(dlast_BHKV.float().reshape(-1, *dlast_BHKV.shape[-2:]))
        for j in reversed(range(num_chunks)):
            dstate_NKV = _at(dnext_JBHKV, j)
            dW_NLV = torch.baddbmm(_at(PtdO_JBHLV, j), _at(Kd_JBHLK, j), dstate_NKV, out=_at(dW_JBHLV, j))
            entering = _at(dnext_JBHKV, j - 1) if j > 0 else None
            dstate_NKV = torch.baddbmm(torch.addcmul(_at(QdtdO_JBHKV, j), chunk_decay_JN11[j], dstate_NKV),
                                       _at(Wk_JBHLK, j).mT, dW_NLV, alpha=-1, out=entering)
        dstate_BHKV = dstate_NKV.view_as(dlast_BHKV)

        # the rest is batched over chunks
        dQd_JBHLK = do_JBHLV @ states_JBHKV.mT
        dP_JBHLL = do_JBHLV @ W_JBHLV.mT
        dKd_JBHLK = W_JBHLV @ dnext_JBHKV.mT
        dchunk_decay_JBH = (states_JBHKV * dnext_JBHKV).sum((-1, -2))
        dX_JBHLX = torch.cat([dW_JBHLV, -(dW_JBHLV @ states_JBHKV.mT)], -1)
        # X = A^-1 R with A unit lower-triangular: dR = A^-T dX, dA = -dR X^T on A's strictly lower part
        dR_JBHLX = Ainv_JBHLL.mT @ dX_JBHLX
        dM_JBHLL = (dR_JBHLX @ X_JBHLX.mT).tril_(-1).neg_()
        dRv_JBHLV, dRk_JBHLK = dR_JBHLX.split([value_dim, dR_JBHLX.shape[-1] - value_dim], dim=-1)

        # M = beta (k k^T) * D and P = (q k^T) * D
        dMD_JBHLL = dM_JBHLL * D_JBHLL
        dMDkk_JBHLL = dMD_JBHLL * kk_JBHLL
        dMk_JBHLL = beta_JBHL[..., None] * dMD_JBHLL  # the gradient of k k^T
        dPD_JBHLL = dP_JBHLL * D_JBHLL
        dq_JBHLK = dQd_JBHLK * gamma_JBHL[..., None] + dPD_JBHLL @ k_JBHLK
        dk_JBHLK = (dMk_JBHLL + dMk_JBHLL.mT) @ k_JBHLK + dPD_JBHLL.mT @ q_JBHLK
        dk_JBHLK += dKd_JBHLK * to_end_JBHL[..., None] + dRk_JBHLK * (beta_JBHL * gamma_JBHL)[..., None]
        dv_JBHLV = dRv_JBHLV * beta_JBHL[..., None]
        dRk_k_JBHL = (dRk_JBHLK * k_JBHLK).sum(-1)
        dbeta_JBHL = (dRv_JBHLV * v_JBHLV).sum(-1) + dRk_k_JBHL * gamma_JBHL + dMDkk_JBHLL.sum(-1)

        # G enters through D_ls = exp(G_l - G_s), gamma = exp(G) and exp(G_L - G)
        dlogD_JBHLL = beta_JBHL[..., None] * dMDkk_JBHLL + dPD_JBHLL * qk_JBHLL
        dgamma_JBHL = (dQd_JBHLK * q_JBHLK).sum(-1) + beta_JBHL * dRk_k_JBHL
        dto_end_JBHL = (dKd_JBHLK * k_JBHLK).sum(-1) * to_end_JBHL
        dG_JBHL = dlogD_JBHLL.sum(-1) - dlogD_JBHLL.sum(-2) + dgamma_JBHL * gamma_JBHL - dto_end_JBHL
        dG_JBHL[..., -1] += dto_end_JBHL.sum(-1) + dchunk_decay_JBH * chunk_decay_JBH
        # G = cumsum(g) within the chunk: dg_l = sum of dG over steps l and later
        dg_JBHL = dG_JBHL - dG_JBHL.cumsum(-1) + dG_JBHL.sum(-1, keepdim=True)
        grads = [_from_chunks(x, ctx.seq_len, dtype) for x, dtype in
                 zip((dq_JBHLK, dk_JBHLK, dv_JBHLV, dg_JBHL[..., None], dbeta_JBHL[..., None]), ctx.dtypes)]
        grads[3:] = [x[..., 0] for x in grads[3:]]
        dinitial = None if ctx.state_dtype is None else dstate_BHKV.to(ctx.state_dtype)
        return *grads, dinitial, None
