"""GPN / GPN+M, HRM-LM and the Universal Transformer: the recurrences do what the papers say.

The shared contract (exact parameters, FLOPs, causality, learning) runs over
tests/zoo/cases_recurrent.py; these are the structure-specific checks.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import archsearch as A
from archsearch.arch.model import build_model
from archsearch.arch.spec import ArchSpec, LayerSpec
from archsearch.arch.structures import gpn as gpn_module
from archsearch.arch.structures import hrm as hrm_module
from archsearch.arch.structures.gpn import l2_normalize
from archsearch.arch.structures.stack import layer_flops, layer_mixing
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
    """The paper's write recalls from M_{t-1}, Gated DeltaNet's from a_t M_{t-1}:
    two writes of GPN's MemoryWrite against the Gated DeltaNet kernel fed the
    same keys, values, betas and decays. They agree on the first write (empty
    memory) and differ on the second by exactly beta (a - 1) k (M_1^T k)^T,
    which is why the kernel is not reused. Fails on the mutation that recalls
    from the decayed memory in ``MemoryWrite.forward`` (``M_BHKW`` ->
    ``decay_BH[..., None, None] * M_BHKW`` in the recall einsum)."""
    from archsearch_kernels.gated_delta import gated_delta_rule_naive

    torch.manual_seed(0)
    spec = gpn(d_model=6, widths=(5,), memory=True, mem_heads=2, mem_key_dim=3, mem_value_dim=2, vocab=11)
    write = build_model(spec).write
    _randomise(write, seed=3)
    states = torch.randn(3, 1, 6)  # grounded states s_0, s_1, s_2 of one sequence
    H, K, W = 2, 3, 2
    with torch.no_grad():
        M1 = write(states[0], states[1], torch.zeros(1, H, K, W))
        M2 = write(states[1], states[2], M1)
        # the write's own terms for steps 1 and 2: key from the previous state, the rest from the current
        keys = [l2_normalize(F.relu(write.key(write.norm(states[t]))).view(H, K)) for t in (0, 1)]
        value, beta, a = zip(*(write.value_beta_decay(write.norm(states[t])).split([H * W, H, H], dim=-1)
                               for t in (1, 2)))
        decay = [torch.exp(-write.A_log.exp() * F.softplus(x[0] + write.dt_bias)) for x in a]
        _, kernel_state = gated_delta_rule_naive(
            torch.stack(keys)[None], torch.stack(keys)[None], torch.stack([v.view(H, W) for v in value])[None],
            torch.stack(decay).log()[None], torch.sigmoid(torch.stack([b[0] for b in beta]))[None],
            return_last_state=True)
        _, kernel_first = gated_delta_rule_naive(
            keys[0][None, None], keys[0][None, None], value[0].view(1, 1, H, W), decay[0].log()[None, None],
            torch.sigmoid(beta[0])[None], return_last_state=True)
    assert torch.allclose(kernel_first, M1, atol=1e-6)
    assert decay[1].max() < 0.99 and not torch.allclose(kernel_state, M2, atol=1e-4)
    k, b2 = keys[1], torch.sigmoid(beta[1][0])
    recalled = torch.einsum("hkw,hk->hw", M1[0], k)
    gap = (b2 * (decay[1] - 1))[:, None, None] * k[:, :, None] * recalled[:, None, :]
    assert torch.allclose(M2[0] - kernel_state[0], gap, atol=1e-5)


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


@pytest.mark.parametrize("options", [dict(N=3, T=2, fast_layers=1), dict(N=2, T=3, segments=2)],
                         ids=["N3-T2", "N2-T3-segments2"])
def test_hrm_flops_count_every_module_call(options):
    """The analytic count against the layer calls the built model makes (forward
    hooks), and the parameters against the built module. Fails on the mutation
    ``S * N * (T * fast + slow)`` -> ``S * (N * T * fast + slow)`` in ``_hrm_sum``
    (the slow module counted once per segment, not N times)."""
    spec = hrm(widths=(48, 40, 56), **options)
    model = build_model(spec)
    seq_len, counted = 12, []
    for layer_module, layer_spec in zip([*model.fast.layers, *model.slow.layers], spec.layers):
        layer_module.register_forward_hook(
            lambda *_, layer_spec=layer_spec: counted.append(layer_flops(spec, layer_spec, seq_len)))
    model(torch.zeros(1, seq_len, dtype=torch.long))
    opts = hrm_module.hrm_options(spec)
    assert len(counted) == opts.segments * opts.N * (opts.T * opts.fast_layers + opts.slow_layers)
    assert hrm_module.hrm_flops(spec, seq_len) == pytest.approx(sum(counted))
    embedding = spec.vocab_size * spec.d_model
    assert hrm_module.hrm_params(spec) == sum(p.numel() for p in model.parameters()) - embedding


def _hrm_pair(**options):
    """An HRM with ``options`` and a plain-BPTT twin with the same weights."""
    torch.manual_seed(0)
    spec = hrm(widths=(48, 40), N=2, T=2, **options)
    model = build_model(spec)
    twin = build_model(replace(spec, options=dict(N=2, T=2)))
    twin.load_state_dict(model.state_dict())
    return spec, model, twin


def _grads(model, loss) -> dict[str, torch.Tensor]:
    model.zero_grad()
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _logits(model, h_BTD):
    return model.norm(h_BTD) @ model.embed.weight.T


def test_hrm_one_step_gradient_is_the_last_updates_with_inputs_held():
    """HRM's one-step gradient: every update but the last fast and last slow one
    under no_grad. Its gradients equal a reference written out here (the loop
    under no_grad, then the two updates with grad), and differ from full BPTT,
    which reaches the same parameters through the earlier updates too.
    Fails on the mutation ``torch.no_grad() if self.one_step and not last`` ->
    ``contextlib.nullcontext()`` in ``HRM._graded`` (one_step becomes BPTT)."""
    spec, model, twin = _hrm_pair(grad="one_step")
    tokens = torch.randint(0, spec.vocab_size, (2, 7))
    targets = torch.randint(0, spec.vocab_size, (2, 7))
    one_step = _grads(model, model.training_loss(tokens, targets))
    bptt = _grads(twin, twin.training_loss(tokens, targets))

    eps = spec.norm_eps
    e = twin.embed(tokens)
    with torch.no_grad():
        fast = slow = torch.zeros_like(e)
        for _ in range(2):
            fast = F.rms_norm(twin.fast(fast + slow + e), (spec.d_model,), eps=eps)
        slow = F.rms_norm(twin.slow(slow + fast), (spec.d_model,), eps=eps)
        fast = F.rms_norm(twin.fast(fast + slow + e), (spec.d_model,), eps=eps)  # cycle 2, fast step 1
    fast = F.rms_norm(twin.fast(fast + slow + e), (spec.d_model,), eps=eps)  # the last fast update
    slow = twin.slow(slow + fast)  # the last slow update
    reference = _grads(twin, F.cross_entropy(_logits(twin, slow).flatten(0, 1), targets.flatten()))

    assert one_step.keys() == reference.keys() == bptt.keys()
    for name in one_step:
        assert torch.allclose(one_step[name], reference[name], atol=1e-6), name
    differs = [name for name in one_step if not torch.allclose(one_step[name], bptt[name], atol=1e-5)]
    assert any(name.startswith("fast.") for name in differs) and any(name.startswith("slow.") for name in differs)
    with torch.no_grad():  # the forward pass is the same computation
        assert torch.allclose(model(tokens), twin(tokens), atol=1e-6)


def test_hrm_deep_supervision_is_the_mean_loss_over_detached_segments():
    """Segments S = 2: the training loss is the mean of each segment's CE, the
    second segment starting from the first's states detached (so its loss sends
    no gradient through segment 1); forward returns the last segment's logits.
    Fails on the mutation that drops ``.detach()`` between segments in
    ``HRM.segment_states`` (the gradients then differ from the reference)."""
    spec, model, twin = _hrm_pair(segments=2)
    tokens = torch.randint(0, spec.vocab_size, (2, 7))
    targets = torch.randint(0, spec.vocab_size, (2, 7))
    loss = model.training_loss(tokens, targets)
    grads = _grads(model, loss)

    e = twin.embed(tokens)
    zeros = torch.zeros_like(e)
    fast, slow = twin.segment(e, zeros, zeros)
    first = _logits(twin, slow)
    fast, slow = twin.segment(e, fast.detach(), F.rms_norm(slow.detach(), (spec.d_model,), eps=spec.norm_eps))
    second = _logits(twin, slow)
    by_segment = [F.cross_entropy(logits.flatten(0, 1), targets.flatten()) for logits in (first, second)]
    assert loss.item() == pytest.approx(((by_segment[0] + by_segment[1]) / 2).item(), abs=1e-6)
    assert by_segment[0].item() != pytest.approx(by_segment[1].item(), abs=1e-4)  # two distinct segments
    reference = _grads(twin, (by_segment[0] + by_segment[1]) / 2)
    for name in grads:
        assert torch.allclose(grads[name], reference[name], atol=1e-6), name
    with torch.no_grad():
        assert torch.allclose(model(tokens), second, atol=1e-6)


@pytest.mark.parametrize("options", [dict(grad="one_step"), dict(segments=3), dict(grad="one_step", segments=2)],
                         ids=["one-step", "segments3", "both"])
def test_hrm_gradient_options_keep_the_parameters(options):
    """The options change how the model trains, not what it is: the same count
    (and the same built parameters) as plain HRM."""
    spec, model, twin = _hrm_pair(**options)
    assert count_params(spec) == count_params(twin.spec)
    assert [p.shape for p in model.parameters()] == [p.shape for p in twin.parameters()]


@pytest.mark.parametrize("options", [dict(), dict(grad="one_step"), dict(segments=2),
                                     dict(grad="one_step", segments=2)],
                         ids=["bptt", "one-step", "segments2", "one-step-segments2"])
def test_hrm_training_flops_match_torchs_count_of_forward_and_backward(options):
    """Training FLOPs per token against torch's counter over one training step
    (forward and backward): it sees every weight matmul and the LM heads, so
    the analytic count less its attention terms must match exactly; under
    one_step only the last fast and slow call (and the head) of each segment
    run backward, deep supervision reads a head per segment. Fails on the
    mutation that drops ``+ 2.0 * graded`` for ``3.0 * trained`` in
    ``flops_per_token`` (one_step then counts a full backward)."""
    torch.manual_seed(0)
    spec = hrm(widths=(48, 40), N=2, T=2, **options)
    model = build_model(spec)
    seq_len = 16
    tokens = torch.randint(0, spec.vocab_size, (1, seq_len))
    with FlopCounterMode(display=False) as counter:
        model.training_loss(tokens, tokens).backward()
    segments = options.get("segments", 1)
    forward_mixing = hrm_module.hrm_mixing(spec, seq_len)
    # backward runs through every call (BPTT) or one call of each layer per segment
    graded_mixing = forward_mixing if options.get("grad") != "one_step" else \
        segments * sum(layer_mixing(spec, layer, seq_len) for layer in spec.layers)
    analytic = flops_per_token(spec, seq_len=seq_len) - forward_mixing - 2 * graded_mixing
    assert counter.get_total_flops() / seq_len == pytest.approx(analytic, rel=1e-9)


@pytest.mark.parametrize("spec,message", [
    (gpn(layers=2), "must equal len"),
    (gpn(mem_heads=2), "unknown options"),
    (replace(gpn(), layers=(LayerSpec(mixer="attention", mlp_width=8),)), "mixer='gpn'"),
    (gpn(memory=True, mem_heads=0), "ints >= 1"),
    (hrm(fast_layers=3), "fast_layers"),
    (hrm(N=2, cycles=3), "unknown options"),
    (hrm(grad="truncated"), "grad must be 'bptt' or 'one_step'"),
    (hrm(segments=0), "segments must be an int >= 1"),
    (universal(steps=0), "steps"),
], ids=["gpn-layers-mismatch", "gpn-memory-option", "gpn-wrong-mixer", "gpn_m-zero-heads", "hrm-no-slow-layer",
        "hrm-unknown", "hrm-bad-grad", "hrm-zero-segments", "universal-zero-steps"])
def test_bad_options_are_refused_by_name(spec, message):
    with pytest.raises(ValueError, match=message):
        count_params(spec)


PAPER_GPN_STUDY = """\
name: gpn-paper
space:
  axes:
    family: gpn
    num_layers: 1  # GPN's depth is gpn.layers
    gpn: {layers: 1, memory: true, d_emb: 768, mem_heads: 15, mem_key_dim: 128, mem_value_dim: 256}
  model: {d_model: 2496, head_dim: 16, multiple_of: 8}
budget: {match: params, count_embeddings: true, solve_for: mlp, targets: [129151902], tolerance: 0.001}
data: {kind: mqar, vocab_size: 32000, seq_len: 64, num_pairs: 4}
"""


def test_the_papers_130m_gpn_m_plans_from_a_study(tmp_path):
    """A study names the paper's 1L GPN+M (papers.md section 4) through the gpn
    axes, and the planner sizes its FFN to the paper's 6656, 129,151,902 in all.
    Fails on the mutation that drops ``d_emb`` from the options families.py
    passes (the plan then has a 2496-wide embedding and misses its target)."""
    path = tmp_path / "study.yaml"
    path.write_text(PAPER_GPN_STUDY)
    (trial,) = A.plan(A.load_study(path))
    assert trial.spec.structure == "gpn_m" and trial.spec.mlp_widths == (6656,)
    assert trial.spec.options == dict(d_emb=768, mem_heads=15, mem_key_dim=128, mem_value_dim=256)
    assert count_params(trial.spec, embeddings=True) == 129_151_902


def test_hrm_training_options_are_reachable_from_a_study(tmp_path):
    """hrm.grad and hrm.segments reach the spec's options (and stay out of it at
    their defaults, so existing HRM trials keep their ids)."""
    path = tmp_path / "study.yaml"
    path.write_text("name: h\nspace:\n  axes: {family: hrm, num_layers: 2, hrm: {N: 2, T: 2, grad: [bptt, one_step], "
                    "segments: [1, 3]}}\n  model: {head_dim: 8}\nbudget: {targets: [20000], tolerance: 0.05}\n")
    options = sorted((t.spec.options for t in A.plan(A.load_study(path))), key=str)
    assert options == sorted([dict(N=2, T=2), dict(N=2, T=2, grad="one_step"), dict(N=2, T=2, segments=3),
                              dict(N=2, T=2, grad="one_step", segments=3)], key=str)
