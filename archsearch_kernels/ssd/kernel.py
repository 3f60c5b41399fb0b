"""Mamba-2 SSD scan, Triton kernel in the recurrent form: the loop of naive.py with the state
in registers. Same signature and return as `ssd_naive` (plus `chunk_size`); see
tests/kernels/test_ssd_triton.py.

Dimensions: B batch, T time, H heads = G groups x R heads per group, P head dim (a block of
BLOCK_P per program), N state size (whole, padded to a power of two), L steps between the
backward's checkpoints.

Not the chunked matmul form of chunked.py: this kernel walks time step by step, as the
selective scan's and the recurrent gated delta rule's do. Each row p of the [P, N] state
evolves on its own,

    a_t = exp(dt_t A_h),   S_t[p] = a_t S_{t-1}[p] + dt_t x_t[p] B_t,   y_t[p] = S_t[p] . C_t

so the programs split P (B H ceil(P / BLOCK_P) of them). Head h reads B and C of group h // R.
The skip D x is added in PyTorch, outside the kernel, as the reference adds it.

Backward, per step from the last (dS the gradient of S_t, from later steps and dy_t):

    dS += dy C^T;   dC = S_t^T dy;   w = dS B   ([P]);   dx = dt w;   dB = dS^T (dt x)
    d log a = a <dS, S_{t-1}>;   ddt = x . w + A d log a;   dA = sum over b, t of dt d log a
    dS_{t-1} = a dS

dC, dB, ddt and d log a sum over the P blocks (and dB, dC over a group's R heads): each program
writes its block's part and torch adds them. The states of a chunk are recomputed from its
checkpoint into a scratch buffer, as in the selective scan's kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 32


@triton.jit
def _ssd_fwd(x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, h0_ptr, y_ptr, last_ptr, ckpt_ptr,
             T, H, R, P, N, num_chunks,
             s_xb, s_xt, s_xh, s_db, s_dt, s_dh, s_bb, s_bt, s_bg, s_cb, s_ct, s_cg,
             CHUNK_LEN: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
             HAS_INIT: tl.constexpr, SAVE: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    b, h = bh // H, bh % H
    g = h // R
    pp = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
    nn = tl.arange(0, BLOCK_N)
    mask_p, mask_n = pp < P, nn < N
    mask_pn = mask_p[:, None] & mask_n[None, :]
    state_off = bh * P * N + pp[:, None] * N + nn[None, :]
    A = tl.load(A_ptr + h).to(tl.float32)
    if HAS_INIT:
        s = tl.load(h0_ptr + state_off, mask=mask_pn, other=0.0).to(tl.float32)
    else:
        s = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    for c in range(0, num_chunks):
        if SAVE:
            tl.store(ckpt_ptr + (bh * num_chunks + c) * P * N + pp[:, None] * N + nn[None, :], s, mask=mask_pn)
        for t in range(c * CHUNK_LEN, tl.minimum((c + 1) * CHUNK_LEN, T)):
            x = tl.load(x_ptr + b * s_xb + t * s_xt + h * s_xh + pp, mask=mask_p, other=0.0).to(tl.float32)
            dt = tl.load(dt_ptr + b * s_db + t * s_dt + h * s_dh).to(tl.float32)
            Bt = tl.load(B_ptr + b * s_bb + t * s_bt + g * s_bg + nn, mask=mask_n, other=0.0).to(tl.float32)
            Ct = tl.load(C_ptr + b * s_cb + t * s_ct + g * s_cg + nn, mask=mask_n, other=0.0).to(tl.float32)
            s = tl.exp(dt * A) * s + (dt * x)[:, None] * Bt[None, :]
            y = tl.sum(s * Ct[None, :], axis=1)
            tl.store(y_ptr + ((b * T + t) * H + h) * P + pp, y, mask=mask_p)
    tl.store(last_ptr + state_off, s, mask=mask_pn)


@triton.jit
def _ssd_bwd(x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, ckpt_ptr, scratch_ptr, dy_ptr, dlast_ptr,
             dx_ptr, ddt_ptr, dlog_ptr, dB_ptr, dC_ptr, dh0_ptr,
             T, H, R, P, N, num_chunks,
             s_xb, s_xt, s_xh, s_db, s_dt, s_dh, s_bb, s_bt, s_bg, s_cb, s_ct, s_cg,
             CHUNK_LEN: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    b, h = bh // H, bh % H
    g = h // R
    block = tl.program_id(1)
    blocks = tl.num_programs(1)
    pp = block * BLOCK_P + tl.arange(0, BLOCK_P)
    nn = tl.arange(0, BLOCK_N)
    mask_p, mask_n = pp < P, nn < N
    mask_pn = mask_p[:, None] & mask_n[None, :]
    state_off = bh * P * N + pp[:, None] * N + nn[None, :]
    A = tl.load(A_ptr + h).to(tl.float32)
    # scratch slot j of a chunk holds the state after j of its steps (slot 0: the checkpoint)
    scratch = scratch_ptr + bh * (CHUNK_LEN + 1) * P * N + pp[:, None] * N + nn[None, :]
    ds = tl.load(dlast_ptr + state_off, mask=mask_pn, other=0.0).to(tl.float32)
    for chunk_back in range(0, num_chunks):
        c = num_chunks - 1 - chunk_back
        start = c * CHUNK_LEN
        steps = tl.minimum(start + CHUNK_LEN, T) - start
        s = tl.load(ckpt_ptr + (bh * num_chunks + c) * P * N + pp[:, None] * N + nn[None, :], mask=mask_pn,
                    other=0.0)
        tl.store(scratch, s, mask=mask_pn)
        for j in range(0, steps):
            t = start + j
            x = tl.load(x_ptr + b * s_xb + t * s_xt + h * s_xh + pp, mask=mask_p, other=0.0).to(tl.float32)
            dt = tl.load(dt_ptr + b * s_db + t * s_dt + h * s_dh).to(tl.float32)
            Bt = tl.load(B_ptr + b * s_bb + t * s_bt + g * s_bg + nn, mask=mask_n, other=0.0).to(tl.float32)
            s = tl.exp(dt * A) * s + (dt * x)[:, None] * Bt[None, :]
            tl.store(scratch + (j + 1) * P * N, s, mask=mask_pn)
        tl.debug_barrier()
        for j_back in range(0, steps):
            j = steps - 1 - j_back
            t = start + j
            s_prev = tl.load(scratch + j * P * N, mask=mask_pn, other=0.0)
            s_t = tl.load(scratch + (j + 1) * P * N, mask=mask_pn, other=0.0)
            x = tl.load(x_ptr + b * s_xb + t * s_xt + h * s_xh + pp, mask=mask_p, other=0.0).to(tl.float32)
            dt = tl.load(dt_ptr + b * s_db + t * s_dt + h * s_dh).to(tl.float32)
            Bt = tl.load(B_ptr + b * s_bb + t * s_bt + g * s_bg + nn, mask=mask_n, other=0.0).to(tl.float32)
            Ct = tl.load(C_ptr + b * s_cb + t * s_ct + g * s_cg + nn, mask=mask_n, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + ((b * T + t) * H + h) * P + pp, mask=mask_p, other=0.0)
            decay = tl.exp(dt * A)
            # parts over this head block: [B, T, H, blocks, N] and [B, T, H, blocks]
            part = ((b * T + t) * H + h) * blocks + block
            tl.store(dC_ptr + part * N + nn, tl.sum(s_t * dy[:, None], axis=0), mask=mask_n)
            ds += dy[:, None] * Ct[None, :]
            w = tl.sum(ds * Bt[None, :], axis=1)
            tl.store(dx_ptr + ((b * T + t) * H + h) * P + pp, dt * w, mask=mask_p)
            tl.store(dB_ptr + part * N + nn, tl.sum(ds * (dt * x)[:, None], axis=0), mask=mask_n)
            dlog = decay * tl.sum(tl.sum(ds * s_prev, axis=1), axis=0)
            tl.store(dlog_ptr + part, dlog)
            tl.store(ddt_ptr + part, tl.sum(x * w, axis=0) + A * dlog)
            ds = decay * ds
        # the next chunk overwrites the scratch this one read
        tl.debug_barrier()
    tl.store(dh0_ptr + state_off, ds, mask=mask_pn)


def _blocks(head_dim: int, state_size: int) -> tuple[int, int]:
    block_n = triton.next_power_of_2(state_size)
    # about 4096 state values per program
    block_p = max(1, min(triton.next_power_of_2(head_dim), 4096 // block_n))
    return block_p, block_n


def _strides(*tensors: torch.Tensor) -> list[int]:
    """(batch, time, head or group) strides of each; the last axis must be contiguous."""
    return [stride for x in tensors for stride in x.stride()[:3]]


def _last_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


class _SSD(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dt, A, B, C, initial_state, chunk_len):
        x, B, C = (_last_contiguous(t) for t in (x, B, C))
        a_dtype, A = A.dtype, A.float().contiguous()
        batch, seq_len, heads, head_dim = x.shape
        groups, state_size = B.shape[2], B.shape[3]
        block_p, block_n = _blocks(head_dim, state_size)
        num_chunks = triton.cdiv(seq_len, chunk_len)
        save = any(ctx.needs_input_grad)
        f32 = dict(device=x.device, dtype=torch.float32)
        y = torch.empty(batch, seq_len, heads, head_dim, **f32)
        last = torch.empty(batch, heads, head_dim, state_size, **f32)
        ckpt = torch.empty(batch, heads, num_chunks, head_dim, state_size, **f32) if save else last
        h0 = initial_state.float().contiguous() if initial_state is not None else last
        grid = (batch * heads, triton.cdiv(head_dim, block_p))
        _ssd_fwd[grid](x, dt, A, B, C, h0, y, last, ckpt, seq_len, heads, heads // groups, head_dim, state_size,
                       num_chunks, *_strides(x, dt[..., None], B, C), CHUNK_LEN=chunk_len, BLOCK_P=block_p,
                       BLOCK_N=block_n, HAS_INIT=initial_state is not None, SAVE=save)
        if save:
            ctx.save_for_backward(x, dt, A, B, C, ckpt)
            ctx.settings = (chunk_len, block_p, block_n, initial_state is not None, a_dtype)
        return y, last

    @staticmethod
    def backward(ctx, dy, dlast):
        x, dt, A, B, C, ckpt = ctx.saved_tensors
        chunk_len, block_p, block_n, has_init, a_dtype = ctx.settings
        batch, seq_len, heads, head_dim = x.shape
        groups, state_size = B.shape[2], B.shape[3]
        num_chunks = ckpt.shape[2]
        blocks = triton.cdiv(head_dim, block_p)
        f32 = dict(device=x.device, dtype=torch.float32)
        dy = dy.float().contiguous()
        dlast = dlast.float().contiguous()
        dx = torch.empty(batch, seq_len, heads, head_dim, **f32)
        ddt = torch.empty(batch, seq_len, heads, blocks, **f32)
        dlog = torch.empty(batch, seq_len, heads, blocks, **f32)
        dB = torch.empty(batch, seq_len, heads, blocks, state_size, **f32)
        dC = torch.empty(batch, seq_len, heads, blocks, state_size, **f32)
        dh0 = torch.empty(batch, heads, head_dim, state_size, **f32)
        scratch = torch.empty(batch, heads, chunk_len + 1, head_dim, state_size, **f32)
        _ssd_bwd[(batch * heads, blocks)](x, dt, A, B, C, ckpt, scratch, dy, dlast, dx, ddt, dlog, dB, dC, dh0,
                                          seq_len, heads, heads // groups, head_dim, state_size, num_chunks,
                                          *_strides(x, dt[..., None], B, C),
                                          CHUNK_LEN=chunk_len, BLOCK_P=block_p, BLOCK_N=block_n)
        # a group's R heads share its B and C: their parts add up
        dB = dB.sum(3).unflatten(2, (groups, heads // groups)).sum(3)
        dC = dC.sum(3).unflatten(2, (groups, heads // groups)).sum(3)
        dA = (dlog.sum(3) * dt.float()).sum((0, 1))
        return (dx.to(x.dtype), ddt.sum(3).to(dt.dtype), dA.to(a_dtype),
                dB.to(B.dtype), dC.to(C.dtype), dh0 if has_init else None, None)


def ssd_triton(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    *,
    initial_state: torch.Tensor | None = None,
    return_last_state: bool = False,
    chunk_size: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """SSD, one Triton program per (batch, head, block of P); matches `ssd_naive`.

    Args:
        x: [B, T, H, P] input.
        dt: [B, T, H] step size (positive).
        A: [H] per-head decay rate (negative for a decaying state).
        B: [B, T, G, N] input matrix.
        C: [B, T, G, N] output matrix.
        D: [H] skip weight, or None for no skip.
        initial_state: [B, H, P, N] state before the first step; zeros if None.
        return_last_state: also return the state after the last step.
        chunk_size: steps between the backward's saved states (default 32); only memory
            ([B, H, L + 1, P, N] scratch) and speed depend on it.

    Returns:
        y [B, T, H, P] in x's dtype, or (y, last_state) with last_state [B, H, P, N] in fp32.
    """
    heads, groups = x.shape[2], B.shape[2]
    if heads % groups:
        raise ValueError(f"ssd: {heads} heads do not split evenly over {groups} groups")
    chunk_len = max(1, min(chunk_size or CHUNK, x.shape[1]))
    y, last = _SSD.apply(x, dt, A, B, C, initial_state, chunk_len)
    if D is not None:
        y = y + x.float() * D.float()[:, None]
    y = y.to(x.dtype)
    return (y, last) if return_last_state else y
