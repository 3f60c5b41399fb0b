"""Per-layer error contraction rho (Basu et al., https://arxiv.org/abs/2603.20991).

For a layer with reference input h and output f(h), and a perturbed run whose
input is h~ and output y~, ``rho = ||y~ - f(h)|| / ||h~ - h||``: below one the
layer absorbs an error, above one it grows it. Norms are Frobenius norms over
every calibration token (papers.md leaves the estimator open; a ratio of sums
does not let a few near-zero tokens dominate as a mean of ratios would).
The abstract leaves open too whether the errors are absolute or relative to
the hidden state's norm (its v1 credits residual connections with growing the
hidden state faster than the error); ``rho`` is the ratio of absolute errors
and ``rho_relative`` the ratio of relative ones, both kept.

Two forward passes give every layer's rho: the reference, and one with

- ``noise``: Gaussian noise of relative size ``noise`` (times the RMS of the
  hidden state) added at the first layer's input, carried through the rest;
- ``wanda`` / ``magnitude`` / ``int8``: the whole model compressed
  (``wanda.compress_model``); the first layer has no input error, so no rho,
  and each later layer's output error also holds what its own compression
  adds, so there rho is propagation plus that layer's share.

An error entering layer t is then predicted to reach the last layer scaled by
the product of rho over layers t.. L-1 (noise; for compression, the error is
born at layer t's output, so the product runs over t+1 .. L-1). ``measured``
checks that prediction: the error put at layer t alone (noise at its input,
or only that layer compressed), the final drift over the error put in.

Dimensions: B batch, T time, D model width, L layers.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from archsearch.data import Batch
from archsearch.inspect import wanda
from archsearch.inspect._trace import Trace, layers_of, trace

MODES = ("noise", *wanda.METHODS)


@dataclass(frozen=True, kw_only=True)
class RhoProfile:
    """rho per layer and the amplification of an error entering at each layer.

    ``rho[l]`` is NaN where layer l's input carries no error. ``predicted[t]``
    is the product of later rho; ``measured[t]`` the final drift over the
    error injected at layer t alone (empty unless asked for).
    """

    mode: str
    rho: list[float]
    input_error: list[float]  # ||h~ - h|| / ||h|| at each layer's input
    output_error: list[float]  # the same at each layer's output
    predicted: list[float]
    measured: list[float] = field(default_factory=list)

    @property
    def rho_relative(self) -> list[float]:
        """The ratio of relative errors, output_error / input_error: below one where the hidden
        state grows faster than the error (a layer that only scales its input has 1)."""
        return [o / i if i > 0 else math.nan for i, o in zip(self.input_error, self.output_error)]

    def spearman(self) -> float:
        """Rank correlation of predicted and measured amplification (NaN with under three layers)."""
        pairs = [(p, m) for p, m in zip(self.predicted, self.measured) if math.isfinite(p) and math.isfinite(m)]
        return spearman([p for p, _ in pairs], [m for _, m in pairs])

    def rows(self) -> list[dict]:
        """(layer, metric, value) rows for the store; non-finite values left out."""
        out = []
        for index in range(len(self.rho)):
            for metric in ("rho", "rho_relative", "input_error", "output_error", "predicted", "measured"):
                values = getattr(self, metric)
                if index < len(values) and math.isfinite(values[index]):
                    out.append(dict(layer=index, metric=metric, value=values[index]))
        if math.isfinite(self.spearman()):
            out.append(dict(layer=None, metric="spearman", value=self.spearman()))
        return out


def error_contraction(model: nn.Module, batches: list[Batch], *, mode: str = "noise", noise: float = 1e-2,
                      sparsity: float = 0.5, measure: bool = True, seed: int = 0) -> RhoProfile:
    """rho of every layer of ``model`` on ``batches`` (see the module docstring).

    ``noise``: the relative size of the injected error; ``sparsity``: for the
    pruning modes. ``measure`` adds one pass per layer for ``measured``.
    """
    if mode not in MODES:
        raise ValueError(f"unknown rho mode {mode!r}; choose one of {', '.join(MODES)}")
    if mode == "noise" and not noise > 0:
        raise ValueError(f"noise must be > 0 (the injected error's size relative to the hidden state), got {noise}")
    model.eval()
    count = len(layers_of(model))
    reference = [trace(model, _tokens(model, b)) for b in batches]
    if mode == "noise":
        perturbed = [trace(model, _tokens(model, b), perturb={0: _noise(ref.inputs[0], noise, seed)})
                     for b, ref in zip(batches, reference)]
    else:
        compressed = wanda.compress_model(model, batches, method=mode, sparsity=sparsity)
        perturbed = [trace(compressed, _tokens(compressed, b)) for b in batches]
    e_in = [_error(reference, perturbed, "inputs", index) for index in range(count)]
    e_out = [_error(reference, perturbed, "outputs", index) for index in range(count)]
    rho = [o / i if i > 0 else math.nan for i, o in zip(e_in, e_out)]
    start = 0 if mode == "noise" else 1  # compression: the error born at t is carried from t + 1 on
    predicted = [math.prod(rho[t + start:]) if all(math.isfinite(r) for r in rho[t + start:]) else math.nan
                 for t in range(count)]
    measured = _measured(model, batches, reference, mode=mode, noise=noise, sparsity=sparsity, seed=seed) \
        if measure else []
    return RhoProfile(mode=mode, rho=rho, input_error=[e / _size(reference, "inputs", i) for i, e in enumerate(e_in)],
                      output_error=[e / _size(reference, "outputs", i) for i, e in enumerate(e_out)],
                      predicted=predicted, measured=measured)


def _measured(model: nn.Module, batches: list[Batch], reference: list[Trace], *, mode: str, noise: float,
              sparsity: float, seed: int) -> list[float]:
    """For each layer t: the last layer's output error over the error put in at t alone."""
    last = len(reference[0].outputs) - 1
    out = []
    for t, layer in enumerate(layers_of(model)):
        if mode == "noise":
            runs = [trace(model, _tokens(model, b), perturb={t: _noise(ref.inputs[t], noise, seed)})
                    for b, ref in zip(batches, reference)]
            put_in = _error(reference, runs, "inputs", t)
        else:
            replacement = copy.deepcopy(layer)
            norms = None
            if mode == "wanda":  # the layer's own inputs, from the uncompressed model
                norms = wanda.input_norms(replacement, lambda: [replacement(ref.inputs[t]) for ref in reference])
            wanda.compress_layer(replacement, method=mode, sparsity=sparsity, norms=norms)
            runs = [trace(model, _tokens(model, b), replace={t: replacement}) for b in batches]
            put_in = _error(reference, runs, "outputs", t)
        out.append(_error(reference, runs, "outputs", last) / put_in if put_in > 0 else math.nan)
    return out


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN below three points or for a constant."""
    if len(x) < 3:
        return math.nan
    rx, ry = _ranks(x), _ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return cov / var if var > 0 else math.nan


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + end) / 2
        start = end + 1
    return ranks


def _tokens(model: nn.Module, batch: Batch) -> torch.Tensor:
    return batch.inputs.to(next(model.parameters()).device)


def _noise(h_BTD: torch.Tensor, scale: float, seed: int) -> torch.Tensor:
    """Gaussian noise with RMS ``scale`` times that of ``h_BTD``, the same for a given seed."""
    generator = torch.Generator().manual_seed(seed)
    noise_BTD = torch.randn(h_BTD.shape, generator=generator).to(h_BTD.device)
    return noise_BTD * scale * h_BTD.pow(2).mean().sqrt()


def _error(reference: list[Trace], perturbed: list[Trace], where: str, index: int) -> float:
    """Frobenius norm of the difference at one layer's input or output, over every batch."""
    return math.sqrt(sum(float((getattr(p, where)[index] - getattr(r, where)[index]).pow(2).sum())
                         for r, p in zip(reference, perturbed)))


def _size(reference: list[Trace], where: str, index: int) -> float:
    return math.sqrt(sum(float(getattr(r, where)[index].pow(2).sum()) for r in reference)) or 1.0
