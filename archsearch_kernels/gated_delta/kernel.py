"""Gated delta rule, Triton kernel in the recurrent form: the loop of naive.py with the state
in registers. Same signature and return as `gated_delta_rule_naive` (plus `chunk_size`);
see tests/kernels/test_triton.py.

Dimensions: B batch, T time, H heads, K key dim (whole, padded to a power of two), V value
dim (a block of BLOCK_V per program), L steps between the backward's checkpoints.

Not the chunked WY form of chunked.py: that one turns each chunk into matmuls, which is what
a GPU wants at long T; this kernel walks time step by step, which is simpler to get right and
already removes the T Python-level steps and the [B, T, H, K, V] intermediates. In the state's
[K, V] layout every value column evolves on its own,

    s_t = alpha_t (s_{t-1} - beta_t k_t (k_t . s_{t-1})) + beta_t k_t v_t[v],   o_t[v] = q_t . s_t

so the programs split V (B H ceil(V / BLOCK_V) of them) and each holds a [K, BLOCK_V] state.

Backward, per step from the last (s' = alpha s_{t-1}, r = s'^T k, c = beta (v - r)):

    dq += s_t dO;            ds += q dO^T
    dc = ds^T k;             dv = beta dc;   d beta = dc . (v - r);   dr = -beta dc
    dk += ds c + s' dr;      ds' = ds + k dr^T
    d alpha = <ds', s_{t-1}>; ds_{t-1} = alpha ds';   dg = alpha d alpha

dq, dk, d beta and dg sum over the value blocks: each program writes its block's part and
torch adds them. The states of a chunk are recomputed from its checkpoint into a scratch
buffer, as in the selective scan's kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 32


@triton.jit
def _gdr_fwd(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, h0_ptr, o_ptr, last_ptr, ckpt_ptr,
             T, H, K, V, num_chunks,
             s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_gb, s_gt, s_gh, s_bb, s_bt, s_bh,
             CHUNK_LEN: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
             HAS_INIT: tl.constexpr, SAVE: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    b, h = bh // H, bh % H
    kk = tl.arange(0, BLOCK_K)
    vv = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_k, mask_v = kk < K, vv < V
    mask_kv = mask_k[:, None] & mask_v[None, :]
    state_off = bh * K * V + kk[:, None] * V + vv[None, :]
    if HAS_INIT:
        s = tl.load(h0_ptr + state_off, mask=mask_kv, other=0.0).to(tl.float32)
    else:
        s = tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.float32)
    for c in range(0, num_chunks):
        if SAVE:
            tl.store(ckpt_ptr + (bh * num_chunks + c) * K * V + kk[:, None] * V + vv[None, :], s, mask=mask_kv)
        for t in range(c * CHUNK_LEN, tl.minimum((c + 1) * CHUNK_LEN, T)):
            q = tl.load(q_ptr + b * s_qb + t * s_qt + h * s_qh + kk, mask=mask_k, other=0.0).to(tl.float32)
            k = tl.load(k_ptr + b * s_kb + t * s_kt + h * s_kh + kk, mask=mask_k, other=0.0).to(tl.float32)
            v = tl.load(v_ptr + b * s_vb + t * s_vt + h * s_vh + vv, mask=mask_v, other=0.0).to(tl.float32)
            alpha = tl.exp(tl.load(g_ptr + b * s_gb + t * s_gt + h * s_gh).to(tl.float32))
            beta = tl.load(beta_ptr + b * s_bb + t * s_bt + h * s_bh).to(tl.float32)
            s = alpha * s
            recalled = tl.sum(s * k[:, None], axis=0)
            s += k[:, None] * (beta * (v - recalled))[None, :]
            o = tl.sum(s * q[:, None], axis=0)
            tl.store(o_ptr + ((b * T + t) * H + h) * V + vv, o.to(o_ptr.dtype.element_ty), mask=mask_v)
    tl.store(last_ptr + state_off, s, mask=mask_kv)


@triton.jit
def _gdr_bwd(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, ckpt_ptr, scratch_ptr, do_ptr, dlast_ptr,
             dq_ptr, dk_ptr, dv_ptr, dg_ptr, dbeta_ptr, dh0_ptr,
             T, H, K, V, num_chunks,
             s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_gb, s_gt, s_gh, s_bb, s_bt, s_bh,
             s_ob, s_ot, s_oh,
             CHUNK_LEN: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    b, h = bh // H, bh % H
    block = tl.program_id(1)
    blocks = tl.num_programs(1)
    kk = tl.arange(0, BLOCK_K)
    vv = block * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_k, mask_v = kk < K, vv < V
    mask_kv = mask_k[:, None] & mask_v[None, :]
    state_off = bh * K * V + kk[:, None] * V + vv[None, :]
    # scratch slot j of a chunk holds the state after j of its steps (slot 0: the checkpoint)
    scratch = scratch_ptr + bh * (CHUNK_LEN + 1) * K * V + kk[:, None] * V + vv[None, :]
    ds = tl.load(dlast_ptr + state_off, mask=mask_kv, other=0.0).to(tl.float32)
    for chunk_back in range(0, num_chunks):
        c = num_chunks - 1 - chunk_back
        start = c * CHUNK_LEN
        steps = tl.minimum(start + CHUNK_LEN, T) - start
        s = tl.load(ckpt_ptr + (bh * num_chunks + c) * K * V + kk[:, None] * V + vv[None, :], mask=mask_kv,
                    other=0.0)
        tl.store(scratch, s, mask=mask_kv)
        for j in range(0, steps):
            t = start + j
            k = tl.load(k_ptr + b * s_kb + t * s_kt + h * s_kh + kk, mask=mask_k, other=0.0).to(tl.float32)
            v = tl.load(v_ptr + b * s_vb + t * s_vt + h * s_vh + vv, mask=mask_v, other=0.0).to(tl.float32)
            alpha = tl.exp(tl.load(g_ptr + b * s_gb + t * s_gt + h * s_gh).to(tl.float32))
            beta = tl.load(beta_ptr + b * s_bb + t * s_bt + h * s_bh).to(tl.float32)
            s = alpha * s
            s += k[:, None] * (beta * (v - tl.sum(s * k[:, None], axis=0)))[None, :]
            tl.store(scratch + (j + 1) * K * V, s, mask=mask_kv)
        tl.debug_barrier()
        for j_back in range(0, steps):
            j = steps - 1 - j_back
            t = start + j
            s_prev = tl.load(scratch + j * K * V, mask=mask_kv, other=0.0)
            s_t = tl.load(scratch + (j + 1) * K * V, mask=mask_kv, other=0.0)
            q = tl.load(q_ptr + b * s_qb + t * s_qt + h * s_qh + kk, mask=mask_k, other=0.0).to(tl.float32)
            k = tl.load(k_ptr + b * s_kb + t * s_kt + h * s_kh + kk, mask=mask_k, other=0.0).to(tl.float32)
            v = tl.load(v_ptr + b * s_vb + t * s_vt + h * s_vh + vv, mask=mask_v, other=0.0).to(tl.float32)
            alpha = tl.exp(tl.load(g_ptr + b * s_gb + t * s_gt + h * s_gh).to(tl.float32))
            beta = tl.load(beta_ptr + b * s_bb + t * s_bt + h * s_bh).to(tl.float32)
            do = tl.load(do_ptr + b * s_ob + t * s_ot + h * s_oh + vv, mask=mask_v, other=0.0).to(tl.float32)
            # parts over this value block: [B, T, H, blocks, K] and [B, T, H, blocks]
            part = ((b * T + t) * H + h) * blocks + block
            tl.store(dq_ptr + part * K + kk, tl.sum(s_t * do[None, :], axis=1), mask=mask_k)
            ds += q[:, None] * do[None, :]
            s_decayed = alpha * s_prev
            residual = v - tl.sum(s_decayed * k[:, None], axis=0)
            dc = tl.sum(ds * k[:, None], axis=0)
            tl.store(dv_ptr + ((b * T + t) * H + h) * V + vv, beta * dc, mask=mask_v)
            tl.store(dbeta_ptr + part, tl.sum(dc * residual, axis=0))
            dr = -beta * dc
            dk = tl.sum(ds * (beta * residual)[None, :], axis=1) + tl.sum(s_decayed * dr[None, :], axis=1)
            tl.store(dk_ptr + part * K + kk, dk, mask=mask_k)
            ds += k[:, None] * dr[None, :]
            tl.store(dg_ptr + part, alpha * tl.sum(tl.sum(ds * s_prev, axis=1), axis=0))
            ds = alpha * ds
        # the next chunk overwrites the scratch this one read
        tl.debug_barrier()
    tl.store(dh0_ptr + state_off, ds, mask=mask_kv)


def _blocks(key_dim: int, value_dim: int) -> tuple[int, int]:
    block_k = triton.next_power_of_2(key_dim)
    # about 4096 state values per program
    block_v = max(1, min(triton.next_power_of_2(value_dim), 4096 // block_k))
    return block_k, block_v


def _strides(*tensors: torch.Tensor) -> list[int]:
    """(batch, time, head) strides of each; the last axis must be contiguous."""
    return [stride for x in tensors for stride in x.stride()[:3]]


class _GatedDeltaRule(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state, chunk_len):
        q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
        batch, seq_len, heads, key_dim = q.shape
        value_dim = v.shape[-1]
        block_k, block_v = _blocks(key_dim, value_dim)
        num_chunks = triton.cdiv(seq_len, chunk_len)
        save = any(ctx.needs_input_grad)
        f32 = dict(device=q.device, dtype=torch.float32)
        o = torch.empty(batch, seq_len, heads, value_dim, device=q.device, dtype=v.dtype)
        last = torch.empty(batch, heads, key_dim, value_dim, **f32)
        ckpt = torch.empty(batch, heads, num_chunks, key_dim, value_dim, **f32) if save else last
        h0 = initial_state.float().contiguous() if initial_state is not None else last
        grid = (batch * heads, triton.cdiv(value_dim, block_v))
        _gdr_fwd[grid](q, k, v, g, beta, h0, o, last, ckpt, seq_len, heads, key_dim, value_dim, num_chunks,
                       *_strides(q, k, v, g, beta), CHUNK_LEN=chunk_len, BLOCK_K=block_k, BLOCK_V=block_v,
                       HAS_INIT=initial_state is not None, SAVE=save)
        if save:
            ctx.save_for_backward(q, k, v, g, beta, ckpt)
            ctx.settings = (chunk_len, block_k, block_v, initial_state is not None)
        return o, last

    @staticmethod
    def backward(ctx, do, dlast):
        q, k, v, g, beta, ckpt = ctx.saved_tensors
        chunk_len, block_k, block_v, has_init = ctx.settings
        batch, seq_len, heads, key_dim = q.shape
        value_dim, num_chunks = v.shape[-1], ckpt.shape[2]
        blocks = triton.cdiv(value_dim, block_v)
        f32 = dict(device=q.device, dtype=torch.float32)
        do = do if do.stride(-1) == 1 else do.contiguous()
        dlast = dlast.float().contiguous()
        dq = torch.empty(batch, seq_len, heads, blocks, key_dim, **f32)
        dk = torch.empty(batch, seq_len, heads, blocks, key_dim, **f32)
        dv = torch.empty(batch, seq_len, heads, value_dim, **f32)
        dg = torch.empty(batch, seq_len, heads, blocks, **f32)
        dbeta = torch.empty(batch, seq_len, heads, blocks, **f32)
        dh0 = torch.empty(batch, heads, key_dim, value_dim, **f32)
        scratch = torch.empty(batch, heads, chunk_len + 1, key_dim, value_dim, **f32)
        _gdr_bwd[(batch * heads, blocks)](q, k, v, g, beta, ckpt, scratch, do, dlast, dq, dk, dv, dg, dbeta, dh0,
                                          seq_len, heads, key_dim, value_dim, num_chunks,
                                          *_strides(q, k, v, g, beta, do),
                                          CHUNK_LEN=chunk_len, BLOCK_K=block_k, BLOCK_V=block_v)
        return (dq.sum(3).to(q.dtype), dk.sum(3).to(k.dtype), dv.to(v.dtype), dg.sum(3).to(g.dtype),
                dbeta.sum(3).to(beta.dtype), dh0 if has_init else None, None)


def gated_delta_rule_triton(
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
    """Gated delta rule, one Triton program per (batch, head, value block); matches
    `gated_delta_rule_naive`.

    Args:
        q: [B, T, H, K] queries.
        k: [B, T, H, K] keys.
        v: [B, T, H, V] values.
        g: [B, T, H] log decay.
        beta: [B, T, H] write strength.
        initial_state: [B, H, K, V] state before the first step (S^T); zeros if None.
        return_last_state: also return the state after the last step.
        chunk_size: steps between the backward's saved states (default 32); only memory
            ([B, H, L + 1, K, V] scratch) and speed depend on it.

    Returns:
        o [B, T, H, V] in v's dtype, or (o, last_state) with last_state [B, H, K, V] in fp32.
    """
    chunk_len = max(1, min(chunk_size or CHUNK, q.shape[1]))
    o, last = _GatedDeltaRule.apply(q, k, v, g, beta, initial_state, chunk_len)
    return (o, last) if return_last_state else o
