"""The one block registry: every mixer and MLP a layer can name.

Each entry carries the module and, beside it, its exact parameter count and
its analytic forward FLOPs per token, so ``budget`` can count a model without
building it. Adding a family is one module in ``blocks/`` and one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from archsearch.arch.blocks import attention, swiglu
from archsearch.arch.spec import ArchSpec, LayerSpec


@dataclass(frozen=True)
class Block:
    """A registered sublayer: module class plus its counting formulas."""

    module: type
    params: Callable[[ArchSpec, LayerSpec], int]
    flops: Callable[[ArchSpec, LayerSpec, int], float]


MIXERS: dict[str, Block] = {
    "attention": Block(attention.Attention, attention.params, attention.flops),
}

MLPS: dict[str, Block] = {
    "swiglu": Block(swiglu.SwiGLU, swiglu.params, swiglu.flops),
}


def mixer(name: str) -> Block:
    if name not in MIXERS:
        raise KeyError(f"unknown mixer {name!r}; registered: {sorted(MIXERS)}")
    return MIXERS[name]


def mlp(name: str) -> Block:
    if name not in MLPS:
        raise KeyError(f"unknown MLP {name!r}; registered: {sorted(MLPS)}")
    return MLPS[name]
