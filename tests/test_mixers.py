"""Mixer behaviour beyond the zoo contract: fast paths equal the references, gates sit where
the paper puts them, Mamba's and Mamba-2's skipped tokens are absent, Gated DeltaNet's decay is a decay.

Dimensions: B batch, T time, D model width, H heads, K head dim, E Mamba inner width, N state size.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from archsearch_kernels.rope import apply_rope, rope_tables

from archsearch.arch.blocks import mixer
from archsearch.arch.blocks.attention import attention_reference
from archsearch.arch.model import build_model
from archsearch.arch.spec import ArchSpec, LayerSpec

ATOL = 1e-4
# longer than one 64-step chunk of either kernel, and not a multiple of it
SEQ_LEN = 80


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def assert_close(name: str, ref: torch.Tensor, out: torch.Tensor, atol: float = ATOL) -> None:
    """max|ref - out| <= atol * max(1, max|ref|): absolute near 1, relative for large gradients."""
    assert ref.shape == out.shape, f"{name}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    assert torch.isfinite(out).all(), f"{name}: NaN or inf"
    diff = (ref.double() - out.double()).abs().max().item()
    scale = max(1.0, ref.double().abs().max().item())
    assert diff <= atol * scale, f"{name}: max abs diff {diff:.3e} > {atol:.1e} * {scale:.3g}"


def spec_with(mixer_name: str, *, d_model: int = 24, head_dim: int = 8, **options) -> tuple[ArchSpec, LayerSpec]:
    layer = LayerSpec(mixer=mixer_name, mlp_width=32, options=options)
    spec = ArchSpec(family=mixer_name, vocab_size=16, d_model=d_model, num_heads=d_model // head_dim, layers=(layer,))
    return spec, layer


def build(mixer_name: str, **options) -> torch.nn.Module:
    spec, layer = spec_with(mixer_name, **options)
    return mixer(mixer_name).module(spec=spec, layer=layer)


FAST_AND_REFERENCE = [
    pytest.param("mamba", {"d_state": 6, "expand": 3}, id="mamba-N6-expand3"),
    pytest.param("gated_deltanet", {"num_heads": 2, "head_k_dim": 6, "head_v_dim": 10}, id="gdn-k6-v10"),
    # E = 128: two heads of 64, one per group; chunks of 16 cross chunk boundaries
    pytest.param("mamba2", {"d_state": 6, "expand": 4, "n_groups": 2, "chunk_size": 16}, id="mamba2-H2-G2-N6"),
]


@pytest.mark.parametrize("name, options", FAST_AND_REFERENCE)
def test_chunked_mixer_matches_naive_forward_and_every_gradient(name, options):
    fast = build(name, **options)
    reference = build(name, scan="naive", **options)
    reference.load_state_dict(fast.state_dict())
    x_BTD = torch.randn(2, SEQ_LEN, 24)
    grad_out_BTD = torch.randn(2, SEQ_LEN, 24)
    outputs, grads = [], []
    for module in (reference, fast):
        x = x_BTD.clone().requires_grad_()
        y = module(x)
        leaves = [x, *module.parameters()]
        outputs.append(y)
        grads.append(torch.autograd.grad((y * grad_out_BTD).sum(), leaves))
    assert_close("y", *outputs)
    names = ["x"] + [n for n, _ in fast.named_parameters()]
    for leaf, grad_ref, grad_fast in zip(names, *grads):
        assert_close(f"grad {leaf}", grad_ref, grad_fast)


@pytest.mark.parametrize("gate, extra", [("elementwise", 48 * 3 * 16), ("headwise", 48 * 3)])
def test_gate_adds_the_parameters_of_papers_section_7(gate, extra):
    """Over plain attention (d 48, H 3, dh 16): elementwise adds d*H*dh (= d^2), headwise d*H."""
    plain = sum(p.numel() for p in build("attention", d_model=48, head_dim=16).parameters())
    gated = sum(p.numel() for p in build("gated_attention", d_model=48, head_dim=16, gate=gate).parameters())
    assert gated - plain == extra


def test_attention_is_rope_then_causal_softmax_attention_written_out():
    """The fast path (q and k rotated together before the permute to heads, SDPA) against the
    spec spelled out: heads split first, each of q and k rotated, the masked softmax. Fails if
    k is left unrotated, the rotation's halves are swapped, or the mask is dropped."""
    module = build("attention")
    H, K = module.num_heads, module.head_dim
    x_BTD = torch.randn(2, 11, 24)
    B, T, D = x_BTD.shape
    q, k, v = module.wqkv(x_BTD).view(B, T, 3, H, K).permute(2, 0, 3, 1, 4).unbind(0)
    cos, sin = rope_tables(T, K, module.theta, x_BTD.device)
    y_BHTK = attention_reference(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
    assert_close("y", module.wo(y_BHTK.transpose(1, 2).reshape(B, T, D)), module(x_BTD), atol=1e-5)


@pytest.mark.parametrize("gate", ["elementwise", "headwise"])
def test_gate_scales_each_heads_sdpa_output_before_the_output_projection(gate):
    """y = W_o flatten(SDPA(q, k, v) * sigmoid(gate)), gate [B, T, H, K] or [B, T, H, 1] from the input."""
    module = build("gated_attention", gate=gate)
    H, K = module.num_heads, module.head_dim
    x_BTD = torch.randn(2, 11, 24)
    B, T, D = x_BTD.shape
    qkv_BTX, gate_BTX = module.wqkvg(x_BTD).split([3 * D, H * module.gate_width], dim=-1)
    q, k, v = qkv_BTX.view(B, T, 3, H, K).permute(2, 0, 3, 1, 4).unbind(0)
    cos, sin = rope_tables(T, K, module.theta, x_BTD.device)
    y_BHTK = attention_reference(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
    gate_BHTG = gate_BTX.view(B, T, H, -1).transpose(1, 2)
    assert gate_BHTG.shape[-1] == (K if gate == "elementwise" else 1)
    expected = module.wo((y_BHTK * torch.sigmoid(gate_BHTG)).transpose(1, 2).reshape(B, T, D))
    assert_close("y", expected, module(x_BTD), atol=1e-5)


def test_unknown_gate_is_refused():
    with pytest.raises(ValueError, match="elementwise"):
        build("gated_attention", gate="channelwise")


@pytest.mark.parametrize("name", ["mamba", "mamba2"])
@pytest.mark.parametrize("scan", ["chunked", "naive"])
def test_skipped_tokens_are_absent_from_state_and_later_outputs(scan, name):
    """With skip_BT, the last SSM state and every kept token's output equal those of the
    sequence with the skipped tokens removed (conv window included); skipped outputs are 0."""
    module = build(name, scan=scan, d_state=5, **({"chunk_size": 16} if name == "mamba2" else {}))
    x_BTD = torch.randn(3, SEQ_LEN, 24)
    skip_BT = torch.rand(3, SEQ_LEN) < 0.3
    skip_BT[0, -4:] = True  # a run of skipped tokens at the end: the state must still be the kept one
    skip_BT[1, :3] = True  # and at the start
    with torch.no_grad():
        y_BTD, state_BEN = module(x_BTD, skip_BT=skip_BT, return_last_state=True)
        for b in range(3):
            kept = ~skip_BT[b]
            y_kept, state_kept = module(x_BTD[b:b + 1, kept], return_last_state=True)
            assert_close(f"state of row {b}", state_kept[0], state_BEN[b], atol=1e-5)
            assert_close(f"kept outputs of row {b}", y_kept[0], y_BTD[b, kept], atol=1e-5)
    assert (y_BTD[skip_BT] == 0).all()


def test_skip_mask_of_all_false_changes_nothing():
    module = build("mamba")
    x_BTD = torch.randn(2, 17, 24)
    with torch.no_grad():
        assert_close("y", module(x_BTD), module(x_BTD, skip_BT=torch.zeros(2, 17, dtype=torch.bool)), atol=1e-6)


def test_skipped_tokens_get_no_gradient():
    """An exited token must not be trained through the layer it skipped."""
    module = build("mamba")
    x_BTD = torch.randn(2, 17, 24, requires_grad=True)
    skip_BT = torch.zeros(2, 17, dtype=torch.bool)
    skip_BT[:, 5] = True
    module(x_BTD, skip_BT=skip_BT).sum().backward()
    assert (x_BTD.grad[:, 5] == 0).all() and (x_BTD.grad[:, 4] != 0).any()


def test_mamba_init_survives_the_stack_and_marks_its_no_decay_parameters():
    """After the model's own init: softplus(dt_bias) in [1e-3, 1e-1], A[e, n] = -(n + 1), D = 1."""
    spec = ArchSpec(family="mamba", vocab_size=16, d_model=32, num_heads=4,
                    layers=(LayerSpec(mixer="mamba", mlp_width=32, options={"d_state": 7}),))
    layer = build_model(spec).layers[0].mixer
    dt_E = F.softplus(layer.dt_bias)
    assert dt_E.min() >= 1e-3 * (1 - 1e-5) and dt_E.max() <= 1e-1 * (1 + 1e-5)
    assert torch.allclose(-layer.A_log.exp(), -torch.arange(1, 8.0).expand(64, 7))
    assert (layer.D == 1).all()
    assert all(getattr(p, "_no_weight_decay", False) for p in (layer.A_log, layer.D, layer.dt_bias))


def test_gdn_decay_is_in_0_1_and_write_strength_in_0_1():
    """alpha = exp(g) in (0, 1] and beta in (0, 1) for inputs at the scale the pre-norm gives."""
    module = build("gated_deltanet")
    g_BTH, beta_BTH = module.gates(F.rms_norm(torch.randn(4, 33, 24), (24,)))
    alpha_BTH = g_BTH.exp()
    assert (alpha_BTH > 0).all() and (alpha_BTH <= 1).all()
    assert (beta_BTH > 0).all() and (beta_BTH < 1).all()
    assert all(getattr(p, "_no_weight_decay", False) for p in (module.A_log, module.dt_bias))


def test_gdn_strong_decay_stays_finite():
    """Far above the normed scale exp(g) underflows to 0 in fp32 (a full forget); the rule
    works on g itself, so the output and every gradient stay finite."""
    module = build("gated_deltanet")
    x_BTD = (30 * F.rms_norm(torch.randn(2, SEQ_LEN, 24), (24,))).requires_grad_()
    g_BTH, _ = module.gates(x_BTD)
    assert torch.isfinite(g_BTH).all() and (g_BTH <= 0).all() and (g_BTH.exp() == 0).any()
    y_BTD = module(x_BTD)
    y_BTD.square().sum().backward()
    assert torch.isfinite(y_BTD).all() and torch.isfinite(x_BTD.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in module.parameters())


def test_mamba_keeps_its_dt_projection_init_inside_a_model():
    from archsearch.arch.model import build_model
    from archsearch.arch.spec import ArchSpec, LayerSpec

    spec = ArchSpec(family="mamba", vocab_size=32, d_model=64, num_heads=4,
                    layers=(LayerSpec(mixer="mamba", mlp="swiglu", mlp_width=64),))
    weight = build_model(spec).layers[0].mixer.dt_proj.weight
    bound = 4**-0.5  # dt_rank = ceil(64 / 16) = 4
    assert weight.abs().max() <= bound and weight.std() > 0.1  # uniform(+-0.5), not N(0, 0.02)
