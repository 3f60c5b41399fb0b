"""Looped and memory structures: behaviour beyond the zoo contract.

Looped: one loop is the plain stack; the exit distribution and the expected
loss match a hand computation; exited tokens keep their state, and mixers that
take ``skip_BT`` see exactly the exited tokens; cache holes sample exits in
training only; shared weights are counted once. Memory: a segment is modulated
only by the segments before it (papers.md section 10's leakage test, with a
leaky variant to show the test can fail); the GRU is torch's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from archsearch.arch import blocks
from archsearch.arch.model import build_model
from archsearch.arch.spec import ArchSpec, LayerSpec
from archsearch.arch.structures.looped import exit_distribution
from archsearch.arch.structures.memory import GRUCell, memory_options
from archsearch.budget import count_params
from tests.zoo.cases_structures import looped, memory


def _frozen_after(states, lambdas, threshold):
    """Per loop r, the tokens whose cumulative exit probability passed the
    threshold at some loop <= r (so they are frozen from loop r + 1 on)."""
    survive, exited, out = torch.ones_like(lambdas[0]), torch.zeros_like(lambdas[0], dtype=torch.bool), []
    for lam in lambdas:
        survive = survive * (1 - lam)
        exited = exited | (1 - survive >= threshold)
        out.append(exited)
    return out


# -- looped -------------------------------------------------------------------------------------------


def test_one_loop_without_gate_is_the_plain_stack():
    torch.manual_seed(0)
    spec = looped(widths=(48, 40), loops=1)
    plain = build_model(replace(spec, structure="stack", options={})).eval()
    loop = build_model(spec).eval()
    loop.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, spec.vocab_size, (2, 13))
    with torch.no_grad():
        assert torch.allclose(loop(tokens), plain(tokens), atol=1e-6)
        assert torch.allclose(loop.training_loss(tokens, tokens), F.cross_entropy(
            plain(tokens).flatten(0, 1), tokens.flatten()), atol=1e-6)


def test_three_loops_apply_the_group_three_times():
    torch.manual_seed(0)
    spec = looped(widths=(40,), loops=3, inject=True)
    model = build_model(spec).eval()
    tokens = torch.randint(0, spec.vocab_size, (2, 9))
    with torch.no_grad():
        e = model.embed(tokens)
        layer = model.layers[0]
        h = layer(layer(layer(e) + e) + e)
        expected = model.norm(h) @ model.embed.weight.T
        assert torch.allclose(model(tokens), expected, atol=1e-6)


@pytest.mark.parametrize("loops", [2, 3, 5])
def test_exit_distribution_sums_to_one(loops):
    torch.manual_seed(loops)
    lambdas = [torch.rand(3, 7) for _ in range(loops - 1)]
    p = exit_distribution(lambdas)
    assert p.shape == (3, 7, loops) and (p >= 0).all()
    assert torch.allclose(p.sum(-1), torch.ones(3, 7))


def test_exit_distribution_by_hand():
    p = exit_distribution([torch.tensor(0.5), torch.tensor(0.25)])
    assert torch.allclose(p, torch.tensor([0.5, 0.5 * 0.25, 0.5 * 0.75]))


def test_expected_loss_matches_hand_computation():
    torch.manual_seed(0)
    beta = 0.3
    spec = looped(widths=(40,), loops=3, d_model=16, inject=True, exit_gate=True, exit_entropy=beta, vocab=11)
    model = build_model(spec)
    nn.init.normal_(model.exit_gate.weight, std=1.0)
    tokens = torch.randint(0, 11, (2, 6))
    targets = torch.randint(0, 11, (2, 6))
    targets[0, :2] = -100
    layer, gate, norm, E = model.layers[0], model.exit_gate, model.norm, model.embed.weight
    with torch.no_grad():
        e = model.embed(tokens)
        h1 = layer(e)
        h2 = layer(h1 + e)
        h3 = layer(h2 + e)
        lam1, lam2 = (torch.sigmoid(gate(norm(h)))[..., 0] for h in (h1, h2))
        p = [lam1, (1 - lam1) * lam2, (1 - lam1) * (1 - lam2)]
        total, count = 0.0, 0
        for b in range(2):
            for t in range(6):
                if targets[b, t] < 0:
                    continue
                ce = [-torch.log_softmax(norm(h)[b, t] @ E.T, -1)[targets[b, t]] for h in (h1, h2, h3)]
                expected_ce = sum(p[r][b, t] * ce[r] for r in range(3))
                entropy = -sum(p[r][b, t] * torch.log(p[r][b, t]) for r in range(3))
                total, count = total + expected_ce - beta * entropy, count + 1
        assert torch.allclose(model.training_loss(tokens, targets), total / count, atol=1e-5)


def test_exit_threshold_freezes_exited_tokens():
    torch.manual_seed(0)
    spec = looped(widths=(48, 40), loops=4, inject=True, exit_gate=True, exit_threshold=0.5)
    model = build_model(spec).eval()
    nn.init.normal_(model.exit_gate.weight, std=0.5)
    tokens = torch.randint(0, spec.vocab_size, (3, 17))
    with torch.no_grad():
        states, lambdas, _ = model.loops(model.embed(tokens), keep_all=True)
    frozen = _frozen_after(states, lambdas, 0.5)
    assert frozen[0].any() and not frozen[-1].all(), "choose a case where some tokens exit and some do not"
    for r in range(len(lambdas)):
        for later in states[r + 1:]:
            assert torch.equal(later[frozen[r]], states[r][frozen[r]])
        running = ~frozen[r]
        assert not torch.allclose(states[r + 1][running], states[r][running])
    # the returned logits are those of each token's exit loop
    with torch.no_grad():
        assert torch.allclose(model(tokens), model.logits(states[-1]), atol=1e-6)


class _SkipSpy(nn.Module):
    """A mixer that takes ``skip_BT``, records it, and mixes nothing across time."""

    seen: ClassVar[list] = []

    def __init__(self, *, spec: ArchSpec, layer: LayerSpec):
        super().__init__()
        self.proj = nn.Linear(spec.d_model, spec.d_model, bias=False)

    def forward(self, x_BTD, *, skip_BT=None):
        _SkipSpy.seen.append(None if skip_BT is None else skip_BT.clone())
        return self.proj(x_BTD)


def test_skip_aware_mixers_get_the_exited_tokens(monkeypatch):
    monkeypatch.setitem(blocks.MIXERS, "skip-spy", blocks.Block(_SkipSpy, lambda s, l: s.d_model**2,
                                                                lambda s, l, t: 2.0 * s.d_model**2))
    monkeypatch.setattr(_SkipSpy, "seen", [])
    torch.manual_seed(0)
    spec = replace(looped(loops=3, exit_gate=True, exit_threshold=0.5),
                   layers=(LayerSpec(mixer="skip-spy", mlp_width=32), LayerSpec(mlp_width=32)))
    model = build_model(spec).eval()
    nn.init.normal_(model.exit_gate.weight, std=0.5)
    tokens = torch.randint(0, spec.vocab_size, (2, 11))
    with torch.no_grad():
        states, lambdas, _ = model.loops(model.embed(tokens), keep_all=True)
    frozen = _frozen_after(states, lambdas, 0.5)
    assert len(_SkipSpy.seen) == 3 and not _SkipSpy.seen[0].any()
    assert frozen[0].any()
    for r in (1, 2):
        assert torch.equal(_SkipSpy.seen[r], frozen[r - 1])


def test_looped_mamba_skips_exited_tokens(monkeypatch):
    mamba = pytest.importorskip("archsearch.arch.blocks.mamba")
    if "mamba" not in blocks.MIXERS:
        monkeypatch.setitem(blocks.MIXERS, "mamba", blocks.Block(mamba.Mamba, mamba.params, mamba.flops,
                                                                 mamba.mixing))
    seen = []
    original = mamba.Mamba.forward

    def spy(self, x_BTD, *, skip_BT=None, **kwargs):
        seen.append(skip_BT)
        return original(self, x_BTD, skip_BT=skip_BT, **kwargs)

    monkeypatch.setattr(mamba.Mamba, "forward", spy)
    torch.manual_seed(0)
    spec = replace(looped(loops=3, exit_gate=True, exit_threshold=0.5),
                   layers=(LayerSpec(mixer="mamba", mlp="none"), LayerSpec(mlp_width=32)))
    model = build_model(spec).eval()
    nn.init.normal_(model.exit_gate.weight, std=0.5)
    tokens = torch.randint(0, spec.vocab_size, (2, 11))
    with torch.no_grad():
        states, lambdas, _ = model.loops(model.embed(tokens), keep_all=True)
        changed = tokens.clone()
        changed[:, 6:] = (changed[:, 6:] + 1) % spec.vocab_size
        assert torch.allclose(model(tokens)[:, :6], model(changed)[:, :6], atol=1e-5)
    frozen = _frozen_after(states, lambdas, 0.5)
    assert frozen[0].any() and torch.equal(seen[1], frozen[0]) and torch.equal(seen[2], frozen[1])
    assert torch.equal(states[2][frozen[0]], states[0][frozen[0]])


def test_cache_hole_samples_exits_in_training_only():
    torch.manual_seed(0)
    spec = looped(loops=3, exit_gate=True, cache_hole=1.0)
    model = build_model(spec)
    # the gate says "exit now" to every token: all of them freeze after loop 1 in training
    nn.init.constant_(model.exit_gate.bias, 20.0)
    tokens = torch.randint(0, spec.vocab_size, (2, 10))
    states, _, _ = model.train().loops(model.embed(tokens), keep_all=True)
    assert torch.equal(states[2], states[0])
    with torch.no_grad():
        states, _, _ = model.eval().loops(model.embed(tokens), keep_all=True)
    assert not torch.allclose(states[2], states[0])
    # with an undecided gate the sampled exits still leave a gradient for it (through p, not the draws)
    nn.init.zeros_(model.exit_gate.bias)
    loss = model.train().training_loss(tokens, tokens)
    loss.backward()
    assert torch.isfinite(loss) and model.exit_gate.weight.grad.abs().sum() > 0


def test_cache_hole_training_is_causal():
    spec = looped(loops=3, exit_gate=True, cache_hole=0.5)
    torch.manual_seed(0)
    model = build_model(spec).train()
    nn.init.normal_(model.exit_gate.weight, std=0.5)
    tokens = torch.randint(0, spec.vocab_size, (2, 16))
    changed = tokens.clone()
    changed[:, 9:] = torch.randint(0, spec.vocab_size, (2, 7))
    with torch.no_grad():
        torch.manual_seed(1)
        a = model(tokens)
        torch.manual_seed(1)
        b = model(changed)
    assert torch.allclose(a[:, :9], b[:, :9], atol=1e-5)


@pytest.mark.parametrize("gate", [False, True])
def test_shared_weights_are_counted_once(gate):
    options = dict(exit_gate=True) if gate else {}
    one, five = looped(loops=1, **options), looped(loops=5, **options)
    plain = replace(one, structure="stack", options={})
    gate_params = one.d_model + 1 if gate else 0
    assert count_params(one) == count_params(five) == count_params(plain) + gate_params
    built = sum(p.numel() for p in build_model(five).parameters())
    assert built == count_params(five, embeddings=True)


@pytest.mark.parametrize("options,message", [
    (dict(), r"options\['loops'\] is required"),
    (dict(loops=0), "loops must be an int >= 1, got 0"),
    (dict(loops=2, exit_threshold=0.5), "exit_threshold and cache_hole need exit_gate=true"),
    (dict(loops=2, exit_gate=True, exit_threshold=1.5), r"exit_threshold must be in \(0, 1\], got 1.5"),
    (dict(loops=2, loop=3), r"unknown options \['loop'\]"),
], ids=["no-loops", "zero-loops", "threshold-without-gate", "threshold-above-one", "misspelt-option"])
def test_looped_rejects_bad_options(options, message):
    """Each bad option is refused for its own reason. Fails on the mutation
    ``opts.loops < 1`` -> ``opts.loops < 0`` in loop_options (zero loops builds)."""
    with pytest.raises(ValueError, match=message):
        build_model(replace(looped(), options=options))


# -- memory -------------------------------------------------------------------------------------------


class _LeakyMemory:
    """The mistake the leakage test is for: each segment reads the memory
    *after* it has been written with that same segment."""

    def __init__(self, memory):
        self.memory = memory

    def __call__(self, hn_BTD, start_BMS=None):
        m, states = self.memory, []
        state = m.initial_MS.repeat(hn_BTD.shape[0], 1, 1)
        for start in range(0, hn_BTD.shape[1], m.segment):
            state = m.write(state, hn_BTD[:, start:start + m.segment])
            states.append(state)
        return torch.stack(states, dim=1)


def _open_memory(spec):
    """A model whose memory path is loud: gate open, large read-out."""
    torch.manual_seed(0)
    model = build_model(spec).eval()
    nn.init.constant_(model.memory.gate.bias, 4.0)
    nn.init.normal_(model.memory.read_out.weight, std=1.0)
    return model


def _moved(model, tokens, position):
    """Which logits move when the token at ``position`` changes: bool [T]."""
    changed = tokens.clone()
    changed[:, position] = (changed[:, position] + 7) % model.spec.vocab_size
    with torch.no_grad():
        return ~torch.isclose(model(tokens), model(changed), atol=1e-5).all(-1).all(0)


@pytest.mark.parametrize("placement", [0, 1])
@pytest.mark.parametrize("position", [12, 14, 20])
def test_memory_reads_only_past_segments(placement, position):
    spec = memory(placement=placement, slots=3, segment=5)
    model = _open_memory(spec)
    tokens = torch.randint(0, spec.vocab_size, (2, 23))
    moved = _moved(model, tokens, position)
    assert not moved[:position].any(), f"logits before {position} moved: {moved.nonzero().flatten().tolist()}"
    assert moved[position:].all()


def test_leakage_test_catches_a_leaky_memory():
    spec = memory(placement=0, slots=3, segment=5)
    model = _open_memory(spec)
    model.memory.segment_states = _LeakyMemory(model.memory)
    tokens = torch.randint(0, spec.vocab_size, (2, 23))
    moved = _moved(model, tokens, 12)
    # earlier segments stay put, but positions 10 and 11 of the same segment see token 12
    assert not moved[:10].any() and moved[10:12].all()


def test_segment_states_depend_only_on_earlier_segments():
    spec = memory(placement=0, slots=3, segment=5)
    model = _open_memory(spec)
    hn = torch.randn(2, 23, spec.d_model)
    changed = hn.clone()
    changed[:, 11] += 1.0  # segment 2
    with torch.no_grad():
        a, b = model.memory.segment_states(hn), model.memory.segment_states(changed)
    assert a.shape == (2, 5, 3, memory_options(spec).memory_dim)
    assert torch.equal(a[:, :3], b[:, :3]) and not torch.allclose(a[:, 3:], b[:, 3:])


def test_gru_cell_is_torchs():
    torch.manual_seed(0)
    ours, theirs = GRUCell(input_size=6, hidden_size=5), nn.GRUCell(6, 5)
    with torch.no_grad():
        ours.input.weight.copy_(theirs.weight_ih)
        ours.input.bias.copy_(theirs.bias_ih)
        ours.hidden.weight.copy_(theirs.weight_hh)
        ours.hidden.bias.copy_(theirs.bias_hh)
    x, h = torch.randn(4, 6), torch.randn(4, 5)
    assert torch.allclose(ours(x, h), theirs(x, h), atol=1e-6)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())


def test_memory_param_formula_by_hand():
    spec = memory(d_model=32, placement=1, slots=5, segment=7, memory_dim=24, memory_heads=3)
    d, s, m = 32, 24, 5
    by_hand = (d + m * s + d * s + 2 * s * s + s * d + (d + s) * d + d + s * s + 2 * d * s + 6 * s * s + 6 * s)
    plain = replace(spec, structure="stack", options={})
    assert count_params(spec) - count_params(plain) == by_hand


@pytest.mark.parametrize("options,message", [
    (dict(placement=3), r"placement must be in \[0, 2\], got 3"),
    (dict(placement=-1), r"placement must be in \[0, 2\], got -1"),
    (dict(slots=0), "slots must be an int >= 1, got 0"),
    (dict(memory_dim=30, memory_heads=4), "memory_heads 4 must divide memory_dim 30"),
    (dict(segments=4), r"unknown options \['segments'\]"),
], ids=["placement-past-top", "placement-negative", "zero-slots", "heads-not-dividing", "misspelt-option"])
def test_memory_rejects_bad_options(options, message):
    """Each bad option is refused for its own reason. Fails on the mutation
    ``value < 1`` -> ``value < 0`` in memory_options (zero slots is accepted)."""
    with pytest.raises(ValueError, match=message):
        memory_options(memory(**options))


def test_training_flops_count_the_exit_gates_extra_heads():
    from archsearch.arch.spec import ArchSpec, LayerSpec
    from archsearch.budget import flops_per_token

    def spec(exit_gate: bool) -> ArchSpec:
        return ArchSpec(family="looped", vocab_size=100, d_model=32, num_heads=4,
                        layers=(LayerSpec(mlp_width=64),), structure="looped",
                        options={"loops": 3, "exit_gate": exit_gate})

    gated, plain = spec(True), spec(False)
    heads = 2 * 32 * 100 * (3 - 1)  # LM heads after loops 1 and 2
    forward_gap = flops_per_token(gated, seq_len=16, kind="forward") - flops_per_token(plain, seq_len=16,
                                                                                        kind="forward")
    train_gap = flops_per_token(gated, seq_len=16) - flops_per_token(plain, seq_len=16)
    assert train_gap == 3 * (forward_gap + heads)
