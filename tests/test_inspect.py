"""Analyses of trained models on tiny models whose answer is known."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from archsearch.arch.model import build_model
from archsearch.arch.spec import ArchSpec, LayerSpec
from archsearch.data import Batch
from archsearch.inspect import (
    block_influence,
    compare_schedules,
    compress_model,
    depth_pruning,
    error_contraction,
    rank_layers,
    remove_layers,
    sparsity_schedule,
    zero_fraction,
)
from archsearch.inspect.early_exit import adapt_cache_holes, exit_curve
from archsearch.inspect.probes import fit_probe, half_lives, ridge, run_probe, states_of
from archsearch.inspect.wanda import compress_layer, input_norms, linears, prune_rows

SPEC = ArchSpec(family="transformer", vocab_size=32, d_model=16, num_heads=2,
                layers=tuple(LayerSpec(mlp_width=32) for _ in range(4)))


class Scale(nn.Module):
    """A layer that multiplies its input by a constant."""

    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return self.factor * x


def batches(count: int = 2, seed: int = 0) -> list[Batch]:
    generator = torch.Generator().manual_seed(seed)
    tokens = [torch.randint(0, 32, (3, 9), generator=generator) for _ in range(count)]
    return [Batch(inputs=t[:, :-1], targets=t[:, 1:]) for t in tokens]


def model_with(**planted: nn.Module) -> nn.Module:
    """The 4-layer stack with some layers swapped for known maps (``layer1=nn.Identity()``)."""
    torch.manual_seed(0)
    model = build_model(SPEC).eval()
    for name, module in planted.items():
        model.layers[int(name.removeprefix("layer"))] = module
    return model


def test_identity_has_rho_one_and_a_half_scale_rho_half():
    """Mutation: rho taken as input error over output error reads 2 for the
    half-scale layer, and this fails."""
    model = model_with(layer1=nn.Identity(), layer2=Scale(0.5))
    profile = error_contraction(model, batches(), mode="noise")
    assert profile.rho[1] == pytest.approx(1.0, abs=1e-6)
    assert profile.rho[2] == pytest.approx(0.5, abs=1e-6)
    assert profile.rho[0] != pytest.approx(1.0, abs=1e-3)  # a real layer moves the error
    # relative to the hidden state, a layer that only scales changes nothing
    assert profile.rho_relative[1] == pytest.approx(1.0, abs=1e-6)
    assert profile.rho_relative[2] == pytest.approx(1.0, abs=1e-6)


def test_predicted_amplification_matches_the_measured_drift_for_linear_layers():
    model = model_with(layer0=Scale(2.0), layer1=Scale(0.5), layer2=nn.Identity(), layer3=Scale(0.25))
    profile = error_contraction(model, batches(), mode="noise")
    assert profile.predicted == pytest.approx([0.25, 0.125, 0.25, 0.25], rel=1e-5)
    assert profile.measured == pytest.approx(profile.predicted, rel=1e-5)


def test_compressed_rho_has_no_value_where_no_error_came_in():
    profile = error_contraction(model_with(layer2=Scale(0.5)), batches(), mode="int8")
    assert math.isnan(profile.rho[0]) and profile.input_error[0] == 0.0
    assert profile.rho[2] == pytest.approx(0.5, abs=1e-6)  # nothing to quantise: the error passes scaled
    assert profile.output_error[0] > 0 and len(profile.measured) == 4
    assert {r["metric"] for r in profile.rows()} >= {"rho", "predicted", "measured"}


def test_identity_has_no_block_influence_and_is_removed_first_by_every_ranking():
    model = model_with(layer1=nn.Identity())
    bi = block_influence(model, batches())
    assert bi[1] == pytest.approx(0.0, abs=1e-6) and min(bi[0], bi[2], bi[3]) > 1e-4
    rho = error_contraction(model, batches(), measure=False).rho
    for by in ("rho", "bi", "blend"):
        assert rank_layers(rho=rho, bi=bi, by=by)[0] == 1


def test_removing_an_identity_layer_leaves_the_output_unchanged():
    model = model_with(layer1=nn.Identity())
    tokens = batches()[0].inputs
    pruned = remove_layers(model, [1])
    assert len(pruned.layers) == 3 and pruned.spec.num_layers == 3
    torch.testing.assert_close(pruned(tokens), model(tokens))
    assert not torch.allclose(remove_layers(model, [2])(tokens), model(tokens))
    assert len(model.layers) == 4  # the original is untouched


def test_depth_pruning_reports_each_ranking_and_refuses_other_structures():
    model = model_with(layer1=nn.Identity())
    rows = depth_pruning(model, batches(), rankings=("rho", "bi"), repeats=1)
    assert [(r["ranking"], r["removed"]) for r in rows] == [("rho", 0), ("rho", 1), ("rho", 2),
                                                            ("bi", 0), ("bi", 1), ("bi", 2)]
    whole, one = rows[0], rows[1]
    assert one["layers"] == [1] and one["perplexity"] == pytest.approx(whole["perplexity"], rel=1e-5)
    assert all(r["tokens_per_s"] > 0 for r in rows)
    looped = build_model(ArchSpec(family="looped", vocab_size=32, d_model=16, num_heads=2, structure="looped",
                                  options={"loops": 2}, layers=(LayerSpec(mlp_width=32),)))
    with pytest.raises(ValueError, match="stack models only; this model is 'looped'"):
        depth_pruning(looped, batches())


def test_wanda_at_half_leaves_exactly_half_of_each_row():
    pruned = compress_model(model_with(), batches(), method="wanda", sparsity=0.5)
    for layer in pruned.layers:
        for linear in linears(layer):
            zeros_per_row = (linear.weight == 0).sum(dim=1)
            assert (zeros_per_row == linear.weight.shape[1] // 2).all()
    assert zero_fraction(pruned) == pytest.approx([0.5] * 4)


def test_wanda_keeps_the_weights_of_loud_inputs():
    """A small weight on a loud input outscores a large weight on a quiet one;
    magnitude pruning drops it. Mutation: Wanda scoring by |W| alone fails."""
    def layer() -> nn.Module:
        module = nn.Sequential(nn.Linear(4, 1, bias=False))
        with torch.no_grad():
            module[0].weight.copy_(torch.tensor([[0.1, 1.0, 0.2, 0.9]]))
        return module

    x_NI = torch.randn(64, 4, generator=torch.Generator().manual_seed(0)) * torch.tensor([100.0, 1.0, 100.0, 1.0])
    wanda_layer, magnitude_layer = layer(), layer()
    compress_layer(wanda_layer, method="wanda", sparsity=0.5, norms=input_norms(wanda_layer, lambda: wanda_layer(x_NI)))
    compress_layer(magnitude_layer, method="magnitude", sparsity=0.5)
    assert (wanda_layer[0].weight[0] != 0).tolist() == [True, False, True, False]
    assert (magnitude_layer[0].weight[0] != 0).tolist() == [False, True, False, True]


def test_wanda_reads_each_layers_inputs_through_the_pruned_layers_before_it():
    """Mutation: reading every layer's input norms from the dense model first fails."""
    model, calib = model_with(), batches()
    pruned = compress_model(model, calib, method="wanda", sparsity=0.5)
    # by hand: layer 0 pruned on the dense inputs, layer 1's norms read after that
    by_hand = model_with()
    for index in (0, 1):
        layer = by_hand.layers[index]
        norms = input_norms(layer, lambda: [by_hand(b.inputs) for b in calib])
        for linear in linears(layer):
            prune_rows(linear.weight.data, linear.weight.data.abs() * norms[linear][None, :], 0.5)
    for ours, theirs in zip(linears(pruned.layers[1]), linears(by_hand.layers[1])):
        assert torch.equal(ours.weight == 0, theirs.weight == 0)


def test_a_depth_schedule_prunes_early_layers_least_at_the_same_total():
    sizes = [100, 300, 300, 100]
    plan = sparsity_schedule("depth", 0.5, sizes, spread=0.5)
    assert plan == sorted(plan) and plan[0] < 0.5 < plan[-1]
    assert sum(s * n for s, n in zip(plan, sizes)) == pytest.approx(0.5 * sum(sizes))
    rows = compare_schedules(model_with(), batches(), sparsity=0.5)
    total = {r["schedule"]: r["value"] for r in rows if r["metric"] == "sparsity" and r["layer"] is None}
    assert total["uniform"] == pytest.approx(0.5) and total["depth"] == pytest.approx(0.5, abs=0.01)
    ppl = {r["schedule"]: r["value"] for r in rows if r["metric"] == "perplexity"}
    assert set(ppl) == {"dense", "uniform", "depth"}


LOOPED = ArchSpec(family="looped", vocab_size=32, d_model=16, num_heads=2, structure="looped",
                  options={"loops": 3, "exit_gate": True, "inject": True}, layers=(LayerSpec(mlp_width=32),))


def looped_with_gate_bias(bias: float) -> nn.Module:
    torch.manual_seed(0)
    model = build_model(LOOPED).eval()
    with torch.no_grad():
        model.exit_gate.weight.zero_()
        model.exit_gate.bias.fill_(bias)
    return model


def test_a_gate_that_always_exits_runs_one_loop_in_three_and_scores_the_first_loop():
    model, calib = looped_with_gate_bias(30.0), batches()
    full, early = exit_curve(model, calib, thresholds=(0.5,))
    assert full["threshold"] is None and full["loop_fraction"] == 1.0
    assert early["loop_fraction"] == pytest.approx(1 / 3)
    # by hand: the logits after the first loop
    with torch.no_grad():
        first = [model.logits(model.loops(model.embed(b.inputs), keep_all=True, exits=False).states[0]) for b in calib]
    by_hand = math.exp(sum(float(nn.functional.cross_entropy(l.flatten(0, 1), b.targets.flatten(), reduction="sum"))
                           for l, b in zip(first, calib)) / sum(b.targets.numel() for b in calib))
    assert early["perplexity"] == pytest.approx(by_hand, rel=1e-5)
    assert model.options.exit_threshold is None  # left as it was


def test_a_gate_that_never_exits_runs_every_loop_at_any_threshold():
    rows = exit_curve(looped_with_gate_bias(-30.0), batches(), thresholds=(0.5, 0.9))
    assert [r["loop_fraction"] for r in rows] == [1.0, 1.0, 1.0]
    assert len({round(r["perplexity"], 6) for r in rows}) == 1


def test_cache_hole_adaptation_trains_a_copy_and_refuses_models_without_a_gate():
    model = looped_with_gate_bias(0.0)
    adapted = adapt_cache_holes(model, batches(count=3, seed=1), cache_hole=1.0, lr=1e-2)
    assert any(not torch.equal(a, b) for a, b in zip(adapted.parameters(), model.parameters()))
    assert adapted.options == model.options and not adapted.training
    with pytest.raises(ValueError, match="exit_gate=true"):
        exit_curve(model_with(), batches())


def test_a_probe_recovers_a_planted_linear_signal():
    generator = torch.Generator().manual_seed(0)
    X_ND = torch.randn(400, 8, generator=generator)
    w_D = torch.randn(8, generator=generator)
    W = ridge(X_ND, (X_ND @ w_D + 3.0)[:, None], lam=1e-8)
    torch.testing.assert_close(W[:-1, 0], w_D.double(), atol=1e-5, rtol=0)
    assert float(W[-1, 0]) == pytest.approx(3.0, abs=1e-5)
    held_out, _ = fit_probe(X_ND, X_ND @ w_D, classes=False)
    noise_only, _ = fit_probe(X_ND, torch.randn(400, generator=generator), classes=False)
    assert held_out > 0.999 and noise_only < 0.1


def test_the_embedding_holds_the_current_token_but_not_the_previous_one():
    """32 classes from 16 features by least squares: not always exact, far above chance (1/32)."""
    model, calib = model_with(), batches(count=8)
    now = run_probe(model, calib, state="hidden:0", target="lag:0")
    before = run_probe(model, calib, state="hidden:0", target="lag:1")
    assert now.score > 0.9 and before.score < 0.2
    position = run_probe(model, calib, state="hidden:4", target="position")
    assert position.tokens == 8 * 3 * 8 and position.width == 16
    with pytest.raises(ValueError, match="hidden:0 .. hidden:4"):
        run_probe(model, calib, state="hidden:5")


def test_half_lives_follow_the_decay_parameters():
    """A GDN head with g = -log 2 / 8 per token halves in 8 tokens."""
    spec = ArchSpec(family="gdn", vocab_size=32, d_model=16, num_heads=2,
                    layers=(LayerSpec(mixer="gated_deltanet", mlp_width=32),))
    torch.manual_seed(0)
    model = build_model(spec).eval()
    mixer = model.layers[0].mixer
    with torch.no_grad():
        mixer.ab_proj.weight.zero_()
        # softplus(dt_bias) = 1, so g = -exp(A_log)
        mixer.dt_bias.fill_(math.log(math.e - 1))
        mixer.A_log.copy_(torch.log(torch.tensor([math.log(2) / 8, math.log(2) / 2])))
    rows = {r["metric"]: r["value"] for r in half_lives(model, batches())}
    assert rows["half_life_head_0"] == pytest.approx(8.0, rel=1e-5)
    assert rows["half_life_head_1"] == pytest.approx(2.0, rel=1e-5)
    assert rows["half_life_max"] == pytest.approx(8.0, rel=1e-5)
    assert half_lives(model_with(), batches()) == []


def test_mamba_half_lives_are_ln2_over_delta_times_a():
    spec = ArchSpec(family="mamba", vocab_size=32, d_model=16, num_heads=2,
                    layers=(LayerSpec(mixer="mamba", mlp="none", mlp_width=0),))
    torch.manual_seed(0)
    model = build_model(spec).eval()
    mixer = model.layers[0].mixer
    with torch.no_grad():
        mixer.dt_proj.weight.zero_()
        mixer.dt_bias.fill_(math.log(math.e - 1))  # delta = softplus(dt_bias) = 1 for every token
        mixer.A_log.fill_(math.log(4.0))
        mixer.A_log[:, 0] = 0.0  # A = 1 in the first state column
    rows = {r["metric"]: r["value"] for r in half_lives(model, batches())}
    assert rows["half_life_max"] == pytest.approx(math.log(2), rel=1e-5)
    assert rows["half_life_min"] == pytest.approx(math.log(2) / 4, rel=1e-5)


def test_rho_and_probes_read_a_memory_model_and_a_gpn_state():
    from tests.zoo.cases_recurrent import gpn
    from tests.zoo.cases_structures import memory

    torch.manual_seed(0)
    calib = batches()
    with_memory = build_model(memory(vocab=32, placement=1, slots=3, segment=4)).eval()
    profile = error_contraction(with_memory, calib, measure=False)
    assert len(profile.rho) == 3 and all(math.isfinite(r) and r > 0 for r in profile.rho)
    slots = states_of(with_memory, calib[0].inputs, "memory")  # 3 slots of 16, segments of 4 tokens
    assert slots.shape == (3, 8, 48)
    assert torch.equal(slots[:, 0], slots[:, 3]) and not torch.equal(slots[:, 3], slots[:, 4])
    assert run_probe(with_memory, calib, state="memory", target="position").width == 48
    state = run_probe(build_model(gpn(vocab=32, layers=1)).eval(), calib, state="gpn", target="position")
    assert state.width == 40 and state.tokens == 2 * 3 * 8
    with pytest.raises(ValueError, match="needs a GPN model"):
        run_probe(model_with(), calib, state="gpn")
    with pytest.raises(ValueError, match="this model is 'gpn'"):
        error_contraction(build_model(gpn(vocab=32, layers=1)), calib)


def _wanda_layer_by_layer(model: nn.Module, calib: list[Batch], sparsity: float) -> nn.Module:
    """Wanda as the one-forward compress_model must reproduce: for each layer in
    order, a whole forward per calibration batch through the pruned layers before
    it reads the layer's norms, then the layer is pruned."""
    import copy

    pruned = copy.deepcopy(model).eval()
    for layer in pruned.layers:
        norms = input_norms(layer, lambda: [pruned(b.inputs) for b in calib])
        compress_layer(layer, method="wanda", sparsity=sparsity, norms=norms)
    return pruned


@pytest.mark.parametrize("family,structure,options,mixer", [
    ("transformer", "stack", {}, "attention"),
    ("gdn", "stack", {}, "gated_deltanet"),
    ("mamba", "stack", {}, "mamba"),
    ("memory", "memory", {"placement": 1, "slots": 2, "segment": 4}, "attention"),
], ids=["transformer", "gdn", "mamba", "memory"])
def test_one_forward_wanda_equals_a_forward_per_layer(family, structure, options, mixer):
    """Every pruned weight is bit for bit what a forward per layer gives (the
    memory sits between layers 1 and 2). Mutation: handing the next layer the
    dense output (``return out`` in the hook) changes layers 1 to 3."""
    spec = ArchSpec(family=family, vocab_size=32, d_model=16, num_heads=2, structure=structure, options=options,
                    layers=tuple(LayerSpec(mixer=mixer, mlp_width=32) for _ in range(4)))
    torch.manual_seed(0)
    model = build_model(spec).eval()
    calib = batches(count=3, seed=1)
    ours, reference = compress_model(model, calib, sparsity=0.5), _wanda_layer_by_layer(model, calib, 0.5)
    for (name, a), b in zip(ours.named_parameters(), reference.parameters()):
        assert torch.equal(a, b), f"{name} differs"
    assert zero_fraction(ours) == pytest.approx([0.5] * 4, abs=0.02)
    with pytest.raises(ValueError, match="share one sequence length"):
        compress_model(model, [calib[0], Batch(inputs=calib[1].inputs[:, :4], targets=calib[1].targets[:, :4])])
