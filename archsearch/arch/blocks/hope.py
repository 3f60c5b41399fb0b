"""The Continuum Memory System (CMS) of Hope, as the MLP of a "Hope-attention" layer.

Behrouz, Razaviyayn, Zhong & Mirrokni, "Nested Learning: The Illusion of Deep
Learning Architectures", https://arxiv.org/abs/2512.24695. Hope is a
self-modifying Titans mixer followed by a CMS, a chain of MLP blocks whose
parameters are updated at different frequencies. "Hope-attention" (one of the
four families of Tapered LMs, https://arxiv.org/abs/2606.23670) is not defined
in the sources; papers.md sections 1 and 7 infer it is Hope with softmax
attention as the mixer. Here it is a layer of ``mixer="attention"`` and
``mlp="cms"``.

In a plain pretraining forward pass every level's weights are fixed, so the CMS
is its chain of MLPs; that is what this block computes. Each level is a SwiGLU
with its own residual inside the block, and the block returns the sum of the
levels' outputs (the layer adds its own residual once):

    u_0 = x;   u_i = u_i-1 + SwiGLU_i(u_i-1)   (i = 1 .. L);   cms(x) = u_L - x

With one level this is exactly ``swiglu``. The multi-frequency update (level i
learning every C_i tokens at test time) is not implemented: the sources give no
inner objective for the MLP levels in language-model pretraining, and without
one the outer optimizer updates every level every step, as it does any MLP.

Options (``layer.options``), with defaults:
    cms_levels  3    L, the number of SwiGLU levels; ``layer.mlp_width`` is split over
                     them, the first ``mlp_width mod L`` levels one wider than the rest

Dimensions: B batch, T time, D model width, F a level's MLP width.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from archsearch.arch.blocks.hope_counts import (  # the formulas, beside the module
    flops,
    level_widths,
    params,
)
from archsearch.arch.blocks.swiglu import SwiGLU
from archsearch.arch.spec import ArchSpec, LayerSpec


class ContinuumMemory(nn.Module):
    """A chain of residual SwiGLU levels: [B, T, D] -> [B, T, D]. No biases."""

    def __init__(self, *, spec: ArchSpec, layer: LayerSpec):
        super().__init__()
        self.levels = nn.ModuleList(SwiGLU(spec=spec, layer=replace(layer, mlp_width=w))
                                    for w in level_widths(layer))

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        # a plain composition of the levels starts with its signal shrunk by every level
        # (each SwiGLU's output is small at init), so each level adds to a running stream
        total_BTD = torch.zeros_like(x_BTD)
        for level in self.levels:
            total_BTD = total_BTD + level(x_BTD + total_BTD)
        return total_BTD
