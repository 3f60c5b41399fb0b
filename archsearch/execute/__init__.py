"""The Ray driver: the only package that imports ray.

``run_study`` is imported on first use, so a Ray worker that imports the
trial's task (``archsearch.execute.task``) does not import the driver's store,
planner and search with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["RunSummary", "run_study"]

if TYPE_CHECKING:
    from archsearch.execute.driver import RunSummary, run_study


def __getattr__(name: str) -> Any:
    if name in __all__:
        from archsearch.execute import driver

        return getattr(driver, name)
    raise AttributeError(f"module 'archsearch.execute' has no attribute '{name}'")
