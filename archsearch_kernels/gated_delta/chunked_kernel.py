"""Gated delta rule, Triton kernels in the chunked (WY / UT-transform) form of chunked.py.

Same signature and return as `gated_delta_rule_naive` (plus `chunk_size`); see
tests/kernels/test_gated_delta_triton.py. The maths per chunk is the derivation at the top of
chunked.py (Yang et al., https://arxiv.org/abs/2412.06464), with the state S entering the
chunk stored [K, V], G the log-decay cumsum from the chunk start, gamma = exp(G):

    T     = (I + M)^-1,  M_ls = beta_l exp(G_l - G_s) k_l . k_s  (s < l)     UT transform
    U     = T diag(beta) V,   Wk = T diag(beta gamma) K                      state-free
    W     = U - Wk S                                                         what is written
    O     = diag(gamma) Q S + A W,   A_ls = exp(G_l - G_s) q_l . k_s  (s <= l)
    S_end = gamma_L S + (K * exp(G_L - G))^T W

Forward, three kernels: `_fwd_prepare` (one program per chunk: T by forward substitution,
then U and Wk), `_fwd_states` (one program per value block, the only loop over chunks: W and
the state entering every chunk), `_fwd_output` (one program per chunk and value block: O).

Backward, two kernels. `_bwd_states` walks the chunks from the last with dS, the gradient of
the state leaving a chunk, and finds what the state-dependent terms need:

    dW       = A^T dO + (K * exp(G_L - G)) dS
    dS_enter = gamma_L dS + (diag(gamma) Q)^T dO - Wk^T dW

`_bwd_chunk` (one program per chunk) then needs only that chunk: it recomputes T and A from
q, k, g, beta, reads S, dS, W and dW, and back-propagates through O = ..., S_end = ...,
W = U - Wk S, U = T Bv, Wk = T Bk (dT = dU Bv^T + dWk Bk^T, dB = T^T dX) and the inverse
(dM = -T^T dT T^T, strictly lower). Every exp(G_l - G_s) factor sends its log-gradient to
G_l and minus it to G_s; dg is the reversed cumsum of dG within the chunk.

Padded steps past T load as k = q = v = 0, beta = 0, g = 0: no write, no decay, so the last
chunk needs no special case (as in chunked.py).

Dimensions: B batch, T time, H heads, K key dim (whole, padded to BK, a power of two >= 16),
V value dim (blocks of BV), J chunks, L chunk length (a power of two >= 16, tl.dot's least).

Precision: fp32 inside. With fp32 inputs every tl.dot is exact fp32 ("ieee"), which the tests
and the preflight compare at 1e-4 / 1e-3; with bf16 / fp16 inputs the dots run in tf32 on
tensor cores, well inside the inputs' own rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Chunks of 32: on an H200 (bf16, B 8, T 2048, H 8, K = V = 128, forward and backward,
# benchmarks/bench_kernels_gpu.py) they take 2.9 ms against 5.0 ms in chunks of 64, with the
# same error against the PyTorch chunked form (7e-3 of its largest value).
CHUNK = 32
# Launch settings, compiled ahead of time for sm_90 on a CPU
# (benchmarks/compile_gated_delta_sm90.py: triton.compile for GPUTarget("cuda", 90, 32), then
# cuobjdump on the cubin). At L 64, K = V = 128, bf16 inputs: with 64-wide value blocks the
# per-chunk backward needs 216 KB of shared memory (of the 227 KB an H100 / H200 block may
# have) and spills 3.6 KB; 32-wide blocks there (`_sizes`) bring it to 176 KB and 2.2 KB, every
# other kernel under 0.8 KB; with 4 warps every kernel spilled more. Chunks of 32 need at
# most 72 KB and spill at most 1.6 KB. fp32 inputs ("ieee" dots, no tensor cores) compile but
# spill 6 to 14 KB a kernel: these kernels are meant for bf16. The per-chunk backward loads
# six tiles per value block, so it is not software-pipelined.
LAUNCH = dict(prepare=dict(num_warps=8), states=dict(num_warps=8, num_stages=2), output=dict(num_warps=8),
              chunk=dict(num_warps=8, num_stages=1))


@triton.jit
def _gates(g_ptr, beta_ptr, b, h, start, T, H, L: tl.constexpr):
    """Steps of this chunk, their mask, G (log decay from the chunk start, inclusive), its last
    entry G_L (the whole chunk's decay; padded steps add 0) and beta."""
    t = start + tl.arange(0, L)
    mask_t = t < T
    g = tl.load(g_ptr + (b * T + t) * H + h, mask=mask_t, other=0.0)
    beta = tl.load(beta_ptr + (b * T + t) * H + h, mask=mask_t, other=0.0)
    return t, mask_t, tl.cumsum(g, axis=0), tl.sum(g, axis=0), beta


@triton.jit
def _rows(ptr, b, h, t, mask_t, cols, width, T, H):
    """[L, len(cols)] rows t of a [B, T, H, width] tensor, zero outside, in fp32."""
    offsets = ((b * T + t[:, None]) * H + h) * width + cols[None, :]
    return tl.load(ptr + offsets, mask=mask_t[:, None] & (cols < width)[None, :], other=0.0).to(tl.float32)


@triton.jit
def _store_rows(ptr, x, b, h, t, mask_t, cols, width, T, H):
    offsets = ((b * T + t[:, None]) * H + h) * width + cols[None, :]
    tl.store(ptr + offsets, x.to(ptr.dtype.element_ty), mask=mask_t[:, None] & (cols < width)[None, :])


@triton.jit
def _state_offsets(bh, c, num_chunks, kk, vv, K, V):
    """Offsets and mask of the [BK, BV] block of chunk c's state in a [B, H, J, K, V] buffer."""
    offsets = ((bh * num_chunks + c) * K + kk[:, None]) * V + vv[None, :]
    return offsets, (kk < K)[:, None] & (vv < V)[None, :]


@triton.jit
def _first_state(ptr, bh, kk, vv, K, V, LOAD: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Offsets and mask of a [B, H, K, V] state's block, and the block (zeros unless LOAD)."""
    offsets, mask_kv = _state_offsets(bh, 0, 1, kk, vv, K, V)
    if LOAD:
        s = tl.load(ptr + offsets, mask=mask_kv, other=0.0).to(tl.float32)
    else:
        s = tl.zeros([BK, BV], dtype=tl.float32)
    return offsets, mask_kv, s


@triton.jit
def _decay(G, L: tl.constexpr, STRICT: tl.constexpr):
    """exp(G_l - G_s) where s <= l (s < l if STRICT), 0 elsewhere: [L, L]."""
    rows = tl.arange(0, L)
    if STRICT:
        keep = rows[:, None] > rows[None, :]
    else:
        keep = rows[:, None] >= rows[None, :]
    # the difference is taken only where it is kept, so exp never sees the (positive) upper part
    return tl.where(keep, tl.exp(tl.where(keep, G[:, None] - G[None, :], 0.0)), 0.0)


@triton.jit
def _unit_lower_inverse(M, L: tl.constexpr):
    """(I + M)^-1 for a strictly lower-triangular [L, L] M, by forward substitution: row i of
    the inverse is e_i - sum_{j<i} M_ij row_j, and rows j < i are final when row i is made."""
    rows = tl.arange(0, L)
    inverse = (rows[:, None] == rows[None, :]).to(tl.float32)
    for i in range(1, L):
        m_i = tl.sum(tl.where(rows[:, None] == i, M, 0.0), axis=0)
        row = -tl.sum(m_i[:, None] * inverse, axis=0)
        inverse = tl.where(rows[:, None] == i, inverse + row[None, :], inverse)
    return inverse


@triton.jit
def _ut_transform(k, G, beta, L: tl.constexpr, PRECISION: tl.constexpr):
    """T = (I + M)^-1 and k k^T, with M as in the module docstring."""
    kk = tl.dot(k, tl.trans(k), input_precision=PRECISION)
    M = beta[:, None] * _decay(G, L, True) * kk
    return _unit_lower_inverse(M, L), kk


@triton.jit
def _fwd_prepare(k_ptr, v_ptr, g_ptr, beta_ptr, wk_ptr, u_ptr, T, H, K, V,
                 L: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    b, h = bh // H, bh % H
    t, mask_t, G, _, beta = _gates(g_ptr, beta_ptr, b, h, tl.program_id(1) * L, T, H, L)
    kk_ = tl.arange(0, BK)
    k = _rows(k_ptr, b, h, t, mask_t, kk_, K, T, H)
    inverse, _ = _ut_transform(k, G, beta, L, PRECISION)
    wk = tl.dot(inverse, k * (beta * tl.exp(G))[:, None], input_precision=PRECISION)
    _store_rows(wk_ptr, wk, b, h, t, mask_t, kk_, K, T, H)
    for block in range(0, tl.cdiv(V, BV)):
        vv = block * BV + tl.arange(0, BV)
        v = _rows(v_ptr, b, h, t, mask_t, vv, V, T, H)
        u = tl.dot(inverse, v * beta[:, None], input_precision=PRECISION)
        _store_rows(u_ptr, u, b, h, t, mask_t, vv, V, T, H)


@triton.jit
def _fwd_states(k_ptr, g_ptr, beta_ptr, wk_ptr, u_ptr, h0_ptr, states_ptr, w_ptr, last_ptr,
                T, H, K, V, num_chunks,
                L: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HAS_INIT: tl.constexpr,
                PRECISION: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    b, h = bh // H, bh % H
    kk_ = tl.arange(0, BK)
    vv = tl.program_id(1) * BV + tl.arange(0, BV)
    first, mask_kv, s = _first_state(h0_ptr, bh, kk_, vv, K, V, HAS_INIT, BK, BV)
    for c in range(0, num_chunks):
        offsets, _ = _state_offsets(bh, c, num_chunks, kk_, vv, K, V)
        tl.store(states_ptr + offsets, s, mask=mask_kv)
        t, mask_t, G, G_end, _ = _gates(g_ptr, beta_ptr, b, h, c * L, T, H, L)
        w = _rows(u_ptr, b, h, t, mask_t, vv, V, T, H) - tl.dot(
            _rows(wk_ptr, b, h, t, mask_t, kk_, K, T, H), s, input_precision=PRECISION)
        _store_rows(w_ptr, w, b, h, t, mask_t, vv, V, T, H)
        k_to_end = _rows(k_ptr, b, h, t, mask_t, kk_, K, T, H) * tl.exp(G_end - G)[:, None]
        s = tl.exp(G_end) * s + tl.dot(tl.trans(k_to_end), w, input_precision=PRECISION)
    tl.store(last_ptr + first, s, mask=mask_kv)


@triton.jit
def _fwd_output(q_ptr, k_ptr, g_ptr, beta_ptr, states_ptr, w_ptr, o_ptr, T, H, K, V, num_chunks,
                L: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    b, h = bh // H, bh % H
    c = tl.program_id(1)
    kk_ = tl.arange(0, BK)
    vv = tl.program_id(2) * BV + tl.arange(0, BV)
    t, mask_t, G, _, _ = _gates(g_ptr, beta_ptr, b, h, c * L, T, H, L)
    q = _rows(q_ptr, b, h, t, mask_t, kk_, K, T, H)
    k = _rows(k_ptr, b, h, t, mask_t, kk_, K, T, H)
    A = tl.dot(q, tl.trans(k), input_precision=PRECISION) * _decay(G, L, False)
    offsets, mask_kv = _state_offsets(bh, c, num_chunks, kk_, vv, K, V)
    s = tl.load(states_ptr + offsets, mask=mask_kv, other=0.0)
    w = _rows(w_ptr, b, h, t, mask_t, vv, V, T, H)
    o = tl.dot(q * tl.exp(G)[:, None], s, input_precision=PRECISION) + tl.dot(A, w, input_precision=PRECISION)
    _store_rows(o_ptr, o, b, h, t, mask_t, vv, V, T, H)


@triton.jit
def _bwd_states(q_ptr, k_ptr, g_ptr, beta_ptr, wk_ptr, do_ptr, dlast_ptr, dstates_ptr, dw_ptr, dh0_ptr,
                T, H, K, V, num_chunks,
                L: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HAS_DLAST: tl.constexpr,
                PRECISION: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    b, h = bh // H, bh % H
    kk_ = tl.arange(0, BK)
    vv = tl.program_id(1) * BV + tl.arange(0, BV)
    first, mask_kv, ds = _first_state(dlast_ptr, bh, kk_, vv, K, V, HAS_DLAST, BK, BV)
    for c_back in range(0, num_chunks):
        c = num_chunks - 1 - c_back
        # dstates[c]: the gradient of the state leaving chunk c
        offsets, _ = _state_offsets(bh, c, num_chunks, kk_, vv, K, V)
        tl.store(dstates_ptr + offsets, ds, mask=mask_kv)
        t, mask_t, G, G_end, _ = _gates(g_ptr, beta_ptr, b, h, c * L, T, H, L)
        q = _rows(q_ptr, b, h, t, mask_t, kk_, K, T, H)
        k = _rows(k_ptr, b, h, t, mask_t, kk_, K, T, H)
        do = _rows(do_ptr, b, h, t, mask_t, vv, V, T, H)
        A = tl.dot(q, tl.trans(k), input_precision=PRECISION) * _decay(G, L, False)
        k_to_end = k * tl.exp(G_end - G)[:, None]
        dw = tl.dot(tl.trans(A), do, input_precision=PRECISION) + tl.dot(k_to_end, ds, input_precision=PRECISION)
        _store_rows(dw_ptr, dw, b, h, t, mask_t, vv, V, T, H)
        wk = _rows(wk_ptr, b, h, t, mask_t, kk_, K, T, H)
        ds = (tl.exp(G_end) * ds + tl.dot(tl.trans(q * tl.exp(G)[:, None]), do, input_precision=PRECISION)
              - tl.dot(tl.trans(wk), dw, input_precision=PRECISION))
    tl.store(dh0_ptr + first, ds, mask=mask_kv)


@triton.jit
def _bwd_chunk(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, states_ptr, dstates_ptr, w_ptr, dw_ptr, do_ptr,
               dq_ptr, dk_ptr, dv_ptr, dg_ptr, dbeta_ptr, T, H, K, V, num_chunks,
               L: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    b, h = bh // H, bh % H
    c = tl.program_id(1)
    kk_ = tl.arange(0, BK)
    rows = tl.arange(0, L)
    t, mask_t, G, G_end, beta = _gates(g_ptr, beta_ptr, b, h, c * L, T, H, L)
    gamma, gamma_end, to_end = tl.exp(G), tl.exp(G_end), tl.exp(G_end - G)
    q = _rows(q_ptr, b, h, t, mask_t, kk_, K, T, H)
    k = _rows(k_ptr, b, h, t, mask_t, kk_, K, T, H)
    inverse, kk = _ut_transform(k, G, beta, L, PRECISION)
    decay = _decay(G, L, False)
    A = tl.dot(q, tl.trans(k), input_precision=PRECISION) * decay

    # the sums over V, one value block at a time; dv is finished inside the loop
    dq_state = tl.zeros([L, BK], dtype=tl.float32)  # dO S^T
    dA = tl.zeros([L, L], dtype=tl.float32)  # dO W^T
    dk_to_end = tl.zeros([L, BK], dtype=tl.float32)  # W dS^T
    dwk = tl.zeros([L, BK], dtype=tl.float32)  # -dW S^T
    dT = tl.zeros([L, L], dtype=tl.float32)  # dU Bv^T, dWk Bk^T added below
    dbeta = tl.zeros([L], dtype=tl.float32)
    state_dot = tl.zeros([BK], dtype=tl.float32)  # <dS, S>, by key row
    for block in range(0, tl.cdiv(V, BV)):
        vv = block * BV + tl.arange(0, BV)
        offsets, mask_kv = _state_offsets(bh, c, num_chunks, kk_, vv, K, V)
        s = tl.load(states_ptr + offsets, mask=mask_kv, other=0.0)
        ds = tl.load(dstates_ptr + offsets, mask=mask_kv, other=0.0)
        w = _rows(w_ptr, b, h, t, mask_t, vv, V, T, H)
        dw = _rows(dw_ptr, b, h, t, mask_t, vv, V, T, H)
        do = _rows(do_ptr, b, h, t, mask_t, vv, V, T, H)
        v = _rows(v_ptr, b, h, t, mask_t, vv, V, T, H)
        dq_state += tl.dot(do, tl.trans(s), input_precision=PRECISION)
        dA += tl.dot(do, tl.trans(w), input_precision=PRECISION)
        dk_to_end += tl.dot(w, tl.trans(ds), input_precision=PRECISION)
        dwk -= tl.dot(dw, tl.trans(s), input_precision=PRECISION)
        dT += tl.dot(dw, tl.trans(v * beta[:, None]), input_precision=PRECISION)
        state_dot += tl.sum(ds * s, axis=1)
        # U = T Bv with dU = dW: dBv = T^T dW
        dbv = tl.dot(tl.trans(inverse), dw, input_precision=PRECISION)
        _store_rows(dv_ptr, dbv * beta[:, None], b, h, t, mask_t, vv, V, T, H)
        dbeta += tl.sum(dbv * v, axis=1)

    # O = diag(gamma) Q S + A W
    dq = gamma[:, None] * dq_state + tl.dot(dA * decay, k, input_precision=PRECISION)
    dk = tl.dot(tl.trans(dA * decay), q, input_precision=PRECISION)
    dG = tl.sum(q * gamma[:, None] * dq_state, axis=1)
    d_log = dA * A
    dG += tl.sum(d_log, axis=1) - tl.sum(d_log, axis=0)
    # S_end = gamma_L S + (K * exp(G_L - G))^T W
    dk += dk_to_end * to_end[:, None]
    d_log_end = tl.sum(dk_to_end * k * to_end[:, None], axis=1)
    dG -= d_log_end
    dG_end = tl.sum(d_log_end, axis=0) + gamma_end * tl.sum(state_dot, axis=0)
    # Wk = T Bk, Bk = diag(beta gamma) K
    write = beta * gamma
    dT += tl.dot(dwk, tl.trans(k * write[:, None]), input_precision=PRECISION)
    dbk = tl.dot(tl.trans(inverse), dwk, input_precision=PRECISION)
    dk += dbk * write[:, None]
    d_write = tl.sum(dbk * k, axis=1)
    dbeta += d_write * gamma
    dG += d_write * write
    # T = (I + M)^-1: dM = -T^T dT T^T on the strictly lower part, M = beta_l exp(G_l - G_s) k_l . k_s
    dM = -tl.dot(tl.dot(tl.trans(inverse), dT, input_precision=PRECISION), tl.trans(inverse),
                 input_precision=PRECISION)
    strict_decay = tl.where(rows[:, None] > rows[None, :], decay, 0.0)
    dM = tl.where(rows[:, None] > rows[None, :], dM, 0.0)
    dbeta += tl.sum(dM * strict_decay * kk, axis=1)
    d_log = dM * beta[:, None] * strict_decay * kk
    dG += tl.sum(d_log, axis=1) - tl.sum(d_log, axis=0)
    dkk = dM * beta[:, None] * strict_decay
    dk += tl.dot(dkk, k, input_precision=PRECISION) + tl.dot(tl.trans(dkk), k, input_precision=PRECISION)
    # G_L is the whole chunk's sum, G_l = g_1 + ... + g_l: dg is the reversed cumsum of dG
    dG += tl.where(rows == L - 1, dG_end, 0.0)
    dg = tl.sum(dG, axis=0) - tl.cumsum(dG, axis=0) + dG

    _store_rows(dq_ptr, dq, b, h, t, mask_t, kk_, K, T, H)
    _store_rows(dk_ptr, dk, b, h, t, mask_t, kk_, K, T, H)
    tl.store(dg_ptr + (b * T + t) * H + h, dg, mask=mask_t)
    tl.store(dbeta_ptr + (b * T + t) * H + h, dbeta, mask=mask_t)


def _sizes(key_dim: int, value_dim: int, chunk_len: int) -> tuple[int, int]:
    """BK (all of K, at least tl.dot's 16) and BV (32 where L BK reaches 64 x 128, see LAUNCH)."""
    block_k = max(16, triton.next_power_of_2(key_dim))
    widest = 32 if chunk_len * block_k >= 64 * 128 else 64
    return block_k, max(16, min(widest, triton.next_power_of_2(value_dim)))


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


class _ChunkedGatedDeltaRule(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state, chunk_len):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        g32, beta32 = g.float().contiguous(), beta.float().contiguous()
        batch, seq_len, heads, key_dim = q.shape
        value_dim = v.shape[-1]
        block_k, block_v = _sizes(key_dim, value_dim, chunk_len)
        num_chunks, value_blocks = triton.cdiv(seq_len, chunk_len), triton.cdiv(value_dim, block_v)
        precision = _precision(v.dtype)
        f32 = dict(device=q.device, dtype=torch.float32)
        wk = torch.empty(batch, seq_len, heads, key_dim, **f32)
        u = torch.empty(batch, seq_len, heads, value_dim, **f32)
        w = torch.empty(batch, seq_len, heads, value_dim, **f32)
        states = torch.empty(batch, heads, num_chunks, key_dim, value_dim, **f32)
        last = torch.empty(batch, heads, key_dim, value_dim, **f32)
        o = torch.empty(batch, seq_len, heads, value_dim, device=q.device, dtype=v.dtype)
        sizes = dict(L=chunk_len, BK=block_k, BV=block_v, PRECISION=precision)
        dims = (seq_len, heads, key_dim, value_dim)
        has_init = initial_state is not None
        h0 = initial_state.contiguous() if has_init else last
        _fwd_prepare[(batch * heads, num_chunks)](k, v, g32, beta32, wk, u, *dims, **sizes, **LAUNCH["prepare"])
        _fwd_states[(batch * heads, value_blocks)](k, g32, beta32, wk, u, h0, states, w, last, *dims, num_chunks,
                                                   HAS_INIT=has_init, **sizes, **LAUNCH["states"])
        _fwd_output[(batch * heads, num_chunks, value_blocks)](q, k, g32, beta32, states, w, o, *dims, num_chunks,
                                                               **sizes, **LAUNCH["output"])
        ctx.save_for_backward(q, k, v, g32, beta32, wk, w, states)
        ctx.chunk_len, ctx.has_init, ctx.dtypes = chunk_len, has_init, (g.dtype, beta.dtype)
        ctx.init_dtype = initial_state.dtype if has_init else None
        return o, last

    @staticmethod
    def backward(ctx, do, dlast):
        q, k, v, g32, beta32, wk, w, states = ctx.saved_tensors
        batch, seq_len, heads, key_dim = q.shape
        value_dim = v.shape[-1]
        chunk_len = ctx.chunk_len
        block_k, block_v = _sizes(key_dim, value_dim, chunk_len)
        num_chunks, value_blocks = triton.cdiv(seq_len, chunk_len), triton.cdiv(value_dim, block_v)
        sizes = dict(L=chunk_len, BK=block_k, BV=block_v, PRECISION=_precision(v.dtype))
        dims = (seq_len, heads, key_dim, value_dim)
        f32 = dict(device=q.device, dtype=torch.float32)
        do = do.contiguous() if do is not None else torch.zeros_like(v)
        has_dlast = dlast is not None
        dlast = dlast.contiguous() if has_dlast else states
        dstates = torch.empty_like(states)
        dw = torch.empty(batch, seq_len, heads, value_dim, **f32)
        dh0 = torch.empty(batch, heads, key_dim, value_dim, **f32)
        _bwd_states[(batch * heads, value_blocks)](q, k, g32, beta32, wk, do, dlast, dstates, dw, dh0, *dims,
                                                   num_chunks, HAS_DLAST=has_dlast, **sizes, **LAUNCH["states"])
        dq, dk = torch.empty_like(q), torch.empty_like(k)
        dv = torch.empty_like(v)
        dg, dbeta = torch.empty_like(g32), torch.empty_like(beta32)
        _bwd_chunk[(batch * heads, num_chunks)](q, k, v, g32, beta32, states, dstates, w, dw, do,
                                                dq, dk, dv, dg, dbeta, *dims, num_chunks, **sizes, **LAUNCH["chunk"])
        g_dtype, beta_dtype = ctx.dtypes
        dh0 = dh0.to(ctx.init_dtype) if ctx.has_init else None
        return dq, dk, dv, dg.to(g_dtype), dbeta.to(beta_dtype), dh0, None


def gated_delta_rule_chunked_triton(
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
    """Gated delta rule in chunks, as Triton kernels; matches `gated_delta_rule_naive`.

    Args:
        q: [B, T, H, K] queries.
        k: [B, T, H, K] keys (unit norm keeps the update a contraction).
        v: [B, T, H, V] values.
        g: [B, T, H] log decay, alpha_t = exp(g_t); g <= 0 for a decaying state.
        beta: [B, T, H] write strength.
        initial_state: [B, H, K, V] state before the first step (S^T); zeros if None.
        return_last_state: also return the state after the last step.
        chunk_size: steps per chunk, a power of two from 16 to 128 (default `CHUNK`, 32); a sequence
            shorter than one chunk runs in one chunk of the next power of two (at least 16).
            Only speed and memory ([B, H, T / chunk, K, V] saved states) depend on it.

    Returns:
        o [B, T, H, V] in v's dtype, or (o, last_state) with last_state [B, H, K, V] in fp32.
    """
    chunk = chunk_size or CHUNK
    if chunk not in (16, 32, 64, 128):
        raise ValueError(f"gated_delta_rule_chunked_triton: chunk_size must be 16, 32, 64 or 128, got {chunk}")
    chunk_len = min(chunk, max(16, triton.next_power_of_2(q.shape[1])))
    o, last = _ChunkedGatedDeltaRule.apply(q, k, v, g, beta, initial_state, chunk_len)
    return (o, last) if return_last_state else o
