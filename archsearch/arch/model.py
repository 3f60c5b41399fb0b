"""The language model: embedding, a stack of registry-built layers, tied head.

Dimensions: B batch, T time, D model width, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import nn

from archsearch.arch import registry
from archsearch.arch.spec import ArchSpec, LayerSpec


class Layer(nn.Module):
    """Pre-norm residual layer: ``x += mixer(norm(x)); x += mlp(norm(x))``."""

    def __init__(self, *, spec: ArchSpec, layer: LayerSpec):
        super().__init__()
        self.mixer_norm = nn.RMSNorm(spec.d_model, eps=spec.norm_eps)
        self.mixer = registry.mixer(layer.mixer).module(spec=spec, layer=layer)
        self.mlp_norm = nn.RMSNorm(spec.d_model, eps=spec.norm_eps)
        self.mlp = registry.mlp(layer.mlp).module(spec=spec, layer=layer)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        x_BTD = x_BTD + self.mixer(self.mixer_norm(x_BTD))
        return x_BTD + self.mlp(self.mlp_norm(x_BTD))


class LanguageModel(nn.Module):
    """Tokens [B, T] int64 -> logits [B, T, V]."""

    def __init__(self, spec: ArchSpec):
        super().__init__()
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab_size, spec.d_model)
        self.layers = nn.ModuleList(Layer(spec=spec, layer=layer) for layer in spec.layers)
        self.norm = nn.RMSNorm(spec.d_model, eps=spec.norm_eps)
        self.head = None if spec.tie_embeddings else nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        self.apply(_init_weights)

    def forward(self, tokens_BT: torch.Tensor) -> torch.Tensor:
        x_BTD = self.embed(tokens_BT)
        for layer in self.layers:
            x_BTD = layer(x_BTD)
        x_BTD = self.norm(x_BTD)
        weight_VD = self.embed.weight if self.head is None else self.head.weight
        return x_BTD @ weight_VD.T


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)


def build_model(spec: ArchSpec) -> LanguageModel:
    """The ``nn.Module`` for ``spec``: tokens [B, T] int64 -> logits [B, T, V]."""
    return LanguageModel(spec)
