"""The typed shape of space and study files.

A *space* names a model family and its design axes; a *study* says what to
match (budget), on what data, with which training recipe and how to run it.
Every model here forbids unknown keys so a typo is an error, not a silent
default. Axes accept one value or a list; a list is a grid dimension.

Torch-free: this module is imported by ``archsearch plan`` and the CLI.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr

T = TypeVar("T")

TAPER_SHAPES = ("uniform", "cosine", "linear", "sigmoid", "reverse")


def _as_list(value: Any) -> Any:
    return value if isinstance(value, list) else [value]


def axis(inner: Any) -> Any:
    """An axis: one value, or a non-empty list of values to grid over."""
    return Annotated[list[inner], BeforeValidator(_as_list, json_schema_input_type=Union[inner, list[inner]]),
                     Field(min_length=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TaperAxes(_Strict):
    """How MLP width is spread over depth; the total MLP width is kept."""

    shape: axis(Literal[TAPER_SHAPES]) = Field(
        default=["uniform"], description="uniform | cosine | linear | sigmoid | reverse (cosine, narrow first)")
    ratio: axis(Annotated[float, Field(ge=1.0, le=20.0)]) = Field(
        default=[3.0], description="widest layer over narrowest; 3.0 gives the 1.5x -> 0.5x cosine of TLM")


class Axes(_Strict):
    num_layers: axis(Annotated[int, Field(ge=1, le=256)]) = Field(description="number of layers")
    taper: TaperAxes = TaperAxes()


class ModelOptions(_Strict):
    """Fixed choices of the family that are not searched."""

    head_dim: int = Field(default=16, ge=4, le=512, description="d_model is a multiple of it")
    mlp_ratio: float = Field(default=8 / 3, gt=0, le=16, description="mean MLP width over d_model")
    multiple_of: int = Field(default=8, ge=1, le=1024, description="every MLP width is a multiple of it")
    rope_theta: float = Field(default=10_000.0, gt=0)
    tie_embeddings: bool = True


class Space(_Strict):
    """The design axes of one model family."""

    name: str = "space"
    family: Literal["transformer"] = "transformer"
    axes: Axes
    model: ModelOptions = ModelOptions()
    _origin: Any = PrivateAttr(default=None)


class Budget(_Strict):
    match: Literal["params"] = Field(default="params", description="what every trial is matched on")
    targets: list[Annotated[float, Field(gt=0)]] = Field(
        min_length=1, description="ladder of targets: non-embedding parameters")
    tolerance: float = Field(default=0.01, gt=0, le=0.5, description="largest |achieved/target - 1|")


class TextData(_Strict):
    """Byte-level text: the installed Python standard library, or your own files."""

    kind: Literal["text"] = "text"
    paths: list[str] | None = Field(
        default=None, description="files or folders of text; default: the Python stdlib's source")
    seq_len: int = Field(default=128, ge=2, le=1 << 16)
    val_fraction: float = Field(default=0.1, gt=0, lt=1)
    max_bytes: int = Field(default=4_000_000, ge=1024, description="read at most this much text")


class MqarData(_Strict):
    """Multi-query associative recall, generated on the fly."""

    kind: Literal["mqar"]
    seq_len: int = Field(default=64, ge=8, le=1 << 16)
    vocab_size: int = Field(default=256, ge=16)
    num_pairs: int = Field(default=8, ge=1)


Data = Annotated[Union[TextData, MqarData], Field(discriminator="kind")]


class Recipe(_Strict):
    """AdamW with linear warmup and cosine decay to ``min_lr_ratio * lr``."""

    steps: int = Field(default=200, ge=1)
    batch_size: int = Field(default=16, ge=1)
    lr: float = Field(default=3e-3, gt=0, le=1)
    warmup_steps: int = Field(default=20, ge=0)
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    weight_decay: float = Field(default=0.1, ge=0)
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.95, ge=0, lt=1)
    grad_clip: float = Field(default=1.0, gt=0)
    eval_every: int = Field(default=50, ge=1)
    eval_batches: int = Field(default=4, ge=1)


class Execution(_Strict):
    max_parallel: int | Literal["auto"] = Field(default="auto", description="trials at once; auto = CPUs")
    threads_per_trial: int = Field(default=1, ge=1, description="torch threads inside each trial")
    retries: int = Field(default=1, ge=0, le=10, description="re-runs of a trial whose worker died")


class Study(_Strict):
    """A study: a space, a budget ladder, data, a recipe, seeds, execution."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="letters, digits, _ . -")
    space: Union[str, Space] = Field(description="path to a space file (relative to this file), or inline")
    budget: Budget
    data: Data = TextData()
    recipe: Recipe = Recipe()
    seeds: list[int] = Field(default=[0], min_length=1)
    execution: Execution = Execution()
    _origin: Any = PrivateAttr(default=None)
