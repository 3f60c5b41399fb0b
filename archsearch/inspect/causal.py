"""The causal-leakage check: no output may move when only later tokens change.

A language model's logits at position t must be a function of tokens 0..t.
A model that breaks this (a block that peeks at the next token, a memory that
reads a segment's state after writing it with that same segment) trains to a
loss far below an honest model's: papers.md section 2 warns that a 0.7-nat
gain from 3.7% more parameters is the size of effect a leak produces. The
check builds the model, changes every token after a cut t, and compares the
logits up to t; it runs before a study trains anything when the study lists
``checks: [causal]`` (archsearch.execute.preflight).

Cuts: every position of a sequence up to 128 tokens. Longer ones (the
check runs at the training length, at most 256 tokens or 3 segments) are cut
at the start, the quarters and the end, and for a model that works in
segments (the memory structure) at the last token of a segment, the first of
the next and one in the middle of it, so a leak inside a segment and one
across a segment boundary are both seen. All cuts run as
rows of one batch (rows never see each other), in eval mode, on the CPU, in
float64: a leak at initialisation can be small (gates start nearly closed),
and float64 leaves it far above the rounding of an honest model.

Dimensions: B batch (one row per cut, plus the unchanged row), T time, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

# An output "moves" past this. The check runs in float64, where every zoo model (tests/zoo)
# repeats its earlier logits exactly but Titans, whose memory computes in float32 (3e-8); a
# leaky memory at initialisation, its write gate nearly closed, moves them by about 1e-5.
ATOL, RTOL = 1e-7, 1e-6
# every position is a cut up to this length; the check runs at most this long (or 3 segments)
EVERY_CUT, LONGEST = 128, 256


@dataclass(frozen=True, kw_only=True)
class Leak:
    """The earliest ``position`` whose logits moved, by ``moved`` at most, when
    the tokens after ``after`` changed (``position`` <= ``after``)."""

    position: int
    after: int
    moved: float

    def describe(self) -> str:
        return (f"changing the tokens after position {self.after} moved its logits at position {self.position} "
                f"(by {self.moved:.3g})")


def cut_points(seq_len: int, segment: int | None = None) -> list[int]:
    """Positions t whose later tokens are changed, in [0, seq_len - 2]."""
    if seq_len <= EVERY_CUT:
        return list(range(seq_len - 1))
    cuts = {0, seq_len // 4, seq_len // 2, 3 * seq_len // 4, seq_len - 2}
    if segment:
        for k in (1, 2):
            cuts |= {k * segment - 1, k * segment, k * segment + segment // 2}
    return sorted(t for t in cuts if 0 <= t <= seq_len - 2)


def check_length(seq_len: int, segment: int | None = None) -> int:
    """The length the check runs at: the training length up to ``LONGEST``
    (a leak is a matter of structure, not of length), and at least three
    segments so the memory is read and written across two boundaries."""
    return max(min(seq_len, LONGEST), 3 * segment if segment else 0, 8)


@torch.no_grad()
def find_leak(model: nn.Module, *, vocab_size: int, seq_len: int, segment: int | None = None,
              seed: int = 0) -> Leak | None:
    """The earliest leak of ``model`` (tokens [B, T] -> logits [B, T, V]) over
    the cuts of ``cut_points``, or None when no output up to a cut moved."""
    generator = torch.Generator().manual_seed(seed)
    cuts = cut_points(seq_len, segment)
    tokens_T = torch.randint(0, vocab_size, (seq_len,), generator=generator)
    rows_BT = tokens_T.repeat(len(cuts) + 1, 1)
    for row, t in enumerate(cuts, start=1):
        # every later token replaced by a different one
        shift_T = torch.randint(1, vocab_size, (seq_len - t - 1,), generator=generator)
        rows_BT[row, t + 1:] = (tokens_T[t + 1:] + shift_T) % vocab_size
    was_training = model.training
    model.eval()
    try:
        logits_BTV = model(rows_BT).double()
    finally:
        model.train(was_training)
    base_TV = logits_BTV[0]
    leaks = []
    for row, t in enumerate(cuts, start=1):
        delta_TV = (logits_BTV[row, : t + 1] - base_TV[: t + 1]).abs()
        moved_T = (delta_TV > ATOL + RTOL * base_TV[: t + 1].abs()).any(-1)
        if moved_T.any():
            first = int(moved_T.nonzero()[0])
            leaks.append(Leak(position=first, after=t, moved=float(delta_TV[first].max())))
    return min(leaks, key=lambda leak: (leak.position, leak.after)) if leaks else None


def spec_leak(spec, *, seq_len: int, seed: int = 0) -> tuple[Leak | None, int]:
    """Build ``spec`` (an ArchSpec) seeded and check it; the leak (or None) and
    the length it was checked at."""
    from archsearch.arch.model import build_model

    from archsearch.arch.structures.memory_counts import memory_options

    segment = memory_options(spec).segment if spec.structure == "memory" else None
    length = check_length(seq_len, segment)
    torch.manual_seed(seed)
    model = build_model(spec).double()
    return find_leak(model, vocab_size=spec.vocab_size, seq_len=length, segment=segment, seed=seed), length
