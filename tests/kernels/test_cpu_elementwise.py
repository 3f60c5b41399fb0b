"""The elementwise C++ CPU kernels (RMSNorm, SwiGLU, the rotary q, k, v heads, the short causal
conv, the step sizes' softplus): equal to their references, forward and every gradient, over explicit shapes; taken by
dispatch on float32 CPU tensors, the PyTorch path elsewhere; not used when they fail to build
or to agree.

The first run on a machine compiles them (about 20 s; cached after that, per machine).
Dimensions: B batch, T time, H heads, K head dim, R rows, D width, F MLP width, C channels,
W conv width.
"""

from __future__ import annotations

import shutil
import warnings

import pytest
import torch
import torch.nn.functional as F
from archsearch_kernels import cpu_build, dispatch
from archsearch_kernels.causal_conv import causal_conv1d_cpu, causal_conv1d_naive
from archsearch_kernels.rmsnorm import cpu as rms_cpu
from archsearch_kernels.rmsnorm import rms_norm_naive
from archsearch_kernels.rope import cpu as rope_cpu
from archsearch_kernels.rope import rope_heads_naive, rope_tables
from archsearch_kernels.softplus import softplus_cpu, softplus_naive
from archsearch_kernels.swiglu import cpu as swiglu_cpu
from archsearch_kernels.swiglu import swiglu_naive
from archsearch_kernels.swiglu.layout import halves_of

from archsearch.arch.model import build_model
from archsearch.arch.spec import ArchSpec, LayerSpec
from archsearch.data import Batch
from archsearch.train.loop import training_loss
from tests.kernels.conftest import assert_close, poison_empty

ATOL = 1e-5


@pytest.fixture(scope="module", autouse=True)
def built():
    """The kernels, built (or loaded from the cache) once; a failure, not a skip, when a
    compiler exists and a build or a self-check fails."""
    for op in ("rms_norm", "swiglu", "rope_heads", "causal_conv1d", "softplus"):
        if not cpu_build.ELEMENTWISE.available(op):
            if shutil.which("c++") or shutil.which("g++"):
                pytest.fail(f"the C++ {op} did not build although a compiler exists: "
                            f"{cpu_build.ELEMENTWISE.build_error(op)}")
            pytest.skip("no C++ compiler on this machine")


@pytest.fixture(autouse=True)
def clean_setting(monkeypatch):
    """The default setting, and every output buffer the kernels are given starts as NaN (the
    Python side allocates them), so an element the C++ loops skip fails the comparison."""
    monkeypatch.delenv(dispatch.MODE_VAR, raising=False)
    monkeypatch.setenv(dispatch.DISABLE_VAR, "")
    poison_empty(monkeypatch)


def outputs_and_grads(fn, inputs: list[torch.Tensor], cotangent_seed: int = 1):
    """fn's outputs and the gradient of every input under fixed random cotangents."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    outs = fn(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    gen = torch.Generator().manual_seed(cotangent_seed)
    cotangents = [torch.randn(o.shape, generator=gen) for o in outs]
    return [*outs, *torch.autograd.grad(outs, leaves, cotangents)]


def assert_all_close(names, want, got, atol=ATOL):
    assert len(want) == len(got) == len(names)
    for name, w, g in zip(names, want, got):
        assert_close(name, w, g, atol)


def loss_and_grads_each_way(model, batch, monkeypatch) -> dict:
    """{setting: (training loss, {parameter: gradient})} under reference and auto."""
    results = {}
    for setting in ("reference", "auto"):
        monkeypatch.setenv(dispatch.MODE_VAR, setting)
        model.zero_grad()
        loss = training_loss(model, batch)
        loss.backward()
        results[setting] = (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    return results


def assert_same_loss_and_grads(results: dict) -> None:
    assert_close("loss", results["reference"][0], results["auto"][0], ATOL)
    for name, grad in results["reference"][1].items():
        assert_close(f"grad {name}", grad, results["auto"][1][name], 1e-4)


# (leading shape, D): rows fewer than one 64-row block, a ragged last block, one row, an odd
# width, a width of one, a wide row
NORM_SHAPES = [((3, 5), 16), ((3, 37), 100), ((1,), 7), ((2, 70), 33), ((4, 3), 1), ((2, 9), 1000)]


@pytest.mark.parametrize("lead, width", NORM_SHAPES, ids=[f"{lead}x{w}" for lead, w in NORM_SHAPES])
def test_rms_norm_matches_the_reference_forward_and_both_gradients(lead, width):
    x, weight = torch.randn(*lead, width) * 3, torch.randn(width)
    want = outputs_and_grads(lambda x, w: rms_norm_naive(x, w, 1e-5), [x, weight])
    got = outputs_and_grads(lambda x, w: rms_cpu.rms_norm_cpu(x, w, 1e-5), [x, weight])
    assert_all_close(["y", "dx", "dweight"], want, got)


def test_rms_norm_of_a_strided_view_and_under_no_grad():
    x = torch.randn(6, 40, 24).transpose(0, 1)  # [40, 6, 24], not contiguous
    weight = torch.randn(24)
    assert_all_close(["y", "dx", "dweight"], outputs_and_grads(lambda x, w: rms_norm_naive(x, w), [x, weight]),
                     outputs_and_grads(lambda x, w: rms_cpu.rms_norm_cpu(x, w), [x, weight]))
    with torch.no_grad():
        assert_close("y", rms_norm_naive(x, weight), rms_cpu.rms_norm_cpu(x, weight), ATOL)


# (leading shape, F): one row, a width below one vector, odd widths, a ragged row count
SWIGLU_SHAPES = [((1,), 1), ((3, 5), 7), ((2, 37), 130), ((4, 33), 343)]


@pytest.mark.parametrize("lead, width", SWIGLU_SHAPES, ids=[f"{lead}x{w}" for lead, w in SWIGLU_SHAPES])
@pytest.mark.parametrize("layout", ["halves", "apart", "strided"])
def test_swiglu_matches_the_reference_forward_and_gradients(lead, width, layout):
    """halves: gate and up are one tensor's chunk(2, -1), as the fused projection gives (the
    packed path); apart: two tensors; strided: views with a row stride that are not halves."""
    if layout == "halves":
        inputs = [torch.randn(*lead, 2 * width) * 4]

        def split(fn):
            return lambda gu: fn(*gu.chunk(2, -1))
    elif layout == "apart":
        inputs = [torch.randn(*lead, width) * 4, torch.randn(*lead, width)]

        def split(fn):
            return fn
    else:
        inputs = [torch.randn(*lead, 3 * width + 1) * 4]

        def split(fn):
            return lambda wide: fn(wide[..., 1:width + 1], wide[..., 2 * width + 1:])
    want = outputs_and_grads(split(swiglu_naive), inputs)
    got = outputs_and_grads(split(swiglu_cpu.swiglu_cpu), inputs)
    assert_all_close(["h", *(f"d input {i}" for i in range(len(inputs)))], want, got)


def test_swiglu_packed_path_is_taken_exactly_for_the_two_halves():
    """The packed path reads one tensor as gate and up; it must recognise the halves of a
    chunk and nothing else (a wrong match would compute with the wrong columns)."""
    gate_up = torch.randn(2, 3, 10)
    gate, up = gate_up.chunk(2, -1)
    assert halves_of(gate, up) is gate_up
    assert halves_of(up, gate) is None  # swapped
    wide = torch.randn(2, 3, 11)
    assert halves_of(wide[..., :5], wide[..., 5:10]) is None  # not the whole tensor
    assert halves_of(wide[..., :5], wide[..., 6:11]) is None  # not adjacent
    other = torch.randn(2, 3, 5)
    assert halves_of(gate, other) is None
    assert halves_of(torch.randn(2, 3, 5), torch.randn(2, 3, 5)) is None


def test_swiglu_of_unequal_shapes_is_an_error():
    with pytest.raises(ValueError, match="differ in shape"):
        swiglu_cpu.swiglu_cpu(torch.randn(2, 3), torch.randn(2, 4))


# (B, T, H, K): one token, one head, a K below one vector, ragged lengths, K 64
ROPE_SHAPES = [(1, 1, 1, 2), (2, 5, 2, 6), (2, 37, 3, 32), (1, 19, 2, 64)]


@pytest.mark.parametrize("shape", ROPE_SHAPES, ids=["x".join(map(str, s)) for s in ROPE_SHAPES])
@pytest.mark.parametrize("wider", [0, 7], ids=["projection", "split-of-a-wider-projection"])
def test_rope_heads_match_the_reference_q_k_v_and_the_projection_gradient(shape, wider):
    """wider 7: q, k, v are the first 3 H K columns of a wider projection (gated attention's
    split), so each row has a stride beyond its width."""
    B, T, H, K = shape
    cos, sin = rope_tables(T, K, 10000.0, torch.device("cpu"))
    wide = torch.randn(B, T, 3 * H * K + wider)

    def heads(fn):
        return lambda w: fn(w[..., :3 * H * K], H, cos, sin)

    assert_all_close(["q", "k", "v", "d qkv"], outputs_and_grads(heads(rope_heads_naive), [wide]),
                     outputs_and_grads(heads(rope_cpu.rope_heads_cpu), [wide]))


def test_rope_heads_gradient_when_only_some_heads_reach_the_loss():
    """Autograd passes None for an output the loss does not use (the looped cache's frozen v,
    a probe reading q alone); its share of the projection's gradient is zero."""
    cos, sin = rope_tables(9, 8, 10000.0, torch.device("cpu"))
    grads = []
    for fn in (rope_heads_naive, rope_cpu.rope_heads_cpu):
        qkv = torch.randn(2, 9, 48, generator=torch.Generator().manual_seed(0)).requires_grad_()
        q, k, v = fn(qkv, 2, cos, sin)
        (q.square().sum() + k.sum()).backward()
        grads.append(qkv.grad)
    assert_close("d qkv", grads[0], grads[1], ATOL)
    assert torch.equal(grads[1][..., 32:], torch.zeros(2, 9, 16))


# (B, T, C, W): one step, fewer steps than the conv width, a ragged second block of 64 steps,
# a channel count below one vector, W 2 and 4
CONV_SHAPES = [(1, 1, 3, 4), (2, 3, 5, 4), (2, 70, 37, 4), (1, 9, 130, 2)]


@pytest.mark.parametrize("shape", CONV_SHAPES, ids=["x".join(map(str, s)) for s in CONV_SHAPES])
@pytest.mark.parametrize("bias, silu", [(True, True), (False, False), (True, False)],
                         ids=["bias-silu", "bare", "bias"])
def test_causal_conv_matches_the_reference_and_every_gradient(shape, bias, silu):
    """x as the first half of a wider projection (Mamba's in_proj chunk): rows with a stride."""
    B, T, C, W = shape
    inputs = [torch.randn(B, T, 2 * C), torch.randn(C, W), torch.randn(C)][:3 if bias else 2]

    def conv(fn):
        return lambda wide, w, b=None: fn(wide[..., :C], w, b, silu)

    names = ["y", "dx", "dweight", "dbias"][:len(inputs) + 1]
    assert_all_close(names, outputs_and_grads(conv(causal_conv1d_naive), inputs),
                     outputs_and_grads(conv(causal_conv1d_cpu), inputs))


def test_causal_conv_is_causal():
    """Changing step t changes no output before t."""
    x, weight = torch.randn(2, 12, 6), torch.randn(6, 4)
    changed = x.clone()
    changed[:, 7] += 5.0
    y, y_changed = causal_conv1d_cpu(x, weight, None, True), causal_conv1d_cpu(changed, weight, None, True)
    assert torch.equal(y[:, :7], y_changed[:, :7]) and not torch.equal(y[:, 7], y_changed[:, 7])


SOFTPLUS_SHAPES = [((3, 5), 7), ((2, 70), 224), ((1,), 1), ((4, 33), 4)]


@pytest.mark.parametrize("lead, width", SOFTPLUS_SHAPES, ids=[f"{lead}x{w}" for lead, w in SOFTPLUS_SHAPES])
def test_softplus_matches_the_reference_forward_and_both_gradients(lead, width):
    """x as the last columns of a wider projection (Mamba-2's dt): rows with a stride."""
    inputs = [torch.randn(*lead, width + 5) * 6, torch.randn(width)]

    def step_size(fn):
        return lambda wide, bias: fn(wide[..., 5:], bias)

    assert_all_close(["y", "dx", "dbias"], outputs_and_grads(step_size(softplus_naive), inputs),
                     outputs_and_grads(step_size(softplus_cpu), inputs))


def test_softplus_holds_to_float_rounding_over_the_whole_range():
    """Relative error of a few float roundings from -87 (softplus = exp(-87), about 1.4 times
    the smallest normal float, where log1p must not lose the value) through 0 to the threshold
    at 20 and past it, for softplus and its gradient (sigmoid); below -87, where the kernel's
    exp flushes to 0, both are within a normal float's smallest step of the truth."""
    x = torch.cat([torch.linspace(-100, 100, 20001), torch.tensor([-87.0, -20.0, 0.0, 19.999, 20.0, 20.001])])
    x64 = x.double().requires_grad_()
    want = torch.nn.functional.softplus(x64)
    (want_grad,) = torch.autograd.grad(want.sum(), x64)
    leaf = x.clone().requires_grad_()
    got = softplus_cpu(leaf, torch.zeros(x.shape))
    (got_grad,) = torch.autograd.grad(got.sum(), leaf)
    tiny = torch.finfo(torch.float32).tiny
    for name, g, w in (("softplus", got, want.detach()), ("sigmoid", got_grad, want_grad)):
        error = (g.double() - w).abs()
        normal = x >= -87.0
        assert (error[normal] / w[normal]).max().item() < 4e-7, name
        assert error[~normal].max().item() < 2 * tiny, name


def assert_layers_take_the_kernel_and_match(mixer: str, kernel: str, monkeypatch) -> None:
    """A two-layer model's loss and every gradient under auto (dispatch's `kernel` ran once a
    layer, counted) equal the reference path's."""
    layer = LayerSpec(mixer=mixer, mlp="none", mlp_width=0, options={"d_state": 4} if mixer == "mamba" else {})
    model = build_model(ArchSpec(family="tiny", vocab_size=50, d_model=32, num_heads=2, layers=(layer, layer)))
    tokens = torch.randint(0, 50, (2, 19))
    batch = Batch(inputs=tokens[:, :-1], targets=tokens[:, 1:])
    calls = []
    real = getattr(dispatch, kernel)
    monkeypatch.setattr(dispatch, kernel, lambda *a, **k: calls.append(1) or real(*a, **k))
    results = loss_and_grads_each_way(model, batch, monkeypatch)
    assert len(calls) == 2  # both layers, under auto only
    assert_same_loss_and_grads(results)


@pytest.mark.parametrize("mixer", ["mamba", "gated_deltanet", "mamba2"])
def test_step_sizes_take_the_softplus_kernel_and_match_the_reference_path(mixer, monkeypatch):
    assert_layers_take_the_kernel_and_match(mixer, "softplus_cpu", monkeypatch)


@pytest.mark.parametrize("mixer", ["mamba", "gated_deltanet", "mamba2"])
def test_recurrent_mixers_take_the_causal_conv_kernel_and_match_the_reference_path(mixer, monkeypatch):
    assert_layers_take_the_kernel_and_match(mixer, "causal_conv1d_cpu", monkeypatch)


def test_dispatch_takes_the_kernels_for_float32_cpu_and_pytorch_elsewhere(monkeypatch):
    """float32 CPU tensors under auto and cpp take each kernel; float64 (the causal gate's
    precision), reference, a disabled op, torch.compile's tracing and a dispatch mode (torch's
    FLOP counter) take the PyTorch path."""
    calls = []
    for module, name in ((rms_cpu, "rms_norm_cpu"), (swiglu_cpu, "swiglu_cpu"), (rope_cpu, "rope_heads_cpu")):
        real = getattr(module, name)
        monkeypatch.setattr(dispatch, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    cos, sin = rope_tables(5, 4, 10000.0, torch.device("cpu"))

    def run_all(dtype):
        x, gate_up, qkv = torch.randn(2, 5, 8, dtype=dtype), torch.randn(2, 5, 6, dtype=dtype), torch.randn(2, 5, 24, dtype=dtype)
        dispatch.rms_norm(x, torch.ones(8, dtype=dtype), 1e-6)
        dispatch.swiglu(*gate_up.chunk(2, -1))
        dispatch.rope_heads(qkv, 2, cos, sin)

    for setting in ("auto", "cpp"):
        monkeypatch.setenv(dispatch.MODE_VAR, setting)
        calls.clear()
        run_all(torch.float32)
        assert calls == ["rms_norm_cpu", "swiglu_cpu", "rope_heads_cpu"], setting
        calls.clear()
        run_all(torch.float64)
        assert calls == [], setting
    monkeypatch.setenv(dispatch.MODE_VAR, "reference")
    run_all(torch.float32)
    assert calls == []
    monkeypatch.setenv(dispatch.MODE_VAR, "auto")
    dispatch.disable("swiglu")
    run_all(torch.float32)
    assert calls == ["rms_norm_cpu", "rope_heads_cpu"]
    calls.clear()
    torch.compile(lambda x: dispatch.rms_norm(x, torch.ones(8), 1e-6), backend="eager")(torch.randn(3, 8))
    assert calls == []
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False):  # the counter must see the ops
        run_all(torch.float32)
    assert calls == []


def tiny_spec(mixer: str) -> ArchSpec:
    layer = LayerSpec(mixer=mixer, mlp="swiglu", mlp_width=40)
    return ArchSpec(family="tiny", vocab_size=50, d_model=32, num_heads=4, layers=(layer, layer))


@pytest.mark.parametrize("mixer", ["attention", "gated_attention"])
def test_model_loss_and_every_gradient_equal_on_the_cpp_and_pytorch_paths(mixer, monkeypatch):
    """A transformer's training loss and every parameter's gradient under auto (all three
    kernels ran, counted) equal the reference path's."""
    model = build_model(tiny_spec(mixer))
    tokens = torch.randint(0, 50, (3, 21))
    batch = Batch(inputs=tokens[:, :-1], targets=tokens[:, 1:])
    calls = []
    for module, name in ((rms_cpu, "rms_norm_cpu"), (swiglu_cpu, "swiglu_cpu"), (rope_cpu, "rope_heads_cpu")):
        real = getattr(module, name)
        monkeypatch.setattr(dispatch, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    results = loss_and_grads_each_way(model, batch, monkeypatch)
    assert set(calls) == {"rms_norm_cpu", "swiglu_cpu", "rope_heads_cpu"}
    assert_same_loss_and_grads(results)


def test_a_failed_build_turns_every_op_of_the_extension_off_with_one_warning_each(monkeypatch):
    """Simulated: the compiler fails. auto warns once per op and runs PyTorch; cpp raises with
    the compiler's line; the build is not retried in this process."""
    extension = cpu_build.ELEMENTWISE
    monkeypatch.setattr(extension, "_state", {})
    attempts = []

    def broken():
        attempts.append(1)
        raise RuntimeError("Error building extension 'archsearch_elementwise'\ng++: fatal error: killed")

    monkeypatch.setattr(extension, "_compile", broken)
    with pytest.warns(RuntimeWarning) as caught:
        assert not dispatch.use_cpp("rms_norm", "cpu")
    assert sorted(str(w.message).split(":")[0] for w in caught) == ["causal_conv1d", "rms_norm", "rope_heads", "softplus",
                                                                    "swiglu"]
    assert all("killed" in str(w.message) and "falling back" in str(w.message) for w in caught)
    x = torch.randn(2, 3, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning, no second build
        assert torch.equal(dispatch.rms_norm(x, torch.ones(8), 1e-6), F.rms_norm(x, (8,), torch.ones(8), 1e-6))
        assert not dispatch.use_cpp("swiglu", "cpu") and not dispatch.use_cpp("rope_heads", "cpu")
    assert attempts == [1]
    monkeypatch.setenv(dispatch.MODE_VAR, "cpp")
    with pytest.raises(RuntimeError, match="rms_norm: the C\\+\\+ CPU kernel is not available here: .*killed"):
        dispatch.rms_norm(x, torch.ones(8), 1e-6)


def test_an_op_that_disagrees_with_its_reference_is_off_and_the_others_stay_on(monkeypatch):
    """A miscompiled SwiGLU (simulated: its forward is off by one) fails its own check before
    first use; RMSNorm and the rotary heads, from the same build, pass theirs and stay on."""
    extension = cpu_build.ELEMENTWISE
    module = extension.module("swiglu")

    class Wrong:
        def __getattr__(self, name):
            return getattr(module, name)

        def swiglu_forward(self, gate, up, h):
            module.swiglu_forward(gate, up, h)
            h.add_(1)

    monkeypatch.setattr(extension, "_state", {})
    monkeypatch.setattr(extension, "_compile", Wrong)
    with pytest.warns(RuntimeWarning, match="swiglu: .*h differs from the reference"):
        assert not extension.available("swiglu")
    assert extension.available("rms_norm") and extension.available("rope_heads")
    assert "differs" in extension.build_error("swiglu")


def test_an_op_added_after_the_build_is_refused():
    extension = cpu_build.Extension("probe")
    extension._state["module"] = object()
    with pytest.raises(RuntimeError, match="added after the extension was built"):
        extension.add("late", "", [], lambda module: None)


def test_an_element_the_kernel_leaves_unwritten_fails_the_comparison(monkeypatch):
    """The planted fault the NaN-filled buffers exist for: a forward that skips the last column
    (simulated by handing the kernel a view one column short) leaves NaN there, and the
    agreement check fails, although every written element is right."""
    module = cpu_build.ELEMENTWISE.module("swiglu")

    class Short:
        def __getattr__(self, name):
            return getattr(module, name)

        def swiglu_forward(self, gate, up, h):
            module.swiglu_forward(gate[:, :-1], up[:, :-1], h[:, :-1].contiguous())
            h[:, :-1] = (torch.nn.functional.silu(gate) * up)[:, :-1]

    gate, up = torch.randn(4, 9), torch.randn(4, 9)
    h = swiglu_cpu._SwiGLU.apply(Short(), gate, up)
    assert torch.isnan(h[:, -1]).all() and not torch.isnan(h[:, :-1]).any()
    with pytest.raises(AssertionError, match="NaN"):
        assert_close("h", swiglu_naive(gate, up), h, ATOL)
