"""The results store (DuckDB, Parquet export). Torch-free."""

from archsearch.store.duck import Store, checkpoint_dir, code_version, open_store

__all__ = ["Store", "checkpoint_dir", "code_version", "open_store"]
