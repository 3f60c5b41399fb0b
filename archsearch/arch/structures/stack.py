"""The plain stack: embedding, pre-norm residual layers, final norm, tied head.

Every other structure reuses ``Layer`` and ``layer_params``/``layer_flops``.
Dimensions: B batch, T time, D model width, V vocabulary.
"""

from __future__ import annotations

import torch
from archsearch_kernels.dispatch import RMSNorm
from torch import nn

from archsearch.arch import blocks
from archsearch.arch.spec import ArchSpec, LayerSpec


class Layer(nn.Module):
    """Pre-norm residual layer: ``x += mixer(norm(x)); x += mlp(norm(x))``."""

    def __init__(self, *, spec: ArchSpec, layer: LayerSpec):
        super().__init__()
        self.mixer_norm = RMSNorm(spec.d_model, eps=spec.norm_eps)
        self.mixer = blocks.mixer(layer.mixer).module(spec=spec, layer=layer)
        self.has_mlp = layer.mlp != "none"
        if self.has_mlp:
            self.mlp_norm = RMSNorm(spec.d_model, eps=spec.norm_eps)
            self.mlp = blocks.mlp(layer.mlp).module(spec=spec, layer=layer)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        x_BTD = x_BTD + self.mixer(self.mixer_norm(x_BTD))
        if self.has_mlp:
            x_BTD = x_BTD + self.mlp(self.mlp_norm(x_BTD))
        return x_BTD


def layer_params(spec: ArchSpec, layer: LayerSpec) -> int:
    """One layer: mixer, MLP and their pre-norm weights."""
    total = blocks.mixer(layer.mixer).params(spec, layer) + spec.d_model
    if layer.mlp != "none":
        total += blocks.mlp(layer.mlp).params(spec, layer) + spec.d_model
    return total


def layer_mixing(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> float:
    """The part of ``layer_flops`` that is not weight matmuls."""
    return blocks.mixer(layer.mixer).mixing(spec, layer, seq_len)


def layer_flops(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> float:
    """Forward FLOPs per token of one layer (matmuls and attention)."""
    total = blocks.mixer(layer.mixer).flops(spec, layer, seq_len)
    if layer.mlp != "none":
        total += blocks.mlp(layer.mlp).flops(spec, layer, seq_len)
    return total


class LanguageModel(nn.Module):
    """The shared frame: tokens [B, T] int64 -> logits [B, T, V] around ``body``."""

    def __init__(self, spec: ArchSpec):
        super().__init__()
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab_size, spec.d_model)
        self.norm = RMSNorm(spec.d_model, eps=spec.norm_eps)
        self.head = None if spec.tie_embeddings else nn.Linear(spec.d_model, spec.vocab_size, bias=False)

    def body(self, x_BTD: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, tokens_BT: torch.Tensor) -> torch.Tensor:
        return self.head_input(tokens_BT) @ self.head_weight().T

    def head_input(self, tokens_BT: torch.Tensor) -> torch.Tensor:
        """The normed last states [B, T, D] the head reads (the fused loss takes them directly)."""
        return self.norm(self.body(self.embed(tokens_BT)))

    def head_weight(self) -> torch.Tensor:
        """The output embedding [V, D]: the input embedding when tied."""
        return self.embed.weight if self.head is None else self.head.weight


class Stack(LanguageModel):
    """Layers applied once each, in order."""

    def __init__(self, spec: ArchSpec):
        super().__init__(spec)
        self.layers = nn.ModuleList(Layer(spec=spec, layer=layer) for layer in spec.layers)
        self.apply(init_weights)

    def body(self, x_BTD: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x_BTD = layer(x_BTD)
        return x_BTD


def reject_unknown_options(spec: ArchSpec, known: set[str]) -> None:
    """A ValueError naming any ``spec.options`` key the structure does not read."""
    unknown = set(spec.options) - known
    if unknown:
        raise ValueError(f"{spec.structure}: unknown options {sorted(unknown)}; known: {sorted(known)}")


def init_weights(module: nn.Module) -> None:
    """Normal(0, 0.02) for every linear and embedding weight (GPT-2 style);
    a block marks a module ``keep_init = True`` to keep its own (Mamba's dt)."""
    if getattr(module, "keep_init", False):
        return
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)


def params(spec: ArchSpec) -> int:
    """Non-embedding parameters: every layer plus the final norm."""
    return sum(per_layer(spec, layer_params)) + spec.d_model


def flops(spec: ArchSpec, seq_len: int) -> float:
    """Forward FLOPs per token of the body (the LM head is counted by the caller)."""
    return sum(per_layer(spec, layer_flops, seq_len))


def per_layer(spec: ArchSpec, formula, *args) -> list:
    """``formula(spec, layer, *args)`` for every layer, computed once per
    distinct layer: a deep stack repeats a handful of layer specs, and the
    planner counts thousands of candidate models."""
    seen: dict = {}
    out = []
    for layer in spec.layers:
        # options dicts are shared between the layers a family builds, and
        # held alive by the spec, so their identity is a cheap exact key
        key = (layer.mixer, layer.mlp, layer.mlp_width, id(layer.options))
        if key not in seen:
            seen[key] = formula(spec, layer, *args)
        out.append(seen[key])
    return out


def mixing(spec: ArchSpec, seq_len: int) -> float:
    """The part of ``flops`` that is not weight matmuls (attention, scans)."""
    return sum(per_layer(spec, layer_mixing, seq_len))


def state(spec: ArchSpec, seq_len: int) -> int:
    """Values a sequence keeps after ``seq_len`` tokens: the sum over layers."""
    return sum(per_layer(spec, lambda s, layer, t: blocks.mixer(layer.mixer).state(s, layer, t), seq_len))
