"""The training recipe's pieces: learning-rate schedules, AdamW groups, the step budget.

Each takes a dumped ``Recipe`` (or its fields) and is pure, so a test can pin
a schedule's shape without training anything.
"""

from __future__ import annotations

import math

import torch

from archsearch.space.training import planned_steps


def lr_at(step: int, *, lr: float, warmup_steps: int, steps: int, min_lr_ratio: float,
          schedule: str = "cosine", decay_fraction: float = 0.2) -> float:
    """The learning rate of ``step`` (0-based); ``lr_at(steps)`` is the floor ``min_lr_ratio * lr``.

    Both schedules warm up linearly to ``lr`` over ``warmup_steps``. cosine
    then decays to the floor over the remaining steps. wsd (warmup-stable-decay,
    https://arxiv.org/abs/2404.06395) holds ``lr`` and decays linearly to the
    floor over the last ``decay_fraction`` of the steps, so one run's stable
    phase can be branched into several budgets
    (https://arxiv.org/abs/2405.18392).
    """
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "cosine":
        progress = (step - warmup_steps) / max(1, steps - warmup_steps)
        return lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))
    if schedule == "wsd":
        decay_start = max(warmup_steps, steps - round(decay_fraction * steps))
        if step < decay_start:
            return lr
        progress = min(1.0, (step - decay_start) / max(1, steps - decay_start))
        return lr * (1 - (1 - min_lr_ratio) * progress)
    raise ValueError(f"unknown schedule {schedule!r}; expected cosine or wsd")


def recipe_lr(step: int, recipe: dict, *, steps: int) -> float:
    """``lr_at`` with a dumped Recipe's fields, over ``steps`` resolved steps."""
    return lr_at(step, lr=recipe["lr"], warmup_steps=recipe["warmup_steps"], steps=steps,
                 min_lr_ratio=recipe["min_lr_ratio"], schedule=recipe.get("schedule", "cosine"),
                 decay_fraction=recipe.get("decay_fraction", 0.2))


def decays(param: torch.nn.Parameter) -> bool:
    """Whether weight decay applies: matrices yes; norms, biases (1-d) and parameters marked
    ``_no_weight_decay = True`` (an SSM's A and D, as mamba marks them) no."""
    return param.ndim >= 2 and not getattr(param, "_no_weight_decay", False)


def adamw(model: torch.nn.Module, recipe: dict) -> torch.optim.AdamW:
    """AdamW over two groups: decayed matrices and everything ``decays`` exempts."""
    params = list(model.parameters())
    groups = [{"params": [p for p in params if decays(p)], "weight_decay": recipe["weight_decay"]},
              {"params": [p for p in params if not decays(p)], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=recipe["lr"], betas=(recipe["beta1"], recipe["beta2"]))


def resolve_steps(recipe: dict, *, params: int, seq_len: int) -> int:
    """Optimizer steps of a recipe: ``steps``, or enough steps of ``batch_size x seq_len`` tokens to
    train on ``tokens`` (a count, or ``"20x"`` times the ``params`` non-embedding parameters)."""
    return planned_steps(recipe, params=params, seq_len=seq_len)


__all__ = ["adamw", "decays", "lr_at", "recipe_lr", "resolve_steps"]
