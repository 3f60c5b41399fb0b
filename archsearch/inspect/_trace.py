"""What every analysis shares: the hidden states around each layer (read with
hooks, so any model whose ``layers`` run once each in order can be traced),
perplexity and measured speed on a calibration set.

Dimensions: B batch, T time, D model width, L layers.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from archsearch.data import IGNORE, Batch

# Structures whose ``layers`` each run exactly once per forward, in order: the
# per-layer analyses (rho, Block Influence, hidden-state probes) read these.
SEQUENTIAL = ("stack", "memory")


def layers_of(model: nn.Module) -> nn.ModuleList:
    """The model's ``layers``; a ValueError for a structure that reuses them."""
    structure = getattr(getattr(model, "spec", None), "structure", "stack")
    layers = getattr(model, "layers", None)
    if structure not in SEQUENTIAL or not isinstance(layers, nn.ModuleList):
        raise ValueError(f"per-layer analyses need layers that run once each ({', '.join(SEQUENTIAL)} "
                         f"structures); this model is '{structure}'")
    return layers


@dataclass
class Trace:
    """Each layer's input and output hidden state, [B, T, D] each, in fp32."""

    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]


@torch.no_grad()
def trace(model: nn.Module, tokens_BT: torch.Tensor, *, perturb: dict[int, torch.Tensor] | None = None,
          replace: dict[int, nn.Module] | None = None) -> Trace:
    """One forward of ``model`` on ``tokens_BT`` recording every layer's input and output.

    ``perturb[l]`` ([B, T, D]) is added to layer l's input; ``replace[l]`` is
    run instead of layer l (a compressed copy). The model is left as it was.
    """
    layers = layers_of(model)
    perturb, replace = perturb or {}, replace or {}
    inputs: list = [None] * len(layers)
    outputs: list = [None] * len(layers)

    def pre_hook(index):
        def hook(module, args):
            x_BTD = args[0] + perturb[index].to(args[0].dtype) if index in perturb else args[0]
            inputs[index] = x_BTD.float()
            return (x_BTD, *args[1:])
        return hook

    def post_hook(index):
        def hook(module, args, out_BTD):
            if index in replace:
                out_BTD = replace[index](args[0])
            outputs[index] = out_BTD.float()
            return out_BTD
        return hook

    handles = []
    for index, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(pre_hook(index)))
        handles.append(layer.register_forward_hook(post_hook(index)))
    try:
        model(tokens_BT)
    finally:
        for handle in handles:
            handle.remove()
    return Trace(inputs=inputs, outputs=outputs)


@torch.no_grad()
def perplexity(model: nn.Module, batches: list[Batch]) -> float:
    """exp of the mean next-token cross-entropy over every scored target of ``batches``."""
    device = next(model.parameters()).device
    total, scored = 0.0, 0
    for batch in batches:
        logits_BTV = model(batch.inputs.to(device))
        targets_BT = batch.targets.to(device)
        total += F.cross_entropy(logits_BTV.flatten(0, 1).float(), targets_BT.flatten(), ignore_index=IGNORE,
                                 reduction="sum").item()
        scored += int((targets_BT != IGNORE).sum())
    return math.exp(total / max(1, scored))


@torch.no_grad()
def tokens_per_second(model: nn.Module, batches: list[Batch], *, repeats: int = 3) -> float:
    """Forward tokens per second over ``batches``: the fastest of ``repeats`` timed passes after one
    untimed warm-up (the fastest, as a shared machine only ever slows a pass down)."""
    device = next(model.parameters()).device
    inputs = [batch.inputs.to(device) for batch in batches]
    model(inputs[0])
    best = math.inf
    for _ in range(repeats):
        _synchronize(device)
        began = time.perf_counter()
        for tokens_BT in inputs:
            model(tokens_BT)
        _synchronize(device)
        best = min(best, time.perf_counter() - began)
    return sum(t.numel() for t in inputs) / best


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
