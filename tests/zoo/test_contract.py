"""The contract every registered family meets, over the cases in cases_*.py.

Each family module adds a ``tests/zoo/cases_<family>.py`` with ``CASES``: a
dict of readable id -> small ArchSpec. Every case must: count its parameters
exactly, count its matmul FLOPs within 2% of torch's counter, be causal, and
learn (MQAR above chance; text loss falls).
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from archsearch.arch.model import build_model
from archsearch.budget import count_params
from archsearch.budget.count import weight_flops_per_token

CASES = {}
for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
    if info.name.startswith("cases_"):
        CASES.update(importlib.import_module(f"tests.zoo.{info.name}").CASES)

IDS, SPECS = list(CASES), list(CASES.values())


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_parameter_count_is_exact(spec):
    model = build_model(spec)
    assert count_params(spec, embeddings=True) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_matmul_flops_agree_with_torch_counter(spec):
    """torch's counter sees the weight matmuls (Linear, Conv and the tied
    head); the analytic count of those must agree within 2%. Attention and
    scan terms (``mixing``) are counted analytically only: torch misses SDPA
    on CPU and counts a chunked scan's einsums, not the recurrence."""
    torch.manual_seed(0)
    seq_len = 32
    model = build_model(spec).eval()
    tokens = torch.randint(0, spec.vocab_size, (1, seq_len))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(tokens)
    weights = {name for name, m in model.named_modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv1d))}
    per_module = counter.get_flop_counts()
    measured = sum(sum(ops.values()) for key, ops in per_module.items()
                   if key.partition(".")[2] in weights)
    measured += 2 * spec.d_model * spec.vocab_size * seq_len  # the head is a bare matmul, tied or not
    analytic = weight_flops_per_token(spec, seq_len=seq_len) * seq_len
    assert measured == pytest.approx(analytic, rel=0.02)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_causal(spec):
    torch.manual_seed(0)
    model = build_model(spec).eval()
    tokens = torch.randint(0, spec.vocab_size, (2, 24))
    for t in (0, 9, 22):
        changed = tokens.clone()
        changed[:, t + 1:] = torch.randint(0, spec.vocab_size, changed[:, t + 1:].shape)
        with torch.no_grad():
            a, b = model(tokens), model(changed)
        assert torch.allclose(a[:, : t + 1], b[:, : t + 1], atol=1e-5), f"position <= {t} saw the future"
