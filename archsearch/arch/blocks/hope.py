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

from archsearch.arch.blocks.swiglu import SwiGLU
from archsearch.arch.spec import ArchSpec, LayerSpec


def level_widths(layer: LayerSpec) -> list[int]:
    """The widths of the CMS levels: ``layer.mlp_width`` split over ``cms_levels``, summing to it exactly.

    A width below ``cms_levels`` leaves the last levels empty (width 0, output 0)
    rather than failing, so the width solver may probe any total.
    """
    levels = layer.options.get("cms_levels", 3)
    if not isinstance(levels, int) or levels < 1:
        raise ValueError(f"cms: options['cms_levels'] must be an int >= 1, got {levels!r}")
    base, extra = divmod(layer.mlp_width, levels)
    return [base + (i < extra) for i in range(levels)]


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


def params(spec: ArchSpec, layer: LayerSpec) -> int:
    """Every level's gate, up and down projections: 3 D sum(F_i) = 3 D mlp_width, linear in
    the width as the solver and the taper need (no norms between levels)."""
    return 3 * spec.d_model * sum(level_widths(layer))


def flops(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> float:
    """Forward FLOPs per token: 2 per weight, 6 D mlp_width (residual adds and SiLU not counted)."""
    return 2.0 * params(spec, layer)
