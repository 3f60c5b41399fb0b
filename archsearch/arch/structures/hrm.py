"""Shared-weight iteration: HRM-LM and the Universal Transformer.

HRM-LM (Han 2026, "Hierarchical vs. Flat Iteration in Shared-Weight
Transformers", https://arxiv.org/abs/2604.14442) adapts HRM (Wang et al. 2025,
https://arxiv.org/abs/2506.21734, code ``sapientinc/HRM``) to causal language
modelling: a fast module updated every step and a slow module updated every T
steps, N cycles, parameters shared across cycles. Both modules are small causal
Transformer++ stacks over the whole sequence (the first ``fast_layers`` of
``spec.layers``, then ``slow_layers``); the recurrence is over iterations, never
over time, so every position is updated in parallel and attention keeps it causal:

    z_F = z_S = 0;  e = embedding
    for n in 1..N:
        for tau in 1..T:  z_F = Fast(z_F + z_S + e)      # input injection by addition
        z_S = Slow(z_S + z_F)
    logits = head(RMSNorm(z_S))

The Universal Transformer (Dehghani et al. 2018, https://arxiv.org/abs/1807.03819)
applies one shared block (all of ``spec.layers``) M = ``steps`` times. Following
papers.md section 10 (the HRM-LM paper's UT plateaued near unigram entropy),
it gets HRM's input injection and a learned embedding per step:

    h = 0;  for r in 1..M:  h = Block(h + e + step_r);  logits = head(RMSNorm(h))

Between iterations each carried state is RMS-normalised without a weight
(HRM's post-norm blocks leave unit-RMS states; Ouro normalises after every
loop). Without it the slow state grows geometrically, about (T+2)x per cycle,
and the pre-norm layers' updates shrink against it. The last state goes
straight to the final (weighted) norm, so one UT step without a step embedding
is exactly the plain stack.

HRM-LM trains by plain BPTT through every iteration (``grad: bptt``, the
default) or by HRM's one-step gradient approximation (``grad: one_step``):
every update but the last fast and the last slow one runs under no_grad, so
the gradient is that of the last two updates with their inputs held fixed
(HRM section 2, https://arxiv.org/abs/2506.21734, ``hrm_act_v1.py``). Deep
supervision (``segments`` S > 1) runs the N-cycle loop S times, each segment
starting from the last one's states detached; ``training_loss`` is the mean
over segments of each segment's cross-entropy, and ``forward`` returns the
last segment's logits. HRM takes one optimizer step per segment; here the S
losses share one step, so their gradients (each through its own segment
only) are averaged at the same weights.

Dimensions: B batch, T time, D model width.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from archsearch.arch import blocks
from archsearch.arch.spec import ArchSpec
from archsearch.arch.structures import stack
from archsearch.arch.structures.stack import (
    LanguageModel,
    Layer,
    init_weights,
    layer_flops,
    layer_mixing,
    reject_unknown_options,
)
from archsearch.data import IGNORE


class Stage(nn.Module):
    """Some layers applied once each, in order: [B, T, D] -> [B, T, D] (one HRM module or the UT block)."""

    def __init__(self, *, spec: ArchSpec, layers):
        super().__init__()
        self.layers = nn.ModuleList(Layer(spec=spec, layer=layer) for layer in layers)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x_BTD = layer(x_BTD)
        return x_BTD


def _carry(x_BTD: torch.Tensor, eps: float) -> torch.Tensor:
    """The state handed to the next iteration: unit RMS per position, no weight."""
    return F.rms_norm(x_BTD, (x_BTD.shape[-1],), eps=eps)


@dataclass(frozen=True, kw_only=True)
class HRMOptions:
    """The options of "hrm", checked.

    ``N`` cycles (default 2) of ``T`` fast steps per slow step (default 2), both
    >= 1; ``fast_layers`` (default half of ``spec.layers``, rounded up) and
    ``slow_layers`` (default the rest) split ``spec.layers`` in order, each >= 1,
    summing to ``len(spec.layers)``. HRM's config is N = T = 2 over 4 + 4 layers.
    ``grad``: "bptt" (default) or "one_step" (HRM's approximation); ``segments``
    >= 1 (default 1): deep supervision over that many segments.
    """

    N: int = 2
    T: int = 2
    fast_layers: int
    slow_layers: int
    grad: str = "bptt"
    segments: int = 1


def hrm_options(spec: ArchSpec) -> HRMOptions:
    """Parse and check ``spec.options``; a ValueError names what is wrong."""
    reject_unknown_options(spec, {"N", "T", "fast_layers", "slow_layers", "grad", "segments"})
    num = spec.num_layers
    fast = spec.options.get("fast_layers", num - num // 2)
    opts = HRMOptions(**{"fast_layers": fast, "slow_layers": num - fast, **spec.options})
    if not all(isinstance(n, int) and n >= 1 for n in (opts.N, opts.T, opts.fast_layers, opts.slow_layers)) \
            or opts.fast_layers + opts.slow_layers != num:
        raise ValueError(f"hrm: N, T, fast_layers, slow_layers must be ints >= 1 with fast_layers + slow_layers = "
                         f"len(spec.layers) = {num}; got {opts}")
    if opts.grad not in ("bptt", "one_step"):
        raise ValueError(f"hrm: grad must be 'bptt' or 'one_step', got {opts.grad!r}")
    if not isinstance(opts.segments, int) or isinstance(opts.segments, bool) or opts.segments < 1:
        raise ValueError(f"hrm: segments must be an int >= 1, got {opts.segments!r}")
    return opts


class HRM(LanguageModel):
    """HRM-LM: tokens [B, T] -> logits [B, T, V]; per segment, the fast module
    N*T times and the slow module N times."""

    def __init__(self, spec: ArchSpec):
        super().__init__(spec)
        opts = hrm_options(spec)
        self.cycles, self.fast_steps = opts.N, opts.T
        self.one_step, self.segments = opts.grad == "one_step", opts.segments
        self.fast = Stage(spec=spec, layers=spec.layers[: opts.fast_layers])
        self.slow = Stage(spec=spec, layers=spec.layers[opts.fast_layers:])
        self.apply(init_weights)

    def _graded(self, last: bool):
        """Where the gradient flows: every update under BPTT, the last ones under one_step."""
        return torch.no_grad() if self.one_step and not last else contextlib.nullcontext()

    def segment(self, e_BTD: torch.Tensor, fast_BTD: torch.Tensor,
                slow_BTD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """N cycles from the given states: (fast, slow) after them, each [B, T, D]."""
        eps = self.spec.norm_eps
        for cycle in range(self.cycles):
            last_cycle = cycle + 1 == self.cycles
            for step in range(self.fast_steps):
                with self._graded(last_cycle and step + 1 == self.fast_steps):
                    fast_BTD = _carry(self.fast(fast_BTD + slow_BTD + e_BTD), eps)
            with self._graded(last_cycle):
                slow_BTD = self.slow(slow_BTD + fast_BTD)
            if not last_cycle:
                slow_BTD = _carry(slow_BTD, eps)
        return fast_BTD, slow_BTD

    def segment_states(self, e_BTD: torch.Tensor) -> list[torch.Tensor]:
        """The slow state after each segment; a segment starts from the last one's
        states, detached (and the slow one carry-normed), the first from zeros."""
        fast_BTD = slow_BTD = torch.zeros_like(e_BTD)
        out = []
        for index in range(self.segments):
            if index:
                fast_BTD, slow_BTD = fast_BTD.detach(), _carry(slow_BTD.detach(), self.spec.norm_eps)
            fast_BTD, slow_BTD = self.segment(e_BTD, fast_BTD, slow_BTD)
            out.append(slow_BTD)
        return out

    def body(self, e_BTD: torch.Tensor) -> torch.Tensor:
        return self.segment_states(e_BTD)[-1]

    def training_loss(self, inputs_BT: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
        """Mean over segments of each segment's next-token cross-entropy (one segment: plain CE)."""
        weight_VD = self.embed.weight if self.head is None else self.head.weight
        losses = [F.cross_entropy((self.norm(h_BTD) @ weight_VD.T).flatten(0, 1).float(), targets_BT.flatten(),
                                  ignore_index=IGNORE)
                  for h_BTD in self.segment_states(self.embed(inputs_BT))]
        return torch.stack(losses).mean()


def hrm_params(spec: ArchSpec) -> int:
    """Non-embedding: every layer once (shared across iterations) plus the final norm;
    independent of N and T. The carry norms have no weights."""
    hrm_options(spec)
    return stack.params(spec)


def _hrm_sum(spec: ArchSpec, per_layer) -> float:
    """S * N * (T * sum over fast layers + sum over slow layers) of ``per_layer(layer)``."""
    opts = hrm_options(spec)
    fast, slow = spec.layers[: opts.fast_layers], spec.layers[opts.fast_layers:]
    return opts.segments * opts.N * (opts.T * sum(map(per_layer, fast)) + sum(map(per_layer, slow)))


def hrm_flops(spec: ArchSpec, seq_len: int) -> float:
    """Forward FLOPs per token, LM head excluded: S (N*T*C_fast + N*C_slow) over S segments."""
    return _hrm_sum(spec, lambda layer: layer_flops(spec, layer, seq_len))


def hrm_graded(spec: ArchSpec, seq_len: int) -> float | None:
    """Under ``one_step``, the training forward FLOPs that carry gradient: per
    segment one fast and one slow call and the LM head, S (C_fast + C_slow + 2 D V);
    None (all of them) under BPTT."""
    opts = hrm_options(spec)
    if opts.grad != "one_step":
        return None
    calls = sum(layer_flops(spec, layer, seq_len) for layer in spec.layers)  # one call of each module
    return opts.segments * (calls + 2.0 * spec.d_model * spec.vocab_size)


def hrm_train_extra(spec: ArchSpec, seq_len: int) -> float:
    """Deep supervision reads logits after segments 1..S-1 too: (S-1) LM heads of 2 D V."""
    return 2.0 * spec.d_model * spec.vocab_size * (hrm_options(spec).segments - 1)


def hrm_mixing(spec: ArchSpec, seq_len: int) -> float:
    """Attention scores and mixing of every layer call: S (N*T*A_fast + N*A_slow)."""
    return _hrm_sum(spec, lambda layer: layer_mixing(spec, layer, seq_len))


def hrm_state(spec: ArchSpec, seq_len: int) -> int:
    """Every module call sees different inputs, so each keeps its own caches:
    S N T times the fast layers' plus S N times the slow layers'."""
    return int(_hrm_sum(spec, lambda layer: blocks.mixer(layer.mixer).state(spec, layer, seq_len)))


@dataclass(frozen=True, kw_only=True)
class UTOptions:
    """The options of "universal": ``steps`` M >= 1 (default 4) and
    ``step_embedding`` (default True: a learned D-vector added at each step)."""

    steps: int = 4
    step_embedding: bool = True


def ut_options(spec: ArchSpec) -> UTOptions:
    """Parse and check ``spec.options``; a ValueError names what is wrong."""
    reject_unknown_options(spec, {"steps", "step_embedding"})
    opts = UTOptions(**spec.options)
    if not isinstance(opts.steps, int) or opts.steps < 1:
        raise ValueError(f"universal: steps must be an int >= 1, got {opts.steps!r}")
    return opts


class Universal(LanguageModel):
    """Universal Transformer: tokens [B, T] -> logits [B, T, V]; the block runs ``steps`` times."""

    def __init__(self, spec: ArchSpec):
        super().__init__(spec)
        opts = ut_options(spec)
        self.steps = opts.steps
        self.block = Stage(spec=spec, layers=spec.layers)
        self.step_embed = nn.Embedding(self.steps, spec.d_model) if opts.step_embedding else None
        self.apply(init_weights)

    def body(self, e_BTD: torch.Tensor) -> torch.Tensor:
        h_BTD = torch.zeros_like(e_BTD)
        for step in range(self.steps):
            x_BTD = h_BTD + e_BTD
            if self.step_embed is not None:
                x_BTD = x_BTD + self.step_embed.weight[step]
            h_BTD = self.block(x_BTD)
            if step + 1 < self.steps:
                h_BTD = _carry(h_BTD, self.spec.norm_eps)
        return h_BTD


def ut_params(spec: ArchSpec) -> int:
    """Non-embedding: the shared block once, the final norm and ``steps * D`` step embeddings."""
    opts = ut_options(spec)
    return stack.params(spec) + (opts.steps * spec.d_model if opts.step_embedding else 0)


def ut_flops(spec: ArchSpec, seq_len: int) -> float:
    """Forward FLOPs per token, LM head excluded: ``steps`` passes of the block."""
    return ut_options(spec).steps * stack.flops(spec, seq_len)


def ut_mixing(spec: ArchSpec, seq_len: int) -> float:
    """Attention scores and mixing of ``steps`` passes of the block."""
    return ut_options(spec).steps * stack.mixing(spec, seq_len)


def ut_state(spec: ArchSpec, seq_len: int) -> int:
    """Every step keeps its own caches (its inputs differ): ``steps`` times the block's."""
    return ut_options(spec).steps * stack.state(spec, seq_len)
