"""Which dispatched kernel ops (``archsearch_kernels.dispatch.OPS``) a model runs, read off its spec.

Torch-free, so the driver's preflight and the bench ask the same question without building a model.
"""

from __future__ import annotations

from collections.abc import Iterable

from archsearch.arch.spec import ArchSpec


def kernels_used(specs: Iterable[ArchSpec]) -> list[str]:
    """The dispatched ops these models run: RMSNorm and the fused loss always, SwiGLU, the
    rotary q, k, v heads of (gated) attention, the short causal conv of the recurrent mixers,
    the softplus of their step sizes, the selective scan, the gated delta rule (both
    its kernels: which one runs depends on the sequence length) and the SSD scan where a layer
    has them."""
    ops = {"rms_norm", "linear_cross_entropy"}
    for spec in specs:
        for layer in spec.layers:
            if layer.mlp == "swiglu":
                ops.add("swiglu")
            if layer.mixer in ("attention", "gated_attention"):
                ops.add("rope_heads")
            if layer.mixer in ("mamba", "mamba2", "gated_deltanet"):
                ops.update(("causal_conv1d", "softplus"))
            if layer.mixer == "mamba":
                ops.add("selective_scan")
            if layer.mixer == "gated_deltanet":
                ops.update(("gated_delta_rule", "gated_delta_rule_chunked"))
            if layer.mixer == "mamba2":
                ops.add("ssd")
    return sorted(ops)
