"""Exact parameter counts and analytic FLOPs per token, without building a model.

Both come from the registry's formulas (the structure's, which sum its
blocks'), so a new family is counted as soon as it is registered. Tests hold
them equal to the built module (parameters) and to torch's FLOP counter
(matmuls).
"""

from __future__ import annotations

from typing import Literal

from archsearch.arch import registry
from archsearch.arch.spec import ArchSpec


def count_params(spec: ArchSpec, *, embeddings: bool = False) -> int:
    """Exact parameter count; non-embedding by default.

    Non-embedding counts every layer (mixers, MLPs, norms), the final norm and
    whatever the structure adds (gates, memories); ``embeddings=True`` adds
    the embedding and, when untied, the LM head.
    """
    structure = registry.structure(spec.structure)
    total = structure.params(spec)
    if embeddings:
        total += spec.vocab_size * structure.embedding_width(spec) * (1 if spec.tie_embeddings else 2)
    return total


def flops_per_token(spec: ArchSpec, *, seq_len: int, kind: Literal["train", "forward"] = "train") -> float:
    """Analytic FLOPs per token at ``seq_len``.

    Forward counts 2 FLOPs per weight in every matmul, the causal attention
    scores and mixing, each block's own recurrence terms, and the LM head
    (2 E V, with E the embedding width: d_model, or GPN's ``d_emb``); norms,
    activations and the softmax are left out. Training is 3x forward
    (backward ~ 2x forward), or the training forward plus 2x the part of it
    that carries gradient, where a structure runs some of it under no_grad
    (HRM's one-step gradient).
    """
    structure = registry.structure(spec.structure)
    forward = structure.flops(spec, seq_len) + 2.0 * structure.embedding_width(spec) * spec.vocab_size
    if kind == "forward":
        return forward
    if kind == "train":  # plus what only training computes (per-loop heads of an exit gate)
        trained = forward + structure.train_extra(spec, seq_len)
        graded = structure.graded(spec, seq_len)
        return 3.0 * trained if graded is None else trained + 2.0 * graded
    raise ValueError(f"kind must be 'train' or 'forward', got {kind!r}")


def weight_flops_per_token(spec: ArchSpec, *, seq_len: int) -> float:
    """Forward FLOPs per token in weight matmuls alone (LM head included):
    what torch's FLOP counter attributes to Linear and Conv modules."""
    return flops_per_token(spec, seq_len=seq_len, kind="forward") - registry.structure(spec.structure).mixing(
        spec, seq_len)


def state_size(spec: ArchSpec, *, seq_len: int) -> int:
    """Values one sequence keeps to decode its next token after ``seq_len``
    tokens: the KV cache of attention, the recurrent state of SSMs and memories.
    Multiply by the bytes per value (2 in bf16) for memory."""
    return registry.structure(spec.structure).state(spec, seq_len)
