"""Data parallelism inside one trial: torch DDP over a process group made elsewhere.

Whoever starts the workers (``archsearch.execute`` starts N Ray workers and a
gloo or NCCL rendezvous) hands ``train_trial`` a ``Rank``; nothing here knows
of Ray. Every rank draws the same global batch from the same seeded stream
and trains on its own contiguous slice of rows; DDP averages the gradients,
and each slice's loss is weighted so that average is the global batch's
gradient (up to rounding), whatever the number of workers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from archsearch.data import Batch


@dataclass(frozen=True, kw_only=True)
class Rank:
    """This process's place in a trial's workers; ``group`` is an initialised process group."""

    rank: int
    world: int
    group: Any

    @property
    def leader(self) -> bool:
        """Rank 0 reports evaluations and writes checkpoints."""
        return self.rank == 0


class Objective(torch.nn.Module):
    """The training loss as a module's forward, so DDP's hooks see it (a model's
    own ``training_loss`` or ``gate_loss`` would bypass a wrapped forward)."""

    def __init__(self, model: torch.nn.Module, loss: Callable[..., torch.Tensor]):
        super().__init__()
        self.model, self.loss = model, loss

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor, gate_only: bool = False) -> torch.Tensor:
        return self.loss(self.model, Batch(inputs=inputs, targets=targets), gate_only=gate_only)


def data_parallel(model: torch.nn.Module, loss: Callable[..., torch.Tensor], rank: Rank,
                  device: torch.device) -> torch.nn.parallel.DistributedDataParallel:
    """``loss(model, batch, gate_only=...)`` wrapped in DDP over ``rank.group``.
    Unused parameters are allowed: an exit gate's stage trains the gate alone."""
    ids = [device.index or 0] if device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(Objective(model, loss), device_ids=ids,
                                                     process_group=rank.group, find_unused_parameters=True)


def shard(batch: Batch, rank: Rank) -> Batch:
    """This rank's contiguous share of the global batch's rows."""
    rows = batch.inputs.shape[0] // rank.world
    part = slice(rank.rank * rows, (rank.rank + 1) * rows)
    return Batch(inputs=batch.inputs[part], targets=batch.targets[part])


def mean(value: float, rank: Rank, device: torch.device) -> float:
    """The mean of ``value`` over the ranks."""
    total = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(total, group=rank.group)
    return float(total.item()) / rank.world
