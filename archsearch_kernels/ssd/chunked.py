"""Mamba-2 SSD scan, chunked form: the maths of naive.py as masked matmuls per chunk.

Same signature and return as `ssd_naive` (plus a `chunk_size` keyword), pure PyTorch, fp32
inside, differentiated by autograd. This is the block decomposition of the SSD paper
(Dao & Gu, https://arxiv.org/abs/2405.21060, section 6; its `ssd_minimal_discrete`),
derived here in this repo's layouts.

Dimensions: B batch, T time, H heads = G groups x R heads per group, P head dim, N state
size, J number of chunks, L chunk length (T is padded up to J*L).

Derivation, for one head and one chunk, with S the [P, N] state entering it. With
a_l = dt_l A (log of the step-l decay, <= 0), G_l = a_1 + ... + a_l and u_l = dt_l x_l:

    S_l = exp(G_l) S + sum_{s<=l} exp(G_l - G_s) u_s B_s^T                  (1)
    y_l = S_l C_l = exp(G_l) S C_l + sum_{s<=l} (C_l . B_s) exp(G_l - G_s) u_s

so inside a chunk the output is one masked "attention" matmul, (C B^T * decay) U with
decay_ls = exp(G_l - G_s) for s <= l, plus the start state read out by C and decayed by
exp(G_l). Only the start states need a sequential pass, one step per chunk:

    S_next = exp(G_L) S + sum_s exp(G_L - G_s) u_s B_s^T = exp(G_L) S + (U * exp(G_L - G))^T B

Four pieces, as in the paper: the diagonal blocks (intra-chunk outputs), each chunk's own
contribution to the state, the J-step pass over chunk boundaries, and the readout of the
start states. B and C belong to groups: C B^T is formed once per group and broadcast over
its R heads, and the state write and readout treat a group's R heads as one [R P]-wide matmul.

Stability: every exponent is a segment sum a_{s+1} + ... + a_l with s <= l (-inf above the
diagonal before the exp) or G_l, all <= 0 for dt >= 0 and A <= 0 and never summed over more
than one chunk. Segments are summed term by term, never taken as differences of G, whose
rounding grows with G (test_strong_decay_stays_finite_and_matches fails with differences).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def ssd_chunked(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    *,
    initial_state: torch.Tensor | None = None,
    return_last_state: bool = False,
    chunk_size: int = 64,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """SSD in chunks of `chunk_size` steps; matches `ssd_naive`.

    Args:
        x: [B, T, H, P] input.
        dt: [B, T, H] step size (positive).
        A: [H] per-head decay rate (negative for a decaying state).
        B: [B, T, G, N] input matrix.
        C: [B, T, G, N] output matrix.
        D: [H] skip weight, or None for no skip.
        initial_state: [B, H, P, N] state before the first step; zeros if None.
        return_last_state: also return the state after the last step.
        chunk_size: steps per chunk (default 64); only speed depends on it.

    Returns:
        y [B, T, H, P] in x's dtype, or (y, last_state) with last_state [B, H, P, N] in fp32.
    """
    out_dtype = x.dtype
    batch, seq_len, heads, head_dim = x.shape
    groups, state_size = B.shape[2], B.shape[3]
    if heads % groups:
        raise ValueError(f"ssd: {heads} heads do not split evenly over {groups} groups")
    per_group = heads // groups
    chunk_len = min(chunk_size, seq_len)
    num_chunks = math.ceil(seq_len / chunk_len)

    # Padded steps get dt = 0 and x = 0: decay exp(0) = 1 and no input, so they leave the
    # state as it was after step T and the last state needs no special case.
    pad = num_chunks * chunk_len - seq_len

    def chunks(x_BTYX: torch.Tensor, split: int) -> torch.Tensor:
        """[B, T, Y, X] -> [B, Y/split, split, J, L, X] in fp32 (Y heads or groups)."""
        x_BTYX = F.pad(x_BTYX.float(), (0, 0, 0, 0, 0, pad)) if pad else x_BTYX.float()
        x_BYJLX = x_BTYX.unflatten(1, (num_chunks, chunk_len)).permute(0, 3, 1, 2, 4)
        return x_BYJLX.unflatten(1, (x_BYJLX.shape[1] // split, split))

    x_BGRJLP = chunks(x, per_group)
    dt_BGRJL = chunks(dt[..., None], per_group)[..., 0]
    B_BG1JLN, C_BG1JLN = chunks(B, 1), chunks(C, 1)

    # log-decay of each step, and from the chunk start up to and including each step, <= 0
    a_BGRJL = dt_BGRJL * A.float().view(groups, per_group, 1, 1)
    G_BGRJL = a_BGRJL.cumsum(-1)
    # segment sums G_l - G_s = a_{s+1} + ... + a_l (the paper's segsum), summed term by term
    # rather than taken as a difference of G: with strong and weak decays mixed, G reaches
    # thousands and its rounding would swamp a segment of order one
    causal_LL = torch.ones(chunk_len, chunk_len, dtype=torch.bool, device=x.device).tril()
    steps_BGRJLL = a_BGRJL[..., :, None].expand(*a_BGRJL.shape, chunk_len).masked_fill(~causal_LL.tril(-1), 0.0)
    segment_BGRJLL = steps_BGRJLL.cumsum(-2).masked_fill(~causal_LL, float("-inf"))
    decay_BGRJLL = segment_BGRJLL.exp()
    u_BGRJLP = dt_BGRJL[..., None] * x_BGRJLP

    # 1. diagonal blocks: each chunk's outputs from its own inputs, one masked matmul
    scores_BGRJLL = (C_BG1JLN @ B_BG1JLN.transpose(-1, -2)) * decay_BGRJLL
    y_BGRJLP = scores_BGRJLL @ u_BGRJLP

    # 2. what each chunk adds to the state on its own, decayed to the chunk's end
    to_end_BGRJL = decay_BGRJLL[..., -1, :]
    # the R heads of a group share its B: one [R P, L] x [L, N] matmul per group and chunk
    # rather than R broadcast ones (broadcasting B would copy it R times)
    u_to_end_BGJLRP = (u_BGRJLP * to_end_BGRJL[..., None]).permute(0, 1, 3, 4, 2, 5)
    chunk_state_BGRJPN = (u_to_end_BGJLRP.flatten(-2).transpose(-1, -2) @ B_BG1JLN[:, :, 0]).unflatten(
        -2, (per_group, head_dim)).permute(0, 1, 3, 2, 4, 5)

    # 3. true state entering each chunk: J sequential steps on [B, G, R, P, N]
    if initial_state is None:
        S_BGRPN = x_BGRJLP.new_zeros(batch, groups, per_group, head_dim, state_size)
    else:
        S_BGRPN = initial_state.float().unflatten(1, (groups, per_group))
    chunk_decay_BGRJ = G_BGRJL[..., -1].exp()
    starts = []
    for chunk_decay_BGR, chunk_state_BGRPN in zip(chunk_decay_BGRJ.unbind(3), chunk_state_BGRJPN.unbind(3)):
        starts.append(S_BGRPN)
        S_BGRPN = torch.addcmul(chunk_state_BGRPN, chunk_decay_BGR[..., None, None], S_BGRPN)
    start_BGRJPN = torch.stack(starts, dim=3)

    # 4. the start states read out by C, decayed from the chunk start to each step
    start_BGJNX = start_BGRJPN.permute(0, 1, 3, 5, 2, 4).flatten(-2)  # X = R P, heads of a group side by side
    readout_BGRJLP = (C_BG1JLN[:, :, 0] @ start_BGJNX).unflatten(-1, (per_group, head_dim)).permute(0, 1, 4, 2, 3, 5)
    y_BGRJLP = torch.addcmul(y_BGRJLP, G_BGRJL.exp()[..., None], readout_BGRJLP)

    # a view until the skip, whose one pass also lays y out as [B, T, H, P]
    y_BTHP = y_BGRJLP.flatten(1, 2).flatten(2, 3).transpose(1, 2)[:, :seq_len]
    if D is not None:
        y_BTHP = torch.addcmul(y_BTHP, x.float(), D.float()[:, None])
    y_BTHP = y_BTHP.to(out_dtype)
    last_BHPN = S_BGRPN.flatten(1, 2)
    return (y_BTHP, last_BHPN) if return_last_state else y_BTHP
