"""The counting formulas of ``stack`` (parameters, FLOPs, state), importable without torch.

``stack.py`` holds the module and re-exports these; the registry reads them from here,
so planning counts a model without importing torch."""

from __future__ import annotations

from archsearch.arch import blocks
from archsearch.arch.spec import ArchSpec, LayerSpec


def layer_params(spec: ArchSpec, layer: LayerSpec) -> int:
    """One layer: mixer, MLP and their pre-norm weights."""
    total = blocks.mixer(layer.mixer).params(spec, layer) + spec.d_model
    if layer.mlp != "none":
        total += blocks.mlp(layer.mlp).params(spec, layer) + spec.d_model
    return total


def layer_mixing(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> float:
    """The part of ``layer_flops`` that is not weight matmuls."""
    return blocks.mixer(layer.mixer).mixing(spec, layer, seq_len)


def layer_flops(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> float:
    """Forward FLOPs per token of one layer (matmuls and attention)."""
    total = blocks.mixer(layer.mixer).flops(spec, layer, seq_len)
    if layer.mlp != "none":
        total += blocks.mlp(layer.mlp).flops(spec, layer, seq_len)
    return total


def reject_unknown_options(spec: ArchSpec, known: set[str]) -> None:
    """A ValueError naming any ``spec.options`` key the structure does not read."""
    unknown = set(spec.options) - known
    if unknown:
        raise ValueError(f"{spec.structure}: unknown options {sorted(unknown)}; known: {sorted(known)}")


def params(spec: ArchSpec) -> int:
    """Non-embedding parameters: every layer plus the final norm."""
    return sum(per_layer(spec, layer_params)) + spec.d_model


def flops(spec: ArchSpec, seq_len: int) -> float:
    """Forward FLOPs per token of the body (the LM head is counted by the caller)."""
    return sum(per_layer(spec, layer_flops, seq_len))


def per_layer(spec: ArchSpec, formula, *args) -> list:
    """``formula(spec, layer, *args)`` for every layer, computed once per
    distinct layer: a deep stack repeats a handful of layer specs, and the
    planner counts thousands of candidate models."""
    seen: dict = {}
    out = []
    for layer in spec.layers:
        # options dicts are shared between the layers a family builds, and
        # held alive by the spec, so their identity is a cheap exact key
        key = (layer.mixer, layer.mlp, layer.mlp_width, id(layer.options))
        if key not in seen:
            seen[key] = formula(spec, layer, *args)
        out.append(seen[key])
    return out


def mixing(spec: ArchSpec, seq_len: int) -> float:
    """The part of ``flops`` that is not weight matmuls (attention, scans)."""
    return sum(per_layer(spec, layer_mixing, seq_len))


def state(spec: ArchSpec, seq_len: int) -> int:
    """Values a sequence keeps after ``seq_len`` tokens: the sum over layers."""
    return sum(per_layer(spec, lambda s, layer, t: blocks.mixer(layer.mixer).state(s, layer, t), seq_len))
