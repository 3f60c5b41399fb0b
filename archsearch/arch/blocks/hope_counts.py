"""The counting formulas of ``hope`` (parameters, FLOPs, state), importable without torch.

``hope.py`` holds the module and re-exports these; the registry reads them from here,
so planning counts a model without importing torch."""

from __future__ import annotations

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


def params(spec: ArchSpec, layer: LayerSpec) -> int:
    """Every level's gate, up and down projections: 3 D sum(F_i) = 3 D mlp_width, linear in
    the width as the solver and the taper need (no norms between levels)."""
    return 3 * spec.d_model * sum(level_widths(layer))


def flops(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> float:
    """Forward FLOPs per token: 2 per weight, 6 D mlp_width (residual adds and SiLU not counted)."""
    return 2.0 * params(spec, layer)
