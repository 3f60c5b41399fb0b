"""The counting formulas of ``attention`` (parameters, FLOPs, state), importable without torch.

``attention.py`` holds the module and re-exports these; the registry reads them from here,
so planning counts a model without importing torch."""

from __future__ import annotations

from archsearch.arch.spec import ArchSpec, LayerSpec


def params(spec: ArchSpec, layer: LayerSpec) -> int:
    """Q, K, V and output projections: 4 D^2."""
    return 4 * spec.d_model**2


def mixing(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> float:
    """QK^T and AV over the causal context (on average T/2 keys): 2 * 2 * (T/2) * D."""
    return 2 * seq_len * spec.d_model


def flops(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> float:
    """Forward FLOPs per token: projections 2 * 4D^2 plus the attention mixing."""
    return 2 * params(spec, layer) + mixing(spec, layer, seq_len)


def state(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> int:
    """The KV cache: a key and a value of width D for every token seen."""
    return 2 * seq_len * spec.d_model
