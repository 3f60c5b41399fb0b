"""Before a study's trials start on a GPU: compile and check each Triton kernel it uses, once.

A kernel that fails to compile, or disagrees with its PyTorch reference on this device, is
turned off (its op runs the PyTorch path in this process and in the workers started after)
and the failure is recorded in the store, instead of every trial failing on it.
"""

from __future__ import annotations

from collections.abc import Iterable

from archsearch.arch.spec import ArchSpec


def kernels_used(specs: Iterable[ArchSpec]) -> list[str]:
    """The dispatched ops these models run: RMSNorm and the fused loss always, SwiGLU, the
    selective scan and the gated delta rule (both its kernels: which one runs depends on the
    sequence length) where a layer has them."""
    ops = {"rms_norm", "linear_cross_entropy"}
    for spec in specs:
        for layer in spec.layers:
            if layer.mlp == "swiglu":
                ops.add("swiglu")
            if layer.mixer == "mamba":
                ops.add("selective_scan")
            if layer.mixer == "gated_deltanet":
                ops.update(("gated_delta_rule", "gated_delta_rule_chunked"))
    return sorted(ops)


def preflight_kernels(study_name: str, db, specs: Iterable[ArchSpec] | None, *, device: str | None = None,
                      warn=print) -> dict[str, str]:
    """Check the kernels `specs` use (every op when None: a sampled search's models are not
    known yet) on `device` (CUDA when present; on a CPU nothing runs Triton, so nothing is
    checked). Records and warns about each failure; returns {op: why}."""
    import torch
    from archsearch_kernels import dispatch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    ops = kernels_used(specs) if specs is not None else list(dispatch.OPS)
    failures = dispatch.preflight(ops, device)
    db.record_kernel_preflight(study_name, failures)
    for reason in failures.values():
        warn(f"warning: {reason}; using the PyTorch path for it")
    return failures
