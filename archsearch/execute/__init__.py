"""The Ray driver: the only package that imports ray."""

from archsearch.execute.driver import RunSummary, run_study

__all__ = ["RunSummary", "run_study"]
