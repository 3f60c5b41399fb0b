"""The counting formulas of ``memory`` (parameters, FLOPs, state), importable without torch.

``memory.py`` holds the module and re-exports these; the registry reads them from here,
so planning counts a model without importing torch."""

from __future__ import annotations

from dataclasses import dataclass, fields

from archsearch.arch.spec import ArchSpec
from archsearch.arch.structures import stack_counts as stack
from archsearch.arch.structures.stack_counts import reject_unknown_options


# default slot width over d_model, rounded to a multiple of 8 * memory_heads:
# at the paper's shape (6 layers, d 512, GPT-2's 50257 tokens, tied) S = 272
# and the memory adds 3.65% of the model's parameters, the paper's "3.7%"
# (S = d_model would add 8.8%)
MEMORY_WIDTH_RATIO = 0.53


AUX_KINDS = ("none", "self", "random")


def default_memory_dim(d_model: int, heads: int = 1) -> int:
    """``MEMORY_WIDTH_RATIO * d_model`` rounded to a multiple of ``8 * heads`` (at least one multiple)."""
    multiple = 8 * heads
    return max(multiple, round(MEMORY_WIDTH_RATIO * d_model / multiple) * multiple)


def default_placement(num_layers: int) -> int:
    """The layer the memory sits after when none is given: ``num_layers // 2 - 1``, clamped at 0,
    so half the layers are below it and half above (the one owner of this default: the
    planner's specs and a spec without ``placement`` both read it here)."""
    return max(0, num_layers // 2 - 1)


@dataclass(frozen=True, kw_only=True)
class MemoryOptions:
    """The options of the "memory" structure, checked.

    ``placement`` in [0, num_layers - 1]: the memory sits after that layer
    (default ``default_placement``: half the layers below it, half above).
    ``slots`` >= 1, ``segment`` >= 1 tokens, ``memory_dim`` >= 1 (default
    ``default_memory_dim``), ``memory_heads`` >= 1 dividing
    ``memory_dim``. ``aux`` in none | self | random with ``aux_weight`` >= 0;
    ``carry``: the state carries across consecutive batches of a stream.
    """

    placement: int
    slots: int = 4
    segment: int = 64
    memory_dim: int
    memory_heads: int = 1
    aux: str = "none"
    aux_weight: float = 0.1
    carry: bool = False


def memory_options(spec: ArchSpec) -> MemoryOptions:
    """Parse and check ``spec.options``; a ValueError names what is wrong."""
    reject_unknown_options(spec, {f.name for f in fields(MemoryOptions)})
    heads = spec.options.get("memory_heads", 1)
    defaults = dict(placement=default_placement(spec.num_layers),
                    memory_dim=default_memory_dim(spec.d_model, heads if isinstance(heads, int) and heads > 0 else 1))
    opts = MemoryOptions(**{**defaults, **spec.options})
    if not 0 <= opts.placement < spec.num_layers:
        raise ValueError(f"memory: placement must be in [0, {spec.num_layers - 1}], got {opts.placement}")
    for name in ("slots", "segment", "memory_dim", "memory_heads"):
        value = getattr(opts, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"memory: {name} must be an int >= 1, got {value!r}")
    if opts.memory_dim % opts.memory_heads:
        raise ValueError(f"memory: memory_heads {opts.memory_heads} must divide memory_dim {opts.memory_dim}")
    if opts.aux not in AUX_KINDS:
        raise ValueError(f"memory: aux must be one of {', '.join(AUX_KINDS)}, got {opts.aux!r}")
    if not isinstance(opts.aux_weight, (int, float)) or opts.aux_weight < 0:
        raise ValueError(f"memory: aux_weight must be a number >= 0, got {opts.aux_weight!r}")
    if not isinstance(opts.carry, bool):
        raise ValueError(f"memory: carry must be true or false, got {opts.carry!r}")
    return opts


def memory_params(spec: ArchSpec) -> int:
    """The memory module alone: D^2 + 5 D S + 9 S^2 + 2 D + 6 S + M S
    (+ S^2 + S for the aux head when ``aux`` is on).

    norm D; slots M S; read q D S, kv 2 S^2, out S D; gate (D + S) D + D;
    write q S^2, kv 2 D S; GRU 6 S^2 + 6 S.
    """
    opts, d = memory_options(spec), spec.d_model
    s, m = opts.memory_dim, opts.slots
    aux = s * s + s if opts.aux != "none" else 0
    return d * d + 5 * d * s + 9 * s * s + 2 * d + 6 * s + m * s + aux


def params(spec: ArchSpec) -> int:
    """The plain stack (layers and final norm) plus the memory."""
    return stack.params(spec) + memory_params(spec)


def overhead(spec: ArchSpec) -> float:
    """The memory's parameters over the rest of the model's, embeddings (and
    an untied head) included: the paper's "+3.7%"."""
    embeddings = spec.vocab_size * spec.d_model * (1 if spec.tie_embeddings else 2)
    return memory_params(spec) / (stack.params(spec) + embeddings)


def _segments(spec: ArchSpec, seq_len: int) -> tuple[MemoryOptions, int, int, int]:
    """Options, segments N = ceil(T / C), writes (N - 1, or N with ``carry``)
    and the tokens those writes read ((N - 1) C, or T)."""
    opts = memory_options(spec)
    num_segments = -(-seq_len // opts.segment)
    if opts.carry:
        return opts, num_segments, num_segments, seq_len
    return opts, num_segments, num_segments - 1, (num_segments - 1) * opts.segment


def memory_mixing(spec: ArchSpec, seq_len: int) -> float:
    """Cross-attention scores and weighted sums, per token: reads 4 M S (every
    token against M slots), writes 4 M S per written token (M slots against
    each token of the written segments), spread over T."""
    opts, _, _, written = _segments(spec, seq_len)
    s, m = opts.memory_dim, opts.slots
    return 4.0 * m * s + 4.0 * m * s * written / seq_len


def memory_flops(spec: ArchSpec, seq_len: int) -> float:
    """Forward FLOPs per token of the memory, weight matmuls plus mixing.

    Per token: read q 2 D S, out 2 S D, gate 2 (D + S) D. Per segment (N of
    them): slot keys and values 4 M S^2. Per write (N - 1 of them, the last
    segment is written only with ``carry``): slot queries 2 M S^2 and GRU
    12 M S^2, and token keys and values 4 D S on every token it reads.
    """
    opts, segments, writes, written = _segments(spec, seq_len)
    d, s, m = spec.d_model, opts.memory_dim, opts.slots
    per_token = 2.0 * d * s + 2.0 * s * d + 2.0 * (d + s) * d
    per_sequence = segments * 4.0 * m * s * s + writes * 14.0 * m * s * s + written * 4.0 * d * s
    return per_token + per_sequence / seq_len + memory_mixing(spec, seq_len)


def train_extra(spec: ArchSpec, seq_len: int) -> float:
    """The aux head, run only by ``training_loss``: 2 M S^2 per consecutive state pair (one per write)."""
    opts, _, writes, _ = _segments(spec, seq_len)
    if opts.aux == "none":
        return 0.0
    return writes * 2.0 * opts.slots * opts.memory_dim**2 / seq_len


def flops(spec: ArchSpec, seq_len: int) -> float:
    """Forward per token: the stack's layers plus the memory."""
    return stack.flops(spec, seq_len) + memory_flops(spec, seq_len)


def mixing(spec: ArchSpec, seq_len: int) -> float:
    """The layers' attention terms plus the memory's cross-attention terms."""
    return stack.mixing(spec, seq_len) + memory_mixing(spec, seq_len)


def state(spec: ArchSpec, seq_len: int) -> int:
    """The layers' caches, the slots M S, and the write keys and values (2 S
    per token) of the unfinished segment, written when it completes."""
    opts = memory_options(spec)
    return stack.state(spec, seq_len) + opts.slots * opts.memory_dim + 2 * opts.memory_dim * (seq_len % opts.segment)
