"""The counting formulas of ``swiglu`` (parameters, FLOPs, state), importable without torch.

``swiglu.py`` holds the module and re-exports these; the registry reads them from here,
so planning counts a model without importing torch."""

from __future__ import annotations

from archsearch.arch.spec import ArchSpec, LayerSpec


def params(spec: ArchSpec, layer: LayerSpec) -> int:
    """Gate, up and down projections: 3 D F."""
    return 3 * spec.d_model * layer.mlp_width


def flops(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> float:
    """Forward FLOPs per token: 2 per weight (the SiLU and product are not counted)."""
    return 2 * params(spec, layer)
