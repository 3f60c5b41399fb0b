"""Titans' test-time memory and Hope's continuum memory: the behaviour the zoo contract does not reach.

The contract (tests/zoo) holds both to exact parameters, matmul FLOPs and causality;
here the Titans memory is checked against hand and autograd gradient steps, its
chunk states against the future, its FLOP formula against torch's counter, and the
CMS against the width solver's assumption (parameters affine in MLP width).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from archsearch.arch.blocks import MLPS, hope, titans
from archsearch.arch.blocks.swiglu import SwiGLU
from archsearch.arch.model import build_model
from archsearch.arch.spec import ArchSpec, LayerSpec
from archsearch.arch.taper import taper_widths
from archsearch.budget import count_params, flops_per_token, solve
from tests.zoo.cases_titans_hope import hope as hope_spec
from tests.zoo.cases_titans_hope import titans as titans_spec

F64 = {"rtol": 1e-9, "atol": 1e-10}


def memory_inputs(*, depth: int, B=2, H=3, T=13, K=5, E=7, seed=0, requires_grad=False):
    """Random memory inputs in float64: unit q and k, theta <= 0.3, and an init of modest scale."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    shapes = [(K, K)] if depth == 1 else [(E, K), (K, E)]
    init = [randn(H, o, i) / o**0.5 for o, i in shapes]
    inputs = [F.normalize(randn(B, H, T, K), dim=-1), F.normalize(randn(B, H, T, K), dim=-1), randn(B, H, T, K),
              0.3 * torch.rand(B, H, T, generator=g, dtype=torch.float64),
              F.logsigmoid(randn(B, H, T)), F.logsigmoid(randn(B, H, T) - 2)]
    if requires_grad:
        for x in inputs + init:
            x.requires_grad_(True)
    return inputs, init


def test_memory_step_is_the_hand_computed_gradient_step():
    """Two tokens, linear memory: the momentum, forgetting and chunk-start gradient written out."""
    inputs, init = memory_inputs(depth=1, B=1, H=1, T=2, K=3)
    q, k, v, theta, log_eta, log_keep = (x[0, 0] for x in inputs)
    th, eta, keep, W = theta, log_eta.exp(), log_keep.exp(), init[0][0]

    def grad(W, t):  # d/dW ||W k_t - v_t||^2
        return 2 * torch.outer(W @ k[t] - v[t], k[t])

    S1 = -th[0] * grad(W, 0)
    M1 = keep[0] * W + S1
    for chunk, W_grad in ((1, M1), (2, W)):  # chunk 2 takes token 1's gradient at the chunk start
        S2 = eta[1] * S1 - th[1] * grad(W_grad, 1)
        M2 = keep[1] * M1 + S2
        expected = torch.stack([M1 @ q[0], M2 @ q[1]])
        torch.testing.assert_close(titans.memory_chunked(*inputs, init, chunk=chunk)[0, 0], expected, **F64)
        if chunk == 1:
            torch.testing.assert_close(titans.memory_online(*inputs, init)[0, 0], expected, **F64)


@pytest.mark.parametrize("max_grad_norm", [0.3, math.inf], ids=["clipped", "unclipped"])
@pytest.mark.parametrize("chunk", [1, 3, 5, 13, 20])
@pytest.mark.parametrize("depth", [1, 2])
def test_chunked_memory_matches_the_autograd_loop(depth, chunk, max_grad_norm):
    """Forward and every gradient: the dual-form chunks equal the token loop with autograd's inner gradients."""
    inputs, init = memory_inputs(depth=depth, requires_grad=True)
    weight = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    fast = titans.memory_chunked(*inputs, init, chunk=chunk, max_grad_norm=max_grad_norm)
    ref = titans.memory_reference(*inputs, init, chunk=chunk, max_grad_norm=max_grad_norm)
    torch.testing.assert_close(fast, ref, **F64)
    leaves = inputs + init
    for a, b in zip(torch.autograd.grad((fast * weight).sum(), leaves),
                    torch.autograd.grad((ref * weight).sum(), leaves)):
        torch.testing.assert_close(a, b, **F64)


@pytest.mark.parametrize("depth", [1, 2])
def test_online_path_is_chunk_one(depth):
    inputs, init = memory_inputs(depth=depth)
    torch.testing.assert_close(titans.memory_online(*inputs, init, max_grad_norm=0.5),
                               titans.memory_chunked(*inputs, init, chunk=1, max_grad_norm=0.5), **F64)


@pytest.mark.parametrize("depth", [1, 2])
def test_memory_entering_a_chunk_depends_only_on_earlier_tokens(depth):
    chunk, T = 4, 13
    inputs, init = memory_inputs(depth=depth, T=T)
    for c in range(1, 4):
        changed = [x.clone() for x in inputs]
        g = torch.Generator().manual_seed(c)
        for x in changed[:3]:  # q, k, v from chunk c on (unit vectors, like the rest)
            fresh = torch.randn(x[:, :, c * chunk:].shape, generator=g, dtype=x.dtype)
            x[:, :, c * chunk:] = F.normalize(fresh, dim=-1)
        before, after = [], []
        titans.memory_chunked(*inputs, init, chunk=chunk, states=before)
        titans.memory_chunked(*changed, init, chunk=chunk, states=after)
        for i, ((w_a, m_a), (w_b, m_b)) in enumerate(zip(before, after)):
            same = all(torch.equal(x, y) for x, y in zip(w_a + m_a, w_b + m_b))
            assert same == (i <= c), f"state entering chunk {i} after changing chunk {c}: same={same}"


def _mixer_non_weight_flops(spec: ArchSpec, seq_len: int) -> float:
    """What torch counts inside the first layer's mixer, less its Linear and Conv modules."""
    model = build_model(spec).eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.randint(0, spec.vocab_size, (2, seq_len)))
    counts = {key.partition(".")[2]: sum(ops.values()) for key, ops in counter.get_flop_counts().items()}
    weights = sum(counts.get(f"layers.0.mixer.{name}", 0) for name, m in model.layers[0].mixer.named_children()
                  if isinstance(m, (torch.nn.Linear, torch.nn.Conv1d)))
    return (counts["layers.0.mixer"] - weights) / 2  # batch of 2


@pytest.mark.parametrize("options", [{"memory_depth": 1, "chunk": 5},
                                     {"memory_depth": 2, "chunk": 7, "memory_width": 20},
                                     {"memory_depth": 2, "chunk": 1}, {"memory_depth": 1, "chunk": 32}],
                         ids=["linear-chunk5", "deep-chunk7", "deep-online", "linear-one-chunk"])
def test_memory_flop_formula_matches_torch_counter(options):
    spec = titans_spec(widths=(40,), **options)
    seq_len = 32
    assert _mixer_non_weight_flops(spec, seq_len) == pytest.approx(
        titans.mixing(spec, spec.layers[0], seq_len) * seq_len, rel=1e-6)


def test_titans_rejects_unknown_depth():
    with pytest.raises(ValueError, match="memory_depth"):
        build_model(titans_spec(memory_depth=3))


def test_cms_one_level_is_swiglu():
    torch.manual_seed(0)
    spec = hope_spec(widths=(44,), levels=1)
    cms = hope.ContinuumMemory(spec=spec, layer=spec.layers[0])
    mlp = SwiGLU(spec=spec, layer=spec.layers[0])
    mlp.load_state_dict(cms.levels[0].state_dict())
    x = torch.randn(2, 5, spec.d_model)
    torch.testing.assert_close(cms(x), mlp(x))


@pytest.mark.parametrize("width, levels, expected", [(40, 3, [14, 13, 13]), (41, 2, [21, 20]), (2, 3, [1, 1, 0])])
def test_cms_levels_split_the_width_exactly(width, levels, expected):
    assert hope.level_widths(LayerSpec(mlp="cms", mlp_width=width, options={"cms_levels": levels})) == expected


@pytest.mark.parametrize("levels", [2, 3])
def test_cms_params_and_flops_are_affine_in_mlp_width(levels):
    """The solver fits a line through two widths; every other width must lie on it, split evenly or not."""
    def make(total: int) -> ArchSpec:
        widths = taper_widths(shape="cosine", ratio=3.0, num_layers=4, total=total, multiple_of=1)
        return hope_spec(d_model=40, head_dim=8, widths=tuple(widths), levels=levels)

    block = MLPS["cms"]
    p0, p1 = count_params(make(40)), count_params(make(41))
    f0, f1 = flops_per_token(make(40), seq_len=32), flops_per_token(make(41), seq_len=32)
    for total in (43, 57, 100, 161):
        spec = make(total)
        assert count_params(spec) == p0 + (p1 - p0) * (total - 40)
        assert flops_per_token(spec, seq_len=32) == pytest.approx(f0 + (f1 - f0) * (total - 40), rel=1e-12)
        assert sum(block.params(spec, layer) for layer in spec.layers) == 3 * spec.d_model * total
        assert sum(p.numel() for p in build_model(spec).parameters()) == count_params(spec, embeddings=True)


def test_solver_sizes_a_tapered_hope_attention_model():
    def make(d_model: int, total: int) -> ArchSpec:
        widths = taper_widths(shape="cosine", ratio=3.0, num_layers=4, total=total, multiple_of=8)
        return hope_spec(d_model=d_model, head_dim=8, widths=tuple(widths), levels=3)

    target = 250_000
    solution = solve(target=target, make_spec=make, measure=count_params, num_layers=4, head_dim=8, mlp_ratio=3.0,
                     multiple_of=8, tolerance=0.01)
    assert abs(count_params(solution.spec) / target - 1) <= 0.01
    assert len(set(solution.spec.mlp_widths)) > 1  # tapered
