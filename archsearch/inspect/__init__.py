"""Analyses of trained models, loaded from their checkpoints (imports torch)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from torch import nn

from archsearch.store import checkpoint_dir, open_store
from archsearch.train.checkpoint import is_uri, load_model, pull


def load_trained(trial_id: str, *, store: str | Path = "archsearch.duckdb", device: str = "cpu") -> nn.Module:
    """The trained model of ``trial_id`` from a store, in eval mode.

    Raises FileNotFoundError when the trial has no checkpoint (not run yet, or
    run before checkpoints were kept).
    """
    with open_store(store, read_only=True) as db:
        found = db.sql("SELECT s.config->>'$.execution.storage' AS storage FROM trials t "
                       "LEFT JOIN study_trials st USING (trial_id) LEFT JOIN studies s ON s.name = st.study "
                       "WHERE t.trial_id = ?", [trial_id]).to_pylist()
    if not found:
        raise FileNotFoundError(f"no trial {trial_id} in {store}; see `archsearch status --store {store}`")
    location = checkpoint_dir(store, trial_id, storage=found[0]["storage"])
    if not is_uri(location):
        return load_model(location, device=device)
    with tempfile.TemporaryDirectory(prefix="archsearch-model-") as folder:
        pull(str(location), folder)
        return load_model(folder, device=device)


__all__ = ["load_trained"]
