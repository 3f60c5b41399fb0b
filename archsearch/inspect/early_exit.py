"""Early exit of looped models with an exit gate: perplexity against compute.

A looped model (``structures/looped.py``) with ``exit_gate`` lets a token stop
after the first loop whose cumulative exit probability reaches
``exit_threshold``; later loops skip it, which leaves *cache holes*: later
tokens read its keys, values and scan state from its exit loop. As the
threshold falls, fewer loop steps run and perplexity rises; ``exit_curve``
reads that trade-off on calibration batches.

Cache-hole adaptation (papers.md §3.3, an inferred design) continues training
with the structure's ``cache_hole`` option: tokens draw exit loops from the
gate and are frozen after them, so the model learns to read the holes it will
meet. ``adapt_cache_holes`` does that on a copy, so one trained trial gives
the curve with and without it.

Dimensions: B batch, T time, D model width, V vocabulary.
"""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from archsearch.data import IGNORE, Batch

THRESHOLDS = (0.5, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)


def check_exit_model(model: nn.Module) -> None:
    """A ValueError unless ``model`` is a looped model with an exit gate and at least two loops."""
    structure = getattr(getattr(model, "spec", None), "structure", type(model).__name__)
    if structure != "looped" or getattr(model, "exit_gate", None) is None or model.options.loops < 2:
        raise ValueError(f"early exit needs a looped model with exit_gate=true and loops >= 2; this model is "
                         f"'{structure}'" + (" without an exit gate" if structure == "looped" else ""))


@torch.no_grad()
def exit_point(model: nn.Module, batches: list[Batch], threshold: float | None) -> dict:
    """Perplexity and the share of token-loop steps run at one ``threshold``
    (None: every token runs every loop)."""
    check_exit_model(model)
    saved, was_training = model.options, model.training
    model.options = replace(saved, exit_threshold=threshold)
    model.eval()
    device = next(model.parameters()).device
    total, scored, ran, possible = 0.0, 0, 0, 0
    try:
        for batch in batches:
            inputs_BT, targets_BT = batch.inputs.to(device), batch.targets.to(device)
            run = model.loops(model.embed(inputs_BT), exits=threshold is not None)
            logits_BTV = model.logits(run.states[-1])
            total += F.cross_entropy(logits_BTV.flatten(0, 1).float(), targets_BT.flatten(), ignore_index=IGNORE,
                                     reduction="sum").item()
            scored += int((targets_BT != IGNORE).sum())
            ran += int(run.steps_BT.sum())
            possible += run.steps_BT.numel() * saved.loops
    finally:
        model.options = saved
        model.train(was_training)
    return dict(threshold=threshold, perplexity=math.exp(total / max(1, scored)), loop_fraction=ran / possible)


def exit_curve(model: nn.Module, batches: list[Batch], thresholds: tuple[float, ...] = THRESHOLDS) -> list[dict]:
    """``exit_point`` with every loop run (threshold None) and at each threshold."""
    return [exit_point(model, batches, threshold) for threshold in (None, *thresholds)]


def adapt_cache_holes(model: nn.Module, batches: list[Batch], *, cache_hole: float = 0.5, lr: float = 1e-4,
                      grad_clip: float = 1.0, seed: int = 0) -> nn.Module:
    """A copy of ``model`` trained one AdamW step per batch with ``cache_hole``
    (the share of tokens that take a sampled exit); returned in eval mode with
    its options as before."""
    check_exit_model(model)
    if not 0 < cache_hole <= 1:
        raise ValueError(f"cache_hole must be in (0, 1], got {cache_hole}")
    torch.manual_seed(seed)
    adapted = copy.deepcopy(model)
    saved = adapted.options
    adapted.options = replace(saved, cache_hole=cache_hole)
    device = next(adapted.parameters()).device
    optimizer = torch.optim.AdamW(adapted.parameters(), lr=lr, weight_decay=0.0)
    adapted.train()
    for batch in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = adapted.training_loss(batch.inputs.to(device), batch.targets.to(device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(adapted.parameters(), grad_clip)
        optimizer.step()
    adapted.options = saved
    return adapted.eval()
