"""Build the ``nn.Module`` for any ArchSpec through the registry."""

from __future__ import annotations

from torch import nn

from archsearch.arch import registry
from archsearch.arch.spec import ArchSpec


def build_model(spec: ArchSpec) -> nn.Module:
    """The model for ``spec``: tokens [B, T] int64 -> logits [B, T, V]."""
    return registry.structure(spec.structure).module(spec)
