"""The counting formulas of ``gated_attention`` (parameters, FLOPs, state), importable without torch.

``gated_attention.py`` holds the module and re-exports these; the registry reads them from here,
so planning counts a model without importing torch."""

from __future__ import annotations

from archsearch.arch.blocks.attention_counts import mixing as attention_mixing
from archsearch.arch.spec import ArchSpec, LayerSpec


GATES = ("elementwise", "headwise")


def gate_width(spec: ArchSpec, layer: LayerSpec) -> int:
    """Gate values per head, G: K for an elementwise gate, 1 for a headwise one."""
    gate = layer.options.get("gate", "elementwise")
    if gate not in GATES:
        raise ValueError(f"gated attention: options['gate'] must be one of {GATES}, got {gate!r}")
    return spec.head_dim if gate == "elementwise" else 1


def params(spec: ArchSpec, layer: LayerSpec) -> int:
    """Q, K, V and output projections 4 D^2, plus the gate projection D * H * G
    (+D^2 elementwise when H*K = D, +D*H headwise)."""
    return 4 * spec.d_model**2 + spec.d_model * spec.num_heads * gate_width(spec, layer)


def mixing(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> float:
    """QK^T and AV over the causal context, as for plain attention: 2 * T * D.
    The sigmoid and the gate product are elementwise and not counted."""
    return attention_mixing(spec, layer, seq_len)


def flops(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> float:
    """Forward FLOPs per token: 2 per projection weight (gate included) plus the attention mixing."""
    return 2 * params(spec, layer) + mixing(spec, layer, seq_len)


def state(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> int:
    """The KV cache, as for plain attention: a key and a value of width D per token seen
    (the gate is computed from the current token and is not kept)."""
    return 2 * seq_len * spec.d_model
