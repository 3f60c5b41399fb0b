"""Mamba-1 selective scan, chunked form: the maths of naive.py in ~2*sqrt(2T) Python steps, not T.

Same signature and return as `selective_scan_naive` (plus a `chunk_size` keyword), pure
PyTorch, fp32 inside, differentiated by autograd.

Dimensions: B batch, E inner channels, N state size, T time, J number of chunks,
L chunk length (T is padded up to J*L).

How it is split. Time is cut into J chunks of L steps. Three short loops replace the T-step one:

    1. chunk ends: L steps, each advancing all J chunks at once from a zero state; this gives
       what each chunk adds to the state on its own;
    2. chunk starts: J steps on [B, E, N], carrying the true state over chunk boundaries
       (a whole chunk decays the state by exp(A * sum of its deltas));
    3. outputs: L steps again, all chunks at once, now from their true start states,
       reading y out with C at each step.

The loop steps work on [B, J, E, N] slices, J times larger than the reference's [B, E, N], so
Python and launch overhead is paid 2L + J times instead of T times and each step has enough
work to spread over threads. The elementwise work stays about the reference's (the chunk loop
runs twice), and on a CPU that bounds the speed-up to a few times (docs/performance.md).

Why not the masked L x L "attention" form used for Mamba-2/SSD (papers.md 3.5): there the
decay is one scalar per head, so the intra-chunk part is a matmul. Mamba-1's decay
exp(delta * A) differs for every (channel, state) pair, so the masked form needs a
[B, E, N, L, L] tensor, L times the memory of the states; in a trial on a 2-core CPU
(B=2, E=256, N=16, T=512, L=16) its forward was ~9x slower than the plain loop. Adding each
chunk's decayed start state to zero-start local states (instead of rerunning the chunk, as
step 3 does) costs more passes over [B, T, E, N] and measured slower too.

Stability: every exponent is delta * A or a sum of them over a chunk, <= 0 for delta >= 0
and A <= 0, so nothing large is ever exponentiated; strong decays underflow to 0 as they
should.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def selective_scan_chunked(
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
    chunk_size: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Selective scan in chunks of `chunk_size` steps; matches `selective_scan_naive`.

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
        chunk_size: steps per chunk; only speed depends on it. None takes about sqrt(T/2),
            which minimises the number of sequential steps, 2L + T/L.

    Returns:
        y [B, E, T] in u's dtype, or (y, last_state) with last_state [B, E, N] in fp32.
    """
    out_dtype = u.dtype
    u_BET, delta_BET, A_EN = u.float(), delta.float(), A.float()
    if delta_bias is not None:
        delta_BET = delta_BET + delta_bias.float()[:, None]
    if delta_softplus:
        delta_BET = F.softplus(delta_BET)
    batch, channels, seq_len = u_BET.shape
    state_size = A_EN.shape[1]
    if chunk_size is None:
        chunk_size = max(1, round(math.sqrt(seq_len / 2)))
    chunk_len = min(chunk_size, seq_len)
    num_chunks = math.ceil(seq_len / chunk_len)

    # Padded steps get delta = 0 and u = 0: decay exp(0) = 1 and no input, so they leave
    # the state as it was after step T and the last state needs no special case.
    pad = num_chunks * chunk_len - seq_len

    def chunks(x_BXT: torch.Tensor) -> torch.Tensor:
        """[B, X, T] -> [B, J, L, X], contiguous. Elementwise results take their inputs' memory
        layout, so a permuted view here would scatter every step's [E, N] block of the
        [B, J, L, E, N] tensors built from it; contiguous, each step reads whole blocks."""
        x_BXJL = F.pad(x_BXT.float(), (0, pad)).unflatten(2, (num_chunks, chunk_len))
        return x_BXJL.permute(0, 2, 3, 1).contiguous()

    delta_BJLE = chunks(delta_BET)
    B_BJLN, C_BJLN = chunks(B), chunks(C)
    decay_BJLEN = torch.exp(delta_BJLE[..., None] * A_EN)
    input_BJLEN = chunks(delta_BET * u_BET)[..., None] * B_BJLN[:, :, :, None, :]
    decay_steps, input_steps = decay_BJLEN.unbind(2), input_BJLEN.unbind(2)

    # 1. what each chunk adds to the state on its own: all J chunks from a zero state
    chunk_end_BJEN = input_BJLEN.new_zeros(batch, num_chunks, channels, state_size)
    for decay_BJEN, input_BJEN in zip(decay_steps, input_steps):
        chunk_end_BJEN = torch.addcmul(input_BJEN, decay_BJEN, chunk_end_BJEN)

    # 2. true state entering each chunk; sum then exp, not a product of L small factors
    chunk_decay_BJEN = torch.exp(delta_BJLE.sum(2)[..., None] * A_EN)
    if initial_state is None:
        state_BEN = u_BET.new_zeros(batch, channels, state_size)
    else:
        state_BEN = initial_state.float()
    starts = []
    for chunk_decay_BEN, chunk_end_BEN in zip(chunk_decay_BJEN.unbind(1), chunk_end_BJEN.unbind(1)):
        starts.append(state_BEN)
        state_BEN = torch.addcmul(chunk_end_BEN, chunk_decay_BEN, state_BEN)

    # 3. rerun every chunk from its true start state, reading out y at each step
    h_BJEN = torch.stack(starts, dim=1)
    ys = []
    for decay_BJEN, input_BJEN, C_BJN in zip(decay_steps, input_steps, C_BJLN.unbind(2)):
        h_BJEN = torch.addcmul(input_BJEN, decay_BJEN, h_BJEN)
        ys.append((h_BJEN @ C_BJN[..., None])[..., 0])
    y_BJLE = torch.stack(ys, dim=2)
    y_BET = y_BJLE.flatten(1, 2).transpose(1, 2)[:, :, :seq_len]

    if D is not None:
        y_BET = y_BET + u_BET * D.float()[:, None]
    if z is not None:
        y_BET = y_BET * F.silu(z.float())
    y_BET = y_BET.to(out_dtype)
    return (y_BET, state_BEN) if return_last_state else y_BET
