"""The counting formulas of ``mamba`` (parameters, FLOPs, state), importable without torch.

``mamba.py`` holds the module and re-exports these; the registry reads them from here,
so planning counts a model without importing torch."""

from __future__ import annotations

import math
from dataclasses import dataclass

from archsearch.arch.spec import ArchSpec, LayerSpec


@dataclass(frozen=True)
class MambaSizes:
    """The resolved widths of one Mamba layer."""

    d_model: int
    inner: int  # E
    state: int  # N
    conv: int  # k
    dt_rank: int  # R


def sizes(spec: ArchSpec, layer: LayerSpec) -> MambaSizes:
    """Widths from ``layer.options`` and their defaults (the mamba_simple defaults)."""
    options, d = layer.options, spec.d_model
    return MambaSizes(d_model=d, inner=int(options.get("expand", 2) * d), state=options.get("d_state", 16),
                      conv=options.get("d_conv", 4), dt_rank=options.get("dt_rank", math.ceil(d / 16)))


def params(spec: ArchSpec, layer: LayerSpec) -> int:
    """in_proj 2DE + conv kE + E (bias) + x_proj E(R + 2N) + dt_proj RE + E (bias)
    + A_log EN + D E + out_proj ED."""
    s = sizes(spec, layer)
    d, e, n, k, r = s.d_model, s.inner, s.state, s.conv, s.dt_rank
    return 2 * d * e + k * e + e + e * (r + 2 * n) + r * e + e + e * n + e + e * d


def mixing(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> float:
    """The recurrence's multiply-adds on the [E, N] state per token: 6 E N.

    Per (channel, state) pair: delta*A (1), (delta*u)*B (1), decay*h + input (2) and the
    readout C.h (2). Per-channel work (delta*u, the D skip, the gate) and the exp, softplus
    and SiLU are left out, as activations are everywhere else. Independent of seq_len.
    """
    s = sizes(spec, layer)
    return 6.0 * s.inner * s.state


def flops(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> float:
    """Forward FLOPs per token: 2 (2DE + E(R + 2N) + RE + ED) for the projections,
    2kE for the conv, plus the scan's ``mixing``."""
    s = sizes(spec, layer)
    d, e, n, k, r = s.d_model, s.inner, s.state, s.conv, s.dt_rank
    weights = 2 * d * e + e * (r + 2 * n) + r * e + e * d
    return 2.0 * weights + 2.0 * k * e + mixing(spec, layer, seq_len)


def state(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> int:
    """The SSM state E N plus the conv's last k-1 inputs E (k-1); independent of seq_len."""
    s = sizes(spec, layer)
    return s.inner * s.state + s.inner * (s.conv - 1)
