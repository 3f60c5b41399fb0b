"""Depth pruning: rank layers, delete the k least useful, measure what is left.

Three rankings, least useful first:

- ``rho``: ``|rho - 1|`` (Basu et al., https://arxiv.org/abs/2603.20991): a
  layer that passes an error through unchanged is closest to the identity;
- ``bi``: ShortGPT's Block Influence (Men et al., https://arxiv.org/abs/2403.03853),
  ``1 - mean_tokens cos(h_in, h_out)`` of the hidden states around the layer;
- ``blend``: ``alpha * rank(bi) + (1 - alpha) * rank(|rho - 1|)``.

The k lowest are deleted from a copy of the model (a stack with fewer layers,
as a shallower trial would be built), and perplexity and measured forward
tokens/s are read on the calibration batches for k = 1 .. L/2.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch
from torch import nn

from archsearch.data import Batch
from archsearch.inspect._trace import perplexity, tokens_per_second, trace
from archsearch.inspect.rho import _ranks, error_contraction

RANKINGS = ("rho", "bi", "blend")


@torch.no_grad()
def block_influence(model: nn.Module, batches: list[Batch]) -> list[float]:
    """ShortGPT's BI per layer: 1 - the mean over tokens of cos(input, output)."""
    model.eval()
    device = next(model.parameters()).device
    sums, tokens = None, 0
    for batch in batches:
        run = trace(model, batch.inputs.to(device))
        cosines = [torch.cosine_similarity(i, o, dim=-1).sum() for i, o in zip(run.inputs, run.outputs)]
        sums = cosines if sums is None else [s + c for s, c in zip(sums, cosines)]
        tokens += batch.inputs.numel()
    return [1.0 - float(total) / tokens for total in sums]


def rank_layers(*, rho: list[float], bi: list[float], by: str, alpha: float = 0.5) -> list[int]:
    """Layer indices, the first to remove first (ties broken by depth, deepest first)."""
    if by not in RANKINGS:
        raise ValueError(f"unknown ranking {by!r}; choose one of {', '.join(RANKINGS)}")
    distance = [abs(r - 1) for r in rho]
    score = {"rho": distance, "bi": bi}.get(by)
    if score is None:
        score = [alpha * b + (1 - alpha) * d for b, d in zip(_ranks(bi), _ranks(distance))]
    return sorted(range(len(score)), key=lambda index: (score[index], -index))


def check_stack(model: nn.Module) -> None:
    """A ValueError unless ``model`` is a stack model (the only structure layers can be removed from)."""
    spec = getattr(model, "spec", None)
    if spec is None or spec.structure != "stack":
        raise ValueError(f"depth pruning removes layers of stack models only; this model is "
                         f"'{getattr(spec, 'structure', type(model).__name__)}'")


def remove_layers(model: nn.Module, drop: set[int] | list[int]) -> nn.Module:
    """A copy of a stack model without the layers ``drop``; the rest keep their weights and order."""
    check_stack(model)
    spec, drop = model.spec, set(drop)
    kept = [index for index in range(spec.num_layers) if index not in drop]
    if not kept:
        raise ValueError("cannot remove every layer")
    pruned = copy.deepcopy(model)
    pruned.layers = nn.ModuleList(pruned.layers[index] for index in kept)
    pruned.spec = replace(spec, layers=tuple(spec.layers[index] for index in kept))
    return pruned.eval()


def layer_scores(model: nn.Module, batches: list[Batch], *, noise: float = 1e-2) -> dict[str, list[float]]:
    """What the rankings read, per layer: rho (noise injected at the first layer) and Block Influence."""
    return dict(rho=error_contraction(model, batches, mode="noise", noise=noise, measure=False).rho,
                bi=block_influence(model, batches))


def depth_pruning(model: nn.Module, batches: list[Batch], *, rankings: tuple[str, ...] = RANKINGS,
                  max_removed: int | None = None, alpha: float = 0.5, scores: dict[str, list[float]] | None = None,
                  repeats: int = 3) -> list[dict]:
    """Rows (ranking, removed, layers, perplexity, tokens_per_s) for k = 0 .. max_removed
    (default L // 2) layers removed per ranking; k = 0 is the whole model.
    ``scores``: ``layer_scores`` already computed."""
    check_stack(model)
    count = model.spec.num_layers
    max_removed = count // 2 if max_removed is None else max_removed
    if not 1 <= max_removed < count:
        raise ValueError(f"max_removed must be in 1 .. {count - 1} for a {count}-layer model, got {max_removed}")
    scores = scores or layer_scores(model, batches)
    whole = dict(removed=0, layers=[], perplexity=perplexity(model, batches),
                 tokens_per_s=tokens_per_second(model, batches, repeats=repeats))
    rows = []
    for by in rankings:
        order = rank_layers(rho=scores["rho"], bi=scores["bi"], by=by, alpha=alpha)
        rows.append(dict(whole, ranking=by))
        for k in range(1, max_removed + 1):
            pruned = remove_layers(model, order[:k])
            rows.append(dict(ranking=by, removed=k, layers=sorted(order[:k]), perplexity=perplexity(pruned, batches),
                             tokens_per_s=tokens_per_second(pruned, batches, repeats=repeats)))
    return rows
