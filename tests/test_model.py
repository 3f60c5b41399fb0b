"""The Transformer++ built from specs: causal, counted exactly, SDPA = reference."""

from __future__ import annotations

import pytest
import torch

from archsearch.arch.blocks.attention import attention_reference
from archsearch.arch.model import build_model
from archsearch.arch.spec import ArchSpec, LayerSpec
from archsearch.budget import count_params


def make_spec(*, d_model=32, head_dim=8, widths=(64, 48), vocab=61, tie=True) -> ArchSpec:
    return ArchSpec(family="transformer", vocab_size=vocab, d_model=d_model, num_heads=d_model // head_dim,
                    layers=tuple(LayerSpec(mlp_width=w) for w in widths), tie_embeddings=tie)


SIZES = {
    "d16-1layer": dict(d_model=16, head_dim=8, widths=(40,)),
    "d32-tapered": dict(d_model=32, head_dim=8, widths=(96, 64, 32)),
    "d48-untied": dict(d_model=48, head_dim=16, widths=(128, 128), tie=False),
    "d24-odd-vocab": dict(d_model=24, head_dim=12, widths=(8, 16, 24, 56), vocab=300),
}


@pytest.mark.parametrize("size", list(SIZES.values()), ids=list(SIZES))
def test_analytic_params_equal_built_module(size):
    spec = make_spec(**size)
    model = build_model(spec)
    assert count_params(spec, embeddings=True) == sum(p.numel() for p in model.parameters())
    embedding = spec.vocab_size * spec.d_model * (1 if spec.tie_embeddings else 2)
    assert count_params(spec) == count_params(spec, embeddings=True) - embedding


@pytest.mark.parametrize("t", [0, 5, 11])
def test_logits_at_or_before_t_ignore_later_tokens(t):
    torch.manual_seed(0)
    spec = make_spec()
    model = build_model(spec).eval()
    tokens = torch.randint(0, spec.vocab_size, (2, 12))
    changed = tokens.clone()
    changed[:, t + 1:] = torch.randint(0, spec.vocab_size, changed[:, t + 1:].shape)
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert torch.allclose(a[:, : t + 1], b[:, : t + 1], atol=1e-5)
    if t + 1 < tokens.shape[1]:
        assert not torch.allclose(a[:, t + 1:], b[:, t + 1:], atol=1e-5)


def test_output_shape_and_dtype():
    spec = make_spec()
    logits = build_model(spec)(torch.zeros(3, 7, dtype=torch.long))
    assert logits.shape == (3, 7, spec.vocab_size) and logits.dtype == torch.float32


def test_sdpa_matches_written_out_attention():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 9, 8) for _ in range(3))
    fast = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(fast, attention_reference(q, k, v), atol=1e-5)


def test_tied_head_shares_the_embedding():
    model = build_model(make_spec(tie=True))
    assert model.head is None
    assert build_model(make_spec(tie=False)).head.weight.shape == (61, 32)
