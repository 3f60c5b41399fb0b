"""From a point of a space to an ArchSpec, given the widths the solver picks.

A family here is a recipe for the per-layer tuple; the blocks themselves live
in the registry. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from archsearch.arch.spec import ArchSpec, LayerSpec
from archsearch.arch.taper import taper_widths
from archsearch.budget.solve import SpecMaker
from archsearch.space.schema import Space


def spec_maker(space: Space, point: Mapping[str, Any], *, vocab_size: int) -> SpecMaker:
    """A function (d_model, total MLP width) -> ArchSpec for this point."""
    options = space.model
    num_layers = point["num_layers"]

    def make(d_model: int, total_width: int) -> ArchSpec:
        widths = taper_widths(shape=point["taper.shape"], ratio=point["taper.ratio"], num_layers=num_layers,
                              total=total_width, multiple_of=options.multiple_of)
        return ArchSpec(
            family=space.family,
            vocab_size=vocab_size,
            d_model=d_model,
            num_heads=d_model // options.head_dim,
            layers=tuple(LayerSpec(mixer="attention", mlp="swiglu", mlp_width=w) for w in widths),
            tie_embeddings=options.tie_embeddings,
            rope_theta=options.rope_theta,
        )

    return make
