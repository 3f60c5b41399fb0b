"""Looped model: a group of k distinct layers applied L times with shared weights.

Saunshi et al., "Reasoning with Latent Thoughts" (https://arxiv.org/abs/2502.17416)
write this k⊗L. ``spec.layers`` are the k layers of the group and
``spec.options["loops"]`` is L. Optional pieces:

- ``inject``: input injection, the embedding is added back to the residual
  stream at the start of every loop after the first.
- ``exit_gate``: an Ouro-style exit gate (https://arxiv.org/abs/2510.25741).
  After loop r < L one linear gate, shared by all loops, reads the normed
  hidden state and gives lambda_r = sigmoid(w . norm(h_r) + b) per token. The
  exit distribution is p(r) = lambda_r * prod_{s<r} (1 - lambda_s), and the last
  loop takes the remaining mass. ``training_loss`` is
  sum_r p(r) * CE_r - beta * H(p), averaged over the scored tokens.
- ``exit_threshold`` (eval only): a token exits after the first loop whose
  cumulative exit probability reaches the threshold; its hidden state is
  frozen for the later loops, and so is what later tokens read of it: Mamba
  (whose forward takes ``skip_BT``) skips it in its scan, attention keeps its
  keys and values from its exit loop (a ``cache`` per layer, across loops).
  Once every token has exited the remaining loops are not run.
- ``cache_hole`` (training only): each token, with probability p, draws its
  exit loop from the gate (a Bernoulli(lambda_r) draw after each loop, which
  is a draw from p(r)) and is frozen after it, so training sees the skipped
  states inference will produce. The draws are detached: no gradient flows
  through the sampling, only through the expected loss over p(r).
- ``gate_loss``: Ouro's stage II (the recipe's ``gate_steps``). The LM runs
  every loop without gradient; the gate alone learns to exit where the next
  loop stops helping: with I_r = max(0, CE_r - CE_{r+1}) per token, the
  target exit probability after loop r is 1 - sigmoid(k (I_r - gamma)), fitted
  by binary cross-entropy. I_r is the gain of the loop the gate decides on
  (r+1), where papers.md writes Ouro's as the gain of the loop just run
  (L(t-1) - L(t)): a deliberate reading, reasoned in docs/architectures.md.

Dimensions: B batch, T time, D model width, V vocabulary, L loops.
"""

from __future__ import annotations

import inspect
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from archsearch.arch.spec import ArchSpec
from archsearch.arch.structures.looped_counts import (  # the formulas, beside the module
    LoopOptions,
    flops,
    loop_options,
    mixing,
    params,
    state,
    train_extra,
)
from archsearch.arch.structures.stack import LanguageModel, Layer, init_weights
from archsearch.data import IGNORE


# Ouro stage II: the sharpness k and margin gamma (nats) of the "continue"
# target sigmoid(k (I - gamma)); papers.md notes both come from memory of the
# paper, not from its text
GATE_SHARPNESS = 50.0
GATE_MARGIN = 0.005


def exit_distribution(lambdas: list[torch.Tensor]) -> torch.Tensor:
    """Exit probabilities over loops from the L-1 gate outputs, each [...].

    p(r) = lambda_r * prod_{s<r}(1 - lambda_s) for r < L-1; the last loop takes
    prod_{s<L-1}(1 - lambda_s). Returns [..., L]; sums to 1 by telescoping.
    """
    survive = torch.ones_like(lambdas[0]) if lambdas else None
    probs = []
    for lam in lambdas:
        probs.append(survive * lam)
        survive = survive * (1 - lam)
    if survive is None:
        raise ValueError("exit_distribution needs at least one gate output (loops >= 2)")
    return torch.stack(probs + [survive], dim=-1)


class LoopRun(NamedTuple):
    """What ``Looped.loops`` computes."""

    states: list[torch.Tensor]  # hidden state after each loop, [B, T, D] (the last only, unless keep_all)
    lambdas: list[torch.Tensor]  # gate outputs lambda_r after loops r < L, [B, T] (none without a gate)
    steps_BT: torch.Tensor  # loops each token ran, 1..L (int64)


def _exit_arguments(module: nn.Module) -> set[str]:
    """Which of the exit-mode keywords (the exited mask, a per-layer cache kept across loops) a mixer takes."""
    return {"skip_BT", "cache"} & set(inspect.signature(module.forward).parameters)


class Looped(LanguageModel):
    """k shared layers applied ``loops`` times; optional injection and exit gate."""

    own_loss = True  # the last loop's CE, or with a gate Ouro's expected loss over loops

    def __init__(self, spec: ArchSpec):
        super().__init__(spec)
        self.options = loop_options(spec)
        self.layers = nn.ModuleList(Layer(spec=spec, layer=layer) for layer in spec.layers)
        # one gate shared by every loop: D + 1 parameters
        self.exit_gate = nn.Linear(spec.d_model, 1) if self.options.exit_gate else None
        self._exit_arguments = [_exit_arguments(layer.mixer) for layer in self.layers]
        self.apply(init_weights)

    def _group(self, x_BTD: torch.Tensor, skip_BT: torch.Tensor | None, caches: list[dict]) -> torch.Tensor:
        """One pass through the k shared layers (``Layer.forward``, plus the skip mask and caches)."""
        for layer, accepted, cache in zip(self.layers, self._exit_arguments, caches):
            if skip_BT is None:
                x_BTD = layer(x_BTD)
                continue
            given = {"skip_BT": skip_BT, "cache": cache}
            mixer_kwargs = {name: given[name] for name in accepted}
            x_BTD = x_BTD + layer.mixer(layer.mixer_norm(x_BTD), **mixer_kwargs)
            if layer.has_mlp:
                x_BTD = x_BTD + layer.mlp(layer.mlp_norm(x_BTD))
        return x_BTD

    @property
    def exits_early(self) -> bool:
        return self.options.exit_threshold is not None

    def loops(self, e_BTD: torch.Tensor, *, keep_all: bool = False, exits: bool = True) -> LoopRun:
        """Run every loop from the embeddings ``e_BTD``; ``exits=False`` runs
        every loop for every token whatever the options say.

        Returns the hidden states after each loop ([B, T, D] each; only the
        last unless ``keep_all``), the gate outputs lambda_r [B, T] for
        loops r < L (empty without a gate) and the loops each token ran.
        Frozen tokens keep their state.
        """
        opts = self.options
        exit_mode = exits and ((opts.exit_threshold is not None and not self.training)
                               or (opts.cache_hole > 0 and self.training))
        exited_BT = torch.zeros(e_BTD.shape[:2], dtype=torch.bool, device=e_BTD.device) if exit_mode else None
        if exit_mode and self.training:
            # which tokens take a sampled exit this step; the rest run every loop
            sampled_BT = torch.rand(e_BTD.shape[:2], device=e_BTD.device) < opts.cache_hole
        survive_BT = torch.ones(e_BTD.shape[:2], device=e_BTD.device)
        steps_BT = torch.zeros(e_BTD.shape[:2], dtype=torch.long, device=e_BTD.device)
        caches: list[dict] = [{} for _ in self.layers]  # attention keys and values, kept across loops
        h_BTD, states, lambdas = e_BTD, [], []
        for r in range(opts.loops):
            x_BTD = h_BTD + e_BTD if (opts.inject and r > 0) else h_BTD
            if exited_BT is None:
                h_BTD = self._group(x_BTD, None, caches)
                steps_BT += 1
            elif not bool(exited_BT.all()):  # once every token has exited, a loop changes nothing
                out_BTD = self._group(x_BTD, exited_BT, caches)
                h_BTD = torch.where(exited_BT[..., None], h_BTD, out_BTD)
                steps_BT += ~exited_BT
            if keep_all or r == opts.loops - 1:
                states.append(h_BTD)
            if self.exit_gate is None or r == opts.loops - 1:
                continue
            # fp32: the exit distribution is a product of L - 1 factors
            lam_BT = torch.sigmoid(self.exit_gate(self.norm(h_BTD)).squeeze(-1).float())
            lambdas.append(lam_BT)
            if exited_BT is None:
                continue
            if self.training:
                draw_BT = torch.rand_like(lam_BT) < lam_BT.detach()
                exited_BT = exited_BT | (sampled_BT & draw_BT)
            else:
                survive_BT = survive_BT * (1 - lam_BT)
                exited_BT = exited_BT | (1 - survive_BT >= opts.exit_threshold)
        return LoopRun(states, lambdas, steps_BT)

    def body(self, x_BTD: torch.Tensor) -> torch.Tensor:
        return self.loops(x_BTD).states[-1]

    def logits(self, h_BTD: torch.Tensor) -> torch.Tensor:
        """The shared head on a hidden state: [B, T, D] -> [B, T, V]."""
        weight_VD = self.embed.weight if self.head is None else self.head.weight
        return self.norm(h_BTD) @ weight_VD.T

    def training_loss(self, inputs_BT: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
        """Without a gate: CE of the last loop. With one: the Ouro stage-I
        objective, sum_r p(r) CE_r - beta H(p), averaged over scored tokens."""
        states, lambdas, _ = self.loops(self.embed(inputs_BT), keep_all=self.exit_gate is not None)
        scored_BT = targets_BT != IGNORE
        if not lambdas:
            return _cross_entropy(self.logits(states[-1]), targets_BT).sum() / scored_BT.sum().clamp(min=1)
        ce_BTL = torch.stack([_cross_entropy(self.logits(h_BTD), targets_BT) for h_BTD in states], dim=-1)
        p_BTL = exit_distribution(lambdas)
        entropy_BT = -(p_BTL * p_BTL.clamp_min(1e-12).log()).sum(-1)
        per_token_BT = (p_BTL * ce_BTL).sum(-1) - self.options.exit_entropy * entropy_BT
        return (per_token_BT * scored_BT).sum() / scored_BT.sum().clamp(min=1)

    def gate_loss(self, inputs_BT: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
        """Ouro stage II: the LM frozen (no gradient reaches it), the gate fitted
        to exit where the next loop stops improving each token's loss. Mean
        over scored tokens and the L - 1 gates."""
        if self.exit_gate is None or self.options.loops < 2:
            raise ValueError("looped: the gate's training stage needs exit_gate=true and loops >= 2")
        with torch.no_grad():
            states = self.loops(self.embed(inputs_BT), keep_all=True, exits=False).states
            ce_BTL = torch.stack([_cross_entropy(self.logits(h_BTD), targets_BT) for h_BTD in states], dim=-1)
            normed = [self.norm(h_BTD) for h_BTD in states[:-1]]
            improvement_BTR = (ce_BTL[..., :-1] - ce_BTL[..., 1:]).clamp(min=0)
            exit_target_BTR = 1 - torch.sigmoid(GATE_SHARPNESS * (improvement_BTR - GATE_MARGIN))
        logit_BTR = torch.stack([self.exit_gate(n_BTD).squeeze(-1).float() for n_BTD in normed], dim=-1)
        bce_BTR = F.binary_cross_entropy_with_logits(logit_BTR, exit_target_BTR, reduction="none")
        scored_BT = targets_BT != IGNORE
        return (bce_BTR.mean(-1) * scored_BT).sum() / scored_BT.sum().clamp(min=1)


def _cross_entropy(logits_BTV: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
    """Per-token CE [B, T] in fp32, zero where the target is IGNORE."""
    flat = F.cross_entropy(logits_BTV.flatten(0, 1).float(), targets_BT.flatten(), ignore_index=IGNORE,
                           reduction="none")
    return flat.view(targets_BT.shape)
