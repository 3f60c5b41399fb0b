"""Before a study's trials start on a GPU: compile and check each Triton kernel it uses, once.

A kernel that fails to compile, or disagrees with its PyTorch reference on this device, is
turned off (its op runs the PyTorch path in this process and in the workers started after)
and the failure is recorded in the store, instead of every trial failing on it.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Iterable

from archsearch.arch.spec import ArchSpec

# The settings archsearch_kernels.dispatch reads, named here without importing it (and torch).
MODE_VAR, DISABLE_VAR = "ARCHSEARCH_KERNELS", "ARCHSEARCH_KERNELS_DISABLE"


def kernels_used(specs: Iterable[ArchSpec]) -> list[str]:
    """The dispatched ops these models run: RMSNorm and the fused loss always, SwiGLU, the
    selective scan and the gated delta rule where a layer has them."""
    ops = {"rms_norm", "linear_cross_entropy"}
    for spec in specs:
        for layer in spec.layers:
            if layer.mlp == "swiglu":
                ops.add("swiglu")
            if layer.mixer == "mamba":
                ops.add("selective_scan")
            if layer.mixer == "gated_deltanet":
                ops.add("gated_delta_rule")
    return sorted(ops)


def preflight_kernels(study_name: str, db, specs: Iterable[ArchSpec] | None, *, device: str | None = None,
                      warn=print) -> dict[str, str]:
    """Check the kernels `specs` use (every op when None: a sampled search's models are not
    known yet) on `device` (CUDA when present; on a CPU nothing runs Triton, so nothing is
    checked). Records and warns about each failure; returns {op: why}."""
    setting = os.environ.get(MODE_VAR, "auto").strip().lower() or "auto"
    if setting == "reference" or (setting == "auto" and device is None and _no_cuda_here()):
        # Nothing would run Triton: told without importing torch (1-4 s), which the driver
        # of a run needs for nothing else.
        db.record_kernel_preflight(study_name, {})
        return {}
    import torch
    from archsearch_kernels import dispatch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    ops = kernels_used(specs) if specs is not None else list(dispatch.OPS)
    failures = dispatch.preflight(ops, device)
    db.record_kernel_preflight(study_name, failures)
    for reason in failures.values():
        warn(f"warning: {reason}; using the PyTorch path for it")
    return failures


def _no_cuda_here() -> bool:
    """Whether torch here can never see a CUDA device, told without importing it: a CPU build
    (its version ends in +cpu), or macOS."""
    if sys.platform == "darwin":
        return True
    try:
        return importlib.metadata.version("torch").endswith("+cpu")
    except importlib.metadata.PackageNotFoundError:
        return False


def kernel_settings() -> dict[str, str | None]:
    """This process's kernel settings (the mode, the ops a preflight turned off), for a trial's
    task to take along: a worker that started before the preflight, or on another node, never
    saw them in its environment."""
    return {name: os.environ.get(name) for name in (MODE_VAR, DISABLE_VAR)}


def use_kernel_settings(settings: dict[str, str | None]) -> None:
    """In a worker, before its trial: the driver's kernel settings, whatever this process had
    (a reused worker may have run another study's trial)."""
    for name, value in settings.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
