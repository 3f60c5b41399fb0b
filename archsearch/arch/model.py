"""Build the ``nn.Module`` for any ArchSpec through the registry."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

import torch
from torch import nn

from archsearch.arch import registry
from archsearch.arch.spec import ArchSpec


class TrainableModel(Protocol):
    """What the training loop (``train.loop``) asks of a model besides its forward.

    Every structure's module is a ``LanguageModel``, which gives a plain
    language model's answers; a structure overrides the ones it has:

    - ``own_loss``: ``training_loss(inputs_BT, targets_BT)`` is its training
      objective (an exit gate's expected loss over loops, an auxiliary loss,
      HRM's per-segment loss) instead of next-token cross-entropy of forward;
    - ``exit_gate``: an exit gate, or None; with one, ``gate_loss`` is the
      objective of the gate's own stage after the main steps;
    - ``carries_state``: inside ``carrying()`` each forward starts from the
      state the previous one left, so training reads consecutive windows;
    - ``exits_early``: tokens may leave the loops early at evaluation, which
      then reports how many loops ran (``loops(e_BTD, exits=...)``).
    """

    own_loss: bool
    exit_gate: nn.Module | None

    @property
    def carries_state(self) -> bool: ...

    @property
    def exits_early(self) -> bool: ...

    def training_loss(self, inputs_BT: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor: ...

    def gate_loss(self, inputs_BT: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor: ...

    def carrying(self) -> AbstractContextManager: ...


def build_model(spec: ArchSpec) -> nn.Module:
    """The model for ``spec``: tokens [B, T] int64 -> logits [B, T, V]; a ``TrainableModel``."""
    return registry.structure(spec.structure).module(spec)
