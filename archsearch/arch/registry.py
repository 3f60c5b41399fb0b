"""The one registry: sublayer blocks (in ``blocks``) and model structures.

A structure wires per-layer blocks into a whole model (a plain stack, a looped
group, a memory between halves, a recurrent hierarchy) and carries its exact
non-embedding parameter count and its forward FLOPs per token beside it, from
the torch-free ``structures/<name>_counts.py``; its module class is named by
path and imported only when a model is built. Adding a structure is a module
and its counts in ``structures/`` and one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from archsearch.arch.blocks import MIXERS, MLPS, Block, load_class, mixer, mlp
from archsearch.arch.spec import ArchSpec
from archsearch.arch.structures import gpn_counts as gpn
from archsearch.arch.structures import hrm_counts as hrm
from archsearch.arch.structures import looped_counts as looped
from archsearch.arch.structures import memory_counts as memory
from archsearch.arch.structures import stack_counts as stack


def _state_unknown(spec: ArchSpec, seq_len: int) -> int:
    raise NotImplementedError(f"structure {spec.structure!r} has no state formula yet")


def _no_extra(spec: ArchSpec, seq_len: int) -> float:
    return 0.0


def _model_width(spec: ArchSpec) -> int:
    return spec.d_model


def _all_graded(spec: ArchSpec, seq_len: int) -> None:
    return None


@dataclass(frozen=True)
class Structure:
    """A registered model structure: module class (by path) plus its counting formulas."""

    # the module class, or its path ("package.module.Class"), imported only when a model is built
    ref: type | str
    params: Callable[[ArchSpec], int]  # non-embedding
    flops: Callable[[ArchSpec, int], float]  # forward per token at seq_len, LM head excluded
    mixing: Callable[[ArchSpec, int], float]  # the part of flops that is not weight matmuls
    state: Callable[[ArchSpec, int], int] = _state_unknown  # values kept per sequence after seq_len tokens
    # forward FLOPs per token that only training runs (an exit gate's LM head after every loop)
    train_extra: Callable[[ArchSpec, int], float] = _no_extra
    # the width of the embedding and LM head (GPN's may differ from d_model)
    embedding_width: Callable[[ArchSpec], int] = _model_width
    # training forward FLOPs per token that carry gradient (the backward's share),
    # or None when all of them do (training is then 3x forward)
    graded: Callable[[ArchSpec, int], float | None] = _all_graded

    @property
    def module(self) -> type:
        return load_class(self.ref)


_AT = "archsearch.arch.structures."
STRUCTURES: dict[str, Structure] = {
    "stack": Structure(_AT + "stack.Stack", stack.params, stack.flops, stack.mixing, stack.state),
    "looped": Structure(_AT + "looped.Looped", looped.params, looped.flops, looped.mixing, looped.state,
                         looped.train_extra),
    "memory": Structure(_AT + "memory.MemoryStack", memory.params, memory.flops, memory.mixing,
                        memory.state, memory.train_extra),
    "gpn": Structure(_AT + "gpn.GPN", gpn.params, gpn.flops, gpn.mixing, gpn.state,
                     embedding_width=gpn.embedding_width),
    "gpn_m": Structure(_AT + "gpn.GPN", gpn.params, gpn.flops, gpn.mixing, gpn.state,
                       embedding_width=gpn.embedding_width),
    "hrm": Structure(_AT + "hrm.HRM", hrm.hrm_params, hrm.hrm_flops, hrm.hrm_mixing, hrm.hrm_state,
                     hrm.hrm_train_extra, graded=hrm.hrm_graded),
    "universal": Structure(_AT + "hrm.Universal", hrm.ut_params, hrm.ut_flops, hrm.ut_mixing, hrm.ut_state),
}


def structure(name: str) -> Structure:
    if name not in STRUCTURES:
        raise KeyError(f"unknown structure {name!r}; registered: {sorted(STRUCTURES)}")
    return STRUCTURES[name]


__all__ = ["MIXERS", "MLPS", "STRUCTURES", "Block", "Structure", "mixer", "mlp", "structure"]
