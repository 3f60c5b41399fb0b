"""Mamba-2 (SSD) and mixer-only Mamba stacks: the block computes the paper's layer and spaces
reach it (family mamba2, the S letter, mlp: none). Its fast path against its reference and
its skipped tokens are tested with the other mixers' in tests/test_mixers.py.

Dimensions: B batch, T time, D model width, E inner width, H heads, P head dim, G groups,
N state size.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F
from archsearch_kernels.ssd import ssd_naive

import archsearch as A
from archsearch.arch.blocks import mamba2
from archsearch.arch.model import build_model
from archsearch.arch.spec import ArchSpec, LayerSpec
from archsearch.budget import count_params
from archsearch.errors import SpecError
from tests.kernels.conftest import assert_close

ATOL = 1e-4
SEQ_LEN = 37  # three chunks of 16, the last one short


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def block(*, d_model: int = 24, **options) -> mamba2.Mamba2:
    options = {"d_state": 5, "head_dim": 8, "chunk_size": 16, **options}
    layer = LayerSpec(mixer="mamba2", mlp="none", options=options)
    spec = ArchSpec(family="mamba2", vocab_size=16, d_model=d_model, num_heads=1, layers=(layer,))
    return mamba2.Mamba2(spec=spec, layer=layer)


def test_block_computes_the_papers_layer_gate_before_norm():
    """in_proj -> (z, xBC, dt); silu(causal conv(xBC)) -> x, B, C; dt = softplus(dt + bias);
    SSD; RMSNorm over each group of y * silu(z) (mamba2.py's norm_before_gate=False); out_proj.
    Written here from the equations; normalising before the gate fails it."""
    module = block(n_groups=2, d_state=4)
    s = module.sizes
    x_BTD = torch.randn(2, SEQ_LEN, 24)
    z, xBC, dt = module.in_proj(x_BTD).split([s.inner, s.conv_channels, s.heads], dim=-1)
    conv = F.conv1d(xBC.transpose(1, 2), module.conv.weight, module.conv.bias, padding=s.conv - 1,
                    groups=s.conv_channels)[..., :SEQ_LEN]
    x, B, C = F.silu(conv.transpose(1, 2)).split([s.inner, s.groups * s.state, s.groups * s.state], dim=-1)
    y = ssd_naive(x.unflatten(-1, (s.heads, s.head_dim)), F.softplus(dt + module.dt_bias), -module.A_log.exp(),
                  B.unflatten(-1, (s.groups, s.state)), C.unflatten(-1, (s.groups, s.state)), module.D).flatten(-2)
    gated = (y * F.silu(z)).unflatten(-1, (s.groups, -1))
    normed = gated * torch.rsqrt(gated.square().mean(-1, keepdim=True) + module.norm_eps)
    expected = module.out_proj(normed.flatten(-2) * module.norm_weight)
    with torch.no_grad():
        assert_close("y", expected, module(x_BTD), 1e-5)


def test_init_survives_the_model_and_marks_its_no_decay_parameters():
    """After the model's init pass: A in [-16, -1] per head, softplus(dt_bias) in [1e-3, 1e-1], D = 1."""
    spec = ArchSpec(family="mamba2", vocab_size=16, d_model=64, num_heads=4,
                    layers=(LayerSpec(mixer="mamba2", mlp="none", options={"head_dim": 16, "d_state": 8}),))
    layer = build_model(spec).layers[0].mixer
    A_H, dt_H = -layer.A_log.exp(), F.softplus(layer.dt_bias)
    assert A_H.shape == (8,) and (A_H >= -16).all() and (A_H <= -1).all()
    assert dt_H.min() >= 1e-3 * (1 - 1e-5) and dt_H.max() <= 1e-1 * (1 + 1e-5)
    assert (layer.D == 1).all()
    assert all(getattr(p, "_no_weight_decay", False) for p in (layer.A_log, layer.D, layer.dt_bias))


@pytest.mark.parametrize("d_model, expand, head_dim, inner", [(64, 2, 64, 128), (24, 3, 16, 64), (40, 2, 64, 64),
                                                               (8, 2, 64, 64)])
def test_inner_width_is_the_multiple_of_the_head_dim_nearest_expand_d(d_model, expand, head_dim, inner):
    s = block(d_model=d_model, expand=expand, head_dim=head_dim).sizes
    assert (s.inner, s.heads) == (inner, inner // head_dim)


def test_heads_that_do_not_split_over_groups_are_refused():
    with pytest.raises(ValueError, match="3 heads do not split evenly over n_groups=2"):
        block(head_dim=16, n_groups=2)  # E = 48: 3 heads


# ---- spaces reach Mamba-2 and mixer-only stacks


def plan(tmp_path, axes: str, *, target: float = 3e5, head_dim: int = 4) -> list:
    (tmp_path / "space.yaml").write_text(f"name: s\naxes:\n{textwrap.indent(textwrap.dedent(axes), '  ')}"
                                         f"model: {{head_dim: {head_dim}}}\n")
    (tmp_path / "study.yaml").write_text(textwrap.dedent(f"""\
        name: s
        space: space.yaml
        budget: {{targets: [{target}], tolerance: 0.03}}
        data: {{kind: mqar, vocab_size: 64, seq_len: 32, num_pairs: 4}}
        """))
    return A.plan(A.load_study(tmp_path / "study.yaml"))


def test_mamba2_family_plans_mamba2_layers_with_the_space_options(tmp_path):
    trials = plan(tmp_path, """\
        family: mamba2
        num_layers: 3
        mamba2: {d_state: [8, 16], head_dim: 16, expand: 1.5, chunk_size: 32}
        """)
    assert sorted(t.spec.layers[0].options["d_state"] for t in trials) == [8, 16]
    for trial in trials:
        assert {layer.mixer for layer in trial.spec.layers} == {"mamba2"}
        assert trial.spec.layers[0].options == {"d_state": trial.axes["mamba2.d_state"], "head_dim": 16,
                                                "expand": 1.5, "chunk_size": 32}
        assert abs(trial.match_error) <= 0.03
        assert sum(p.numel() for p in build_model(trial.spec).parameters()) == count_params(trial.spec,
                                                                                             embeddings=True)


@pytest.mark.parametrize("hybrid, mixers", [
    ("{pattern: SA}", ("mamba2", "attention", "mamba2", "attention")),
    ('{mixer: mamba2, ratio: "3:1"}', ("mamba2", "mamba2", "mamba2", "attention")),
])
def test_letter_S_and_hybrid_mixer_mamba2_build_mamba2_layers(tmp_path, hybrid, mixers):
    trials = plan(tmp_path, f"family: hybrid\nnum_layers: 4\nhybrid: {hybrid}\n")
    assert [tuple(layer.mixer for layer in t.spec.layers) for t in trials] == [mixers]


def test_points_without_a_mamba2_layer_do_not_multiply_over_its_axes(tmp_path):
    trials = plan(tmp_path, """\
        family: hybrid
        num_layers: 4
        hybrid: {pattern: MA}
        mamba2: {d_state: [8, 16]}
        """)
    assert len(trials) == 1 and not any(k.startswith("mamba2.") for k in trials[0].axes)


@pytest.mark.parametrize("family", ["mamba", "mamba2"])
def test_mlp_none_builds_mixer_only_layers_and_has_nothing_to_taper(tmp_path, family):
    """The Mamba papers' stacks: one norm and one mixer per layer, no MLP; taper shapes collapse."""
    trials = plan(tmp_path, f"""\
        family: {family}
        num_layers: 3
        mlp: none
        taper: {{shape: [uniform, cosine]}}
        mamba2: {{d_state: 8, head_dim: 8}}
        """)
    assert len(trials) == 1
    spec = trials[0].spec
    assert all(layer.mlp == "none" and layer.mlp_width == 0 for layer in spec.layers)
    model = build_model(spec)
    assert not any("mlp" in name for name, _ in model.named_parameters())
    assert sum(p.numel() for p in model.parameters()) == count_params(spec, embeddings=True)
    assert abs(trials[0].match_error) <= 0.03


@pytest.mark.parametrize("axes, field", [
    ("family: hybrid\nnum_layers: 2\nhybrid: {pattern: SX}\n", "axes.hybrid.pattern"),
    ("family: mamba2\nnum_layers: 2\nmamba2: {state: 8}\n", "axes.mamba2.state"),
    ("family: mamba\nnum_layers: 2\nmlp: gelu\n", "axes.mlp"),
])
def test_bad_mamba2_settings_are_refused_naming_the_field(tmp_path, axes, field):
    with pytest.raises(SpecError) as err:
        plan(tmp_path, axes)
    assert field in str(err.value)
