"""Exact parameter counts and analytic FLOPs per token, without building a model.

Both sum the registry's per-block formulas over the layer specs, so a new
family is counted as soon as its block is registered. Tests hold them equal to
the built module (parameters) and to torch's FLOP counter (matmuls).
"""

from __future__ import annotations

from typing import Literal

from archsearch.arch import registry
from archsearch.arch.spec import ArchSpec


def count_params(spec: ArchSpec, *, embeddings: bool = False) -> int:
    """Exact parameter count; non-embedding by default.

    Non-embedding counts every layer (mixer, MLP, both RMSNorm weights) and
    the final norm; ``embeddings=True`` adds the embedding and, when untied,
    the LM head.
    """
    d = spec.d_model
    total = d  # final norm
    for layer in spec.layers:
        total += registry.mixer(layer.mixer).params(spec, layer)
        total += registry.mlp(layer.mlp).params(spec, layer)
        total += 2 * d  # the two pre-norm weights
    if embeddings:
        total += spec.vocab_size * d * (1 if spec.tie_embeddings else 2)
    return total


def flops_per_token(spec: ArchSpec, *, seq_len: int, kind: Literal["train", "forward"] = "train") -> float:
    """Analytic FLOPs per token at ``seq_len``.

    Forward counts 2 FLOPs per weight in every matmul, the causal attention
    scores and mixing, and the LM head (2 D V); norms, activations and the
    softmax are left out. Training is 3x forward (backward ~ 2x forward).
    """
    forward = 2.0 * spec.d_model * spec.vocab_size
    for layer in spec.layers:
        forward += registry.mixer(layer.mixer).flops(spec, layer, seq_len)
        forward += registry.mlp(layer.mlp).flops(spec, layer, seq_len)
    if kind == "forward":
        return forward
    if kind == "train":
        return 3.0 * forward
    raise ValueError(f"kind must be 'train' or 'forward', got {kind!r}")
