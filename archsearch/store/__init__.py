"""The results store (DuckDB, Parquet export). Torch-free."""

from archsearch.store.duck import Store, code_version, open_store

__all__ = ["Store", "code_version", "open_store"]
