"""Looped / Ouro: the exit options from a space, a real cache hole for
attention, the gate's training stage, and what early exits save at evaluation.

Planted mutations each test catches: attention ignoring its ``cache`` (the
K/V test: an exited token's later-loop keys leak into later tokens); the
all-exited shortcut removed (the group is called every loop); ``gate_loss``
letting gradient into the LM, or its target not 1 - sigmoid(k (I - gamma));
``exit_metrics`` counting loops of exited tokens (loop_fraction would be 1).
"""

from __future__ import annotations

import textwrap

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import archsearch as A
from archsearch.arch.blocks.attention import Attention
from archsearch.arch.model import build_model
from archsearch.arch.structures.looped import GATE_MARGIN, GATE_SHARPNESS
from archsearch.data.synthetic import MQAR
from archsearch.train import train_trial
from archsearch.train.loop import exit_metrics
from tests.zoo.cases_structures import looped
from tests.zoo.test_contract import _recipe


def _gated(**options):
    """A looped model whose gate lets some tokens exit after loop 1 and keeps others."""
    torch.manual_seed(0)
    model = build_model(looped(loops=3, exit_gate=True, exit_threshold=0.5, **options)).eval()
    nn.init.normal_(model.exit_gate.weight, std=0.5)
    return model


# -- options from a space -----------------------------------------------------------------------------


def test_gate_options_come_from_the_space(tmp_path, corpus):
    (tmp_path / "space.yaml").write_text(textwrap.dedent("""\
        name: loops
        axes:
          family: looped
          num_layers: 2
          loops: 3
          exit_gate: [false, true]
          exit_threshold: [0.6, 0.8]
          cache_hole: 0.25
          exit_entropy: 0.1
        model: {head_dim: 8}
        """))
    (tmp_path / "study.yaml").write_text(textwrap.dedent(f"""\
        name: loops
        space: space.yaml
        budget: {{targets: [20000], tolerance: 0.05}}
        data: {{kind: text, paths: [{corpus}], seq_len: 16}}
        """))
    trials = A.plan(A.load_study(tmp_path / "study.yaml"))
    options = sorted((t.spec.options for t in trials), key=lambda o: (o["exit_gate"], o.get("exit_threshold", 0)))
    # one ungated trial (the gate's options cannot matter there), one per threshold with the gate
    assert options == [
        {"loops": 3, "exit_gate": False, "inject": True},
        {"loops": 3, "exit_gate": True, "inject": True, "exit_threshold": 0.6, "cache_hole": 0.25,
         "exit_entropy": 0.1},
        {"loops": 3, "exit_gate": True, "inject": True, "exit_threshold": 0.8, "cache_hole": 0.25,
         "exit_entropy": 0.1},
    ]


# -- the cache hole in attention ----------------------------------------------------------------------


def test_an_exited_tokens_keys_and_values_stay_those_of_its_exit_loop(monkeypatch):
    """Whatever later loops compute at an exited token's position, the tokens
    after it read the keys and values it had when it exited."""
    original = Attention.forward
    calls: list[tuple] = []

    def noisy(self, x_BTD, *, skip_BT=None, cache=None, scale=0.0):
        assert skip_BT is not None and cache is not None, "attention in a looped group must get both"
        x_BTD = x_BTD + scale * torch.randn_like(x_BTD) * skip_BT[..., None]
        out = original(self, x_BTD, skip_BT=skip_BT, cache=cache)
        calls.append((skip_BT.clone(), cache["k"].clone(), cache["v"].clone()))
        return out

    tokens = torch.randint(0, 64, (2, 13), generator=torch.Generator().manual_seed(1))
    outputs = []
    for scale in (0.0, 10.0):
        def forward(self, x_BTD, *, skip_BT=None, cache=None, scale=scale):
            return noisy(self, x_BTD, skip_BT=skip_BT, cache=cache, scale=scale)

        monkeypatch.setattr(Attention, "forward", forward)
        model = _gated()
        calls.clear()
        with torch.no_grad():
            outputs.append(model(tokens))
    assert torch.equal(outputs[0], outputs[1]), "noise at exited positions reached other tokens"
    # per layer (2 of them), the keys of a token exited before loop r are those of the loop before
    per_layer = [calls[0::2], calls[1::2]]
    exited_at_2 = per_layer[0][1][0]
    assert exited_at_2.any() and not exited_at_2.all(), "choose a case where some tokens exit and some do not"
    for layer_calls in per_layer:
        for (_, k_prev, v_prev), (skip, k, v) in zip(layer_calls, layer_calls[1:]):
            frozen = skip[:, None, :, None].expand_as(k)
            assert torch.equal(k[frozen], k_prev[frozen]) and torch.equal(v[frozen], v_prev[frozen])


def test_exits_keep_the_model_causal():
    model = _gated(inject=True)
    tokens = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(2))
    changed = tokens.clone()
    changed[:, 11:] = (changed[:, 11:] + 5) % 64
    with torch.no_grad():
        assert torch.allclose(model(tokens)[:, :11], model(changed)[:, :11], atol=1e-5)
        assert model.loops(model.embed(tokens)).steps_BT.min() < 3


def test_once_every_token_has_exited_no_loop_runs(monkeypatch):
    model = _gated()
    nn.init.constant_(model.exit_gate.bias, 20.0)  # every token exits after loop 1
    calls = []
    monkeypatch.setattr(model, "_group", lambda *args: calls.append(1) or type(model)._group(model, *args))
    with torch.no_grad():
        run = model.loops(model.embed(torch.randint(0, 64, (2, 9))), keep_all=True)
    assert len(calls) == 1 and (run.steps_BT == 1).all()
    assert torch.equal(run.states[2], run.states[0])


# -- Ouro stage II ------------------------------------------------------------------------------------


def test_gate_loss_by_hand():
    model = _gated()
    tokens = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(3))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    with torch.no_grad():
        states = model.loops(model.embed(inputs), keep_all=True, exits=False).states
        ce = [nn.functional.cross_entropy(model.logits(h).transpose(1, 2), targets, reduction="none")
              for h in states]
        total = 0.0
        for r in range(2):
            exit_target = 1 - torch.sigmoid(GATE_SHARPNESS * ((ce[r] - ce[r + 1]).clamp(min=0) - GATE_MARGIN))
            lam = torch.sigmoid(model.exit_gate(model.norm(states[r])).squeeze(-1))
            total = total + nn.functional.binary_cross_entropy(lam, exit_target) / 2
    loss = model.gate_loss(inputs, targets)
    assert loss.item() == pytest.approx(total.item(), rel=1e-5)
    loss.backward()
    gate = {id(p) for p in model.exit_gate.parameters()}
    assert all((p.grad is None) != (id(p) in gate) for p in model.parameters())


@pytest.mark.slow
def test_gate_steps_train_the_gate_alone(tmp_path):
    spec = looped(widths=(32,), loops=3, exit_gate=True, exit_threshold=0.7)
    data = MQAR(vocab_size=64, seq_len=32, num_pairs=4)
    finals = {}
    for gate_steps in (0, 3):
        folder = tmp_path / f"gate{gate_steps}"
        result = train_trial(spec=spec, recipe=_recipe(steps=3, gate_steps=gate_steps, batch_size=8, eval_every=3,
                                                       warmup_steps=1, eval_batches=1),
                             data=data, seed=0, threads=1, checkpoint_dir=folder)
        assert result.steps == 3 + gate_steps
        finals[gate_steps] = load_file(folder / "model.safetensors")
    before, after = finals[0], finals[3]
    for name in before:
        same = torch.equal(before[name], after[name])
        assert same != name.startswith("exit_gate."), name


def test_models_without_a_gate_skip_the_gate_stage():
    result = train_trial(spec=looped(loops=2), recipe=_recipe(steps=2, gate_steps=3, batch_size=4, eval_every=2,
                                                              warmup_steps=1, eval_batches=1),
                         data=MQAR(vocab_size=64, seq_len=32, num_pairs=4), seed=0, threads=1)
    assert result.steps == 2
    with pytest.raises(ValueError, match="exit_gate"):
        build_model(looped(loops=2)).gate_loss(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4,
                                                                                                 dtype=torch.long))


# -- what exits save, as evaluation metrics -----------------------------------------------------------


def test_exit_metrics_count_the_loops_run():
    source = MQAR(vocab_size=64, seq_len=32, num_pairs=4)
    recipe = _recipe(batch_size=4, eval_batches=2)
    model = _gated()
    nn.init.constant_(model.exit_gate.bias, 20.0)  # all exit after loop 1 of 3
    nn.init.zeros_(model.exit_gate.weight)
    metrics = exit_metrics(model, source, recipe, seed=0)
    assert metrics["loop_fraction"] == pytest.approx(1 / 3) and metrics["loop_time_ratio"] > 0
    nn.init.constant_(model.exit_gate.bias, -20.0)  # none exit
    assert exit_metrics(model, source, recipe, seed=0)["loop_fraction"] == 1.0
    nn.init.normal_(model.exit_gate.weight, std=0.5)
    nn.init.zeros_(model.exit_gate.bias)
    assert 1 / 3 < exit_metrics(model, source, recipe, seed=0)["loop_fraction"] < 1.0
    assert exit_metrics(build_model(looped(loops=2)), source, recipe, seed=0) == {}


def test_exit_metrics_reach_the_store(tmp_path):
    spec = looped(widths=(32,), loops=3, exit_gate=True, exit_threshold=0.6)
    result = train_trial(spec=spec, recipe=_recipe(steps=2, batch_size=4, eval_every=1, warmup_steps=1,
                                                   eval_batches=1),
                         data=MQAR(vocab_size=64, seq_len=32, num_pairs=4), seed=0, threads=1)
    assert all(0 < row["loop_fraction"] <= 1 and row["loop_time_ratio"] > 0 for row in result.curve)
    with A.open_store(tmp_path / "s.duckdb") as db:
        db.finish("t", result.to_dict())
        rows = db.metrics().to_pylist()
    assert [r["loop_fraction"] for r in rows] == [row["loop_fraction"] for row in result.curve]
    assert all(r["loop_time_ratio"] is not None for r in rows)
