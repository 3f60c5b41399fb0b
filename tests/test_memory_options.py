"""Persistent memory: the paper's defaults, its ablation options and the state
carried across batches (papers.md section 2).

Planted mutations each test catches: placement default back to 0 (the
placement tests); ``memory_dim`` default back to d_model (overhead 8.8%);
``aux_loss`` left out of ``training_loss`` or its target not detached; the
random control fitted to the next state; ``hidden`` not storing or not
reading the carried state, or storing it undetached; ``stream_batch`` drawing
random windows.
"""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
import torch.nn.functional as F

import archsearch as A
from archsearch.arch.model import build_model
from archsearch.arch.spec import ArchSpec, LayerSpec
from archsearch.arch.structures.memory import memory_options, overhead
from archsearch.data.text import TokenCorpus
from tests.zoo.cases_structures import memory


def _memory_study(tmp_path, corpus, *, memory_axes: str = "", extra: str = "") -> object:
    (tmp_path / "space.yaml").write_text(textwrap.dedent(f"""\
        name: mem
        axes:
          family: memory
          num_layers: 6
          {memory_axes}
        model:
          head_dim: 8
        """))
    path = tmp_path / "study.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: mem
        space: space.yaml
        budget: {{targets: [60000], tolerance: 0.05}}
        data: {{kind: text, paths: [{corpus}], seq_len: 16}}
        recipe: {{steps: 4, batch_size: 2, warmup_steps: 1, eval_every: 2, eval_batches: 2}}
        {extra}
        """))
    return path


def _paper_shape(**options) -> ArchSpec:
    """6 layers, d 512, GPT-2's vocabulary, tied, SwiGLU at 8/3 d (the planner's default MLP)."""
    return ArchSpec(family="memory", vocab_size=50257, d_model=512, num_heads=8,
                    layers=tuple(LayerSpec(mlp_width=1368) for _ in range(6)), structure="memory",
                    options=options)


# -- defaults -----------------------------------------------------------------------------------------


def test_a_planned_memory_sits_between_the_halves(tmp_path, corpus):
    (trial,) = A.plan(A.load_study(_memory_study(tmp_path, corpus)))
    placement = memory_options(trial.spec).placement
    below, above = placement + 1, trial.spec.num_layers - placement - 1
    assert (below, above) == (3, 3)


@pytest.mark.parametrize("num_layers, placement", [(1, 0), (2, 0), (6, 2), (7, 2), (8, 3)])
def test_a_spec_without_a_placement_sits_between_the_halves(num_layers, placement):
    """The structure's own default, at depths where it is not 0 (every spec the other tests
    build without a placement has 3 layers, where the default is 0 too)."""
    spec = memory(widths=(40,) * num_layers, slots=2, segment=4)
    assert "placement" not in spec.options
    assert memory_options(spec).placement == placement
    assert build_model(spec).placement == placement


def test_the_planner_writes_the_structures_default(tmp_path, corpus):
    """A planned trial writes its placement out (it is part of the id), and it is the one the
    structure would pick on its own."""
    (trial,) = A.plan(A.load_study(_memory_study(tmp_path, corpus)))
    unwritten = dict(trial.spec.options)
    del unwritten["placement"]
    from dataclasses import replace

    assert trial.spec.options["placement"] == memory_options(replace(trial.spec, options=unwritten)).placement == 2


def test_a_written_placement_still_wins(tmp_path, corpus):
    (trial,) = A.plan(A.load_study(_memory_study(tmp_path, corpus, memory_axes="memory: {placement: 0}")))
    assert memory_options(trial.spec).placement == 0


def test_default_width_lands_near_the_papers_overhead():
    spec = _paper_shape()
    assert overhead(spec) == pytest.approx(0.037, abs=0.001)
    # a slot width of d_model, the old default, is more than twice that
    assert overhead(_paper_shape(memory_dim=512)) == pytest.approx(0.088, abs=0.001)


def test_overhead_is_the_built_memory_over_the_rest():
    spec = memory(d_model=32, slots=3, segment=5, aux="self")
    model = build_model(spec)
    in_memory = sum(p.numel() for p in model.memory.parameters())
    assert overhead(spec) == pytest.approx(in_memory / (sum(p.numel() for p in model.parameters()) - in_memory))


def test_plan_shows_the_overhead(tmp_path, corpus):
    from typer.testing import CliRunner

    from archsearch.cli import app

    path = _memory_study(tmp_path, corpus)
    (row,) = json.loads(CliRunner().invoke(app, ["plan", str(path), "--json"]).stdout)
    spec = A.plan(A.load_study(path))[0].spec
    assert row["memory_overhead"] == pytest.approx(overhead(spec))
    table = CliRunner().invoke(app, ["plan", str(path)]).stdout
    assert f"{row['trial_id']} +{overhead(spec):.2%}" in table


# -- auxiliary losses ---------------------------------------------------------------------------------


def _aux_model(aux: str, weight: float = 0.5):
    torch.manual_seed(0)
    model = build_model(memory(d_model=32, slots=3, segment=5, aux=aux, aux_weight=weight)).train()
    tokens = torch.randint(0, 64, (2, 21))
    return model, tokens[:, :-1], tokens[:, 1:]


def test_self_prediction_adds_to_the_loss_and_trains_the_memory():
    model, inputs, targets = _aux_model("self")
    h, states = model.hidden(model.embed(inputs))
    ce = F.cross_entropy((model.norm(h) @ model.embed.weight.T).flatten(0, 1), targets.flatten())
    aux = F.mse_loss(model.memory.aux_head(states[:, :-1]), states[:, 1:].detach())
    loss = model.training_loss(inputs, targets)
    assert aux > 0 and loss.item() == pytest.approx((ce + 0.5 * aux).item(), rel=1e-5)
    loss.backward()
    assert model.memory.aux_head.weight.grad.abs().sum() > 0
    # the same model with the aux term weighted 0: the memory's gradient changes
    unweighted, _, _ = _aux_model("self", weight=0.0)
    unweighted.training_loss(inputs, targets).backward()
    assert not torch.allclose(model.memory.gru.hidden.weight.grad, unweighted.memory.gru.hidden.weight.grad)


def test_random_control_fits_noise_not_the_next_state():
    model, inputs, targets = _aux_model("random")
    h, states = model.hidden(model.embed(inputs))
    torch.manual_seed(1)
    first = model.memory.aux_loss(states)
    torch.manual_seed(2)
    second = model.memory.aux_loss(states)
    next_state = F.mse_loss(model.memory.aux_head(states[:, :-1]), states[:, 1:])
    # fresh noise every call, and not the self-prediction target
    assert first != second and abs(first - next_state) > 0.1
    first.backward()
    assert model.memory.aux_head.weight.grad.abs().sum() > 0


def test_aux_head_is_counted_and_only_with_aux():
    plain, aux = memory(d_model=32), memory(d_model=32, aux="self")
    s = memory_options(plain).memory_dim
    assert A.count_params(aux) - A.count_params(plain) == s * s + s
    # the head runs in training only: 2 M S^2 for each of the 3 state pairs of 4 segments
    assert A.flops_per_token(aux, seq_len=256, kind="forward") == A.flops_per_token(plain, seq_len=256,
                                                                                     kind="forward")
    extra = A.flops_per_token(aux, seq_len=256) - A.flops_per_token(plain, seq_len=256)
    assert extra == pytest.approx(3 * 3 * 2 * 4 * s * s / 256)


# -- state carried across batches ---------------------------------------------------------------------


def test_carried_state_continues_from_the_previous_batch():
    torch.manual_seed(0)
    model = build_model(memory(d_model=32, slots=3, segment=5, carry=True)).eval()
    first, second = torch.randint(0, 64, (2, 10)), torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        fresh = model(second)
        assert torch.equal(model(second), fresh), "outside carrying() a forward is pure"
        whole_states = model.hidden(model.embed(first))[1]
        with model.carrying():
            model(first)
            carried = model._carried[0]
            continued = model(second)
            again = model(second)
    # the state handed over is the one after every segment of the first batch, detached
    assert torch.allclose(carried, whole_states[:, -1]) and not carried.requires_grad
    assert not torch.allclose(continued, fresh) and not torch.allclose(again, continued)
    with torch.no_grad():
        assert torch.equal(model(second), fresh), "the context restores the pure forward"


def test_carried_state_keeps_no_graph_across_batches():
    torch.manual_seed(0)
    model = build_model(memory(d_model=32, slots=3, segment=5, carry=True)).train()
    tokens = torch.randint(0, 64, (2, 11))
    with model.carrying():
        model.training_loss(tokens[:, :-1], tokens[:, 1:]).backward()
        # a second backward through the first batch's graph would raise
        model.training_loss(tokens[:, :-1], tokens[:, 1:]).backward()


def test_stream_batches_continue_each_row():
    tokens = torch.arange(1000)
    corpus = TokenCorpus(splits={"train": tokens, "val": tokens}, seq_len=16, vocab_size=1000)
    batches = [corpus.stream_batch(split="train", batch_size=3, step=s) for s in range(4)]
    for row in range(3):
        joined = torch.cat([b.inputs[row] for b in batches])
        assert torch.equal(joined, joined[0] + torch.arange(64)), f"row {row} is not one stream"
        assert torch.equal(batches[0].targets[row], batches[0].inputs[row] + 1)
    # rows read different parts of the split
    assert len({int(b) for b in batches[0].inputs[:, 0]}) == 3


def test_training_with_carry_reads_streams(corpus, monkeypatch):
    from archsearch.data.text import ByteCorpus
    from archsearch.train import train_trial
    from tests.zoo.test_contract import _recipe

    source = ByteCorpus(paths=[str(corpus)], seq_len=16)
    steps = []
    original = source.stream_batch

    def spy(*, split, batch_size, step):
        steps.append((split, step))
        return original(split=split, batch_size=batch_size, step=step)

    monkeypatch.setattr(source, "stream_batch", spy)
    monkeypatch.setattr(source, "batch", lambda **kw: pytest.fail("carry must not draw random windows"))
    spec = memory(d_model=32, slots=2, segment=8, carry=True, vocab=256)
    result = train_trial(spec=spec, recipe=_recipe(steps=4, batch_size=2, eval_every=2, eval_batches=2,
                                                   warmup_steps=1), data=source, seed=0, threads=1)
    assert [s for split, s in steps if split == "train"] == [0, 1, 2, 3]
    assert [s for split, s in steps if split == "val"] == [0, 1, 0, 1]
    assert result.val_loss < 6.0


def test_carry_refuses_sources_without_streams():
    from archsearch.data.synthetic import MQAR
    from archsearch.train import train_trial
    from tests.zoo.test_contract import _recipe

    with pytest.raises(ValueError, match="text data"):
        train_trial(spec=memory(d_model=32, carry=True), recipe=_recipe(steps=1), data=MQAR(vocab_size=64, seq_len=32, num_pairs=4),
                    seed=0, threads=1)


RECIPE = "recipe: {steps: 4, batch_size: 2, warmup_steps: 1, eval_every: 2, eval_batches: 2}"


@pytest.mark.parametrize("field, old, new", [
    ("data.kind", "data: {kind: text, paths: [CORPUS], seq_len: 16}", "data: {kind: mqar, seq_len: 32}"),
    ("recipe.grad_accum", RECIPE, "recipe: {steps: 4, batch_size: 4, grad_accum: 2}"),
], ids=["not-text", "grad-accum"])
def test_plan_refuses_carry_it_cannot_stream(tmp_path, corpus, field, old, new):
    path = _memory_study(tmp_path, corpus, memory_axes="memory: {carry: true}")
    text = path.read_text()
    assert old.replace("CORPUS", str(corpus)) in text
    path.write_text(text.replace(old.replace("CORPUS", str(corpus)), new))
    with pytest.raises(A.SpecError, match=field.replace(".", r"\.")) as err:
        A.plan(A.load_study(path))
    assert "study.yaml:" in str(err.value)
