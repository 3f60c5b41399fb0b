"""ArchSpec: the frozen, per-layer description every model is built from.

A model is a tuple of per-layer specs; each names its mixer and MLP from the
block registry. Specs round-trip through ``to_dict``/``from_dict`` so the
resolved architecture is stored beside every result. Torch-free.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, kw_only=True)
class LayerSpec:
    """One residual layer: ``x + mixer(norm(x))`` then ``x + mlp(norm(x))``."""

    mixer: str = "attention"
    mlp: str = "swiglu"
    mlp_width: int


@dataclass(frozen=True, kw_only=True)
class ArchSpec:
    """A whole language model.

    ``d_model = num_heads * head_dim``; the LM head is tied to the embedding
    unless ``tie_embeddings`` is False.
    """

    family: str
    vocab_size: int
    d_model: int
    num_heads: int
    layers: tuple[LayerSpec, ...]
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
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ArchSpec:
        fields = dict(data)
        fields["layers"] = tuple(LayerSpec(**layer) for layer in data["layers"])
        return cls(**fields)
