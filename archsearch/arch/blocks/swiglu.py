"""SwiGLU MLP (Shazeer 2020, https://arxiv.org/abs/2002.05202).

Dimensions: B batch, T time, D model width, F this layer's MLP width.
"""

from __future__ import annotations

import torch
from archsearch_kernels.dispatch import swiglu
from torch import nn

from archsearch.arch.blocks.swiglu_counts import (  # the formulas, beside the module
    flops,
    params,
)
from archsearch.arch.spec import ArchSpec, LayerSpec


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``: [B, T, D] -> [B, T, D]. No biases."""

    def __init__(self, *, spec: ArchSpec, layer: LayerSpec):
        super().__init__()
        d, f = spec.d_model, layer.mlp_width
        self.gate_up = nn.Linear(d, 2 * f, bias=False)
        self.down = nn.Linear(f, d, bias=False)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        gate_BTF, up_BTF = self.gate_up(x_BTD).chunk(2, dim=-1)
        # silu(gate) * up, fused in one Triton kernel on CUDA
        return self.down(swiglu(gate_BTF, up_BTF))

