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
from archsearch.arch.structures.stack_counts import (  # the formulas, beside the module
    flops,
    layer_flops,
    layer_mixing,
    layer_params,
    mixing,
    params,
    per_layer,
    reject_unknown_options,
    state,
)


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


class LanguageModel(nn.Module):
    """The shared frame: tokens [B, T] int64 -> logits [B, T, V] around ``body``.

    It answers the training loop's questions (``arch.model.TrainableModel``)
    as a plain language model does: next-token cross-entropy, no exit gate, no
    carried state, every loop run; a structure overrides what it has.
    """

    own_loss = False

    def __init__(self, spec: ArchSpec):
        super().__init__()
        self.spec = spec
        # a structure with a gate sets a module here (an instance attribute, not a class one:
        # nn.Module keeps submodules apart, and a class-level None would hide them)
        self.exit_gate: nn.Module | None = None
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

    @property
    def carries_state(self) -> bool:
        return False

    @property
    def exits_early(self) -> bool:
        return False

    def training_loss(self, inputs_BT: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
        """A structure with ``own_loss`` defines its objective here (the loop never asks the others)."""
        raise NotImplementedError(f"{type(self).__name__} trains on next-token cross-entropy of its forward")

    def gate_loss(self, inputs_BT: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
        raise ValueError(f"{type(self).__name__} has no exit gate to train")

    def carrying(self):
        raise ValueError(f"{type(self).__name__} carries no state across batches")


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


def init_weights(module: nn.Module) -> None:
    """Normal(0, 0.02) for every linear and embedding weight (GPT-2 style);
    a block marks a module ``keep_init = True`` to keep its own (Mamba's dt)."""
    if getattr(module, "keep_init", False):
        return
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
