"""The counting formulas of ``mamba2`` (parameters, FLOPs, state), importable without torch.

``mamba2.py`` holds the module and re-exports these; the registry reads them from here,
so planning counts a model without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from archsearch.arch.spec import ArchSpec, LayerSpec


@dataclass(frozen=True)
class Mamba2Sizes:
    """The resolved widths of one Mamba-2 layer."""

    d_model: int
    inner: int  # E = H P
    heads: int  # H
    head_dim: int  # P
    groups: int  # G
    state: int  # N
    conv: int  # k

    @property
    def conv_channels(self) -> int:
        """Channels through the conv: x, B and C, E + 2GN."""
        return self.inner + 2 * self.groups * self.state

    @property
    def in_proj(self) -> int:
        """in_proj outputs: z, x, B, C and dt, 2E + 2GN + H."""
        return self.inner + self.conv_channels + self.heads


def sizes(spec: ArchSpec, layer: LayerSpec) -> Mamba2Sizes:
    """Widths from ``layer.options`` and their defaults."""
    options, d = layer.options, spec.d_model
    head_dim = options.get("head_dim", 64)
    heads = max(1, round(options.get("expand", 2) * d / head_dim))
    return Mamba2Sizes(d_model=d, inner=heads * head_dim, heads=heads, head_dim=head_dim,
                       groups=options.get("n_groups", 1), state=options.get("d_state", 128),
                       conv=options.get("d_conv", 4))


def params(spec: ArchSpec, layer: LayerSpec) -> int:
    """in_proj D(2E + 2GN + H) + conv k(E + 2GN) + its bias (E + 2GN) + A_log, dt_bias and D
    (3H) + the norm weight E + out_proj E D."""
    s = sizes(spec, layer)
    d, e, x, h = s.d_model, s.inner, s.conv_channels, s.heads
    return d * s.in_proj + s.conv * x + x + 3 * h + e + e * d


def mixing(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> float:
    """The recurrence's multiply-adds on each head's [P, N] state per token: 5 H P N = 5 E N.

    Per (channel, state) pair: (dt x) * B (1), decay * S + input (2) and the readout S C (2).
    Mamba-1 counts 6 E N: its decay exp(delta A) is one more product per pair, here it is one
    scalar per head. Per-channel and per-head work (dt x, the D skip, the gate, the norm) and
    the exp and softplus are left out, as activations are everywhere else. The chunked form
    does more arithmetic for fewer sequential steps; this counts the recurrence. Independent
    of seq_len.
    """
    s = sizes(spec, layer)
    return 5.0 * s.inner * s.state


def flops(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> float:
    """Forward FLOPs per token: 2 (D(2E + 2GN + H) + E D) for the projections, 2k(E + 2GN)
    for the conv, plus the scan's ``mixing``."""
    s = sizes(spec, layer)
    weights = s.d_model * s.in_proj + s.inner * s.d_model
    return 2.0 * weights + 2.0 * s.conv * s.conv_channels + mixing(spec, layer, seq_len)


def state(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> int:
    """Each head's [P, N] SSM state, H P N = E N, plus the conv's last k-1 inputs
    (E + 2GN)(k-1); independent of seq_len."""
    s = sizes(spec, layer)
    return s.inner * s.state + s.conv_channels * (s.conv - 1)
