"""Before a study's trials start: the checks it lists, and on a GPU each Triton kernel it uses.

``checks: [causal]`` builds every planned architecture and stops the study, before any
trial trains, if changing later tokens moves an earlier output (archsearch.inspect.causal).
A kernel that fails to compile, or disagrees with its PyTorch reference on this device, is
turned off (its op runs the PyTorch path in this process and in the workers started after)
and the failure is recorded in the store, instead of every trial failing on it.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from collections.abc import Iterable

from archsearch.arch.kernel_ops import kernels_used
from archsearch.arch.spec import ArchSpec
from archsearch.errors import SpecError

# The settings archsearch_kernels.dispatch reads, named here without importing it (and torch).
MODE_VAR, DISABLE_VAR = "ARCHSEARCH_KERNELS", "ARCHSEARCH_KERNELS_DISABLE"


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


# the dispatched op of each scan's C++ extension (cpu_cache.EXTENSIONS)
SCAN_EXTENSIONS = {"selective_scan": "selective_scan", "ssd": "ssd", "gated_delta_rule": "gated_delta"}


def cpu_builds_missing(specs: Iterable[ArchSpec] | None, *, address: str | None) -> list[str]:
    """The C++ CPU extensions (archsearch_kernels/cpu_build.py) a local CPU run's trials need that
    this Python environment has not built yet, told without importing torch: "elementwise" (every
    model's RMSNorm), for Mamba's scan "selective_scan", for Mamba-2's "ssd" and for Gated
    DeltaNet's "gated_delta" (every one when `specs` is None, as for a sampled search). None on a
    cluster (its nodes build their own) or where the kernels would not run (a CUDA torch,
    ARCHSEARCH_KERNELS=reference or triton)."""
    from archsearch_kernels.cpu_cache import is_built

    setting = os.environ.get(MODE_VAR, "auto").strip().lower() or "auto"
    if address is not None or setting in ("reference", "triton") or not _no_cuda_here():
        return []
    needed = ["elementwise"]
    used = kernels_used(specs) if specs is not None else None
    needed += [extension for op, extension in SCAN_EXTENSIONS.items() if used is None or op in used]
    return [name for name in needed if not is_built(name)]


def build_cpu_kernels(extensions: list[str]) -> None:
    """Build `extensions` before any trial starts, in a process of its own (torch is imported
    there, not in the driver), whose lines (what compiles, about how long, when it is done) go to
    stderr as they come. Otherwise each trial's worker would build them, silently, its clock
    running. A build that fails is said; the trials then use the PyTorch path."""
    import subprocess

    command = [sys.executable, "-m", "archsearch.cli", "kernels", "build", "--only", ",".join(extensions)]
    done = subprocess.run(command, stdin=subprocess.DEVNULL, check=False)
    if done.returncode != 0:
        print("warning: the C++ CPU kernels did not build (see above); the trials use the PyTorch path",
              file=sys.stderr, flush=True)


def preflight_checks(study, db, trials: list | None = None) -> None:
    """Run ``study.checks`` on its planned ``trials`` (``plan(study)`` when None),
    one build per distinct architecture; record the outcome in the store and,
    when one fails, raise a SpecError naming the arm, its trial and the position."""
    if "causal" not in study.checks:
        return
    import torch

    from archsearch.analysis.compare import varying_axes
    from archsearch.data import seq_len_of
    from archsearch.inspect.causal import spec_leak
    from archsearch.planner import plan

    trials = plan(study) if trials is None else trials
    arms: dict[str, object] = {}  # one trial per architecture and length (seeds share both)
    for trial in trials:
        arms.setdefault(json.dumps([trial.spec.to_dict(), seq_len_of(trial.data)], sort_keys=True), trial)
    leaks, lengths = [], set()
    threads = torch.get_num_threads()
    torch.set_num_threads(study.execution.threads_per_trial)  # as a trial runs; the machine's cores oversubscribe
    try:
        for trial in arms.values():
            leak, length = spec_leak(trial.spec, seq_len=seq_len_of(trial.data), seed=trial.seed)
            lengths.add(length)
            if leak is not None:
                leaks.append((trial, leak))
    finally:
        torch.set_num_threads(threads)
    if not leaks:
        db.record_check(study.name, "causal", dict(passed=True, architectures=len(arms), seq_len=sorted(lengths)))
        return
    trial, leak = leaks[0]
    more = f" (and {len(leaks) - 1} more of the {len(arms)} arms)" if len(leaks) > 1 else ""
    names = varying_axes([t.axes for t in arms.values()])
    label = " ".join(f"{name}={trial.axes[name]}" for name in names if name in trial.axes) or trial.spec.family
    line = (f"causal-leakage check failed: arm {label} (trial "
            f"{trial.trial_id}): {leak.describe()}{more}; no trial was trained")
    db.record_check(study.name, "causal", dict(passed=False, architectures=len(arms), seq_len=sorted(lengths),
                                              leaking=len(leaks), failure=line))
    hint = "the model reads tokens after the one it predicts; fix it before training, the loss would be a leak's"
    origin = study._origin
    if origin is None:
        raise SpecError(line, field="checks", hint=hint)
    raise origin.error(line, loc=("checks",), hint=hint)


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
