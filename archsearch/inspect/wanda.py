"""Weight compression of a trained model's layers: Wanda, magnitude pruning, int8.

Wanda (Sun et al., https://arxiv.org/abs/2306.11695; the reference is
``locuslab/wanda`` ``lib/prune.py``) scores each weight of a linear map by
``|W_ij| * ||X_j||``, the weight's size times the norm of its input feature
over the calibration tokens, and zeroes the lowest-scored weights *within each
output row*. Layers are pruned in order, and each layer's input norms are
read with every earlier layer already pruned, so a layer sees the inputs the
pruned model will give it: in one forward over the calibration set, each
layer pruned and run again as soon as it has run. Magnitude pruning is the same with every input
norm equal to one. int8 rounds each output row to 255 levels of its own
absolute maximum.

Dimensions: O output features, I input features, L layers.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from archsearch.data import Batch
from archsearch.inspect._trace import layers_of, perplexity

METHODS = ("wanda", "magnitude", "int8")
SCHEDULES = ("uniform", "depth")


def linears(module: nn.Module) -> list[nn.Linear]:
    """Every linear map inside ``module`` (the prunable weights of a layer)."""
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def prune_rows(weight_OI: torch.Tensor, score_OI: torch.Tensor, sparsity: float) -> None:
    """Zero, in place, the ``round(I * sparsity)`` lowest-scored weights of every row
    (Wanda's code floors; rounding keeps a per-layer schedule's total closer to its target)."""
    drop = round(weight_OI.shape[1] * sparsity)
    if drop == 0:
        return
    lowest_OK = torch.sort(score_OI, dim=-1, stable=True).indices[:, :drop]
    weight_OI.scatter_(1, lowest_OK, 0.0)


def quantize_int8(weight_OI: torch.Tensor) -> None:
    """Symmetric per-row int8 round trip, in place: ``round(W / s) * s`` with ``s = max|W_row| / 127``."""
    scale_O1 = weight_OI.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127.0
    weight_OI.copy_((weight_OI / scale_O1).round().clamp(-127, 127) * scale_O1)


@torch.no_grad()
def input_norms(module: nn.Module, run: Callable[[], object]) -> dict[nn.Linear, torch.Tensor]:
    """``||X_j||_2`` over every token each linear map in ``module`` sees while ``run()`` runs: linear -> [I]."""
    sums: dict[nn.Linear, torch.Tensor] = {}

    def hook(linear, args):
        x_NI = args[0].detach().float().reshape(-1, args[0].shape[-1])
        sums[linear] = sums.get(linear, 0) + (x_NI * x_NI).sum(0)

    handles = [linear.register_forward_pre_hook(hook) for linear in linears(module)]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return {linear: total.sqrt() for linear, total in sums.items()}


@torch.no_grad()
def compress_layer(layer: nn.Module, *, method: str, sparsity: float = 0.5,
                   norms: dict[nn.Linear, torch.Tensor] | None = None) -> None:
    """Compress every linear map of ``layer`` in place. ``wanda`` needs ``norms`` (``input_norms``);
    a linear map that saw no tokens is left as it is."""
    if method not in METHODS:
        raise ValueError(f"unknown compression {method!r}; choose one of {', '.join(METHODS)}")
    for linear in linears(layer):
        weight_OI = linear.weight.data
        if method == "int8":
            quantize_int8(weight_OI)
        elif method == "magnitude":
            prune_rows(weight_OI, weight_OI.abs(), sparsity)
        elif norms is not None and linear in norms:
            prune_rows(weight_OI, weight_OI.abs() * norms[linear].to(weight_OI.device)[None, :], sparsity)


@torch.no_grad()
def compress_model(model: nn.Module, batches: list[Batch], *, method: str = "wanda",
                   sparsity: float | list[float] = 0.5) -> nn.Module:
    """A compressed copy of ``model``: every layer in order, each one's input
    norms read through the already-compressed earlier layers. ``sparsity`` is
    one value or one per layer.

    Wanda's norms come from one forward over all the calibration batches at
    once (they must have one shape): as each layer finishes, it is pruned on
    the norms its linear maps just saw and run again, and the next layer
    reads that pruned output. The norms are the ones a forward per layer
    through the pruned layers before it reads (that was L forwards), summed
    batch by batch in the same order.
    """
    pruned = copy.deepcopy(model).eval()
    layers = layers_of(pruned)
    per_layer = sparsity if isinstance(sparsity, list) else [sparsity] * len(layers)
    if len(per_layer) != len(layers):
        raise ValueError(f"{len(per_layer)} sparsities for {len(layers)} layers")
    if any(not 0 <= s < 1 for s in per_layer):
        raise ValueError(f"sparsity must be in [0, 1), got {per_layer}")
    if method != "wanda":  # no statistics to read
        for layer, layer_sparsity in zip(layers, per_layer):
            compress_layer(layer, method=method, sparsity=layer_sparsity)
        return pruned
    if len({tuple(batch.inputs.shape[1:]) for batch in batches}) > 1:
        raise ValueError("calibration batches must share one sequence length to run as one batch")
    device = next(pruned.parameters()).device
    rows = [batch.inputs.shape[0] for batch in batches]
    handles = [layer.register_forward_hook(_prune_when_run(layer, layer_sparsity, rows, last=index == len(layers) - 1),
                                           with_kwargs=True)
               for index, (layer, layer_sparsity) in enumerate(zip(layers, per_layer))]
    try:
        pruned(torch.cat([batch.inputs for batch in batches]).to(device))
    except _LastLayerPruned:  # what follows the last layer (the head) reads no norms
        pass
    finally:
        for handle in handles:
            handle.remove()
    return pruned


class _LastLayerPruned(Exception):
    """Raised by the last layer's hook: the rest of the forward is not needed."""


def _prune_when_run(layer: nn.Module, sparsity: float, rows: list[int], *, last: bool):
    """A forward hook of ``layer`` for ``compress_model``: the layer's linear maps
    have seen the calibration batches (``rows`` each, concatenated); prune it on
    their norms and hand the next layer the pruned layer's output."""
    sums: dict[nn.Linear, torch.Tensor] = {}

    def collect(linear, args):
        x = args[0].detach().float()
        # batch-major inputs are summed per calibration batch, as one forward per batch sums them
        parts = x.split([r * x.shape[0] // sum(rows) for r in rows]) if x.shape[0] % sum(rows) == 0 else [x]
        for part in parts:
            x_NI = part.reshape(-1, x.shape[-1])
            sums[linear] = sums.get(linear, 0) + (x_NI * x_NI).sum(0)

    collecting = [linear.register_forward_pre_hook(collect) for linear in linears(layer)]

    def hook(module, args, kwargs, out):
        for handle in collecting:
            handle.remove()
        compress_layer(layer, method="wanda", sparsity=sparsity,
                       norms={linear: total.sqrt() for linear, total in sums.items()})
        if last:
            raise _LastLayerPruned
        return layer.forward(*args, **kwargs)  # not layer(...): that would run this hook again

    return hook


def sparsity_schedule(kind: str, sparsity: float, sizes: list[int], *, spread: float = 0.5) -> list[float]:
    """Per-layer sparsities with the same total share of pruned weights, given each layer's weight count.

    ``uniform``: ``sparsity`` everywhere. ``depth``: a linear ramp from
    ``(1 - spread)`` to ``(1 + spread)`` times the mean, early layers pruned
    least, rescaled so the pruned weights add up to the uniform schedule's
    (a negative ``spread``, in [-1, 1], prunes early layers most).
    """
    if kind not in SCHEDULES:
        raise ValueError(f"unknown schedule {kind!r}; choose one of {', '.join(SCHEDULES)}")
    if not -1 <= spread <= 1:
        raise ValueError(f"spread must be in [-1, 1], got {spread}")
    count = len(sizes)
    if kind == "uniform" or count == 1:
        return [sparsity] * count
    ramp = [1 + spread * (2 * index / (count - 1) - 1) for index in range(count)]
    scale = sparsity * sum(sizes) / sum(n * r for n, r in zip(sizes, ramp))
    return [min(0.99, scale * r) for r in ramp]


def zero_fraction(model: nn.Module) -> list[float]:
    """The share of zero weights in each layer's linear maps."""
    out = []
    for layer in layers_of(model):
        weights = [linear.weight for linear in linears(layer)]
        out.append(sum(int((w == 0).sum()) for w in weights) / max(1, sum(w.numel() for w in weights)))
    return out


def compare_schedules(model: nn.Module, batches: list[Batch], *, sparsity: float = 0.5, spread: float = 0.5,
                      method: str = "wanda") -> list[dict]:
    """Perplexity of the dense model and of each schedule at the same total
    sparsity: rows (schedule, layer, metric, value), ``layer`` None for the
    whole model."""
    sizes = [sum(linear.weight.numel() for linear in linears(layer)) for layer in layers_of(model)]
    rows = [dict(schedule="dense", layer=None, metric="perplexity", value=perplexity(model, batches))]
    for kind in SCHEDULES:
        plan = sparsity_schedule(kind, sparsity, sizes, spread=spread)
        pruned = compress_model(model, batches, method=method, sparsity=plan)
        zeros = zero_fraction(pruned)
        rows.append(dict(schedule=kind, layer=None, metric="perplexity", value=perplexity(pruned, batches)))
        rows.append(dict(schedule=kind, layer=None, metric="sparsity",
                         value=sum(z * n for z, n in zip(zeros, sizes)) / sum(sizes)))
        rows += [dict(schedule=kind, layer=index, metric="sparsity", value=z) for index, z in enumerate(zeros)]
    return rows
