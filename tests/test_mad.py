"""The MAD tasks: each generator checked against a property its definition implies."""

from __future__ import annotations

import pytest
import torch

from archsearch.data import IGNORE
from archsearch.data.mad import (
    Compression,
    FuzzyRecall,
    InContextRecall,
    Memorization,
    NoisyRecall,
    SelectiveCopying,
)

SPLITS = ["train", "val"]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rows(batch):
    return list(zip(batch.inputs.tolist(), batch.targets.tolist()))


def _check_recall_row(inputs, targets, *, num_keys, num_content, split):
    """Replays a recall row: every answer must be the value its key was shown with."""
    T = len(inputs)
    shown = {}
    for p in range(0, T - 2, 2):
        key, value = inputs[p], inputs[p + 1]
        if key >= num_content:  # a noise pair: both tokens noise, never scored
            assert value >= num_content and targets[p] == IGNORE
            continue
        assert key < num_keys <= value < num_content
        assert shown.get(key, value) == value  # a key keeps its value within a sequence
        expected = value if split == "train" and key in shown else IGNORE
        assert targets[p] == expected
        assert targets[p + 1] == IGNORE
        shown[key] = value
    probe = inputs[T - 1]
    assert probe in shown and targets[T - 1] == shown[probe]
    assert targets[T - 2] == IGNORE


@pytest.mark.parametrize("split", SPLITS)
def test_in_context_recall_answers_come_from_the_context(split):
    task = InContextRecall(vocab_size=16, seq_len=64)
    batch = task.batch(split=split, batch_size=8, generator=_gen(0))
    assert (batch.inputs[:, -2] == 15).all()
    for inputs, targets in _rows(batch):
        _check_recall_row(inputs, targets, num_keys=7, num_content=15, split=split)
    scored = (batch.targets != IGNORE).sum(dim=1)
    if split == "val":
        assert (scored == 1).all()
    else:
        assert (scored > 1).all()


@pytest.mark.parametrize("split", SPLITS)
def test_noisy_recall_scores_only_real_pairs(split):
    task = NoisyRecall(vocab_size=32, seq_len=128, noise_vocab_size=16, frac_noise=0.3)
    batch = task.batch(split=split, batch_size=16, generator=_gen(0))
    assert (batch.inputs[:, -2] == 31).all()
    for inputs, targets in _rows(batch):
        _check_recall_row(inputs, targets, num_keys=7, num_content=15, split=split)
    noise_share = (batch.inputs[:, :-2:2] >= 15).float().mean().item()
    assert 0.2 < noise_share < 0.4


def _runs(tokens, boundary):
    """Split tokens into maximal runs of key tokens (< boundary) and value tokens."""
    runs = []
    for token in tokens:
        kind = token < boundary
        if runs and runs[-1][0] == kind:
            runs[-1][1].append(token)
        else:
            runs.append((kind, [token]))
    return runs


@pytest.mark.parametrize("split", SPLITS)
def test_fuzzy_recall_answers_the_probe_with_its_value_from_the_context(split):
    task = FuzzyRecall(vocab_size=16, seq_len=64, max_key_len=3, max_value_len=3)
    pad, query, boundary = 14, 15, 7
    batch = task.batch(split=split, batch_size=12, generator=_gen(0))
    scored_rows = 0
    for inputs, targets in _rows(batch):
        start = next(p for p, t in enumerate(inputs) if t != pad)
        q = inputs.index(query)
        body = _runs(inputs[start:q], boundary)
        assert [kind for kind, _ in body] == [True, False] * (len(body) // 2)
        table, recalls, at = {}, [], start
        for (_, key), (_, value) in zip(body[0::2], body[1::2]):
            assert len(set(key)) == len(key) <= 3 and len(set(value)) == len(value) <= 3
            if split == "val":
                assert len(key) == 3
            at += len(key)
            # On train, each value token of a key shown before is scored, at the position before it.
            if split == "train" and tuple(key) in table:
                recalls += range(at - 1, at - 1 + len(value))
            assert table.setdefault(tuple(key), value) == value
            at += len(value)
        # The row is inputs + one hidden token; the probe value's last token is that one.
        probe_key = [t for t in inputs[q + 1 :] if t < boundary]
        probe_value = table[tuple(probe_key)]
        answer_from = q + len(probe_key)
        assert inputs[answer_from + 1 :] == probe_value[:-1]
        assert targets[answer_from:] == probe_value
        assert [p for p in range(answer_from) if targets[p] != IGNORE] == recalls
        assert all(targets[p] == inputs[p + 1] for p in recalls)
        scored_rows += bool(recalls)
    if split == "train":
        assert scored_rows > 0
    else:
        assert scored_rows == 0


def test_selective_copying_targets_are_the_content_tokens_in_order():
    task = SelectiveCopying(vocab_size=16, seq_len=60, num_tokens=8)
    blank, copy = 14, 15
    batch = task.batch(split="train", batch_size=16, generator=_gen(0))
    for inputs, targets in _rows(batch):
        context = 60 - 8 - 1
        assert inputs[context] == copy and inputs[context + 1 :] == [blank] * 8
        content = [t for t in inputs[:context] if t != blank]
        assert [t for t in targets if t != IGNORE] == content
        assert targets[context + 1 :] == content and len(content) == 8


def test_compression_targets_rebuild_the_sequence_from_blind_slots():
    task = Compression(vocab_size=16, seq_len=24)
    batch = task.batch(split="train", batch_size=8, generator=_gen(0))
    m = 12
    assert (batch.inputs[:, m] == 14).all() and (batch.inputs[:, m + 1 :] == 15).all()
    assert (batch.inputs[:, :m] < 14).all()
    assert torch.equal(batch.targets[:, m:], batch.inputs[:, :m])
    assert (batch.targets[:, :m] == IGNORE).all()


def test_memorization_asks_the_same_facts_in_every_batch():
    task = Memorization(vocab_size=32, seq_len=16, seed=7)
    table = task.table()
    assert len(set(table.tolist())) == len(table) == 15  # one-to-one onto values [15, 31)
    assert ((table >= 15) & (table < 31)).all()
    for seed, split in [(0, "train"), (1, "train"), (2, "val")]:
        batch = task.batch(split=split, batch_size=8, generator=_gen(seed))
        assert (batch.inputs[:, 1::2] == 31).all() and (batch.targets[:, 0::2] == IGNORE).all()
        assert torch.equal(batch.targets[:, 1::2], table[batch.inputs[:, 0::2]])
        # The answer never shows up in the inputs, so only the weights can hold it.
        assert (batch.inputs[:, 0::2] < 15).all()
    assert torch.equal(Memorization(vocab_size=32, seq_len=16, seed=7).table(), table)
    assert not torch.equal(Memorization(vocab_size=32, seq_len=16, seed=8).table(), table)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: InContextRecall(seq_len=31), "even seq_len"),
        (lambda: NoisyRecall(vocab_size=16, noise_vocab_size=16), "raise vocab_size"),
        (lambda: NoisyRecall(frac_noise=1.0), "frac_noise"),
        (lambda: FuzzyRecall(seq_len=8), "seq_len >= 12"),
        (lambda: FuzzyRecall(vocab_size=6), "raise vocab_size"),
        (lambda: SelectiveCopying(seq_len=33, num_tokens=16), "seq_len >= 2 \\* num_tokens"),
        (lambda: Compression(seq_len=31), "even seq_len"),
        (lambda: Memorization(seq_len=7), "even seq_len"),
    ],
    ids=["recall-odd-length", "noise-eats-vocab", "all-noise", "fuzzy-too-short", "fuzzy-tiny-vocab",
         "copying-too-short", "compression-odd", "memorization-odd"],
)
def test_impossible_configs_are_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()
