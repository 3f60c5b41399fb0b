"""The one protocol every data source follows.

A source hands out batches of next-token training pairs. ``targets`` holds the
token each position should predict, or ``IGNORE`` where nothing is scored
(synthetic tasks supervise only their answers). Shapes: inputs and targets are
int64 ``[B, T]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:  # annotations only: planning reads vocab sizes through here without torch
    import torch

IGNORE = -100


class Batch(NamedTuple):
    inputs: torch.Tensor  # [B, T] int64 token ids
    targets: torch.Tensor  # [B, T] int64 token ids, IGNORE where unscored


class Source(Protocol):
    """A seeded stream of batches for one split ("train" or "val")."""

    vocab_size: int

    def batch(self, *, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        """One batch drawn with ``generator`` so a seed fixes the stream."""
        ...
