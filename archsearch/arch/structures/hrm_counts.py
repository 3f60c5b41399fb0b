"""The counting formulas of ``hrm`` (parameters, FLOPs, state), importable without torch.

``hrm.py`` holds the module and re-exports these; the registry reads them from here,
so planning counts a model without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from archsearch.arch import blocks
from archsearch.arch.spec import ArchSpec
from archsearch.arch.structures import stack_counts as stack
from archsearch.arch.structures.stack_counts import layer_flops, layer_mixing, reject_unknown_options


@dataclass(frozen=True, kw_only=True)
class HRMOptions:
    """The options of "hrm", checked.

    ``N`` cycles (default 2) of ``T`` fast steps per slow step (default 2), both
    >= 1; ``fast_layers`` (default half of ``spec.layers``, rounded up) and
    ``slow_layers`` (default the rest) split ``spec.layers`` in order, each >= 1,
    summing to ``len(spec.layers)``. HRM's config is N = T = 2 over 4 + 4 layers.
    ``grad``: "bptt" (default) or "one_step" (HRM's approximation); ``segments``
    >= 1 (default 1): deep supervision over that many segments.
    """

    N: int = 2
    T: int = 2
    fast_layers: int
    slow_layers: int
    grad: str = "bptt"
    segments: int = 1


def hrm_options(spec: ArchSpec) -> HRMOptions:
    """Parse and check ``spec.options``; a ValueError names what is wrong."""
    reject_unknown_options(spec, {"N", "T", "fast_layers", "slow_layers", "grad", "segments"})
    num = spec.num_layers
    fast = spec.options.get("fast_layers", num - num // 2)
    opts = HRMOptions(**{"fast_layers": fast, "slow_layers": num - fast, **spec.options})
    if not all(isinstance(n, int) and n >= 1 for n in (opts.N, opts.T, opts.fast_layers, opts.slow_layers)) \
            or opts.fast_layers + opts.slow_layers != num:
        raise ValueError(f"hrm: N, T, fast_layers, slow_layers must be ints >= 1 with fast_layers + slow_layers = "
                         f"len(spec.layers) = {num}; got {opts}")
    if opts.grad not in ("bptt", "one_step"):
        raise ValueError(f"hrm: grad must be 'bptt' or 'one_step', got {opts.grad!r}")
    if not isinstance(opts.segments, int) or isinstance(opts.segments, bool) or opts.segments < 1:
        raise ValueError(f"hrm: segments must be an int >= 1, got {opts.segments!r}")
    return opts


def hrm_params(spec: ArchSpec) -> int:
    """Non-embedding: every layer once (shared across iterations) plus the final norm;
    independent of N and T. The carry norms have no weights."""
    hrm_options(spec)
    return stack.params(spec)


def _hrm_sum(spec: ArchSpec, per_layer) -> float:
    """S * N * (T * sum over fast layers + sum over slow layers) of ``per_layer(layer)``."""
    opts = hrm_options(spec)
    fast, slow = spec.layers[: opts.fast_layers], spec.layers[opts.fast_layers:]
    return opts.segments * opts.N * (opts.T * sum(map(per_layer, fast)) + sum(map(per_layer, slow)))


def hrm_flops(spec: ArchSpec, seq_len: int) -> float:
    """Forward FLOPs per token, LM head excluded: S (N*T*C_fast + N*C_slow) over S segments."""
    return _hrm_sum(spec, lambda layer: layer_flops(spec, layer, seq_len))


def hrm_graded(spec: ArchSpec, seq_len: int) -> float | None:
    """Under ``one_step``, the training forward FLOPs that carry gradient: per
    segment one fast and one slow call and the LM head, S (C_fast + C_slow + 2 D V);
    None (all of them) under BPTT."""
    opts = hrm_options(spec)
    if opts.grad != "one_step":
        return None
    calls = sum(layer_flops(spec, layer, seq_len) for layer in spec.layers)  # one call of each module
    return opts.segments * (calls + 2.0 * spec.d_model * spec.vocab_size)


def hrm_train_extra(spec: ArchSpec, seq_len: int) -> float:
    """Deep supervision reads logits after segments 1..S-1 too: (S-1) LM heads of 2 D V."""
    return 2.0 * spec.d_model * spec.vocab_size * (hrm_options(spec).segments - 1)


def hrm_mixing(spec: ArchSpec, seq_len: int) -> float:
    """Attention scores and mixing of every layer call: S (N*T*A_fast + N*A_slow)."""
    return _hrm_sum(spec, lambda layer: layer_mixing(spec, layer, seq_len))


def hrm_state(spec: ArchSpec, seq_len: int) -> int:
    """Every module call sees different inputs, so each keeps its own caches:
    S N T times the fast layers' plus S N times the slow layers'."""
    return int(_hrm_sum(spec, lambda layer: blocks.mixer(layer.mixer).state(spec, layer, seq_len)))


@dataclass(frozen=True, kw_only=True)
class UTOptions:
    """The options of "universal": ``steps`` M >= 1 (default 4) and
    ``step_embedding`` (default True: a learned D-vector added at each step)."""

    steps: int = 4
    step_embedding: bool = True


def ut_options(spec: ArchSpec) -> UTOptions:
    """Parse and check ``spec.options``; a ValueError names what is wrong."""
    reject_unknown_options(spec, {"steps", "step_embedding"})
    opts = UTOptions(**spec.options)
    if not isinstance(opts.steps, int) or opts.steps < 1:
        raise ValueError(f"universal: steps must be an int >= 1, got {opts.steps!r}")
    return opts


def ut_params(spec: ArchSpec) -> int:
    """Non-embedding: the shared block once, the final norm and ``steps * D`` step embeddings."""
    opts = ut_options(spec)
    return stack.params(spec) + (opts.steps * spec.d_model if opts.step_embedding else 0)


def ut_flops(spec: ArchSpec, seq_len: int) -> float:
    """Forward FLOPs per token, LM head excluded: ``steps`` passes of the block."""
    return ut_options(spec).steps * stack.flops(spec, seq_len)


def ut_mixing(spec: ArchSpec, seq_len: int) -> float:
    """Attention scores and mixing of ``steps`` passes of the block."""
    return ut_options(spec).steps * stack.mixing(spec, seq_len)


def ut_state(spec: ArchSpec, seq_len: int) -> int:
    """Every step keeps its own caches (its inputs differ): ``steps`` times the block's."""
    return ut_options(spec).steps * stack.state(spec, seq_len)
