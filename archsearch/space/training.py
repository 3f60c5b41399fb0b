"""The data and training-recipe sections of a study file.

Kept apart from the space and budget schema because the training loop reads
them directly (as dumped dicts). Torch-free.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    """Frozen, and unknown keys are errors rather than silent defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class TextData(Strict):
    """Byte-level text: the installed Python standard library, or your own files."""

    kind: Literal["text"] = "text"
    paths: list[str] | None = Field(
        default=None, description="files or folders of text; default: the Python stdlib's source")
    seq_len: int = Field(default=128, ge=2, le=1 << 16)
    val_fraction: float = Field(default=0.1, gt=0, lt=1)
    max_bytes: int = Field(default=4_000_000, ge=1024, description="read at most this much text")


class MqarData(Strict):
    """Multi-query associative recall, generated on the fly."""

    kind: Literal["mqar"]
    seq_len: int = Field(default=64, ge=8, le=1 << 16)
    vocab_size: int = Field(default=256, ge=16)
    num_pairs: int = Field(default=8, ge=1)


Data = Annotated[Union[TextData, MqarData], Field(discriminator="kind")]


class Recipe(Strict):
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


