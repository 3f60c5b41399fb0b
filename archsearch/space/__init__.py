"""Space and study files: YAML -> typed, validated models. Torch-free."""

from archsearch.space.load import Origin, load_space, load_study
from archsearch.space.running import Execution
from archsearch.space.schema import Budget, Space, Study
from archsearch.space.training import Data, MqarData, Recipe, TextData

__all__ = ["Budget", "Data", "Execution", "MqarData", "Origin", "Recipe", "Space", "Study", "TextData", "load_space",
           "load_study"]
