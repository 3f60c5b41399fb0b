"""archsearch: declarative architecture search and scaling studies for LMs.

The public API, declared once here. Imports are lazy so ``archsearch --help``
and torch-free tools do not pay for torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {
    "SpecError": "archsearch.errors",
    "ArchsearchError": "archsearch.errors",
    "load_study": "archsearch.space",
    "load_space": "archsearch.space",
    "plan": "archsearch.planner",
    "PlannedTrial": "archsearch.planner",
    "ArchSpec": "archsearch.arch.spec",
    "LayerSpec": "archsearch.arch.spec",
    "build_model": "archsearch.arch.model",
    "count_params": "archsearch.budget",
    "flops_per_token": "archsearch.budget",
    "train_trial": "archsearch.train",
    "run_study": "archsearch.execute",
    "open_store": "archsearch.store",
}

__all__ = [
    "ArchSpec", "ArchsearchError", "LayerSpec", "PlannedTrial", "SpecError", "__version__", "build_model",
    "count_params", "flops_per_token", "load_space", "load_study", "open_store", "plan", "run_study",
    "train_trial",
]

if TYPE_CHECKING:
    from archsearch.arch.model import build_model
    from archsearch.arch.spec import ArchSpec, LayerSpec
    from archsearch.budget import count_params, flops_per_token
    from archsearch.errors import ArchsearchError, SpecError
    from archsearch.execute import run_study
    from archsearch.planner import PlannedTrial, plan
    from archsearch.space import load_space, load_study
    from archsearch.store import open_store
    from archsearch.train import train_trial


def __getattr__(name: str):
    if name == "inspect":  # A.inspect.load_trained(...) and the analyses; imports torch, so only on use
        return importlib.import_module("archsearch.inspect")
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'archsearch' has no attribute {name!r}")
