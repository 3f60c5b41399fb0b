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
un-modulated H_k, so the write path never depends on the read path. A plain
forward starts from the learned slots and does not write the last segment
(nothing reads the result): it is a pure function of its tokens. With
``carry``, the last segment is written too, and inside ``model.carrying()``
each call starts from the state the previous call left, detached (truncated
backpropagation through time): the training loop then feeds row b of every
batch the next chunk of the same stream (``TokenCorpus.stream_batch``).

Auxiliary losses (the paper's ablations; its objective is not published, so
this is our reading of "self-prediction"): ``aux: self`` trains a linear head
to predict the next state S_{k+1} (detached) from S_k; ``aux: random`` is the
control, the same head fitted to fresh Gaussian noise. Either adds
``aux_weight`` times its mean squared error to the training loss.

Dimensions: B batch, T time, D model width, N segments, C segment length,
M slots, S memory width, H memory heads, K = S / H head width.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from archsearch.arch.spec import ArchSpec
from archsearch.arch.structures.memory_counts import (  # the formulas, beside the module
    AUX_KINDS,
    MEMORY_WIDTH_RATIO,
    MemoryOptions,
    default_memory_dim,
    flops,
    memory_flops,
    memory_mixing,
    memory_options,
    memory_params,
    mixing,
    overhead,
    params,
    state,
    train_extra,
)
from archsearch.arch.structures.stack import (
    LanguageModel,
    Layer,
    init_weights,
)
from archsearch.data import IGNORE

# the write gate starts nearly closed (sigmoid(-2) = 0.12), so the memory is a
# small perturbation of the plain stack at initialisation
GATE_BIAS_INIT = -2.0
# the initial slots must differ, or every slot reads and writes the same thing
SLOT_INIT_STD = 0.5


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

    forward: hidden states [B, T, D] (and optionally the state to start
    from, [B, M, S]) -> modulated hidden states [B, T, D] and the states
    S_0 .. S_N (S_N only with ``carry``), [B, N or N + 1, M, S].
    """

    def __init__(self, *, spec: ArchSpec, opts: MemoryOptions):
        super().__init__()
        d, s = spec.d_model, opts.memory_dim
        self.segment, self.heads, self.write_last = opts.segment, opts.memory_heads, opts.carry
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
        # training only: S_k -> a prediction of S_{k+1} (or of noise, the control)
        self.aux_kind = opts.aux
        self.aux_head = nn.Linear(s, s) if opts.aux != "none" else None

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

    def segment_states(self, hn_BTD: torch.Tensor, start_BMS: torch.Tensor | None = None) -> torch.Tensor:
        """The state each segment reads, [B, N, M, S]: segment k gets S_k,
        the slots after segments 0..k-1 (``start_BMS``, default the learned
        slots, for k = 0). With ``carry`` one more, S_N, after the last segment."""
        B, T, _ = hn_BTD.shape
        # a copy, not expand(): a view of a parameter made under no_grad trips
        # module hooks (torch's FLOP counter) that expect a grad_fn
        state_BMS = self.initial_MS.repeat(B, 1, 1) if start_BMS is None else start_BMS
        states = [state_BMS]
        last = T if self.write_last else T - self.segment
        for start in range(0, last, self.segment):
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

    def forward(self, h_BTD: torch.Tensor, start_BMS: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        hn_BTD = self.norm(h_BTD)
        states_BKMS = self.segment_states(hn_BTD, start_BMS)
        num_segments = -(-h_BTD.shape[1] // self.segment)
        read_BTS = self.read(hn_BTD, states_BKMS[:, :num_segments])
        gate_BTD = torch.sigmoid(self.gate(torch.cat([hn_BTD, read_BTS], dim=-1)))
        return h_BTD + gate_BTD * self.read_out(read_BTS), states_BKMS

    def aux_loss(self, states_BKMS: torch.Tensor) -> torch.Tensor:
        """Mean squared error of the aux head over consecutive state pairs:
        S_k predicts S_{k+1} (detached; ``self``) or fresh N(0, 1) noise
        (``random``). Zero when there is no pair (a single segment)."""
        pred_BKMS = self.aux_head(states_BKMS[:, :-1])
        if pred_BKMS.shape[1] == 0:
            return pred_BKMS.sum()
        if self.aux_kind == "self":
            target_BKMS = states_BKMS[:, 1:].detach()
        else:
            target_BKMS = torch.randn_like(pred_BKMS)
        return F.mse_loss(pred_BKMS.float(), target_BKMS.float())


class MemoryStack(LanguageModel):
    """Plain pre-norm stack with a ``RecurrentMemory`` after layer ``placement``."""

    own_loss = True  # CE plus the auxiliary loss when ``aux`` is on

    def __init__(self, spec: ArchSpec):
        super().__init__(spec)
        self.options = opts = memory_options(spec)
        self.placement = opts.placement
        self.layers = nn.ModuleList(Layer(spec=spec, layer=layer) for layer in spec.layers)
        self.memory = RecurrentMemory(spec=spec, opts=opts)
        self.apply(init_weights)
        self.memory.reset_parameters()
        # inside carrying(): [the state the last forward left] (empty before the first)
        self._carried: list[torch.Tensor] | None = None

    @property
    def carries_state(self) -> bool:
        return self.options.carry

    @contextlib.contextmanager
    def carrying(self):
        """Inside, each forward starts from the (detached) state the previous
        one ended with, row by row; outside, every forward starts from the
        learned slots. Nested uses start fresh and restore the outer state."""
        if not self.options.carry:
            raise ValueError("memory: carrying() needs the option carry=True")
        outer, self._carried = self._carried, []
        try:
            yield self
        finally:
            self._carried = outer

    def _start_state(self, batch_size: int) -> torch.Tensor | None:
        if not self._carried:
            return None
        state_BMS = self._carried[0]
        if state_BMS.shape[0] != batch_size:
            raise ValueError(f"memory: a carried state has {state_BMS.shape[0]} rows, this batch {batch_size}; "
                             "carry needs the same batch size on every step (and grad_accum 1)")
        return state_BMS

    def hidden(self, x_BTD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The last layer's output [B, T, D] and the memory states [B, K, M, S]."""
        states_BKMS = None
        for index, layer in enumerate(self.layers):
            x_BTD = layer(x_BTD)
            if index == self.placement:
                x_BTD, states_BKMS = self.memory(x_BTD, self._start_state(x_BTD.shape[0]))
        if self._carried is not None:
            self._carried[:] = [states_BKMS[:, -1].detach()]
        return x_BTD, states_BKMS

    def body(self, x_BTD: torch.Tensor) -> torch.Tensor:
        return self.hidden(x_BTD)[0]

    def training_loss(self, inputs_BT: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
        """Next-token CE, plus ``aux_weight`` times the auxiliary loss when ``aux`` is on."""
        h_BTD, states_BKMS = self.hidden(self.embed(inputs_BT))
        weight_VD = self.embed.weight if self.head is None else self.head.weight
        logits_BTV = self.norm(h_BTD) @ weight_VD.T
        loss = F.cross_entropy(logits_BTV.flatten(0, 1).float(), targets_BT.flatten(), ignore_index=IGNORE)
        if self.memory.aux_head is None:
            return loss
        return loss + self.options.aux_weight * self.memory.aux_loss(states_BKMS)
