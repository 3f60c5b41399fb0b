"""The results store (DuckDB, Parquet export). Torch-free."""

from archsearch.store.duck import Store, checkpoint_dir, open_store
from archsearch.store.runlock import RunLock, run_alive
from archsearch.store.values import code_version
from archsearch.store.writes import divergence

__all__ = ["RunLock", "Store", "checkpoint_dir", "code_version", "divergence", "open_store", "run_alive"]
