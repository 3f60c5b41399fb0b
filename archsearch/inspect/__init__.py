"""Analyses of trained models, loaded from their checkpoints (imports torch).

``load_trained`` reloads a trial's model and ``calibration`` draws its
calibration batches from the trial's own data; the analyses take a model and
a list of batches: ``error_contraction`` (rho per layer), ``depth_pruning``,
``compress_model`` / ``compare_schedules`` (Wanda), ``exit_curve`` (early
exit of looped models), ``run_probe`` and ``half_lives``. See docs/inspect.md.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
from torch import nn

from archsearch.data import Batch, make_source
from archsearch.inspect._trace import perplexity, tokens_per_second, trace
from archsearch.inspect.early_exit import adapt_cache_holes, exit_curve, exit_point
from archsearch.inspect.probes import ProbeResult, fit_probe, half_lives, ridge, run_probe
from archsearch.inspect.prune import block_influence, depth_pruning, layer_scores, rank_layers, remove_layers
from archsearch.inspect.rho import RhoProfile, error_contraction, spearman
from archsearch.inspect.wanda import compare_schedules, compress_model, sparsity_schedule, zero_fraction
from archsearch.store import checkpoint_dir, open_store
from archsearch.train.checkpoint import is_uri, load_model, pull


def _trial_row(trial_id: str, store: str | Path) -> dict:
    with open_store(store, read_only=True) as db:
        found = db.sql("SELECT status, data FROM trials WHERE trial_id = ?", [trial_id]).to_pylist()
    if not found:
        raise FileNotFoundError(f"no trial {trial_id} in {store}; see `archsearch status --store {store}`")
    return found[0]


def load_trained(trial_id: str, *, store: str | Path = "archsearch.duckdb", device: str = "cpu") -> nn.Module:
    """The trained model of ``trial_id`` from a store, in eval mode.

    Raises FileNotFoundError when the trial has no checkpoint (not run yet, or
    run before checkpoints were kept).
    """
    with open_store(store, read_only=True) as db:
        # a twin that shared another's training (same_as) has that trial's model
        columns = db.sql("SELECT * FROM trials LIMIT 0").column_names
        trained = "coalesce(t.same_as, t.trial_id)" if "same_as" in columns else "t.trial_id"
        found = db.sql(f"SELECT {trained} AS trained, s.config->>'$.execution.storage' AS storage FROM trials t "
                       f"LEFT JOIN study_trials st ON st.trial_id = {trained} LEFT JOIN studies s ON s.name = st.study "
                       "WHERE t.trial_id = ?", [trial_id]).to_pylist()
    if not found:
        raise FileNotFoundError(f"no trial {trial_id} in {store}; see `archsearch status --store {store}`")
    location = checkpoint_dir(store, found[0]["trained"], storage=found[0]["storage"])
    if not is_uri(location):
        return load_model(location, device=device)
    with tempfile.TemporaryDirectory(prefix="archsearch-model-") as folder:
        pull(str(location), folder)
        return load_model(folder, device=device)


def calibration(trial_id: str, *, store: str | Path = "archsearch.duckdb", batches: int = 4, batch_size: int = 8,
                seed: int = 0, split: str = "val") -> list[Batch]:
    """``batches`` batches of the trial's own data (its ``split``), the same ones for a given seed."""
    source = make_source(json.loads(_trial_row(trial_id, store)["data"]))
    generator = torch.Generator().manual_seed(seed)
    return [source.batch(split=split, batch_size=batch_size, generator=generator) for _ in range(batches)]


__all__ = [
    "ProbeResult", "RhoProfile", "adapt_cache_holes", "block_influence", "calibration", "compare_schedules",
    "compress_model", "depth_pruning", "error_contraction", "exit_curve", "exit_point", "fit_probe", "half_lives",
    "layer_scores", "load_trained", "perplexity", "rank_layers", "remove_layers", "ridge", "run_probe",
    "sparsity_schedule", "spearman", "tokens_per_second", "trace", "zero_fraction",
]
