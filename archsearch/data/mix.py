"""Several sources as one: each batch's rows drawn from them by weight.

Every source must share one vocabulary (a token id means one thing to the
model). Sources with shorter sequences are right-padded with token 0 and
``IGNORE`` targets, so a causal model's scored positions never see padding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from archsearch.data._base import IGNORE, Batch, Source
from archsearch.errors import SpecError


def check_one_vocab(vocab_sizes: Sequence[int], labels: Sequence[str]) -> int:
    """The shared vocabulary of a mix's sources; a SpecError naming each when they differ."""
    if len(set(vocab_sizes)) > 1:
        each = ", ".join(f"{label} has {size}" for label, size in zip(labels, vocab_sizes))
        raise SpecError(f"the sources of a mix must share one vocabulary: {each}", field="data.sources",
                        hint="give every task the same vocab_size in its params (text: 256 bytes, or the bpe size)")
    return vocab_sizes[0]


class Mix:
    """A Source drawing ``weight / sum(weights)`` of every batch's rows from each source (in expectation).

    inputs, targets: int64 [B, T] with T the longest ``seq_len`` of the sources.
    """

    def __init__(self, *, sources: Sequence[Source], weights: Sequence[float], labels: Sequence[str] | None = None):
        if len(sources) != len(weights) or not sources:
            raise ValueError("a mix needs one weight per source and at least one source")
        labels = labels or [f"sources[{i}]" for i in range(len(sources))]
        self.vocab_size = check_one_vocab([s.vocab_size for s in sources], labels)
        self.sources = list(sources)
        self.weights_S = torch.tensor(weights, dtype=torch.float64)
        self.seq_len = max(source.seq_len for source in sources)

    def batch(self, *, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        pick_B = torch.multinomial(self.weights_S, batch_size, replacement=True, generator=generator)
        counts_S = torch.bincount(pick_B, minlength=len(self.sources)).tolist()
        inputs, targets = [], []
        for source, count in zip(self.sources, counts_S):
            if count == 0:
                continue
            part = source.batch(split=split, batch_size=count, generator=generator)
            pad = self.seq_len - part.inputs.shape[1]
            inputs.append(torch.nn.functional.pad(part.inputs, (0, pad), value=0))
            targets.append(torch.nn.functional.pad(part.targets, (0, pad), value=IGNORE))
        return Batch(inputs=torch.cat(inputs), targets=torch.cat(targets))


__all__ = ["Mix", "check_one_vocab"]
