"""The training recipe: schedules, weight-decay groups, token budgets, accumulation, compile, checkpoints."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from archsearch.arch.model import build_model
from archsearch.arch.spec import ArchSpec, LayerSpec
from archsearch.budget import count_params
from archsearch.data import IGNORE, Batch
from archsearch.data.text import ByteCorpus
from archsearch.space.training import Recipe, tokens_per_param
from archsearch.train import evaluate, load_model, lr_at, resolve_steps, train_trial
from archsearch.train.recipe import adamw

SPEC = ArchSpec(family="transformer", vocab_size=256, d_model=32, num_heads=4,
                layers=tuple(LayerSpec(mlp_width=w) for w in (96, 64)))


def recipe(**overrides) -> dict:
    fields = dict(steps=12, batch_size=8, lr=3e-3, warmup_steps=2, eval_every=3, eval_batches=2)
    return Recipe(**{**fields, **overrides}).model_dump()


@pytest.fixture
def source(corpus):
    return ByteCorpus(paths=[str(corpus)], seq_len=16)


class HalfScored:
    """Text whose targets are IGNORE at random positions, so micro-batches score unequal counts."""

    def __init__(self, inner):
        self.inner, self.vocab_size, self.seq_len = inner, inner.vocab_size, inner.seq_len

    def batch(self, *, split, batch_size, generator):
        batch = self.inner.batch(split=split, batch_size=batch_size, generator=generator)
        drop_BT = torch.rand(batch.targets.shape, generator=generator) < torch.linspace(0, 0.9, batch_size)[:, None]
        return Batch(inputs=batch.inputs, targets=batch.targets.masked_fill(drop_BT, IGNORE))


def test_wsd_warms_up_holds_then_decays_linearly_to_the_floor():
    kw = dict(lr=1.0, warmup_steps=10, steps=100, min_lr_ratio=0.1, schedule="wsd", decay_fraction=0.2)
    assert lr_at(0, **kw) == pytest.approx(0.1) and lr_at(9, **kw) == pytest.approx(1.0)
    assert all(lr_at(s, **kw) == 1.0 for s in range(10, 81))
    assert lr_at(90, **kw) == pytest.approx(0.55)
    assert lr_at(100, **kw) == pytest.approx(0.1)
    drops = [lr_at(s, **kw) - lr_at(s + 1, **kw) for s in range(80, 100)]
    assert all(d == pytest.approx(0.9 / 20) for d in drops)


def test_no_weight_decay_on_norms_biases_and_marked_parameters():
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 4, bias=False))
    model.A_log = nn.Parameter(torch.zeros(8, 4))
    model.A_log._no_weight_decay = True
    decayed, exempt = (set(map(id, g["params"])) for g in adamw(model, recipe(weight_decay=0.1)).param_groups)
    assert decayed == {id(model[0].weight), id(model[2].weight)}
    assert exempt == {id(model[0].bias), id(model[1].weight), id(model[1].bias), id(model.A_log)}
    built = build_model(SPEC)
    groups = adamw(built, recipe()).param_groups
    norms = {id(p) for n, p in built.named_parameters() if "norm" in n}
    assert norms and norms <= set(map(id, groups[1]["params"])) and groups[1]["weight_decay"] == 0.0


def test_tokens_per_parameter_sets_the_steps(source):
    params = count_params(SPEC)
    assert resolve_steps(recipe(tokens="20x"), params=params, seq_len=16) == math.ceil(20 * params / (8 * 16))
    assert resolve_steps(recipe(tokens=4096), params=params, seq_len=16) == 32
    assert resolve_steps(recipe(), params=params, seq_len=16) == 12
    result = train_trial(spec=SPEC, recipe=recipe(tokens="0.1x", eval_every=100), data=source, seed=0)
    assert result.steps == math.ceil(0.1 * params / (8 * 16)) and result.tokens == result.steps * 8 * 16


# (written, tokens trained for a model of 1000 non-embedding parameters), or None where refused
TOKEN_BUDGETS = [("20x", 20_000), (" 2.5x", 2_500), ("1e6", 1_000_000), (1.0e9, 10**9), (10**9, 10**9),
                 ("20", 20), ("x20", None), ("0x", None), (0, None)]


@pytest.mark.parametrize("tokens, trained", TOKEN_BUDGETS, ids=[repr(t) for t, _ in TOKEN_BUDGETS])
def test_token_budgets_are_validated(tokens, trained):
    """A ratio ("20x", " 2.5x") is tokens per parameter, anything else a count:
    "1e6" (how YAML reads 1e6) is a million tokens and "20" is twenty, not 20x.
    Checked through the steps a batch of 10 x 10 tokens gives, at 1000 parameters.
    Fails on the mutation that makes the "x" of _TOKENS_PER_PARAM optional
    (``\\s*x\\s*$`` -> ``\\s*x?\\s*$``): "20" then reads as 20x, 200 steps, not 1."""
    if trained is None:
        with pytest.raises(ValidationError, match="tokens"):
            Recipe(tokens=tokens)
        return
    dumped = Recipe(tokens=tokens, batch_size=10).model_dump()
    assert resolve_steps(dumped, params=1000, seq_len=10) == math.ceil(trained / 100)
    ratio = tokens_per_param(dumped["tokens"])
    assert (ratio * 1000 if ratio is not None else dumped["tokens"]) == trained


def test_grad_accum_must_divide_the_batch():
    with pytest.raises(ValidationError, match="divide"):
        Recipe(batch_size=8, grad_accum=3)


def test_accumulating_two_half_batches_equals_the_full_batch(source):
    data = HalfScored(source)
    full = train_trial(spec=SPEC, recipe=recipe(steps=6), data=data, seed=1, threads=1)
    halves = train_trial(spec=SPEC, recipe=recipe(steps=6, grad_accum=2), data=data, seed=1)
    for a, b in zip(full.curve, halves.curve):
        assert b["train_loss"] == pytest.approx(a["train_loss"], abs=1e-5)
        assert b["val_loss"] == pytest.approx(a["val_loss"], abs=1e-5)


def test_the_compile_flag_compiles_the_model(source, monkeypatch):
    if not hasattr(torch, "compile") or not torch._dynamo.is_dynamo_supported():
        pytest.skip("torch.compile is not available here")
    compiled, real = [], torch.compile
    # The eager backend traces with dynamo but skips code generation: cheap on CPU.
    monkeypatch.setattr(torch, "compile", lambda model, **kw: compiled.append(model) or real(model, backend="eager"))
    result = train_trial(spec=SPEC, recipe=recipe(steps=1, compile=True), data=source, seed=0, threads=1)
    assert len(compiled) == 1 and math.isfinite(result.val_loss)


class Preempted(Exception):
    pass


def test_a_preempted_trial_resumes_to_the_same_losses(source, tmp_path):
    # grad_accum and WSD ride along: the optimizer state, the data stream and the schedule all resume.
    plan = recipe(steps=12, grad_accum=2, schedule="wsd", decay_fraction=0.5)
    whole = train_trial(spec=SPEC, recipe=plan, data=source, seed=5, checkpoint_dir=tmp_path / "whole")

    def preempt(row):
        if row["step"] == 6:
            raise Preempted

    folder = tmp_path / "resumed"
    with pytest.raises(Preempted):
        train_trial(spec=SPEC, recipe=plan, data=source, seed=5, checkpoint_dir=folder, checkpoint_every=4,
                    on_eval=preempt)
    assert [p.name for p in folder.iterdir()] == ["step-000000004"]
    seen = []
    resumed = train_trial(spec=SPEC, recipe=plan, data=source, seed=5, checkpoint_dir=folder, checkpoint_every=4,
                          on_eval=seen.append)
    assert [row["step"] for row in seen] == [6, 9, 12]
    assert resumed.curve == whole.curve and resumed.tokens == whole.tokens
    one, two = load_model(tmp_path / "whole"), load_model(folder)
    for (name, a), b in zip(one.state_dict().items(), two.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_checkpoint_of_another_trial_is_refused(source, tmp_path):
    train_trial(spec=SPEC, recipe=recipe(steps=3), data=source, seed=0, checkpoint_dir=tmp_path)
    with pytest.raises(ValueError, match="another trial"):
        train_trial(spec=SPEC, recipe=recipe(steps=3), data=source, seed=1, checkpoint_dir=tmp_path)


def test_load_model_reproduces_the_trained_model(source, tmp_path):
    plan = recipe(steps=6)
    result = train_trial(spec=SPEC, recipe=plan, data=source, seed=2, checkpoint_dir=tmp_path)
    assert {p.name for p in tmp_path.iterdir()} >= {"model.safetensors", "spec.json"}
    model = load_model(tmp_path)
    assert not model.training
    assert evaluate(model, source, plan, seed=2) == (result.val_loss, result.val_accuracy)
    tokens_BT = source.batch(split="val", batch_size=2, generator=torch.Generator().manual_seed(0)).inputs
    assert torch.equal(model(tokens_BT), load_model(tmp_path / "step-000000006")(tokens_BT))
