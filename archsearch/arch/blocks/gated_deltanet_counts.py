"""The counting formulas of ``gated_deltanet`` (parameters, FLOPs, state), importable without torch.

``gated_deltanet.py`` holds the module and re-exports these; the registry reads them from here,
so planning counts a model without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from archsearch.arch.spec import ArchSpec, LayerSpec


@dataclass(frozen=True)
class DeltaSizes:
    """The resolved widths of one Gated DeltaNet layer."""

    d_model: int
    heads: int  # H
    key: int  # K
    value: int  # V
    conv: int

    @property
    def qkv(self) -> int:
        """Channels through the short conv: 2HK + HV."""
        return self.heads * (2 * self.key + self.value)


def sizes(spec: ArchSpec, layer: LayerSpec) -> DeltaSizes:
    """Widths from ``layer.options`` and their defaults."""
    options = layer.options
    key = options.get("head_k_dim", spec.head_dim)
    return DeltaSizes(d_model=spec.d_model, heads=options.get("num_heads", spec.num_heads), key=key,
                      value=options.get("head_v_dim", key), conv=options.get("d_conv", 4))


def params(spec: ArchSpec, layer: LayerSpec) -> int:
    """q, k, v projections D(2HK + HV), their convs k(2HK + HV), decay and write-strength
    projections 2DH, A_log and dt_bias 2H, output gate D HV, the per-head norm V and the
    output projection HV D."""
    s = sizes(spec, layer)
    d, h, hv = s.d_model, s.heads, s.heads * s.value
    return d * s.qkv + s.conv * s.qkv + 2 * d * h + 2 * h + d * hv + s.value + hv * d


def mixing(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> float:
    """The recurrence's multiply-adds on each head's [K, V] state per token: 7 H K V.

    Decay alpha*S (KV), recall S^T k (2KV), write k (beta (v - recall))^T (2KV), readout
    S q (2KV), in the recurrent form. Per-channel work (the correction, l2 and RMS norms,
    the gate) and the exp, sigmoid and softplus are left out, as activations are everywhere
    else. The chunked form does more arithmetic for fewer sequential steps; this counts the
    recurrence. Independent of seq_len.
    """
    s = sizes(spec, layer)
    return 7.0 * s.heads * s.key * s.value


def flops(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> float:
    """Forward FLOPs per token: 2 per projection weight, 2k(2HK + HV) for the convs, plus ``mixing``."""
    s = sizes(spec, layer)
    d, h, hv = s.d_model, s.heads, s.heads * s.value
    weights = d * s.qkv + 2 * d * h + d * hv + hv * d
    return 2.0 * weights + 2.0 * s.conv * s.qkv + mixing(spec, layer, seq_len)


def state(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> int:
    """Each head's [K, V] state, H K V, plus the short conv's last k-1 inputs (2HK + HV)(k-1);
    independent of seq_len."""
    s = sizes(spec, layer)
    return s.heads * s.key * s.value + s.qkv * (s.conv - 1)
