"""The typed shape of space and study files.

A *space* names the design axes (the model family among them); a *study* says
what to match (budget), on what data, with which training recipe and how to
run it. Every model here forbids unknown keys so a typo is an error, not a
silent default.

An axis is written as one value, a list (a grid dimension), or a mapping:
``{values: [...]}``, ``{low, high, log, grid: n}`` (n evenly spaced points),
``{low, high, log, sample: n}`` (n seeded random draws), each with an optional
``when: "<expression>"`` that keeps the axis only where it holds.

Torch-free: this module is imported by ``archsearch plan`` and the CLI.
"""

from __future__ import annotations

from typing import Annotated, Any, Generic, Literal, TypeVar, Union

from pydantic import BeforeValidator, Field, PrivateAttr, model_validator

from archsearch.space.training import Data, Recipe, Strict, TextData

T = TypeVar("T")

TAPER_SHAPES = ("uniform", "cosine", "linear", "sigmoid", "reverse")
FAMILIES = ("transformer", "gated_attention", "mamba", "mamba2", "gdn", "hybrid", "looped", "memory", "gpn", "hrm",
            "universal", "titans", "hope")


class Axis(Strict, Generic[T]):
    """One design axis: listed values, or a numeric range to grid or sample."""

    values: list[T] | None = Field(default=None, min_length=1)
    low: float | None = None
    high: float | None = None
    log: bool = Field(default=False, description="space the range evenly in log")
    grid: int | None = Field(default=None, ge=1, le=10_000, description="evenly spaced points in [low, high]")
    sample: int | None = Field(default=None, ge=1, le=10_000, description="seeded random draws in [low, high]")
    when: str | None = Field(default=None, description="expression over other axes; the axis exists where true")

    @model_validator(mode="after")
    def _one_form(self) -> Axis:
        ranged = self.low is not None or self.high is not None
        if self.values is not None and ranged:
            raise ValueError("give either values or low/high, not both")
        if self.values is None:
            if self.low is None or self.high is None:
                raise ValueError("give values, or both low and high")
            if (self.grid is None) == (self.sample is None):
                raise ValueError("a range needs exactly one of grid: N or sample: N")
            if self.low > self.high:
                raise ValueError(f"low ({self.low}) is above high ({self.high})")
            if self.log and self.low <= 0:
                raise ValueError("a log range needs low > 0")
        return self


def _as_axis(value: Any) -> Any:
    if isinstance(value, dict):
        return value
    return {"values": value if isinstance(value, list) else [value]}


def axis(inner: Any) -> Any:
    """An axis type over ``inner`` values, written as a value, list or mapping."""
    return Annotated[Axis[inner], BeforeValidator(_as_axis, json_schema_input_type=Union[
        inner, list[inner], Axis[inner]])]


def fixed(value: Any) -> Any:
    return Field(default=value, validate_default=True)


PositiveInt = Annotated[int, Field(ge=1)]


class TaperAxes(Strict):
    """How MLP width is spread over depth; the total MLP width is kept."""

    shape: axis(Literal[TAPER_SHAPES]) = Field(
        default="uniform", validate_default=True,
        description="uniform | cosine | linear | sigmoid | reverse (cosine, narrow first)")
    ratio: axis(Annotated[float, Field(ge=1.0, le=20.0)]) = Field(
        default=3.0, validate_default=True,
        description="widest layer over narrowest; 3.0 gives the 1.5x -> 0.5x cosine of TLM")


class AttentionAxes(Strict):
    gate: axis(Literal["elementwise", "headwise"]) = fixed("headwise")


class HybridAxes(Strict):
    """The layer mix of hybrid and looped stacks."""

    ratio: axis(Annotated[str, Field(pattern=r"^\d+:\d+$")]) = Field(
        default="3:1", validate_default=True, description="recurrent:attention layers, evenly interleaved")
    pattern: axis(Annotated[str, Field(pattern=r"^[MSGA]*$", max_length=256)]) = Field(
        default="", validate_default=True,
        description="layer letters, tiled to num_layers: M mamba, S mamba-2 (SSD), G gated deltanet, "
                    "A attention; when set, used instead of ratio (looped: the shared group, default A)")
    mixer: axis(Literal["mamba", "mamba2", "gdn"]) = fixed("mamba")


class Mamba2Axes(Strict):
    """Mamba-2 (SSD) layers, of the mamba2 family and S letters of hybrid and looped patterns."""

    d_state: axis(PositiveInt) = Field(default=128, validate_default=True, description="state size N")
    head_dim: axis(PositiveInt) = Field(
        default=64, validate_default=True,
        description="SSM head dim P; the inner width is the multiple of it nearest expand x d_model")
    expand: axis(Annotated[float, Field(gt=0, le=8)]) = fixed(2.0)
    chunk_size: axis(PositiveInt) = Field(default=64, validate_default=True,
                                          description="steps per chunk of the SSD scan (speed only)")


class MemoryAxes(Strict):
    placement: axis(Annotated[int, Field(ge=0)]) = Field(
        default=0, validate_default=True, description="the memory sits after this layer index")
    slots: axis(PositiveInt) = fixed(8)
    width: axis(Annotated[int, Field(ge=0)]) = Field(default=0, validate_default=True,
                                     description="memory slot width; 0 = d_model")
    segment: axis(PositiveInt) = fixed(32)


class GpnAxes(Strict):
    layers: axis(Literal[1, 2]) = fixed(1)
    memory: axis(bool) = Field(default=False, validate_default=True, description="GPN+M")


class HrmAxes(Strict):
    N: axis(PositiveInt) = Field(default=2, validate_default=True, description="slow cycles")
    T: axis(PositiveInt) = Field(default=2, validate_default=True, description="fast steps per slow step")


class Axes(Strict):
    family: axis(Literal[FAMILIES]) = fixed("transformer")
    num_layers: axis(Annotated[int, Field(ge=1, le=256)]) = Field(description="number of layers")
    taper: TaperAxes = TaperAxes()
    loops: axis(Annotated[int, Field(ge=1, le=64)]) = Field(
        default=2, validate_default=True, description="applications of a shared group (looped, universal)")
    exit_gate: axis(bool) = fixed(False)
    mlp: axis(Literal["swiglu", "none"]) = Field(
        default="swiglu", validate_default=True,
        description="none: mixer-only layers, as the Mamba papers build them (mamba, mamba2)")
    attention: AttentionAxes = AttentionAxes()
    hybrid: HybridAxes = HybridAxes()
    mamba2: Mamba2Axes = Mamba2Axes()
    memory: MemoryAxes = MemoryAxes()
    gpn: GpnAxes = GpnAxes()
    hrm: HrmAxes = HrmAxes()


class ModelOptions(Strict):
    """Fixed choices that are not searched."""

    head_dim: int = Field(default=16, ge=4, le=512, description="d_model is a multiple of it")
    mlp_ratio: float = Field(default=8 / 3, gt=0, le=16, description="mean MLP width over d_model")
    multiple_of: int = Field(default=8, ge=1, le=1024, description="every MLP width is a multiple of it")
    d_model: int | None = Field(default=None, ge=4, description="fixed width, for budget.solve_for: mlp")
    rope_theta: float = Field(default=10_000.0, gt=0)
    tie_embeddings: bool = True


INCLUDE = Field(default=None, description="file(s) whose keys this file starts from (relative paths); "
                                         "keys written here override theirs")


class Space(Strict):
    """The design axes, derived values and constraints of a search."""

    include: Union[str, list[str], None] = INCLUDE
    name: str = "space"
    axes: Axes
    derived: dict[str, str] = Field(
        default_factory=dict, description="name: expression over axes (dots become underscores: taper_ratio)")
    constraints: list[str] = Field(default_factory=list, description="expressions every point must satisfy")
    model: ModelOptions = ModelOptions()
    seed: int = Field(default=0, description="seed of sampled axes")
    _origin: Any = PrivateAttr(default=None)


class Ladder(Strict):
    """A geometric ladder of ``count`` targets from ``start`` to ``stop``."""

    start: float = Field(gt=0)
    stop: float = Field(gt=0)
    count: int = Field(ge=2, le=1000)


class Budget(Strict):
    match: Literal["params", "flops", "state"] = Field(
        default="params", description="params: non-embedding parameters; flops: training FLOPs per token at "
                                      "data.seq_len; state: values kept per sequence at data.seq_len")
    targets: Union[list[Annotated[float, Field(gt=0)]], Ladder] = Field(
        description="the ladder of targets: a list, or {start, stop, count}")
    count_embeddings: bool = Field(default=False, description="match total rather than non-embedding params")
    solve_for: Literal["d_model", "mlp", "both"] = Field(
        default="d_model", description="d_model: width with the MLP ratio kept; mlp: MLP width at model.d_model; "
                                       "both: whichever pair lands closest")
    tolerance: float = Field(default=0.005, gt=0, le=0.5, description="largest |achieved/target - 1|")
    protocol: Literal["none", "iso_param", "iso_flop"] = Field(
        default="none", description="looped points also get a baseline arm: iso_param = the same layers once; "
                                    "iso_flop = loops x layers distinct layers")

    @model_validator(mode="after")
    def _non_empty(self) -> Budget:
        if isinstance(self.targets, list) and not self.targets:
            raise ValueError("give at least one target")
        return self

    def target_list(self) -> list[float]:
        if isinstance(self.targets, list):
            return list(self.targets)
        ladder = self.targets
        ratio = (ladder.stop / ladder.start) ** (1 / (ladder.count - 1))
        return [ladder.start * ratio**i for i in range(ladder.count)]


class Execution(Strict):
    max_parallel: int | Literal["auto"] = Field(default="auto", description="trials at once; auto = CPUs")
    threads_per_trial: int = Field(default=1, ge=1, description="torch threads inside each trial")
    retries: int = Field(default=1, ge=0, le=10, description="re-runs of a trial whose worker died")


class Study(Strict):
    """A study: a space, a budget ladder, data, a recipe, seeds, execution."""

    include: Union[str, list[str], None] = INCLUDE
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="letters, digits, _ . -")
    space: Union[str, Space] = Field(description="path to a space file (relative to this file), or inline")
    budget: Budget
    data: Data = TextData()
    recipe: Recipe = Recipe()
    seeds: list[int] = Field(default=[0], min_length=1)
    execution: Execution = Execution()
    _origin: Any = PrivateAttr(default=None)


_BASE = ("family", "num_layers", "taper.shape", "taper.ratio")
MAMBA2_AXES = ("mamba2.d_state", "mamba2.head_dim", "mamba2.expand", "mamba2.chunk_size")
# The axes each family reads; the others are dropped from its points, so a
# transformer is not planned once per loop count.
FAMILY_AXES: dict[str, tuple[str, ...]] = {
    "transformer": _BASE,
    "gated_attention": _BASE + ("attention.gate",),
    "mamba": _BASE + ("mlp",),
    "mamba2": _BASE + ("mlp",) + MAMBA2_AXES,
    "gdn": _BASE,
    "hybrid": _BASE + ("hybrid.ratio", "hybrid.pattern", "hybrid.mixer") + MAMBA2_AXES,
    "looped": _BASE + ("loops", "exit_gate", "hybrid.pattern") + MAMBA2_AXES,
    "memory": _BASE + ("memory.placement", "memory.slots", "memory.width", "memory.segment"),
    "gpn": ("family", "taper.shape", "taper.ratio", "gpn.layers", "gpn.memory"),
    "hrm": _BASE + ("hrm.N", "hrm.T"),
    "universal": _BASE + ("loops",),
    "titans": _BASE,
    "hope": _BASE,
}
