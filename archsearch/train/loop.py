"""One trial: build the model, train it, evaluate it, report.

No Ray and no DuckDB in here: ``train_trial`` takes plain specs and returns a
result, so it runs the same in a test, a notebook or a Ray worker.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from archsearch.arch.model import build_model
from archsearch.arch.spec import ArchSpec
from archsearch.data import IGNORE, Source, make_source


@dataclass(frozen=True, kw_only=True)
class TrialResult:
    """What a finished trial reports; ``curve`` has one row per evaluation."""

    train_loss: float
    val_loss: float
    val_accuracy: float  # argmax = target on supervised positions (next byte, or a task's answers)
    steps: int
    tokens: int
    wall_time_s: float
    tokens_per_s: float
    curve: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def lr_at(step: int, *, lr: float, warmup_steps: int, steps: int, min_lr_ratio: float) -> float:
    """Linear warmup to ``lr``, then cosine decay to ``min_lr_ratio * lr``."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)
    return lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def train_trial(*, spec: ArchSpec, recipe: dict, data: dict | Source, seed: int, threads: int | None = None,
                on_eval: Callable[[dict], None] | None = None) -> TrialResult:
    """Train ``spec`` with ``recipe`` (a dumped ``Recipe``) on ``data`` and evaluate.

    ``data`` is a dumped data config or a ready Source. Seeds torch, the data
    stream and the evaluation stream from ``seed``. ``on_eval`` sees each
    evaluation row (step, tokens, train_loss, val_loss, lr) as it happens.
    """
    if threads is not None:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    source = make_source(data) if isinstance(data, dict) else data
    model = build_model(spec)
    optimizer = _adamw(model, recipe)
    train_stream = torch.Generator().manual_seed(seed)
    steps, batch_size = recipe["steps"], recipe["batch_size"]
    curve: list[dict] = []
    tokens, recent = 0, []
    start = time.perf_counter()
    for step in range(steps):
        lr = lr_at(step, lr=recipe["lr"], warmup_steps=recipe["warmup_steps"], steps=steps,
                   min_lr_ratio=recipe["min_lr_ratio"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = source.batch(split="train", batch_size=batch_size, generator=train_stream)
        loss = training_loss(model, batch)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"training loss became {loss.item()} at step {step}; lower the lr")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe["grad_clip"])
        optimizer.step()
        tokens += batch.inputs.numel()
        recent = (recent + [loss.item()])[-10:]
        if (step + 1) % recipe["eval_every"] == 0 or step + 1 == steps:
            val_loss, val_accuracy = evaluate(model, source, recipe, seed=seed)
            row = dict(step=step + 1, tokens=tokens, train_loss=sum(recent) / len(recent), val_loss=val_loss,
                       val_accuracy=val_accuracy, lr=lr)
            curve.append(row)
            if on_eval is not None:
                on_eval(row)
    wall = time.perf_counter() - start
    last = curve[-1]
    return TrialResult(train_loss=last["train_loss"], val_loss=last["val_loss"], val_accuracy=last["val_accuracy"],
                       steps=steps, tokens=tokens,
                       wall_time_s=wall, tokens_per_s=tokens / wall, curve=curve)


@torch.no_grad()
def evaluate(model: torch.nn.Module, source: Source, recipe: dict, *, seed: int) -> tuple[float, float]:
    """Mean validation loss and accuracy over ``eval_batches`` batches, the same ones every call."""
    was_training = model.training
    model.eval()
    stream = torch.Generator().manual_seed(seed + 1_000_003)
    losses, hits, scored = [], 0, 0
    for _ in range(recipe["eval_batches"]):
        batch = source.batch(split="val", batch_size=recipe["batch_size"], generator=stream)
        logits_BTV = model(batch.inputs)
        losses.append(_loss(logits_BTV, batch.targets).item())
        mask_BT = batch.targets != IGNORE
        hits += int((logits_BTV.argmax(-1) == batch.targets)[mask_BT].sum())
        scored += int(mask_BT.sum())
    model.train(was_training)
    return sum(losses) / len(losses), hits / max(1, scored)


def training_loss(model: torch.nn.Module, batch) -> torch.Tensor:
    """The model's own training objective when it has one (exit gates add an
    expected loss over loops), else next-token cross-entropy."""
    own = getattr(model, "training_loss", None)
    if own is not None:
        return own(batch.inputs, batch.targets)
    return _loss(model(batch.inputs), batch.targets)


def _loss(logits_BTV: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits_BTV.flatten(0, 1).float(), targets_BT.flatten(), ignore_index=IGNORE)


def _adamw(model: torch.nn.Module, recipe: dict) -> torch.optim.AdamW:
    # weight decay only on matrices: norms (1-d) are left alone
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": recipe["weight_decay"]},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=recipe["lr"], betas=(recipe["beta1"], recipe["beta2"]))
