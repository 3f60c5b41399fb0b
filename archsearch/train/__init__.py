"""One trial, start to finish. Imports neither ray nor duckdb."""

from archsearch.train.loop import TrialResult, evaluate, lr_at, train_trial

__all__ = ["TrialResult", "evaluate", "lr_at", "train_trial"]
