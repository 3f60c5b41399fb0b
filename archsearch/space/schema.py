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

import re
from typing import Annotated, Any, Generic, Literal, TypeVar, Union

from pydantic import AfterValidator, BeforeValidator, Field, PrivateAttr, model_validator

from archsearch.space.running import Execution, Logging
from archsearch.space.training import Data, Recipe, Strict, TextData

T = TypeVar("T")

TAPER_SHAPES = ("uniform", "cosine", "linear", "sigmoid", "reverse", "step_early", "step_middle", "step_late")
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
            # neither is fine for a sampled search (the range itself is the
            # distribution); expand() asks a grid search for one of them
            if self.grid is not None and self.sample is not None:
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


def fixed(value: Any, description: str | None = None) -> Any:
    return Field(default=value, validate_default=True, description=description)


PositiveInt = Annotated[int, Field(ge=1)]
# Seeds are stored as DuckDB INTEGER (int32), and every RNG takes them.
Seed = Annotated[int, Field(ge=0, le=2**31 - 1, description="0 to 2**31 - 1")]
NAME_LIMIT = 100


class TaperAxes(Strict):
    """How MLP width is spread over depth; the total MLP width is kept."""

    shape: axis(Literal[TAPER_SHAPES]) = Field(
        default="uniform", validate_default=True,
        description="uniform | cosine | linear | sigmoid | reverse (cosine, narrow first) | step_early | "
                    "step_middle | step_late (one third of the layers ratio x as wide as the rest)")
    ratio: axis(Annotated[float, Field(ge=1.0, le=20.0)]) = Field(
        default=3.0, validate_default=True,
        description="widest layer over narrowest; 3.0 gives the 1.5x -> 0.5x cosine of TLM")


class AttentionAxes(Strict):
    gate: axis(Literal["elementwise", "headwise"]) = Field(
        default="elementwise", validate_default=True,
        description="elementwise: a gate per head channel (the paper's best); headwise: one per head")


def _ratio_has_layers(ratio: str) -> str:
    if sum(int(part) for part in ratio.split(":")) == 0:
        raise ValueError(f"ratio {ratio!r} has no layers; write recurrent:attention such as '3:1'")
    return ratio


class HybridAxes(Strict):
    """The layer mix of hybrid and looped stacks."""

    ratio: axis(Annotated[str, Field(pattern=r"^\d{1,4}:\d{1,4}$"), AfterValidator(_ratio_has_layers)]) = Field(
        default="3:1", validate_default=True, description="recurrent:attention layers, evenly interleaved")
    pattern: axis(Annotated[str, Field(pattern=r"^[MSGA]*$", max_length=256)]) = Field(
        default="", validate_default=True,
        description="layer letters, tiled to num_layers: M mamba, S mamba-2 (SSD), G gated deltanet, "
                    "A attention; when set, used instead of ratio (looped: the shared group, default A)")
    mixer: axis(Literal["mamba", "mamba2", "gdn"]) = fixed("mamba", "the recurrent mixer a ratio interleaves with attention")

    @model_validator(mode="after")
    def _pattern_or_ratio(self) -> HybridAxes:
        # A written pattern replaces the ratio; a ratio written beside a
        # pattern every point has would be dropped without a word.
        pattern = self.pattern
        if ({"pattern", "ratio"} <= self.model_fields_set and pattern.when is None
                and pattern.values is not None and all(pattern.values)):
            raise ValueError("hybrid.pattern and hybrid.ratio are both given, and the pattern replaces the ratio; "
                             "keep one (or add '' to the patterns to also use the ratio)")
        return self


class Mamba2Axes(Strict):
    """Mamba-2 (SSD) layers, of the mamba2 family and S letters of hybrid and looped patterns."""

    d_state: axis(PositiveInt) = Field(default=128, validate_default=True, description="state size N")
    head_dim: axis(PositiveInt) = Field(
        default=64, validate_default=True,
        description="SSM head dim P; the inner width is the multiple of it nearest expand x d_model")
    expand: axis(Annotated[float, Field(gt=0, le=8)]) = fixed(2.0, "inner width over d_model")
    chunk_size: axis(PositiveInt) = Field(default=64, validate_default=True,
                                          description="steps per chunk of the SSD scan (speed only)")


class MemoryAxes(Strict):
    placement: axis(Union[Annotated[int, Field(ge=0)], None]) = Field(
        default=None, validate_default=True,
        description="the memory sits after this layer index; null: between the halves (3 and 3 of 6 layers)")
    slots: axis(PositiveInt) = fixed(8, "memory slots the GRU keeps")
    width: axis(Annotated[int, Field(ge=0)]) = Field(default=0, validate_default=True,
                                     description="memory slot width; 0 = 0.53 x d_model (the paper's +3.7%)")
    segment: axis(PositiveInt) = fixed(32, "tokens per segment between memory reads and writes")
    aux: axis(Literal["none", "self", "random"]) = Field(
        default="none", validate_default=True,
        description="auxiliary loss: self = the state predicts its next state; random = the noise control")
    aux_weight: axis(Annotated[float, Field(ge=0)]) = fixed(0.1, "weight of the auxiliary loss in the training loss")
    carry: axis(bool) = Field(default=False, validate_default=True,
                              description="carry the state across consecutive batches of a stream (text data)")


class GpnAxes(Strict):
    """GPN's layers and widths; 0 keeps the structure's default."""

    layers: axis(Literal[1, 2]) = fixed(1, "recurrent blocks of the GPN")
    memory: axis(bool) = Field(default=False, validate_default=True, description="GPN+M")
    d_emb: axis(Annotated[int, Field(ge=0)]) = Field(
        default=0, validate_default=True, description="embedding width; 0 = d_model (the paper: 768 at d 2496)")
    mem_heads: axis(Annotated[int, Field(ge=0)]) = Field(default=0, validate_default=True,
                                                         description="GPN+M memory heads; 0 = 4")
    mem_key_dim: axis(Annotated[int, Field(ge=0)]) = Field(default=0, validate_default=True,
                                                           description="GPN+M key dim; 0 = 3 d_model / (4 heads)")
    mem_value_dim: axis(Annotated[int, Field(ge=0)]) = Field(default=0, validate_default=True,
                                                             description="GPN+M value dim; 0 = 2 x key dim")


class HrmAxes(Strict):
    N: axis(Annotated[int, Field(ge=1, le=64)]) = Field(default=2, validate_default=True, description="slow cycles")
    T: axis(Annotated[int, Field(ge=1, le=64)]) = Field(default=2, validate_default=True,
                                                        description="fast steps per slow step")
    grad: axis(Literal["bptt", "one_step"]) = Field(
        default="bptt", validate_default=True,
        description="bptt: through every step; one_step: HRM's approximation, only the last fast and slow "
                    "updates carry gradient")
    segments: axis(Annotated[int, Field(ge=1, le=64)]) = Field(
        default=1, validate_default=True,
        description="deep supervision: forward segments, each supervised, state detached between")


class Axes(Strict):
    family: axis(Literal[FAMILIES]) = fixed("transformer", "the model family; each reads only its own axes")
    num_layers: axis(Annotated[int, Field(ge=1, le=256)]) = Field(description="number of layers")
    taper: TaperAxes = TaperAxes()
    loops: axis(Annotated[int, Field(ge=1, le=64)]) = Field(
        default=2, validate_default=True, description="applications of a shared group (looped, universal)")
    exit_gate: axis(bool) = fixed(False, "looped: an Ouro exit gate after every loop")
    exit_threshold: axis(Union[Annotated[float, Field(gt=0, le=1)], None]) = Field(
        default=None, validate_default=True,
        description="looped with exit_gate, evaluation: a token exits once its cumulative exit probability "
                    "reaches this; null runs every loop")
    cache_hole: axis(Annotated[float, Field(ge=0, le=1)]) = Field(
        default=0.0, validate_default=True,
        description="looped with exit_gate, training: share of tokens that take a sampled exit")
    exit_entropy: axis(Annotated[float, Field(ge=0)]) = Field(
        default=0.05, validate_default=True, description="looped with exit_gate: beta of the entropy bonus")
    mlp: axis(Literal["swiglu", "none"]) = Field(
        default="swiglu", validate_default=True,
        description="none: mixer-only layers, as the Mamba papers build them (mamba, mamba2)")
    attention: AttentionAxes = Field(default=AttentionAxes(), description="gated attention's gate")
    hybrid: HybridAxes = HybridAxes()
    mamba2: Mamba2Axes = Mamba2Axes()
    memory: MemoryAxes = Field(default=MemoryAxes(), description="the persistent memory of the memory family")
    gpn: GpnAxes = GpnAxes()
    hrm: HrmAxes = Field(default=HrmAxes(), description="HRM-LM's slow and fast loops and training options")


class ModelOptions(Strict):
    """Fixed choices that are not searched."""

    head_dim: int = Field(default=16, ge=4, le=512, description="d_model is a multiple of it")
    mlp_ratio: float = Field(default=8 / 3, gt=0, le=16, description="mean MLP width over d_model")
    multiple_of: int = Field(default=8, ge=1, le=1024, description="every MLP width is a multiple of it")
    d_model: int | None = Field(default=None, ge=4, le=65_536, description="fixed width, for budget.solve_for: mlp")
    rope_theta: float = Field(default=10_000.0, gt=0, description="RoPE base frequency")
    tie_embeddings: bool = Field(default=True, description="the LM head shares the input embedding")


INCLUDE = Field(default=None, description="file(s) whose keys this file starts from (relative paths); "
                                         "keys written here override theirs")


class Space(Strict):
    """The design axes, derived values and constraints of a search."""

    include: Union[str, list[str], None] = INCLUDE
    name: str = Field(default="space", max_length=NAME_LIMIT, description="a label for the space")
    axes: Axes = Field(description="the design axes: each a value, a list, a range or a conditional")
    derived: dict[str, str] = Field(
        default_factory=dict, description="name: expression over axes (dots become underscores: taper_ratio); "
                                           "a point's model reads d_model (its width, fixed: the budget solves "
                                           "the MLPs), tie_embeddings, and gdn_heads, gdn_key_dim, gdn_value_dim "
                                           "(its Gated DeltaNet heads and their widths; 0 keeps the default)")
    constraints: list[str] = Field(default_factory=list, description="expressions every point must satisfy")
    model: ModelOptions = ModelOptions()
    seed: Seed = Field(default=0, description="seed of sampled axes")
    _origin: Any = PrivateAttr(default=None)


class Ladder(Strict):
    """A geometric ladder of ``count`` targets from ``start`` to ``stop``."""

    start: float = Field(gt=0, description="the smallest target")
    stop: float = Field(gt=0, description="the largest target")
    count: int = Field(ge=2, le=1000, description="targets, evenly spaced in log between start and stop")


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
        default="none", description="looped and hrm points also get a baseline arm, its MLP width solved to "
                                    "their params (iso_param) or training FLOPs (iso_flop): looped k x L against "
                                    "the same k layers once (iso_param) or L x k distinct layers (iso_flop); hrm "
                                    "N x T against the Universal Transformer over the same layers for N * T steps")

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


SAMPLERS = ("grid", "random", "tpe", "nsga2", "cmaes", "gp")
OBJECTIVES = ("val_loss", "params", "flops_per_token", "train_flops", "tokens_per_s", "state_bytes",
              "val_accuracy", "gen_gap")
_OBJECTIVE = r"^(" + "|".join(OBJECTIVES) + r"):(min|max)$"


class Fidelity(Strict):
    """Multi-fidelity by training tokens: trials stop at rungs, the best go on."""

    kind: Literal["asha", "halving", "hyperband"] = Field(
        description="asha: promote as soon as a rung has enough results; halving: rung by rung; "
                    "hyperband: halving brackets starting at each rung")
    rungs: int = Field(default=3, ge=2, le=8, description="stops, the full budget included: 3 -> 1/eta^2, 1/eta, 1")
    eta: int = Field(default=3, ge=2, le=10, description="keep the top 1/eta of each rung")


class Probe(Strict):
    """A fidelity ladder: every candidate first trains on a cheap synthetic
    task; only the best ``keep`` share then trains on the study's data."""

    data: Data = Field(description="the probe's data, e.g. {kind: mqar} or {kind: task, task: mad_fuzzy_recall}")
    recipe: Recipe | None = Field(default=None, description="the probe's recipe; default: the study's")
    keep: float = Field(default=0.25, gt=0, le=1, description="share of candidates promoted to the study's data")


class Search(Strict):
    """Which points of the space to train: all of them (grid), or proposals of
    an Optuna sampler told each result as it lands."""

    sampler: Literal[SAMPLERS] = Field(
        default="grid", description="grid: every point; random | tpe | nsga2 | cmaes | gp: Optuna's sampler, "
                                    "asked for one point at a time")
    trials: int | None = Field(default=None, ge=1, le=100_000,
                               description="points to propose in all (samplers; a rerun with more continues)")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="the sampler's seed")
    objectives: list[Annotated[str, Field(pattern=_OBJECTIVE)]] = Field(
        default=["val_loss:min"], min_length=1, max_length=4,
        description="NAME:min|max, NAME one of " + ", ".join(OBJECTIVES))
    fidelity: Fidelity | None = Field(default=None, description="train every trial to its end (default), or "
                                                                "stop at rungs and promote the best")
    probe: Probe | None = Field(default=None, description="rank candidates on a synthetic task first")

    @model_validator(mode="after")
    def _sampler_needs(self) -> Search:
        if self.sampler != "grid" and self.trials is None:
            raise ValueError(f"sampler {self.sampler} needs trials: N (how many points to propose)")
        if self.sampler == "cmaes" and len(self.objectives) > 1:
            raise ValueError("cmaes optimises one objective; use nsga2 or tpe for several")
        if self.probe is not None and (self.sampler != "grid" or self.fidelity is not None):
            raise ValueError("search.probe ranks a grid's points: use it with sampler: grid and no fidelity")
        names = [o.split(":")[0] for o in self.objectives]
        if len(set(names)) < len(names):
            raise ValueError("an objective is listed twice")
        return self


# Checks a study may list under ``checks`` (archsearch.execute.preflight runs them).
CHECKS = ("causal",)


def _file_name(name: Any) -> Any:
    # Checked before the pattern so the message says what a name may hold, not a regex.
    if isinstance(name, str) and not (0 < len(name) <= NAME_LIMIT and re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*",
                                                                                  name)):
        raise ValueError(f"a study name is 1 to {NAME_LIMIT} letters, digits, _ . - (not starting with . or -), "
                         f"as it names files; got {name[:40]!r}{'...' if len(name) > 40 else ''}")
    return name


class Study(Strict):
    """A study: a space, a budget ladder, data, a recipe, seeds, search, execution."""

    include: Union[str, list[str], None] = INCLUDE
    name: Annotated[str, BeforeValidator(_file_name)] = Field(
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", max_length=NAME_LIMIT,
        description=f"letters, digits, _ . - (not first: . -), at most {NAME_LIMIT}; it names the report file")
    space: Union[str, Space] = Field(description="path to a space file (relative to this file), or inline")
    budget: Budget = Field(description="what every trial is matched on, and the ladder of targets")
    data: Data = Field(default=TextData(), description="what trials train and evaluate on: text (default), "
                                                       "mqar, a synthetic task, or a mix")
    recipe: Recipe = Recipe()
    seeds: list[Seed] = Field(default=[0], min_length=1, description="every point trains once per seed")
    search: Search = Search()
    execution: Execution = Field(default=Execution(), description="how trials run: parallelism, resources, "
                                                                  "retries, checkpoint storage")
    logging: Logging = Field(default=Logging(), description="where each trained trial's config and curves also go: "
                                                            "TensorBoard, W&B, MLflow (run --log-to adds one)")
    checks: list[Literal[CHECKS]] = Field(
        default_factory=list,
        description="run before any trial trains, each stopping the study (exit 2) if it fails; causal: every "
                    "planned architecture is built and the tokens after a position changed, and no logit up to "
                    "it may move (across memory segments too); recorded in the store, shown by status")
    _origin: Any = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _checks_know_the_architectures(self) -> Study:
        if "causal" in self.checks and self.search.sampler != "grid":
            raise ValueError(f"checks: causal builds every planned architecture before training, and a "
                             f"{self.search.sampler} search's are not known then; use search.sampler: grid, or "
                             "check a grid over the same space first")
        if len(set(self.checks)) < len(self.checks):
            raise ValueError("checks: a check is listed twice")
        return self

    @model_validator(mode="after")
    def _batch_splits_across_workers(self) -> Study:
        workers, recipe = self.execution.workers_per_trial, self.recipe
        if workers > 1 and recipe.batch_size % (workers * recipe.grad_accum):
            raise ValueError(f"execution.workers_per_trial: {workers} workers with recipe.grad_accum "
                             f"{recipe.grad_accum} cannot split recipe.batch_size {recipe.batch_size} evenly; "
                             f"make batch_size a multiple of {workers * recipe.grad_accum}")
        return self

    @model_validator(mode="after")
    def _fidelity_fits_the_schedule(self) -> Study:
        fidelity = self.search.fidelity
        if fidelity is None:
            return self
        if self.recipe.schedule != "wsd":
            raise ValueError("search.fidelity needs recipe.schedule: wsd (a cosine schedule is set by the full "
                             "length, so a trial stopped at a rung cannot be continued honestly)")
        if 1 / fidelity.eta > 1 - self.recipe.decay_fraction:
            raise ValueError(f"search.fidelity: the last rung before the end (1/{fidelity.eta} of the tokens) "
                             f"falls in the decay phase (recipe.decay_fraction {self.recipe.decay_fraction}); "
                             "lower decay_fraction or raise eta")
        if not isinstance(self.recipe.lr, (int, float)):
            raise ValueError("search.fidelity cannot be combined with a learning-rate sweep; give one lr")
        return self


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
    "looped": _BASE + ("loops", "exit_gate", "exit_threshold", "cache_hole", "exit_entropy", "hybrid.pattern")
    + MAMBA2_AXES,
    "memory": _BASE + ("memory.placement", "memory.slots", "memory.width", "memory.segment", "memory.aux",
                       "memory.aux_weight", "memory.carry"),
    "gpn": ("family", "taper.shape", "taper.ratio", "gpn.layers", "gpn.memory", "gpn.d_emb", "gpn.mem_heads",
            "gpn.mem_key_dim", "gpn.mem_value_dim"),
    "hrm": _BASE + ("hrm.N", "hrm.T", "hrm.grad", "hrm.segments"),
    "universal": _BASE + ("loops",),
    "titans": _BASE,
    "hope": _BASE,
}
