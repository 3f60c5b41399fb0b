"""Transformer stack with a persistent recurrent memory between two layers.

The design (papers.md section 2; no public source) reads a small bank of
memory slots into the residual stream and writes each finished segment back
into the slots with a GRU:

    H = layers[0..placement](embed(x))                  hidden states, [B, T, D]
    S_0 = learned initial slots                          [M, S]
    for segment k (tokens kC .. kC+C-1):
        R_k = CrossAttn(q = H_k, kv = S_k)               tokens read the slots
        H'_k = H_k + sigmoid(W_g [H_k; R_k] + b_g) * W_o R_k     gated addition
        S_{k+1} = GRU(CrossAttn(q = S_k, kv = H_k), S_k)         slots read the segment
    logits = head(norm(layers[placement+1..](H')))

Segment k is modulated only by S_k, the state from before it: no token can
see a later token of its own segment through the memory. The write reads the
un-modulated H_k, so the write path never depends on the read path. The last
segment is not written (nothing after it reads the result), and the state
starts from the learned slots on every call: it persists across the segments
of a sequence, not across batches.

Dimensions: B batch, T time, D model width, N segments, C segment length,
M slots, S memory width, H memory heads, K = S / H head width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from archsearch.arch.spec import ArchSpec
from archsearch.arch.structures import stack
from archsearch.arch.structures.stack import (
    LanguageModel,
    Layer,
    init_weights,
    reject_unknown_options,
)

# the write gate starts nearly closed (sigmoid(-2) = 0.12), so the memory is a
# small perturbation of the plain stack at initialisation
GATE_BIAS_INIT = -2.0
# the initial slots must differ, or every slot reads and writes the same thing
SLOT_INIT_STD = 0.5


@dataclass(frozen=True, kw_only=True)
class MemoryOptions:
    """The options of the "memory" structure, checked.

    ``placement`` in [0, num_layers - 1]: the memory sits after that layer
    (default num_layers // 2 - 1, clamped at 0: after the lower half).
    ``slots`` >= 1, ``segment`` >= 1 tokens, ``memory_dim`` >= 1 (default
    d_model), ``memory_heads`` >= 1 dividing ``memory_dim``.
    """

    placement: int
    slots: int = 4
    segment: int = 64
    memory_dim: int
    memory_heads: int = 1


def memory_options(spec: ArchSpec) -> MemoryOptions:
    """Parse and check ``spec.options``; a ValueError names what is wrong."""
    reject_unknown_options(spec, {f.name for f in fields(MemoryOptions)})
    defaults = dict(placement=max(0, spec.num_layers // 2 - 1), memory_dim=spec.d_model)
    opts = MemoryOptions(**{**defaults, **spec.options})
    if not 0 <= opts.placement < spec.num_layers:
        raise ValueError(f"memory: placement must be in [0, {spec.num_layers - 1}], got {opts.placement}")
    for name in ("slots", "segment", "memory_dim", "memory_heads"):
        value = getattr(opts, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"memory: {name} must be an int >= 1, got {value!r}")
    if opts.memory_dim % opts.memory_heads:
        raise ValueError(f"memory: memory_heads {opts.memory_heads} must divide memory_dim {opts.memory_dim}")
    return opts


class GRUCell(nn.Module):
    """``torch.nn.GRUCell`` written with two Linear layers (so FLOP counters see
    the matmuls), same equations, same parameter count 6 S^2 + 6 S:

        r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
        z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
        n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
        h' = (1 - z) * n + z * h
    """

    def __init__(self, *, input_size: int, hidden_size: int):
        super().__init__()
        self.input = nn.Linear(input_size, 3 * hidden_size)
        self.hidden = nn.Linear(hidden_size, 3 * hidden_size)

    def reset_parameters(self) -> None:
        """torch's GRUCell init: every weight and bias U(-1/sqrt(S), 1/sqrt(S))."""
        bound = 1.0 / math.sqrt(self.hidden.in_features)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def forward(self, x_BMS: torch.Tensor, h_BMS: torch.Tensor) -> torch.Tensor:
        xr, xz, xn = self.input(x_BMS).chunk(3, dim=-1)
        hr, hz, hn = self.hidden(h_BMS).chunk(3, dim=-1)
        reset, update = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        candidate = torch.tanh(xn + reset * hn)
        return (1 - update) * candidate + update * h_BMS


def _attend(q_BQHK: torch.Tensor, k_BKHK: torch.Tensor, v_BKHK: torch.Tensor) -> torch.Tensor:
    """Unmasked multi-head cross-attention over the leading-batch dims.

    q [..., Q, H, K], k and v [..., P, H, K] -> [..., Q, H, K]. Every key is in
    the past of every query here, so nothing is masked.
    """
    scores = torch.einsum("...qhk,...phk->...hqp", q_BQHK, k_BKHK) / q_BQHK.shape[-1] ** 0.5
    return torch.einsum("...hqp,...phk->...qhk", scores.softmax(-1), v_BKHK)


class RecurrentMemory(nn.Module):
    """Slots read by each segment's tokens, then updated from that segment.

    forward: hidden states [B, T, D] -> modulated hidden states [B, T, D].
    """

    def __init__(self, *, spec: ArchSpec, opts: MemoryOptions):
        super().__init__()
        d, s = spec.d_model, opts.memory_dim
        self.segment, self.heads = opts.segment, opts.memory_heads
        self.norm = nn.RMSNorm(d, eps=spec.norm_eps)
        self.initial_MS = nn.Parameter(torch.randn(opts.slots, s) * SLOT_INIT_STD)
        # read: tokens are queries, slots are keys and values
        self.read_q = nn.Linear(d, s, bias=False)
        self.read_kv = nn.Linear(s, 2 * s, bias=False)
        self.read_out = nn.Linear(s, d, bias=False)
        self.gate = nn.Linear(d + s, d)
        # write: slots are queries, the segment's tokens are keys and values
        self.write_q = nn.Linear(s, s, bias=False)
        self.write_kv = nn.Linear(d, 2 * s, bias=False)
        self.gru = GRUCell(input_size=s, hidden_size=s)

    def reset_parameters(self) -> None:
        """What differs from the GPT-2 init the whole model gets first."""
        nn.init.constant_(self.gate.bias, GATE_BIAS_INIT)
        self.gru.reset_parameters()

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.heads, -1))

    def write(self, state_BMS: torch.Tensor, hn_BCD: torch.Tensor) -> torch.Tensor:
        """The slots after reading one segment's normed hidden states."""
        k_BCS, v_BCS = self.write_kv(hn_BCD).chunk(2, dim=-1)
        read_BMHK = _attend(self._heads(self.write_q(state_BMS)), self._heads(k_BCS), self._heads(v_BCS))
        return self.gru(read_BMHK.flatten(-2), state_BMS)

    def segment_states(self, hn_BTD: torch.Tensor) -> torch.Tensor:
        """The state each segment reads, [B, N, M, S]: segment k gets S_k,
        the slots after segments 0..k-1 (the learned slots for k = 0)."""
        B, T, _ = hn_BTD.shape
        # a copy, not expand(): a view of a parameter made under no_grad trips
        # module hooks (torch's FLOP counter) that expect a grad_fn
        state_BMS = self.initial_MS.repeat(B, 1, 1)
        states = [state_BMS]
        for start in range(0, T - self.segment, self.segment):
            state_BMS = self.write(state_BMS, hn_BTD[:, start:start + self.segment])
            states.append(state_BMS)
        return torch.stack(states, dim=1)

    def read(self, hn_BTD: torch.Tensor, states_BNMS: torch.Tensor) -> torch.Tensor:
        """Each token's read R of its segment's state, [B, T, S]."""
        T = hn_BTD.shape[1]
        N, C = states_BNMS.shape[1], self.segment
        # pad the last segment to C queries; the padded reads are dropped
        q_BNCS = F.pad(self.read_q(hn_BTD), (0, 0, 0, N * C - T)).unflatten(1, (N, C))
        k_BNMS, v_BNMS = self.read_kv(states_BNMS).chunk(2, dim=-1)
        read_BNCHK = _attend(self._heads(q_BNCS), self._heads(k_BNMS), self._heads(v_BNMS))
        return read_BNCHK.flatten(-2).flatten(1, 2)[:, :T]

    def forward(self, h_BTD: torch.Tensor) -> torch.Tensor:
        hn_BTD = self.norm(h_BTD)
        read_BTS = self.read(hn_BTD, self.segment_states(hn_BTD))
        gate_BTD = torch.sigmoid(self.gate(torch.cat([hn_BTD, read_BTS], dim=-1)))
        return h_BTD + gate_BTD * self.read_out(read_BTS)


class MemoryStack(LanguageModel):
    """Plain pre-norm stack with a ``RecurrentMemory`` after layer ``placement``."""

    def __init__(self, spec: ArchSpec):
        super().__init__(spec)
        opts = memory_options(spec)
        self.placement = opts.placement
        self.layers = nn.ModuleList(Layer(spec=spec, layer=layer) for layer in spec.layers)
        self.memory = RecurrentMemory(spec=spec, opts=opts)
        self.apply(init_weights)
        self.memory.reset_parameters()

    def body(self, x_BTD: torch.Tensor) -> torch.Tensor:
        for index, layer in enumerate(self.layers):
            x_BTD = layer(x_BTD)
            if index == self.placement:
                x_BTD = self.memory(x_BTD)
        return x_BTD


def memory_params(spec: ArchSpec) -> int:
    """The memory module alone: D^2 + 5 D S + 9 S^2 + 2 D + 6 S + M S.

    norm D; slots M S; read q D S, kv 2 S^2, out S D; gate (D + S) D + D;
    write q S^2, kv 2 D S; GRU 6 S^2 + 6 S.
    """
    opts, d = memory_options(spec), spec.d_model
    s, m = opts.memory_dim, opts.slots
    return d * d + 5 * d * s + 9 * s * s + 2 * d + 6 * s + m * s


def params(spec: ArchSpec) -> int:
    """The plain stack (layers and final norm) plus the memory."""
    return stack.params(spec) + memory_params(spec)


def _segments(spec: ArchSpec, seq_len: int) -> tuple[MemoryOptions, int, int]:
    """Options, number of segments N = ceil(T / C), and writes N - 1."""
    opts = memory_options(spec)
    num_segments = -(-seq_len // opts.segment)
    return opts, num_segments, num_segments - 1


def memory_mixing(spec: ArchSpec, seq_len: int) -> float:
    """Cross-attention scores and weighted sums, per token: reads 4 M S (every
    token against M slots), writes 4 M C S per written segment (M slots
    against C tokens), spread over T."""
    opts, _, writes = _segments(spec, seq_len)
    s, m = opts.memory_dim, opts.slots
    return 4.0 * m * s + writes * 4.0 * m * opts.segment * s / seq_len


def memory_flops(spec: ArchSpec, seq_len: int) -> float:
    """Forward FLOPs per token of the memory, weight matmuls plus mixing.

    Per token: read q 2 D S, out 2 S D, gate 2 (D + S) D. Per segment (N of
    them): slot keys and values 4 M S^2. Per write (N - 1 of them, the last
    segment is not written): token keys and values 4 D S on each of its C
    tokens, slot queries 2 M S^2, GRU 12 M S^2.
    """
    opts, segments, writes = _segments(spec, seq_len)
    d, s, m, c = spec.d_model, opts.memory_dim, opts.slots, opts.segment
    per_token = 2.0 * d * s + 2.0 * s * d + 2.0 * (d + s) * d
    per_sequence = segments * 4.0 * m * s * s + writes * (4.0 * d * s * c + 14.0 * m * s * s)
    return per_token + per_sequence / seq_len + memory_mixing(spec, seq_len)


def flops(spec: ArchSpec, seq_len: int) -> float:
    """Forward per token: the stack's layers plus the memory."""
    return stack.flops(spec, seq_len) + memory_flops(spec, seq_len)


def mixing(spec: ArchSpec, seq_len: int) -> float:
    """The layers' attention terms plus the memory's cross-attention terms."""
    return stack.mixing(spec, seq_len) + memory_mixing(spec, seq_len)


def state(spec: ArchSpec, seq_len: int) -> int:
    """The layers' caches, the slots M S, and the write keys and values (2 S
    per token) of the unfinished segment, written when it completes."""
    opts = memory_options(spec)
    return stack.state(spec, seq_len) + opts.slots * opts.memory_dim + 2 * opts.memory_dim * (seq_len % opts.segment)
