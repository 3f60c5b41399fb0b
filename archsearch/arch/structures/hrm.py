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

import torch
import torch.nn.functional as F
from torch import nn

from archsearch.arch.spec import ArchSpec
from archsearch.arch.structures.hrm_counts import (  # the formulas, beside the module
    HRMOptions,
    UTOptions,
    hrm_flops,
    hrm_graded,
    hrm_mixing,
    hrm_options,
    hrm_params,
    hrm_state,
    hrm_train_extra,
    ut_flops,
    ut_mixing,
    ut_options,
    ut_params,
    ut_state,
)
from archsearch.arch.structures.stack import (
    LanguageModel,
    Layer,
    init_weights,
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

    own_loss = True  # the mean over segments of each one's CE

    def training_loss(self, inputs_BT: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
        """Mean over segments of each segment's next-token cross-entropy (one segment: plain CE)."""
        weight_VD = self.embed.weight if self.head is None else self.head.weight
        losses = [F.cross_entropy((self.norm(h_BTD) @ weight_VD.T).flatten(0, 1).float(), targets_BT.flatten(),
                                  ignore_index=IGNORE)
                  for h_BTD in self.segment_states(self.embed(inputs_BT))]
        return torch.stack(losses).mean()


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
