"""Space and study files: YAML -> typed, validated models. Torch-free."""

from archsearch.space.load import Origin, load_space, load_study
from archsearch.space.schema import Budget, Execution, Recipe, Space, Study

__all__ = ["Budget", "Execution", "Origin", "Recipe", "Space", "Study", "load_space", "load_study"]
