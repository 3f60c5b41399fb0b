"""ArchSpec: the frozen, per-layer description every model is built from.

A model is a *structure* (how layers are wired: a plain stack, a looped group,
a memory between halves, a recurrent hierarchy) over a tuple of per-layer
specs, each naming its mixer and MLP from the block registry. ``options`` hold
what a structure or block needs beyond the shared fields (loop count, state
size, gate kind), as plain JSON values. Specs round-trip through
``to_dict``/``from_dict`` so the resolved architecture is stored beside every
result. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True, kw_only=True)
class LayerSpec:
    """One residual layer: ``x + mixer(norm(x))`` then ``x + mlp(norm(x))``.

    ``mlp="none"`` (with ``mlp_width=0``) leaves the MLP out, as Mamba blocks do.
    """

    mixer: str = "attention"
    mlp: str = "swiglu"
    mlp_width: int = 0
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ArchSpec:
    """A whole language model.

    ``d_model = num_heads * head_dim``; the LM head is tied to the embedding
    unless ``tie_embeddings`` is False. ``structure`` names the registry entry
    that wires the layers; ``options`` are that structure's settings.
    """

    family: str
    vocab_size: int
    d_model: int
    num_heads: int
    layers: tuple[LayerSpec, ...]
    structure: str = "stack"
    options: dict[str, Any] = field(default_factory=dict)
    tie_embeddings: bool = True
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def mlp_widths(self) -> tuple[int, ...]:
        return tuple(layer.mlp_width for layer in self.layers)

    def to_dict(self) -> dict:
        # written out rather than dataclasses.asdict, which deep-copies and is
        # the slowest step of planning a large space
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["layers"] = [{f.name: getattr(layer, f.name) for f in fields(layer)} for layer in self.layers]
        out["layers"] = [dict(layer, options=dict(layer["options"])) for layer in out["layers"]]
        out["options"] = dict(self.options)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> ArchSpec:
        fields = dict(data)
        fields["layers"] = tuple(LayerSpec(**layer) for layer in data["layers"])
        return cls(**fields)
