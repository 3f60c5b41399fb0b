"""One trial, start to finish. Imports neither ray nor duckdb."""

from archsearch.train.checkpoint import load_model
from archsearch.train.loop import TrialResult, evaluate, train_trial
from archsearch.train.recipe import lr_at, resolve_steps

__all__ = ["TrialResult", "evaluate", "load_model", "lr_at", "resolve_steps", "train_trial"]
