"""GPN / GPN+M, HRM-LM and the Universal Transformer: the recurrences do what the papers say.

The shared contract (exact parameters, FLOPs, causality, learning) runs over
tests/zoo/cases_recurrent.py; these are the structure-specific checks.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from archsearch.arch.model import build_model
from archsearch.arch.spec import ArchSpec, LayerSpec
from archsearch.arch.structures import gpn as gpn_module
from archsearch.arch.structures import hrm as hrm_module
from archsearch.arch.structures.stack import layer_flops
from archsearch.budget import count_params, flops_per_token
from tests.zoo.cases_recurrent import gpn, hrm, universal


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Every parameter drawn afresh, so zero-initialised gates and biases take part."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.5)


def _write_by_hand(write, prev: torch.Tensor, now: torch.Tensor, M: torch.Tensor) -> torch.Tensor:
    """papers.md section 4, one sequence, head by head:
    k = l2norm(ReLU(W_k h(prev) + b_k)), v = W_v h(now), beta = sigmoid(W_beta h(now)),
    a = exp(-exp(A_log) softplus(W_a h(now) + dt_bias)), M_h <- a M_h + beta k (v - M_h^T k)^T."""
    H, K, W = write.heads, write.key_dim, write.value_dim

    def h(x):
        return x / torch.sqrt((x * x).mean() + write.norm.eps) * write.norm.weight

    key = torch.relu(write.key.weight @ h(prev) + write.key.bias).view(H, K)
    projected = write.value_beta_decay.weight @ h(now)
    value, beta_logit, a_logit = projected[: H * W].view(H, W), projected[H * W: H * W + H], projected[H * W + H:]
    out = torch.empty_like(M)
    for head in range(H):
        k = key[head] / torch.sqrt((key[head] ** 2).sum() + 1e-12)
        beta = 1 / (1 + torch.exp(-beta_logit[head]))
        decay = torch.exp(-torch.exp(write.A_log[head]) * F.softplus(a_logit[head] + write.dt_bias[head]))
        out[head] = decay * M[head] + beta * torch.outer(k, value[head] - M[head].T @ k)
    return out


def test_gpn_m_memory_write_is_the_gated_delta_rule_by_hand():
    torch.manual_seed(0)
    spec = gpn(d_model=6, widths=(5,), memory=True, mem_heads=2, mem_key_dim=3, mem_value_dim=2, vocab=11)
    model = build_model(spec).eval()
    _randomise(model, seed=1)
    seen = []
    model.write.register_forward_hook(lambda module, args, out: seen.append((*args, out)))
    tokens = torch.tensor([[3, 7, 1]])
    with torch.no_grad():
        model(tokens)
        # the first grounded state is the fused embedding alone: the predicted state starts at zero
        first = model.fuse(model.fuse_norm(model.embed(tokens[:, 0])))
    assert len(seen) == 3
    assert torch.equal(seen[0][0], torch.zeros(1, 6)) and torch.allclose(seen[0][1], first)
    M = torch.zeros(2, 3, 2)
    for t, (prev, now, M_in, M_out) in enumerate(seen):
        if t > 0:
            # the key comes from the grounded state one token back
            assert torch.equal(prev, seen[t - 1][1])
        M = _write_by_hand(model.write, prev[0], now[0], M)
        assert torch.allclose(M_out[0], M, atol=1e-6), f"write {t}"
    assert M.abs().sum() > 0


def test_gpn_m_recall_reads_the_undecayed_memory_unlike_gated_deltanet():
    """The paper's write recalls from M_{t-1}, Gated DeltaNet's from a_t M_{t-1};
    with a < 1 the two differ, which is why the kernel is not reused."""
    from archsearch_kernels.gated_delta import gated_delta_rule_naive

    torch.manual_seed(0)
    k = F.normalize(torch.randn(1, 2, 1, 3), dim=-1)
    v, beta, g = torch.randn(1, 2, 1, 2), torch.full((1, 2, 1), 0.7), torch.full((1, 2, 1), -0.5)
    _, kernel_state = gated_delta_rule_naive(k, k, v, g, beta, return_last_state=True)
    M = torch.zeros(3, 2)
    for t in range(2):
        kt, vt, a = k[0, t, 0], v[0, t, 0], g[0, t, 0].exp()
        M = a * M + beta[0, t, 0] * torch.outer(kt, vt - M.T @ kt)
    assert not torch.allclose(kernel_state[0, 0], M, atol=1e-4)


def test_gpn_logits_depend_on_the_state_not_on_position():
    """One recurrent block per token: the same prefix gives the same logits
    wherever the sequence is cut, and a longer prefix changes later logits."""
    torch.manual_seed(0)
    model = build_model(gpn(widths=(24, 24), d_model=16, layers=2, vocab=13)).eval()
    _randomise(model, seed=2)
    tokens = torch.randint(0, 13, (2, 9))
    with torch.no_grad():
        whole, prefix = model(tokens), model(tokens[:, :5])
    assert torch.allclose(whole[:, :5], prefix, atol=1e-6)
    with torch.no_grad():
        shifted = model(torch.cat([tokens[:, :1], tokens[:, :8]], dim=1))
    assert not torch.allclose(shifted[:, 5], whole[:, 5], atol=1e-4)


@pytest.mark.parametrize("cycles,fast_steps", [(2, 2), (3, 1), (1, 4)])
def test_hrm_calls_slow_module_N_times_and_fast_N_times_T(cycles, fast_steps):
    model = build_model(hrm(N=cycles, T=fast_steps))
    calls = {"fast": 0, "slow": 0}
    for name in calls:
        getattr(model, name).register_forward_hook(lambda *_, name=name: calls.__setitem__(name, calls[name] + 1))
    model(torch.zeros(1, 5, dtype=torch.long))
    assert calls == {"fast": cycles * fast_steps, "slow": cycles}


def test_hrm_splits_spec_layers_fast_then_slow():
    model = build_model(hrm(widths=(48, 40, 56), fast_layers=1))
    assert [layer.mlp.down.in_features for layer in model.fast.layers] == [48]
    assert [layer.mlp.down.in_features for layer in model.slow.layers] == [40, 56]


def test_universal_with_one_step_and_no_step_embedding_is_one_pass_of_the_block():
    torch.manual_seed(0)
    spec = universal(widths=(48, 40), steps=1, step_embedding=False)
    ut = build_model(spec).eval()
    plain = build_model(replace(spec, structure="stack", options={})).eval()
    plain.load_state_dict({name.removeprefix("block."): p for name, p in ut.state_dict().items()})
    tokens = torch.randint(0, spec.vocab_size, (2, 10))
    with torch.no_grad():
        assert torch.equal(ut(tokens), plain(tokens))
        # more steps of the same block change the output
        more = build_model(replace(spec, options=dict(steps=2, step_embedding=False))).eval()
        more.load_state_dict(ut.state_dict())
        assert not torch.allclose(more(tokens), ut(tokens), atol=1e-4)


def test_universal_step_embeddings_are_steps_times_d():
    spec = universal(steps=5)
    assert count_params(spec) - count_params(replace(spec, options=dict(steps=5, step_embedding=False))) == 5 * 40


def test_gpn_m_paper_total_reproduces_papers_md():
    """papers.md section 4: 1L GPN+M, d=2496, d_emb=768, d_ffn=6656, H=15, K=128, W=256, V=32k -> 129.15M,
    by the formula and by the module built at that size (on the meta device: shapes, no memory).
    Fails on the mutation ``self.decode = nn.Linear(d, e)`` -> ``nn.Linear(d, d)`` in GPN (the built
    model has D x D more parameters) and on ``2 * e * d + d * d`` -> ``3 * d * d`` in ``flops``."""
    total = gpn_module.paper_params(vocab_size=32000, d_state=2496, d_emb=768, ffn_widths=(6656,),
                                    memory=(15, 128, 256))
    assert total == 129_151_902
    spec = gpn(widths=(6656,), d_model=2496, vocab=32000, memory=True, d_emb=768, mem_heads=15, mem_key_dim=128,
               mem_value_dim=256)
    with torch.device("meta"):
        model = build_model(spec)
    assert sum(p.numel() for p in model.parameters()) == total == count_params(spec, embeddings=True)
    assert model.embed.weight.shape == (32000, 768) and model.fuse.weight.shape == (2496, 768)
    # every Linear runs once per token: forward FLOPs are 2 per Linear weight, the tied head's V x E
    # included, plus the memory einsums
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert flops_per_token(spec, seq_len=2048, kind="forward") == 2 * (linear + 32000 * 768) + \
        gpn_module.mixing(spec, 2048)


def test_hrm_paper_total_reproduces_papers_md():
    """papers.md section 11: HRM's 8 blocks at d=512 (8 heads, SwiGLU 1536) -> 27.26M,
    which counts attention and MLP weights only; ours add RMSNorm weights (2 per layer + final)."""
    spec = ArchSpec(family="transformer", vocab_size=32000, d_model=512, num_heads=8,
                    layers=tuple(LayerSpec(mlp_width=1536) for _ in range(8)), structure="hrm",
                    options=dict(N=2, T=2, fast_layers=4, slow_layers=4))
    assert count_params(spec) - (2 * 8 + 1) * 512 == 27_262_976


def test_hrm_flops_count_every_module_call():
    spec = hrm(widths=(48, 40, 56), N=3, T=2, fast_layers=1)
    stack = replace(spec, structure="stack", options={})
    per_layer = [layer_flops(spec, layer, 64) for layer in spec.layers]
    assert hrm_module.hrm_flops(spec, 64) == pytest.approx(3 * (2 * per_layer[0] + per_layer[1] + per_layer[2]))
    assert hrm_module.hrm_params(spec) == count_params(stack)


@pytest.mark.parametrize("spec,message", [
    (gpn(layers=2), "must equal len"),
    (gpn(mem_heads=2), "unknown options"),
    (replace(gpn(), layers=(LayerSpec(mixer="attention", mlp_width=8),)), "mixer='gpn'"),
    (gpn(memory=True, mem_heads=0), "ints >= 1"),
    (hrm(fast_layers=3), "fast_layers"),
    (hrm(N=2, cycles=3), "unknown options"),
    (universal(steps=0), "steps"),
], ids=["gpn-layers-mismatch", "gpn-memory-option", "gpn-wrong-mixer", "gpn_m-zero-heads", "hrm-no-slow-layer",
        "hrm-unknown", "universal-zero-steps"])
def test_bad_options_are_refused_by_name(spec, message):
    with pytest.raises(ValueError, match=message):
        count_params(spec)
