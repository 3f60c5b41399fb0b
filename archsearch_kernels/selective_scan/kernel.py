"""Mamba-1 selective scan, Triton kernel: the loop of naive.py with the state in registers.

Same signature and return as `selective_scan_naive` (plus `chunk_size`); see
tests/kernels/test_selective_scan_triton.py. Dimensions: B batch, E channels (a block of
BLOCK_E per program), N state size (padded to a power of two, masked), T time, J chunks of
L steps for the backward's checkpoints.

A skipped token (a looped model's exited one) arrives with delta = 0: its decay is
exp(0 * A) = 1 and it writes nothing, so the state passes through it unchanged, with no
special case here.

Forward: one program per (batch, block of channels) walks t = 0..T-1 with h [BLOCK_E, N]
held in registers, writes y_t, and (when a gradient is wanted) saves h at every chunk start,
J [B, E, N] checkpoints instead of T.

Backward: the same programs walk the chunks last to first. For each chunk the states are
recomputed forward from its checkpoint into a scratch buffer [B, E, L + 1, N], then the
chunk is walked backward carrying dh:

    y_t = <h_t, C_t> + D u_t,   out_t = y_t silu(z_t)
    dh_t += g_t C_t                        (g_t = d out_t * silu(z_t))
    h_t = a_t h_{t-1} + delta_t u_t B_t,   a_t = exp(delta_t A)
    d delta_t = sum_n dh_t h_{t-1} a_t A + u_t sum_n dh_t B_t;    dA += dh_t h_{t-1} a_t delta_t
    dh_{t-1} = a_t dh_t

B_t and C_t are shared by all channels, so their gradients are sums over E: each program
writes its block's partial sum and torch adds the blocks (as dA over the batch), which
keeps the result independent of scheduling.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 64


@triton.jit
def _softplus(x):
    # torch's threshold: above 20 softplus(x) equals x in fp32
    return tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))


@triton.jit
def _step_size(delta_ptr, bias, t, e_off, mask_e, s_dt, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr):
    """(raw, final) step size at time t: raw = delta + bias, final = softplus(raw) or raw."""
    raw = tl.load(delta_ptr + e_off + t * s_dt, mask=mask_e, other=0.0).to(tl.float32)
    if HAS_BIAS:
        raw += bias
    if SOFTPLUS:
        return raw, _softplus(raw)
    return raw, raw


@triton.jit
def _scan_fwd(u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, h0_ptr, y_ptr, last_ptr, ckpt_ptr,
              E, N, T, num_chunks,
              s_ub, s_ue, s_ut, s_db, s_de, s_dt, s_zb, s_ze, s_zt, s_yb, s_ye, s_yt, s_Bb, s_Bn, s_Bt,
              s_Cb, s_Cn, s_Ct,
              CHUNK_LEN: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_N: tl.constexpr,
              HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_INIT: tl.constexpr,
              SOFTPLUS: tl.constexpr, SAVE: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    n = tl.arange(0, BLOCK_N)
    mask_e, mask_n = e < E, n < N
    mask_en = mask_e[:, None] & mask_n[None, :]
    state_off = b * E * N + e[:, None] * N + n[None, :]
    A = tl.load(A_ptr + e[:, None] * N + n[None, :], mask=mask_en, other=0.0).to(tl.float32)
    D = tl.load(D_ptr + e, mask=mask_e, other=0.0).to(tl.float32) if HAS_D else 0.0
    bias = tl.load(bias_ptr + e, mask=mask_e, other=0.0).to(tl.float32) if HAS_BIAS else 0.0
    if HAS_INIT:
        h = tl.load(h0_ptr + state_off, mask=mask_en, other=0.0).to(tl.float32)
    else:
        h = tl.zeros([BLOCK_E, BLOCK_N], dtype=tl.float32)
    for c in range(0, num_chunks):
        if SAVE:
            tl.store(ckpt_ptr + c * E * N + b * num_chunks * E * N + e[:, None] * N + n[None, :], h, mask=mask_en)
        for t in range(c * CHUNK_LEN, tl.minimum((c + 1) * CHUNK_LEN, T)):
            _, dt = _step_size(delta_ptr, bias, t, b * s_db + e * s_de, mask_e, s_dt, HAS_BIAS, SOFTPLUS)
            u = tl.load(u_ptr + b * s_ub + e * s_ue + t * s_ut, mask=mask_e, other=0.0).to(tl.float32)
            B_t = tl.load(B_ptr + b * s_Bb + n * s_Bn + t * s_Bt, mask=mask_n, other=0.0).to(tl.float32)
            C_t = tl.load(C_ptr + b * s_Cb + n * s_Cn + t * s_Ct, mask=mask_n, other=0.0).to(tl.float32)
            h = tl.exp(dt[:, None] * A) * h + (dt * u)[:, None] * B_t[None, :]
            y = tl.sum(h * C_t[None, :], axis=1) + D * u
            if HAS_Z:
                z = tl.load(z_ptr + b * s_zb + e * s_ze + t * s_zt, mask=mask_e, other=0.0).to(tl.float32)
                y = y * z * tl.sigmoid(z)
            tl.store(y_ptr + b * s_yb + e * s_ye + t * s_yt, y.to(y_ptr.dtype.element_ty), mask=mask_e)
    tl.store(last_ptr + state_off, h, mask=mask_en)


@triton.jit
def _scan_bwd(u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, ckpt_ptr, scratch_ptr,
              dy_ptr, dlast_ptr, du_ptr, ddelta_ptr, dz_ptr, dA_ptr, dB_ptr, dC_ptr, dD_ptr, dbias_ptr, dh0_ptr,
              E, N, T, num_chunks,
              s_ub, s_ue, s_ut, s_db, s_de, s_dt, s_zb, s_ze, s_zt, s_gb, s_ge, s_gt, s_Bb, s_Bn, s_Bt,
              s_Cb, s_Cn, s_Ct, s_yb, s_ye, s_yt,
              CHUNK_LEN: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_N: tl.constexpr,
              HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    blocks = tl.num_programs(1)
    e = block * BLOCK_E + tl.arange(0, BLOCK_E)
    n = tl.arange(0, BLOCK_N)
    mask_e, mask_n = e < E, n < N
    mask_en = mask_e[:, None] & mask_n[None, :]
    state_off = b * E * N + e[:, None] * N + n[None, :]
    # scratch slot k of a chunk holds the state after k of its steps (slot 0: the checkpoint)
    scratch = scratch_ptr + b * E * (CHUNK_LEN + 1) * N + e[:, None] * (CHUNK_LEN + 1) * N + n[None, :]
    # partial sums over this block's channels of dB and dC: [B, blocks, N, T], contiguous
    partial = (b * blocks + block) * N * T + n * T
    A = tl.load(A_ptr + e[:, None] * N + n[None, :], mask=mask_en, other=0.0).to(tl.float32)
    D = tl.load(D_ptr + e, mask=mask_e, other=0.0).to(tl.float32) if HAS_D else 0.0
    bias = tl.load(bias_ptr + e, mask=mask_e, other=0.0).to(tl.float32) if HAS_BIAS else 0.0
    dh = tl.load(dlast_ptr + state_off, mask=mask_en, other=0.0).to(tl.float32)
    dA = tl.zeros([BLOCK_E, BLOCK_N], dtype=tl.float32)
    dD = tl.zeros([BLOCK_E], dtype=tl.float32)
    dbias = tl.zeros([BLOCK_E], dtype=tl.float32)
    for chunk_back in range(0, num_chunks):
        c = num_chunks - 1 - chunk_back
        start = c * CHUNK_LEN
        steps = tl.minimum(start + CHUNK_LEN, T) - start
        h = tl.load(ckpt_ptr + c * E * N + b * num_chunks * E * N + e[:, None] * N + n[None, :],
                    mask=mask_en, other=0.0)
        tl.store(scratch, h, mask=mask_en)
        for k in range(0, steps):
            t = start + k
            _, dt = _step_size(delta_ptr, bias, t, b * s_db + e * s_de, mask_e, s_dt, HAS_BIAS, SOFTPLUS)
            u = tl.load(u_ptr + b * s_ub + e * s_ue + t * s_ut, mask=mask_e, other=0.0).to(tl.float32)
            B_t = tl.load(B_ptr + b * s_Bb + n * s_Bn + t * s_Bt, mask=mask_n, other=0.0).to(tl.float32)
            h = tl.exp(dt[:, None] * A) * h + (dt * u)[:, None] * B_t[None, :]
            tl.store(scratch + (k + 1) * N, h, mask=mask_en)
        tl.debug_barrier()
        for k_back in range(0, steps):
            k = steps - 1 - k_back
            t = start + k
            h_prev = tl.load(scratch + k * N, mask=mask_en, other=0.0)
            h_t = tl.load(scratch + (k + 1) * N, mask=mask_en, other=0.0)
            raw, dt = _step_size(delta_ptr, bias, t, b * s_db + e * s_de, mask_e, s_dt, HAS_BIAS, SOFTPLUS)
            u = tl.load(u_ptr + b * s_ub + e * s_ue + t * s_ut, mask=mask_e, other=0.0).to(tl.float32)
            B_t = tl.load(B_ptr + b * s_Bb + n * s_Bn + t * s_Bt, mask=mask_n, other=0.0).to(tl.float32)
            C_t = tl.load(C_ptr + b * s_Cb + n * s_Cn + t * s_Ct, mask=mask_n, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + b * s_yb + e * s_ye + t * s_yt, mask=mask_e, other=0.0).to(tl.float32)
            g = dy
            if HAS_Z:
                z = tl.load(z_ptr + b * s_zb + e * s_ze + t * s_zt, mask=mask_e, other=0.0).to(tl.float32)
                sig = tl.sigmoid(z)
                y = tl.sum(h_t * C_t[None, :], axis=1) + D * u
                dz = dy * y * sig * (1.0 + z * (1.0 - sig))
                tl.store(dz_ptr + b * s_gb + e * s_ge + t * s_gt, dz, mask=mask_e)
                g = dy * z * sig
            du = g * D
            dD += g * u
            tl.store(dC_ptr + partial + t, tl.sum(g[:, None] * h_t, axis=0), mask=mask_n)
            dh += g[:, None] * C_t[None, :]
            a = tl.exp(dt[:, None] * A)
            da = dh * h_prev * a
            dh_B = tl.sum(dh * B_t[None, :], axis=1)
            ddt = tl.sum(da * A, axis=1) + dh_B * u
            dA += da * dt[:, None]
            du += dh_B * dt
            tl.store(dB_ptr + partial + t, tl.sum(dh * (dt * u)[:, None], axis=0), mask=mask_n)
            dh = dh * a
            if SOFTPLUS:
                ddt = ddt * tl.where(raw > 20.0, 1.0, tl.sigmoid(raw))
            dbias += ddt
            tl.store(ddelta_ptr + b * s_gb + e * s_ge + t * s_gt, ddt, mask=mask_e)
            tl.store(du_ptr + b * s_gb + e * s_ge + t * s_gt, du, mask=mask_e)
        # the next chunk overwrites the scratch this one read
        tl.debug_barrier()
    tl.store(dh0_ptr + state_off, dh, mask=mask_en)
    tl.store(dA_ptr + state_off, dA, mask=mask_en)
    tl.store(dD_ptr + b * E + e, dD, mask=mask_e)
    tl.store(dbias_ptr + b * E + e, dbias, mask=mask_e)


def _strides3(x: torch.Tensor | None) -> tuple[int, int, int]:
    return tuple(x.stride()) if x is not None else (0, 0, 0)


def _blocks(channels: int, state_size: int) -> tuple[int, int]:
    block_n = triton.next_power_of_2(state_size)
    # about 512 state values per program: enough parallel work, few enough registers
    block_e = max(1, min(triton.next_power_of_2(channels), 512 // block_n))
    return block_e, block_n


def _time_major(batch: int, channels: int, seq_len: int, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, E, T] laid out as [B, T, E], the layout a Mamba layer's activations have, so a
    program's BLOCK_E channels at one step are adjacent in memory."""
    return torch.empty(batch, seq_len, channels, device=like.device, dtype=dtype).transpose(1, 2)


class _SelectiveScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, initial_state, delta_softplus, chunk_len):
        batch, channels, seq_len = u.shape
        state_size = A.shape[1]
        block_e, block_n = _blocks(channels, state_size)
        num_chunks = triton.cdiv(seq_len, chunk_len)
        save = any(ctx.needs_input_grad)
        A_EN = A.contiguous()
        y = _time_major(batch, channels, seq_len, u, u.dtype)
        last = torch.empty(batch, channels, state_size, device=u.device, dtype=torch.float32)
        ckpt = torch.empty(batch, num_chunks, channels, state_size, device=u.device,
                           dtype=torch.float32) if save else last
        h0 = initial_state.float().contiguous() if initial_state is not None else None
        dummy = last
        grid = (batch, triton.cdiv(channels, block_e))
        _scan_fwd[grid](u, delta, A_EN, B, C, D if D is not None else dummy, z if z is not None else dummy,
                        delta_bias if delta_bias is not None else dummy, h0 if h0 is not None else dummy,
                        y, last, ckpt, channels, state_size, seq_len, num_chunks,
                        *u.stride(), *delta.stride(), *_strides3(z), *y.stride(), *B.stride(), *C.stride(),
                        CHUNK_LEN=chunk_len, BLOCK_E=block_e, BLOCK_N=block_n, HAS_D=D is not None,
                        HAS_Z=z is not None, HAS_BIAS=delta_bias is not None, HAS_INIT=h0 is not None,
                        SOFTPLUS=delta_softplus, SAVE=save)
        if save:
            ctx.save_for_backward(u, delta, A_EN, B, C, D, z, delta_bias, ckpt)
            ctx.settings = (delta_softplus, chunk_len, block_e, block_n, initial_state is not None)
        return y, last

    @staticmethod
    def backward(ctx, dy, dlast):
        u, delta, A, B, C, D, z, delta_bias, ckpt = ctx.saved_tensors
        delta_softplus, chunk_len, block_e, block_n, has_init = ctx.settings
        batch, channels, seq_len = u.shape
        state_size = A.shape[1]
        num_chunks = ckpt.shape[1]
        blocks = triton.cdiv(channels, block_e)
        f32 = dict(device=u.device, dtype=torch.float32)
        dy = dy if dy is not None else torch.zeros_like(u)
        dlast = dlast.float().contiguous() if dlast is not None else torch.zeros(batch, channels, state_size, **f32)
        du, ddelta, dz = (_time_major(batch, channels, seq_len, u, torch.float32) for _ in range(3))
        dA = torch.empty(batch, channels, state_size, **f32)
        dh0 = torch.empty(batch, channels, state_size, **f32)
        dB = torch.empty(batch, blocks, state_size, seq_len, **f32)
        dC = torch.empty(batch, blocks, state_size, seq_len, **f32)
        dD, dbias = torch.empty(batch, channels, **f32), torch.empty(batch, channels, **f32)
        scratch = torch.empty(batch, channels, chunk_len + 1, state_size, **f32)
        dummy = dA
        _scan_bwd[(batch, blocks)](u, delta, A, B, C, D if D is not None else dummy, z if z is not None else dummy,
                                   delta_bias if delta_bias is not None else dummy, ckpt, scratch, dy, dlast,
                                   du, ddelta, dz, dA, dB, dC, dD, dbias, dh0, channels, state_size, seq_len,
                                   num_chunks, *u.stride(), *delta.stride(), *_strides3(z), *du.stride(),
                                   *B.stride(), *C.stride(), *dy.stride(),
                                   CHUNK_LEN=chunk_len, BLOCK_E=block_e, BLOCK_N=block_n, HAS_D=D is not None,
                                   HAS_Z=z is not None, HAS_BIAS=delta_bias is not None, SOFTPLUS=delta_softplus)
        return (du.to(u.dtype), ddelta.to(delta.dtype), dA.sum(0).to(A.dtype), dB.sum(1).to(B.dtype),
                dC.sum(1).to(C.dtype), dD.sum(0).to(D.dtype) if D is not None else None,
                dz.to(z.dtype) if z is not None else None,
                dbias.sum(0).to(delta_bias.dtype) if delta_bias is not None else None,
                dh0 if has_init else None, None, None)


def selective_scan_triton(
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
    """Selective scan as one Triton program per (batch, channel block); matches `selective_scan_naive`.

    Args:
        u: [B, E, T] input.
        delta: [B, E, T] step size before `delta_bias` and softplus (0 at a skipped token).
        A: [E, N] state matrix.
        B: [B, N, T] input matrix.
        C: [B, N, T] output matrix.
        D: [E] skip weight, or None.
        z: [B, E, T] gate, or None.
        delta_bias: [E] added to delta before the softplus, or None.
        delta_softplus: apply softplus to delta (after the bias).
        initial_state: [B, E, N] state before the first step; zeros if None.
        return_last_state: also return the state after the last step.
        chunk_size: steps between the backward's saved states (default 64); only memory
            (J [B, E, N] checkpoints plus an [B, E, L, N] scratch) and speed depend on it.

    Returns:
        y [B, E, T] in u's dtype, or (y, last_state) with last_state [B, E, N] in fp32.
    """
    chunk_len = max(1, min(chunk_size or CHUNK, u.shape[-1]))
    y, last = _SelectiveScan.apply(u, delta, A, B, C, D, z, delta_bias, initial_state, delta_softplus, chunk_len)
    return (y, last) if return_last_state else y
