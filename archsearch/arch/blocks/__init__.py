"""Sublayer blocks: every mixer and MLP a layer can name.

Each entry carries the module's path and, beside it, its exact parameter count
and its analytic forward FLOPs per token, so ``budget`` counts a model without
building it, or importing torch: the formulas live in ``<block>_counts.py``
(torch-free, re-exported by ``<block>.py``), the module class is imported only
when a model is built. Adding a mixer is a module and its counts here and one
line in the table.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from archsearch.arch.blocks import (
    attention_counts,
    gated_attention_counts,
    gated_deltanet_counts,
    hope_counts,
    mamba2_counts,
    mamba_counts,
    swiglu_counts,
    titans_counts,
)
from archsearch.arch.spec import ArchSpec, LayerSpec


def load_class(ref: type | str) -> type:
    """The class ``ref`` is or names ("package.module.Class", imported now): the registry
    names its module classes by path, so counting a model never imports torch."""
    if isinstance(ref, type):
        return ref
    module, _, name = ref.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _no_mixing(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> float:
    return 0.0


def _no_state(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> int:
    return 0


@dataclass(frozen=True)
class Block:
    """A registered sublayer: module class plus its counting formulas.

    ``flops`` is the whole forward count per token; ``mixing`` is the part of
    it that is not a weight matmul (attention scores, scans, state updates),
    which torch's FLOP counter sees differently or not at all. ``state`` is
    the number of values a sequence keeps to generate its next token after
    ``seq_len`` tokens (KV cache, recurrent state); MLPs keep none.
    """

    # the module class, or its path ("package.module.Class"), imported only when a model is built
    ref: type | str
    params: Callable[[ArchSpec, LayerSpec], int]
    flops: Callable[[ArchSpec, LayerSpec, int], float]
    mixing: Callable[[ArchSpec, LayerSpec, int], float] = _no_mixing
    state: Callable[[ArchSpec, LayerSpec, int], int] = _no_state

    @property
    def module(self) -> type:
        return load_class(self.ref)


def _block(module: str, name: str, counts, *, mixer: bool = True) -> Block:
    """The entry for class ``name`` of ``blocks/<module>.py``, with the formulas of ``counts``."""
    if not mixer:
        return Block(f"archsearch.arch.blocks.{module}.{name}", counts.params, counts.flops)
    return Block(f"archsearch.arch.blocks.{module}.{name}", counts.params, counts.flops, counts.mixing, counts.state)


MIXERS: dict[str, Block] = {
    "attention": _block("attention", "Attention", attention_counts),
    "gated_attention": _block("gated_attention", "GatedAttention", gated_attention_counts),
    "mamba": _block("mamba", "Mamba", mamba_counts),
    "mamba2": _block("mamba2", "Mamba2", mamba2_counts),
    "gated_deltanet": _block("gated_deltanet", "GatedDeltaNet", gated_deltanet_counts),
    "titans": _block("titans", "Titans", titans_counts),
}

MLPS: dict[str, Block] = {
    "swiglu": _block("swiglu", "SwiGLU", swiglu_counts, mixer=False),
    "cms": _block("hope", "ContinuumMemory", hope_counts, mixer=False),
}


def mixer(name: str) -> Block:
    if name not in MIXERS:
        raise KeyError(f"unknown mixer {name!r}; registered: {sorted(MIXERS)}")
    return MIXERS[name]


def mlp(name: str) -> Block:
    if name not in MLPS:
        raise KeyError(f"unknown MLP {name!r}; registered: {sorted(MLPS)}")
    return MLPS[name]
