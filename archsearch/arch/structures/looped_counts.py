"""The counting formulas of ``looped`` (parameters, FLOPs, state), importable without torch.

``looped.py`` holds the module and re-exports these; the registry reads them from here,
so planning counts a model without importing torch."""

from __future__ import annotations

from dataclasses import dataclass, fields

from archsearch.arch.spec import ArchSpec
from archsearch.arch.structures import stack_counts as stack


@dataclass(frozen=True, kw_only=True)
class LoopOptions:
    """The options of the "looped" structure, checked.

    ``loops`` >= 1 (required); ``exit_entropy`` >= 0; ``exit_threshold`` in
    (0, 1] or None; ``cache_hole`` in [0, 1]. The last two need ``exit_gate``.
    """

    loops: int
    inject: bool = False
    exit_gate: bool = False
    exit_entropy: float = 0.05
    exit_threshold: float | None = None
    cache_hole: float = 0.0


def loop_options(spec: ArchSpec) -> LoopOptions:
    """Parse and check ``spec.options``; a ValueError names what is wrong."""
    stack.reject_unknown_options(spec, {f.name for f in fields(LoopOptions)})
    if "loops" not in spec.options:
        raise ValueError("looped: options['loops'] is required (an int >= 1)")
    opts = LoopOptions(**spec.options)
    if not isinstance(opts.loops, int) or opts.loops < 1:
        raise ValueError(f"looped: loops must be an int >= 1, got {opts.loops!r}")
    if opts.exit_entropy < 0:
        raise ValueError(f"looped: exit_entropy must be >= 0, got {opts.exit_entropy}")
    if opts.exit_threshold is not None and not 0 < opts.exit_threshold <= 1:
        raise ValueError(f"looped: exit_threshold must be in (0, 1], got {opts.exit_threshold}")
    if not 0 <= opts.cache_hole <= 1:
        raise ValueError(f"looped: cache_hole must be in [0, 1], got {opts.cache_hole}")
    if (opts.exit_threshold is not None or opts.cache_hole > 0) and not opts.exit_gate:
        raise ValueError("looped: exit_threshold and cache_hole need exit_gate=true")
    return opts


def params(spec: ArchSpec) -> int:
    """Shared layers counted once, the final norm, and one exit gate (D + 1) if on."""
    gate = spec.d_model + 1 if loop_options(spec).exit_gate else 0
    return stack.params(spec) + gate


def flops(spec: ArchSpec, seq_len: int) -> float:
    """Forward per token: L times the group, plus the gate (2D) after each of loops 1..L-1."""
    opts = loop_options(spec)
    gate = 2.0 * spec.d_model * (opts.loops - 1) if opts.exit_gate else 0.0
    return opts.loops * stack.flops(spec, seq_len) + gate


def train_extra(spec: ArchSpec, seq_len: int) -> float:
    """With an exit gate, training reads logits after loops 1..L-1 too: (L-1) LM heads of 2 D V."""
    opts = loop_options(spec)
    return 2.0 * spec.d_model * spec.vocab_size * (opts.loops - 1) if opts.exit_gate else 0.0


def mixing(spec: ArchSpec, seq_len: int) -> float:
    """L times the group's attention (and scan) terms."""
    return loop_options(spec).loops * stack.mixing(spec, seq_len)


def state(spec: ArchSpec, seq_len: int) -> int:
    """Every loop keeps its own caches (as Ouro's per-loop KV cache): L times
    the group's. Exited tokens leave holes, so this is the upper bound."""
    return loop_options(spec).loops * stack.state(spec, seq_len)
