"""What docs/architectures.md states about initialisation and weight decay is what the code does."""

from __future__ import annotations

import math
from pathlib import Path

import torch

import archsearch as A
from archsearch.space.training import Recipe
from archsearch.train.recipe import adamw
from tests.zoo.cases_mixers import mamba

ROOT = Path(__file__).resolve().parents[1]


def _section(title: str) -> str:
    text = (ROOT / "docs" / "architectures.md").read_text()
    start = text.index(f"## {title}")
    return text[start:text.index("\n## ", start + 1)]


def test_mamba_init_and_weight_decay_are_as_documented():
    """The page said dt_proj is re-drawn N(0, 0.02) and that the optimizer ignores
    ``_no_weight_decay``; the code keeps mamba's U(±R^-½) and leaves A_log, D and dt_bias undecayed."""
    torch.manual_seed(0)
    model = A.build_model(mamba(d_model=64, head_dim=16, widths=(64,)))
    mixer = model.layers[0].mixer
    bound = mixer.sizes.dt_rank ** -0.5  # R = ceil(64 / 16) = 4: U(±0.5)
    weight = mixer.dt_proj.weight.detach()
    assert weight.abs().max() <= bound and weight.std() > 0.5 * bound / math.sqrt(3)
    assert abs(float(mixer.in_proj.weight.detach().std()) - 0.02) < 0.004
    groups = adamw(model, Recipe().model_dump()).param_groups
    undecayed = {id(p) for g in groups if g["weight_decay"] == 0.0 for p in g["params"]}
    assert {id(mixer.A_log), id(mixer.D), id(mixer.dt_bias)} <= undecayed
    assert id(mixer.dt_proj.weight) not in undecayed and id(mixer.in_proj.weight) not in undecayed
    section = _section("Mamba")
    assert "U(±R^-½)" in section and "re-drawn N(0, 0.02)" not in section
    assert "does not read it yet" not in section and "zero-decay group" in section
