"""The typed shape of space and study files.

A *space* names a model family and its design axes; a *study* says what to
match (budget), on what data, with which training recipe and how to run it.
Every model here forbids unknown keys so a typo is an error, not a silent
default. Axes accept one value or a list; a list is a grid dimension.

Torch-free: this module is imported by ``archsearch plan`` and the CLI.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar, Union

from pydantic import BeforeValidator, Field, PrivateAttr

from archsearch.space.training import Data, Recipe, Strict, TextData

T = TypeVar("T")

TAPER_SHAPES = ("uniform", "cosine", "linear", "sigmoid", "reverse")


def _as_list(value: Any) -> Any:
    return value if isinstance(value, list) else [value]


def axis(inner: Any) -> Any:
    """An axis: one value, or a non-empty list of values to grid over."""
    return Annotated[list[inner], BeforeValidator(_as_list, json_schema_input_type=Union[inner, list[inner]]),
                     Field(min_length=1)]


class TaperAxes(Strict):
    """How MLP width is spread over depth; the total MLP width is kept."""

    shape: axis(Literal[TAPER_SHAPES]) = Field(
        default=["uniform"], description="uniform | cosine | linear | sigmoid | reverse (cosine, narrow first)")
    ratio: axis(Annotated[float, Field(ge=1.0, le=20.0)]) = Field(
        default=[3.0], description="widest layer over narrowest; 3.0 gives the 1.5x -> 0.5x cosine of TLM")


class Axes(Strict):
    num_layers: axis(Annotated[int, Field(ge=1, le=256)]) = Field(description="number of layers")
    taper: TaperAxes = TaperAxes()


class ModelOptions(Strict):
    """Fixed choices of the family that are not searched."""

    head_dim: int = Field(default=16, ge=4, le=512, description="d_model is a multiple of it")
    mlp_ratio: float = Field(default=8 / 3, gt=0, le=16, description="mean MLP width over d_model")
    multiple_of: int = Field(default=8, ge=1, le=1024, description="every MLP width is a multiple of it")
    rope_theta: float = Field(default=10_000.0, gt=0)
    tie_embeddings: bool = True


class Space(Strict):
    """The design axes of one model family."""

    name: str = "space"
    family: Literal["transformer"] = "transformer"
    axes: Axes
    model: ModelOptions = ModelOptions()
    _origin: Any = PrivateAttr(default=None)


class Budget(Strict):
    match: Literal["params"] = Field(default="params", description="what every trial is matched on")
    targets: list[Annotated[float, Field(gt=0)]] = Field(
        min_length=1, description="ladder of targets: non-embedding parameters")
    tolerance: float = Field(default=0.01, gt=0, le=0.5, description="largest |achieved/target - 1|")


class Execution(Strict):
    max_parallel: int | Literal["auto"] = Field(default="auto", description="trials at once; auto = CPUs")
    threads_per_trial: int = Field(default=1, ge=1, description="torch threads inside each trial")
    retries: int = Field(default=1, ge=0, le=10, description="re-runs of a trial whose worker died")


class Study(Strict):
    """A study: a space, a budget ladder, data, a recipe, seeds, execution."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="letters, digits, _ . -")
    space: Union[str, Space] = Field(description="path to a space file (relative to this file), or inline")
    budget: Budget
    data: Data = TextData()
    recipe: Recipe = Recipe()
    seeds: list[int] = Field(default=[0], min_length=1)
    execution: Execution = Execution()
    _origin: Any = PrivateAttr(default=None)
