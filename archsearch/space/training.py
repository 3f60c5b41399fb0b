"""The data and training-recipe sections of a study file.

Kept apart from the space and budget schema because the training loop reads
them directly (as dumped dicts). Torch-free, and it imports nothing of
``archsearch.data``: the synthetic task names are listed here and a test keeps
them equal to ``archsearch.data.synthetic.TASKS``; what only a task class knows
(its vocabulary, its sequence length) the planner asks ``archsearch.data``.
"""

from __future__ import annotations

import math

import re
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

BYTE_VOCAB = 256
DEFAULT_BPE_VOCAB = 8192
TASK_NAMES = ("mqar", "phop", "mano", "mad_in_context_recall", "mad_fuzzy_recall", "mad_noisy_recall",
              "mad_selective_copying", "mad_compression", "mad_memorization")
_TOKENS_PER_PARAM = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*x\s*$")
# A quadrillion tokens is past any run this tool will see; counts are stored as BIGINT.
MAX_TOKENS = 10**15
MAX_TOKENS_PER_PARAM = 10_000
MAX_VOCAB = 1 << 20


class Strict(BaseModel):
    """Frozen; unknown keys are errors rather than silent defaults; and values are
    not converted between types: ``num_layers: "4"`` (a quoted number) or
    ``exit_gate: 1`` is refused, so what a file says is what runs. An integer
    is accepted where a float is asked; NaN and infinities (`.nan`, `.inf`) are not
    numbers a study can mean, and are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class HubSource(Strict):
    """A Hugging Face ``datasets`` corpus, e.g. FineWeb-Edu: ``{name: HuggingFaceFW/fineweb-edu,
    config: sample-10BT}``. ``name: parquet`` (or json, text) with ``data_files`` reads local files
    through the same loader."""

    name: str = Field(description="dataset on the hub, or a builder such as parquet with data_files")
    config: str | None = Field(default=None, description="the dataset's configuration (subset)")
    split: str = Field(default="train", description="the dataset's split to read")
    data_files: list[str] | None = Field(default=None, description="local files for a builder such as parquet")
    revision: str | None = Field(default=None, description="pin a commit so the corpus never changes")
    streaming: bool = Field(default=True, description="read documents as they arrive; stops at max_bytes")


class TextData(Strict):
    """Text: the installed Python standard library, your own files, or a hub corpus.

    Documents go to train or validation by a hash of their identity, so the
    split never leaks a document and never changes.
    """

    kind: Literal["text"] = Field(default="text", description="text (the default when kind is left out)")
    paths: list[str] | None = Field(
        default=None, description="files or folders (.txt and other text, .jsonl, .parquet); "
                                  "default: the Python stdlib's source")
    hub: HubSource | None = Field(default=None, description="a Hugging Face datasets corpus instead of paths")
    text_field: str = Field(default="text", description="the text column of jsonl, parquet and hub rows")
    id_field: str | None = Field(
        default=None, description="column naming a document for the split; default: its file and row")
    tokenizer: Literal["byte", "bpe"] = Field(
        default="byte", description="byte: 256 byte values; bpe: byte-level BPE trained on the train split")
    vocab_size: int | None = Field(
        default=None, ge=260, le=MAX_VOCAB, description=f"bpe only; default {DEFAULT_BPE_VOCAB}")
    cache_dir: str | None = Field(
        default=None, description="token cache; default $ARCHSEARCH_CACHE or ~/.cache/archsearch")
    seq_len: int = Field(default=128, ge=2, le=1 << 16, description="tokens per training row")
    val_fraction: float = Field(default=0.1, gt=0, lt=1, description="share of documents held out for validation")
    max_bytes: int = Field(default=4_000_000, ge=1024, le=1 << 40, description="read at most this much text")

    @model_validator(mode="before")
    @classmethod
    def _bpe_vocab(cls, data: Any) -> Any:
        # Filled in here so the dumped config (and so the trial id) names the real vocabulary.
        if isinstance(data, dict) and data.get("tokenizer") == "bpe" and data.get("vocab_size") is None:
            data = {**data, "vocab_size": DEFAULT_BPE_VOCAB}
        return data

    @model_validator(mode="after")
    def _one_corpus(self) -> TextData:
        if self.paths is not None and self.hub is not None:
            raise ValueError("give paths or hub, not both")
        if self.tokenizer == "byte" and self.vocab_size not in (None, BYTE_VOCAB):
            raise ValueError(f"byte-level text has {BYTE_VOCAB} tokens; vocab_size is for tokenizer: bpe")
        return self


class MqarData(Strict):
    """Multi-query associative recall, generated on the fly."""

    kind: Literal["mqar"] = Field(description="multi-query associative recall")
    seq_len: int = Field(default=64, ge=8, le=1 << 16, description="tokens per row")
    vocab_size: int = Field(default=256, ge=16, le=MAX_VOCAB, description="keys and values are drawn from it")
    num_pairs: int = Field(default=8, ge=1, le=MAX_VOCAB, description="key-value pairs per row, each queried")


class TaskData(Strict):
    """Any synthetic task of ``archsearch.data.synthetic.TASKS`` by name, with its parameters."""

    kind: Literal["task"] = Field(description="a synthetic task by name")
    name: Literal[TASK_NAMES] = Field(description=", ".join(TASK_NAMES))
    params: dict[str, Any] = Field(default_factory=dict, description="the task's own fields (seq_len, ...)")


def _kind(value: Any) -> str | None:
    """A data section's kind; one written without ``kind:`` is text (the default data)."""
    if isinstance(value, dict):
        return value.get("kind", "text")
    return getattr(value, "kind", None)


Part = Annotated[Union[Annotated[TextData, Tag("text")], Annotated[MqarData, Tag("mqar")],
                       Annotated[TaskData, Tag("task")]], Discriminator(_kind)]


class MixPart(Strict):
    """One source of a mix, drawn for a share ``weight / sum(weights)`` of every batch's rows."""

    weight: float = Field(default=1.0, gt=0, description="share of every batch's rows: weight / sum of weights")
    source: Part = Field(description="text, mqar or a task")


class MixData(Strict):
    """Several sources sharing one vocabulary, mixed row by row; shorter rows are padded and unscored."""

    kind: Literal["mix"] = Field(description="several sources mixed row by row")
    sources: list[MixPart] = Field(min_length=1, description="the sources and their weights")


Data = Annotated[Union[Annotated[TextData, Tag("text")], Annotated[MqarData, Tag("mqar")],
                       Annotated[TaskData, Tag("task")], Annotated[MixData, Tag("mix")]], Discriminator(_kind)]


class LrSweep(Strict):
    """A small learning-rate sweep for every arm; the best run per arm counts."""

    sweep: list[Annotated[float, Field(gt=0, le=1)]] = Field(min_length=1, max_length=32,
                                                             description="peak learning rates, each run per arm")


class Recipe(Strict):
    """AdamW, warmup then cosine decay (or warmup-stable-decay), gradient clipping.

    ``batch_size`` is the batch per optimizer step; ``grad_accum`` splits it
    into that many micro-batches, so changing it to fit memory never changes
    the experiment. ``tokens`` replaces ``steps`` when set: a count, or
    ``"20x"`` for 20 tokens per non-embedding parameter (Chinchilla,
    https://arxiv.org/abs/2203.15556).
    """

    steps: int = Field(default=200, ge=1, le=10**9, description="optimizer steps (unless tokens is set)")
    tokens: int | str | None = Field(
        default=None, description='training tokens, or "20x" tokens per non-embedding parameter; overrides steps')
    batch_size: int = Field(default=16, ge=1, le=1 << 20, description="rows per optimizer step")
    grad_accum: int = Field(default=1, ge=1, le=1 << 20, description="micro-batches per step; divides batch_size")
    lr: Union[Annotated[float, Field(gt=0, le=1)], LrSweep] = Field(
        default=3e-3, description="peak learning rate, or {sweep: [...]}: every arm runs each and keeps its best, "
                                  "so no family wins by being tuned better")
    schedule: Literal["cosine", "wsd"] = Field(
        default="cosine", description="cosine: decay from warmup on; wsd: constant, then decay_fraction linear decay")
    decay_fraction: float = Field(default=0.2, gt=0, le=1, description="wsd: share of steps spent decaying")
    warmup_steps: int = Field(default=20, ge=0, description="linear warmup to lr")
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1, description="the schedule's floor over lr")
    weight_decay: float = Field(default=0.1, ge=0, description="AdamW's, on matrices only (not norms, biases, A, D)")
    beta1: float = Field(default=0.9, ge=0, lt=1, description="AdamW's first-moment decay")
    beta2: float = Field(default=0.95, ge=0, lt=1, description="AdamW's second-moment decay")
    grad_clip: float = Field(default=1.0, gt=0, description="largest gradient norm")
    eval_every: int = Field(default=50, ge=1, description="steps between evaluations (and checkpoints)")
    eval_batches: int = Field(default=4, ge=1, le=100_000,
                              description="validation batches per evaluation, the same each time")
    log_every: int = Field(default=10, ge=1, le=10**9,
                           description="steps between points of the stored training-loss curve (the mean loss "
                                       "of the steps since the last point); changes what is reported, not the "
                                       "result, so it is no part of a trial's id")
    autocast: Literal["auto", "bf16", "off"] = Field(default="auto", description="auto: bf16 on CUDA, off on CPU")
    compile: bool = Field(default=False, description="torch.compile the model")
    gate_steps: int = Field(
        default=0, ge=0, description="looped with exit_gate: Ouro's stage II after the main steps, this many steps "
                                     "training only the exit gate on each loop's loss improvement, the LM frozen; "
                                     "models without a gate ignore it")

    @field_validator("tokens", mode="before")
    @classmethod
    def _tokens(cls, value: Any) -> Any:
        # A count is a number (the study reader takes 1e9 as one); text is only a ratio.
        if isinstance(value, str) and not _TOKENS_PER_PARAM.match(value):
            raise ValueError(f'tokens takes a count (a number, without quotes) or a ratio such as "20x", '
                             f'got {value!r}')
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        ratio = tokens_per_param(value) if isinstance(value, str) else value
        if isinstance(ratio, (int, float)) and ratio <= 0:
            raise ValueError(f"tokens must be positive, got {value!r}")
        if isinstance(value, str) and ratio > MAX_TOKENS_PER_PARAM:
            raise ValueError(f'tokens per parameter must be at most {MAX_TOKENS_PER_PARAM:,}x, got {value!r}')
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > MAX_TOKENS:
            raise ValueError(f"tokens must be at most {MAX_TOKENS:.0e}, got {value:.3g}")
        return value

    @model_validator(mode="after")
    def _micro_batches(self) -> Recipe:
        if self.batch_size % self.grad_accum:
            raise ValueError(f"grad_accum={self.grad_accum} must divide batch_size={self.batch_size}")
        return self


# Recipe fields that change only what a trial reports, never what it trains: left out of
# every hash of what decides a result (trial ids, checkpoint fingerprints).
REPORTING_ONLY = frozenset({"log_every"})


def deciding(recipe: dict) -> dict:
    """A dumped recipe without its ``REPORTING_ONLY`` fields: what decides the trained model."""
    return {key: value for key, value in recipe.items() if key not in REPORTING_ONLY}


def planned_steps(recipe: dict, *, params: int, seq_len: int) -> int:
    """Optimizer steps of a dumped recipe: ``steps``, or enough steps of ``batch_size x seq_len`` tokens
    to train on ``tokens`` (a count, or ``"20x"`` times the ``params`` non-embedding parameters)."""
    tokens = recipe.get("tokens")
    if tokens is None:
        return recipe["steps"]
    ratio = tokens_per_param(tokens)
    total = ratio * params if ratio is not None else int(tokens)
    return max(1, math.ceil(total / (recipe["batch_size"] * seq_len)))


def tokens_per_param(tokens: int | str | None) -> float | None:
    """The ratio of a ``"20x"`` token budget, or None for a count or no budget."""
    if isinstance(tokens, str):
        return float(_TOKENS_PER_PARAM.match(tokens).group(1))
    return None
