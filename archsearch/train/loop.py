"""One trial: build the model, train it, evaluate it, report.

No Ray and no DuckDB in here: ``train_trial`` takes plain specs and returns a
result, so it runs the same in a test, a notebook or a Ray worker. Given a
``checkpoint_dir`` it checkpoints as it goes and, started again on the same
folder, resumes where it stopped with the same losses an uninterrupted run
would have had.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from archsearch_kernels import dispatch as kernel_dispatch

from archsearch.arch.model import TrainableModel, build_model
from archsearch.arch.spec import ArchSpec
from archsearch.arch.structures.stack import LanguageModel
from archsearch.budget import count_params
from archsearch.data import IGNORE, Batch, Source, make_source
from archsearch.train import checkpoint
from archsearch.space.training import deciding
from archsearch.train.distributed import Rank, data_parallel, mean, shard
from archsearch.train.progress import OnProgress, Reporter
from archsearch.train.recipe import adamw, lr_at, recipe_lr, resolve_steps


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


def train_trial(*, spec: ArchSpec, recipe: dict, data: dict | Source, seed: int, threads: int | None = None,
                on_eval: Callable[[dict], None] | None = None, device: str | torch.device | None = None,
                checkpoint_dir: str | Path | None = None, checkpoint_every: int | None = None,
                stop_at: float | None = None, on_checkpoint: Callable[[Path], None] | None = None,
                rank: Rank | None = None, on_progress: OnProgress | None = None) -> TrialResult:
    """Train ``spec`` with ``recipe`` (a dumped ``Recipe``) on ``data`` and evaluate.

    ``data`` is a dumped data config or a ready Source. Seeds torch, the data
    stream and the evaluation stream from ``seed``. ``on_eval`` sees each
    evaluation row (step, tokens, train_loss, val_loss, val_accuracy, lr) as it
    happens. ``device`` defaults to CUDA when there is one. With
    ``checkpoint_dir``, saves a checkpoint every ``checkpoint_every`` steps
    (default: at every evaluation) and at the end, resumes from the newest one
    found there, and writes the final ``model.safetensors`` and ``spec.json``;
    ``on_checkpoint`` is called with the folder after each of those writes.
    ``stop_at`` (a share of the budget, for multi-fidelity rungs) stops early
    with an evaluation and a checkpoint; the schedule stays that of the full
    budget, so a later call continues exactly as an uninterrupted run.
    ``rank``: one of several data-parallel workers (see ``distributed``);
    every rank restores from ``checkpoint_dir``, only rank 0 writes there.
    ``on_progress(report, rows)`` hears every few seconds where training is
    and the training-loss rows (every ``recipe.log_every`` steps) since the
    last call (see ``progress.Reporter``); on rank 0 only.
    """
    if threads is not None:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    run = _set_up(spec=spec, recipe=recipe, data=data, seed=seed, device=device, stop_at=stop_at, rank=rank,
                  resume_from=checkpoint_dir)
    save_every = checkpoint_every or recipe["eval_every"]
    saves = checkpoint_dir is not None and run.writes
    start = time.perf_counter() - run.state.elapsed_s
    reporter = None
    if on_progress is not None and run.writes:
        reporter = Reporter(on_progress=on_progress, log_every=recipe.get("log_every", 10), total_steps=run.stop,
                            step=run.state.step, tokens=run.state.tokens)
    with _carrying(run):
        for step in range(run.state.step, run.stop):
            lr, loss = _train_step(run, step)
            if reporter is not None:
                reporter.after_step(step=run.state.step, tokens=run.state.tokens, loss=loss, lr=lr,
                                    curve=step < run.steps)
            if run.state.step % recipe["eval_every"] == 0 or run.state.step in (run.steps, run.stop, run.total):
                if reporter is not None:  # the training curve up to here before the evaluation's point
                    reporter.flush()
                row = _evaluation_row(run, lr)
                if on_eval is not None and run.writes:
                    on_eval(row)
            if saves and (run.state.step % save_every == 0 or run.state.step in (run.stop, run.total)):
                run.state.elapsed_s = time.perf_counter() - start
                checkpoint.save(checkpoint_dir, model=run.model, spec=spec, optimizer=run.optimizer,
                                state=run.state, generator=run.train_stream, fingerprint=run.fingerprint)
                if on_checkpoint is not None:
                    on_checkpoint(Path(checkpoint_dir))
    wall = time.perf_counter() - start
    if saves and run.state.step == run.total:
        checkpoint.save_final(checkpoint_dir, model=run.model, spec=spec)
        if on_checkpoint is not None:
            on_checkpoint(Path(checkpoint_dir))
    last = run.state.curve[-1]
    return TrialResult(train_loss=last["train_loss"], val_loss=last["val_loss"], val_accuracy=last["val_accuracy"],
                       steps=run.state.step, tokens=run.state.tokens, wall_time_s=wall,
                       tokens_per_s=run.state.tokens / wall, curve=run.state.curve)


@dataclass(kw_only=True)
class _Run:
    """One trial's training, set up: what each step reads and what it moves on.

    ``model`` is the plain model (its parameters, options and checkpoints);
    ``forward`` the same model as evaluated (compiled with ``recipe.compile``);
    ``trainer`` as trained (``forward``, or its DDP objective on several ranks).
    The first ``steps`` train the model, the ``gate_steps`` after them its exit
    gate alone (Ouro's stage II); this call stops after step ``stop``.
    """

    recipe: dict
    source: Source
    seed: int
    model: LanguageModel
    forward: torch.nn.Module
    trainer: torch.nn.Module
    optimizer: torch.optim.Optimizer
    train_stream: torch.Generator
    device: torch.device
    autocast: bool
    rank: Rank | None
    steps: int
    gate_steps: int
    stop: int
    state: checkpoint.TrainerState
    fingerprint: str

    @property
    def total(self) -> int:
        return self.steps + self.gate_steps

    @property
    def writes(self) -> bool:
        """This process reports evaluations and writes checkpoints (rank 0, or the only one)."""
        return self.rank is None or self.rank.leader


def _set_up(*, spec: ArchSpec, recipe: dict, data: dict | Source, seed: int, device: str | torch.device | None,
            stop_at: float | None, rank: Rank | None, resume_from: str | Path | None) -> _Run:
    """Build the model and its optimizer, size the run, and restore the newest checkpoint in ``resume_from``."""
    source = make_source(data) if isinstance(data, dict) else data
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = build_model(spec).to(device)
    optimizer = adamw(model, recipe)
    train_stream = torch.Generator().manual_seed(seed)
    steps = resolve_steps(recipe, params=count_params(spec), seq_len=_seq_len(source))
    gate_steps = recipe.get("gate_steps", 0) if model.exit_gate is not None else 0  # the others have no stage II
    stop = steps + gate_steps if stop_at is None else min(steps + gate_steps, max(1, math.ceil(stop_at * steps)))
    fingerprint = _fingerprint(spec, recipe, data, seed)
    state = checkpoint.TrainerState()
    found = checkpoint.latest(resume_from) if resume_from is not None else None
    if found is not None:
        state = checkpoint.restore(found, model=model, optimizer=optimizer, generator=train_stream,
                                   fingerprint=fingerprint)
    # The compiled module shares the model's parameters; checkpoints save the plain model.
    forward = torch.compile(model) if recipe.get("compile") else model
    # DDP wraps the objective for training; evaluation runs the plain model on every rank.
    trainer = forward if rank is None else data_parallel(forward, training_loss, rank, device)
    return _Run(recipe=recipe, source=source, seed=seed, model=model, forward=forward, trainer=trainer,
                optimizer=optimizer, train_stream=train_stream, device=device, autocast=_autocast(recipe, device),
                rank=rank, steps=steps, gate_steps=gate_steps, stop=stop, state=state, fingerprint=fingerprint)


def _carrying(run: _Run) -> contextlib.AbstractContextManager:
    """For a model that carries a state batch to batch (per row): inside, it does; else nothing.
    A ``with`` block, so the carried state is let go however training ends."""
    if not run.model.carries_state:
        return contextlib.nullcontext()
    _check_streams(run.source, run.recipe.get("grad_accum", 1))
    return run.model.carrying()


def _train_step(run: _Run, step: int) -> tuple[float, float]:
    """One optimizer step at ``step``: the model's, or in the gate stage the gate's; its lr and loss."""
    recipe, state = run.recipe, run.state
    gate_only = step >= run.steps
    if gate_only:
        lr = recipe_lr(step - run.steps, recipe, steps=run.gate_steps)
    else:
        lr = recipe_lr(step, recipe, steps=run.steps)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    batch = _train_batch(run.source, batch_size=recipe["batch_size"], generator=run.train_stream, step=step,
                         streams=run.model.carries_state)
    run.optimizer.zero_grad(set_to_none=True)
    loss = _backward(run.trainer, batch, grad_accum=recipe.get("grad_accum", 1), device=run.device,
                     autocast=run.autocast, step=step, gate_only=gate_only, rank=run.rank)
    torch.nn.utils.clip_grad_norm_(run.model.parameters(), recipe["grad_clip"])
    run.optimizer.step()
    state.step, state.tokens = step + 1, state.tokens + batch.inputs.numel()
    # in the gate stage train_loss is the gate's loss, not averaged with the LM's
    state.recent = (([] if step == run.steps else state.recent) + [loss])[-10:]
    return lr, loss


def _evaluation_row(run: _Run, lr: float) -> dict:
    """Evaluate now; the curve's new row (also kept in the trainer's state)."""
    kwargs = dict(seed=run.seed, device=run.device, autocast=run.autocast)
    val_loss, val_accuracy = evaluate(run.forward, run.source, run.recipe, **kwargs)
    state = run.state
    row = dict(step=state.step, tokens=state.tokens, train_loss=sum(state.recent) / len(state.recent),
               val_loss=val_loss, val_accuracy=val_accuracy, lr=lr)
    row.update(exit_metrics(run.forward, run.source, run.recipe, **kwargs))
    state.curve.append(row)
    return row


@torch.no_grad()
def evaluate(model: torch.nn.Module, source: Source, recipe: dict, *, seed: int,
             device: str | torch.device = "cpu", autocast: bool = False) -> tuple[float, float]:
    """Mean validation loss and accuracy over ``eval_batches`` batches, the same ones every call."""
    was_training = model.training
    model.eval()
    stream = torch.Generator().manual_seed(seed + 1_000_003)
    losses, hits, scored = [], 0, 0
    for batch in _val_batches(_plain(model), source, recipe, stream):
        batch = _to(batch, device)
        with _autocast_context(device, autocast):
            logits_BTV = model(batch.inputs)
        losses.append(_loss(logits_BTV, batch.targets).item())
        mask_BT = batch.targets != IGNORE
        hits += int((logits_BTV.argmax(-1) == batch.targets)[mask_BT].sum())
        scored += int(mask_BT.sum())
    model.train(was_training)
    return sum(losses) / len(losses), hits / max(1, scored)


def training_loss(model: torch.nn.Module, batch, *, gate_only: bool = False) -> torch.Tensor:
    """The model's own training objective when it has one (exit gates add an
    expected loss over loops), else next-token cross-entropy. ``gate_only``:
    the exit gate's stage-II loss, which leaves every other weight without a
    gradient (so AdamW, which skips those, leaves them as they are)."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model(batch.inputs, batch.targets, gate_only)
    plain = _plain(model)  # (a compiled model's own objective runs uncompiled)
    if gate_only:
        return plain.gate_loss(batch.inputs, batch.targets)
    if plain.own_loss:
        return plain.training_loss(batch.inputs, batch.targets)
    if _fused_loss_applies(model, batch.inputs.device):
        return kernel_dispatch.linear_cross_entropy(model.head_input(batch.inputs), model.head_weight(),
                                                    batch.targets, ignore_index=IGNORE)
    return _loss(model(batch.inputs), batch.targets)


def _fused_loss_applies(model: torch.nn.Module, device: torch.device) -> bool:
    """Whether the head and loss run as one chunked kernel, which never holds the [B, T, V]
    logits: for models whose logits are the plain ``hidden @ head_weight.T`` (a structure
    with its own forward, or a compiled module, keeps its path)."""
    return (isinstance(model, LanguageModel) and type(model).forward is LanguageModel.forward
            and kernel_dispatch.use_triton("linear_cross_entropy", device))


def _backward(model: torch.nn.Module, batch: Batch, *, grad_accum: int, device: torch.device, autocast: bool,
              step: int, gate_only: bool = False, rank: Rank | None = None) -> float:
    """Backpropagate the batch's loss in ``grad_accum`` micro-batches; the loss, as a float.

    Each micro-batch's mean loss is weighted by its share of the scored
    targets, so the summed gradient is the full batch's (up to rounding).
    With ``rank`` the micro-batches are this rank's slice, their weights are
    scaled by the world size (DDP averages over ranks) and the returned loss
    is the mean over ranks: the global batch's.
    """
    scored = (batch.targets != IGNORE).sum().clamp(min=1)
    world = 1 if rank is None else rank.world
    if rank is not None:
        batch = shard(batch, rank)
    micro = batch.inputs.shape[0] // grad_accum
    total = 0.0
    for index in range(grad_accum):
        part = _to(Batch(inputs=batch.inputs[index * micro:(index + 1) * micro],
                         targets=batch.targets[index * micro:(index + 1) * micro]), device)
        # DDP all-reduces once, on the last micro-batch
        last = index == grad_accum - 1
        with (contextlib.nullcontext() if rank is None or last else model.no_sync()):
            with _autocast_context(device, autocast):
                loss = training_loss(model, part, gate_only=gate_only)
            # one rank alone raising would leave the others waiting in the all-reduce
            if rank is None and not torch.isfinite(loss):
                raise FloatingPointError(f"training loss became {loss.item()} at step {step}; lower the lr")
            if grad_accum > 1 or world > 1:
                loss = loss * ((part.targets != IGNORE).sum().clamp(min=1) * world / scored).to(loss.device)
            loss.backward()
        total += loss.item()
    if rank is not None:
        total = mean(total, rank, device)
        if not math.isfinite(total):
            raise FloatingPointError(f"training loss became {total} at step {step}; lower the lr")
    return total


@torch.no_grad()
def exit_metrics(model: torch.nn.Module, source: Source, recipe: dict, *, seed: int,
                 device: str | torch.device = "cpu", autocast: bool = False) -> dict:
    """For a looped model that exits early (``exit_threshold``), on the
    evaluation batches: ``loop_fraction``, the share of token-loop steps run
    (1.0 = every token ran every loop), and ``loop_time_ratio``, the wall
    time of those loops over the same batches run at the full loop count.
    Empty for every other model."""
    plain = _plain(model)
    if not plain.exits_early:
        return {}
    was_training = plain.training
    plain.eval()
    stream = torch.Generator().manual_seed(seed + 1_000_003)  # the batches ``evaluate`` reads
    ran, possible, seconds = 0, 0, {True: 0.0, False: 0.0}
    for index, batch in enumerate(_val_batches(plain, source, recipe, stream)):
        e_BTD = plain.embed(_to(batch, device).inputs)
        for exits in (True, False):
            if index == 0:  # one untimed pass each, so neither pays for warming up
                plain.loops(e_BTD, exits=exits)
            _synchronize(device)
            began = time.perf_counter()
            with _autocast_context(device, autocast):
                run = plain.loops(e_BTD, exits=exits)
            _synchronize(device)
            seconds[exits] += time.perf_counter() - began
            if exits:
                ran += int(run.steps_BT.sum())
                possible += run.steps_BT.numel() * plain.options.loops
    plain.train(was_training)
    return {"loop_fraction": ran / possible, "loop_time_ratio": seconds[True] / seconds[False]}


def _synchronize(device: str | torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _plain(model: torch.nn.Module) -> TrainableModel:
    """The model itself under a ``torch.compile`` wrapper (which keeps it as ``_orig_mod``)."""
    return getattr(model, "_orig_mod", model)


def _check_streams(source: Source, grad_accum: int) -> None:
    if not hasattr(source, "stream_batch"):
        raise ValueError(f"memory carry needs consecutive windows of one stream per row, which only text data "
                         f"gives; {type(source).__name__} draws independent examples (use data.kind: text)")
    if grad_accum != 1:
        raise ValueError("memory carry keeps one state per batch row; use recipe.grad_accum: 1")


def _val_batches(model: torch.nn.Module, source: Source, recipe: dict, stream: torch.Generator):
    """The evaluation batches: random windows drawn with ``stream``, or, for a
    model that carries a state, consecutive windows read from fresh slots."""
    if not model.carries_state:
        for _ in range(recipe["eval_batches"]):
            yield source.batch(split="val", batch_size=recipe["batch_size"], generator=stream)
        return
    with model.carrying():
        for index in range(recipe["eval_batches"]):
            yield source.stream_batch(split="val", batch_size=recipe["batch_size"], step=index)


def _train_batch(source: Source, *, batch_size: int, generator: torch.Generator, step: int,
                 streams: bool) -> Batch:
    """Random windows, or with ``streams`` batch ``step`` of consecutive windows per row."""
    if streams:
        return source.stream_batch(split="train", batch_size=batch_size, step=step)
    return source.batch(split="train", batch_size=batch_size, generator=generator)


def _loss(logits_BTV: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits_BTV.flatten(0, 1).float(), targets_BT.flatten(), ignore_index=IGNORE)


def _to(batch: Batch, device: torch.device) -> Batch:
    if batch.inputs.device == device:
        return batch
    return Batch(inputs=batch.inputs.to(device, non_blocking=True), targets=batch.targets.to(device, non_blocking=True))


def _autocast(recipe: dict, device: torch.device) -> bool:
    """bf16 autocast: always with ``bf16``, never with ``off``, on CUDA only with ``auto``."""
    mode = recipe.get("autocast", "auto")
    return mode == "bf16" or (mode == "auto" and device.type == "cuda")


def _autocast_context(device: str | torch.device, enabled: bool):
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def _seq_len(source: Source) -> int:
    """Positions per row: the source's ``seq_len``, or one probe batch's width."""
    seq_len = getattr(source, "seq_len", None)
    if seq_len is None:
        seq_len = source.batch(split="train", batch_size=1, generator=torch.Generator().manual_seed(0)).inputs.shape[1]
    return int(seq_len)


def _fingerprint(spec: ArchSpec, recipe: dict, data: dict | Source, seed: int) -> str:
    described = data if isinstance(data, dict) else type(data).__name__
    blob = json.dumps({"spec": spec.to_dict(), "recipe": deciding(recipe), "data": described, "seed": seed},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


__all__ = ["TrialResult", "evaluate", "lr_at", "train_trial", "training_loss"]
