"""Sublayer blocks: every mixer and MLP a layer can name.

Each entry carries the module and, beside it, its exact parameter count and
its analytic forward FLOPs per token, so ``budget`` counts a model without
building it. Adding a mixer is one module here and one line in the table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from archsearch.arch.blocks import (
    attention,
    gated_attention,
    gated_deltanet,
    hope,
    mamba,
    mamba2,
    swiglu,
    titans,
)
from archsearch.arch.spec import ArchSpec, LayerSpec


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

    module: type
    params: Callable[[ArchSpec, LayerSpec], int]
    flops: Callable[[ArchSpec, LayerSpec, int], float]
    mixing: Callable[[ArchSpec, LayerSpec, int], float] = _no_mixing
    state: Callable[[ArchSpec, LayerSpec, int], int] = _no_state


MIXERS: dict[str, Block] = {
    "attention": Block(attention.Attention, attention.params, attention.flops, attention.mixing, attention.state),
    "gated_attention": Block(gated_attention.GatedAttention, gated_attention.params, gated_attention.flops,
                             gated_attention.mixing, gated_attention.state),
    "mamba": Block(mamba.Mamba, mamba.params, mamba.flops, mamba.mixing, mamba.state),
    "mamba2": Block(mamba2.Mamba2, mamba2.params, mamba2.flops, mamba2.mixing, mamba2.state),
    "gated_deltanet": Block(gated_deltanet.GatedDeltaNet, gated_deltanet.params, gated_deltanet.flops,
                            gated_deltanet.mixing, gated_deltanet.state),
    "titans": Block(titans.Titans, titans.params, titans.flops, titans.mixing, titans.state),
}

MLPS: dict[str, Block] = {
    "swiglu": Block(swiglu.SwiGLU, swiglu.params, swiglu.flops),
    "cms": Block(hope.ContinuumMemory, hope.params, hope.flops),
}


def mixer(name: str) -> Block:
    if name not in MIXERS:
        raise KeyError(f"unknown mixer {name!r}; registered: {sorted(MIXERS)}")
    return MIXERS[name]


def mlp(name: str) -> Block:
    if name not in MLPS:
        raise KeyError(f"unknown MLP {name!r}; registered: {sorted(MLPS)}")
    return MLPS[name]
