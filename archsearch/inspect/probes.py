"""Linear probes on a model's states, and the half-lives of learned decays.

A probe is ridge regression in closed form, ``W = (X^T X + lam I)^-1 X^T Y``
with an unpenalised bias, fitted on three quarters of the calibration tokens
and scored on the rest: R^2 for a number (``position``, the relative position
t / (T - 1) in the context window), accuracy of the argmax over one-hot
columns for a token (``lag:k``, the token k places back). The states:

- ``hidden:l``: the hidden state entering layer l (``hidden:L`` is the last
  layer's output), for stack and memory models;
- ``gpn``: the GPN predicted state s^p_t;
- ``memory``: the memory slots a token's segment reads (memory models),
  flattened to M x S features; every token of a segment shares them.

Run the same probe on a baseline trial's hidden states to compare.

Half-lives: Gated DeltaNet decays its state by alpha_t = exp(g_t) per token
and Mamba by exp(delta_t A); with the mean log-decay over the calibration
tokens g, half an entry is left after ln 2 / -g tokens.

Dimensions: B batch, T time, D state width, N tokens, K targets, H heads,
E Mamba channels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from archsearch.arch.blocks.gated_deltanet import GatedDeltaNet
from archsearch.arch.blocks.mamba import Mamba
from archsearch.arch.structures.memory import RecurrentMemory
from archsearch.data import Batch
from archsearch.inspect._trace import layers_of, trace


def ridge(X_ND: torch.Tensor, Y_NK: torch.Tensor, *, lam: float = 1e-3) -> torch.Tensor:
    """The ridge solution with a bias row, [D + 1, K] in fp64 (the bias is not penalised)."""
    X = torch.cat([X_ND.double(), X_ND.new_ones(X_ND.shape[0], 1).double()], dim=1)
    penalty = lam * torch.eye(X.shape[1], dtype=torch.float64, device=X.device)
    penalty[-1, -1] = 0.0
    return torch.linalg.solve(X.T @ X + penalty, X.T @ Y_NK.double())


def predict(W: torch.Tensor, X_ND: torch.Tensor) -> torch.Tensor:
    return X_ND.double() @ W[:-1] + W[-1]


@dataclass(frozen=True, kw_only=True)
class ProbeResult:
    """A probe's held-out score (R^2 or accuracy), its score on the tokens it was fitted on, and the counts."""

    state: str
    target: str
    score: float
    train_score: float
    tokens: int
    width: int


def fit_probe(X_ND: torch.Tensor, y_N: torch.Tensor, *, classes: bool, lam: float = 1e-3, seed: int = 0,
              holdout: float = 0.25) -> tuple[float, float]:
    """Fit on a random ``1 - holdout`` of the rows; (held-out score, training score)."""
    order = torch.randperm(X_ND.shape[0], generator=torch.Generator().manual_seed(seed))
    cut = max(1, int(X_ND.shape[0] * (1 - holdout)))
    train, test = order[:cut], order[cut:]
    Y = F.one_hot(y_N.long()).double() if classes else y_N.double()[:, None]
    W = ridge(X_ND[train], Y[train], lam=lam)

    def score(rows: torch.Tensor) -> float:
        guess = predict(W, X_ND[rows])
        if classes:
            return float((guess.argmax(-1) == y_N[rows]).double().mean())
        truth = Y[rows]
        return 1.0 - float(((guess - truth) ** 2).sum() / ((truth - truth.mean()) ** 2).sum().clamp_min(1e-12))

    return score(test), score(train)


@torch.no_grad()
def states_of(model: nn.Module, tokens_BT: torch.Tensor, state: str) -> torch.Tensor:
    """The state a probe reads, [B, T, D] (see the module docstring)."""
    if state == "gpn":
        if not hasattr(model, "states"):
            raise ValueError(f"state 'gpn' needs a GPN model; this one is '{model.spec.structure}'")
        return model.states(tokens_BT).float()
    if state == "memory":
        return _memory_slots(model, tokens_BT)
    name, _, index = state.partition(":")
    if name != "hidden" or not index.isdigit():
        raise ValueError(f"unknown probe state {state!r}; use hidden:LAYER (0 .. L), gpn or memory")
    count, layer = len(layers_of(model)), int(index)
    if layer > count:
        raise ValueError(f"probe state {state!r}: the model has {count} layers (hidden:0 .. hidden:{count})")
    run = trace(model, tokens_BT)
    return run.outputs[-1] if layer == count else run.inputs[layer]


def _memory_slots(model: nn.Module, tokens_BT: torch.Tensor) -> torch.Tensor:
    """The slots each token's segment reads, [B, T, M * S]."""
    memory = getattr(model, "memory", None)
    if not isinstance(memory, RecurrentMemory):
        raise ValueError(f"state 'memory' needs a memory model; this one is '{model.spec.structure}'")
    captured = []
    handle = memory.register_forward_hook(lambda module, args, out: captured.append(out[1]))
    try:
        model(tokens_BT)
    finally:
        handle.remove()
    states_BKMS = captured[0]
    segment_T = torch.arange(tokens_BT.shape[1], device=tokens_BT.device) // memory.segment
    return states_BKMS[:, segment_T].flatten(2).float()


def targets_of(tokens_BT: torch.Tensor, target: str) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(values [B, T], mask [B, T] of positions that have one, whether they are classes)."""
    B, T = tokens_BT.shape
    if target == "position":
        position_BT = (torch.arange(T, dtype=torch.float64) / max(1, T - 1)).expand(B, T)
        return position_BT, torch.ones(B, T, dtype=torch.bool), False
    name, _, lag = target.partition(":")
    if name != "lag" or not lag.isdigit():
        raise ValueError(f"unknown probe target {target!r}; use position or lag:K (the token K places back)")
    k = int(lag)
    if k >= T:
        raise ValueError(f"probe target {target!r}: the context has only {T} positions")
    lagged_BT = torch.zeros_like(tokens_BT)
    lagged_BT[:, k:] = tokens_BT[:, :T - k]
    mask_BT = torch.zeros(B, T, dtype=torch.bool)
    mask_BT[:, k:] = True
    return lagged_BT, mask_BT, True


def run_probe(model: nn.Module, batches: list[Batch], *, state: str = "hidden:0", target: str = "position",
              lam: float = 1e-3, seed: int = 0) -> ProbeResult:
    """Fit one probe from ``state`` to ``target`` on every calibration token."""
    model.eval()
    device = next(model.parameters()).device
    features, values = [], []
    for batch in batches:
        states_BTD = states_of(model, batch.inputs.to(device), state).cpu()
        target_BT, mask_BT, classes = targets_of(batch.inputs.cpu(), target)
        features.append(states_BTD[mask_BT])
        values.append(target_BT[mask_BT])
    X_ND, y_N = torch.cat(features), torch.cat(values)
    score, train_score = fit_probe(X_ND, y_N, classes=classes, lam=lam, seed=seed)
    return ProbeResult(state=state, target=target, score=score, train_score=train_score, tokens=X_ND.shape[0],
                       width=X_ND.shape[1])


@torch.no_grad()
def half_lives(model: nn.Module, batches: list[Batch]) -> list[dict]:
    """Rows (layer, metric, value): per layer with a learned decay, the median,
    smallest and largest half-life in tokens, and for Gated DeltaNet each
    head's (``half_life_head_<h>``). Empty for a model without decays."""
    model.eval()
    device = next(model.parameters()).device
    decaying = {index: layer.mixer for index, layer in enumerate(getattr(model, "layers", []))
                if isinstance(getattr(layer, "mixer", None), (GatedDeltaNet, Mamba))}
    sums: dict[int, torch.Tensor] = {}
    counts: dict[int, int] = {}

    def hook(index):
        def record(mixer, args):
            rate_NX = _decay_rate(mixer, args[0])
            sums[index] = sums.get(index, 0) + rate_NX.sum(0)
            counts[index] = counts.get(index, 0) + rate_NX.shape[0]
        return record

    handles = [mixer.register_forward_pre_hook(hook(index)) for index, mixer in decaying.items()]
    try:
        for batch in batches:
            model(batch.inputs.to(device))
    finally:
        for handle in handles:
            handle.remove()
    rows = []
    for index in sorted(sums):
        mixer = decaying[index]
        mean_log = (sums[index] / counts[index]).double()
        if isinstance(mixer, Mamba):  # the mean of delta_t A is mean(delta) A: A is fixed per entry
            mean_log = mean_log[:, None] * -torch.exp(mixer.A_log.double())
        life = (math.log(2) / (-mean_log).clamp_min(1e-12)).flatten()
        rows += [dict(layer=index, metric=f"half_life_{name}", value=float(value))
                 for name, value in (("median", life.median()), ("min", life.min()), ("max", life.max()))]
        if isinstance(mixer, GatedDeltaNet):
            rows += [dict(layer=index, metric=f"half_life_head_{h}", value=float(v)) for h, v in enumerate(life)]
    return rows


def _decay_rate(mixer: nn.Module, x_BTD: torch.Tensor) -> torch.Tensor:
    """Per token, what the log decay is linear in: GDN's g [N, H] itself; Mamba's delta [N, E] (times A)."""
    if isinstance(mixer, GatedDeltaNet):
        g_BTH, _ = mixer.gates(x_BTD)
        return g_BTH.flatten(0, 1)
    s = mixer.sizes
    x_BTE, _ = mixer.in_proj(x_BTD).chunk(2, dim=-1)
    u_BTE = mixer.causal_conv(x_BTE, None, silu=True)
    dt_BTR = mixer.x_proj(u_BTE)[..., :s.dt_rank]
    return F.softplus(mixer.dt_proj(dt_BTR).float() + mixer.dt_bias.float()).flatten(0, 1)
