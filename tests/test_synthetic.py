"""MQAR, p-hop and Mano against their definitions, and what every synthetic task promises."""

from __future__ import annotations

import math

import pytest
import torch

from archsearch.data import IGNORE
from archsearch.data.synthetic import (
    MQAR,
    TASKS,
    Mano,
    PHop,
    mano_batch,
    mano_value,
    mqar_batch,
    phop_batch,
    phop_targets,
    phop_targets_ref,
    task_accuracy,
)

# Small configurations, one per registered task, so the shared tests stay fast.
SMALL = {
    "mqar": dict(vocab_size=64, seq_len=48, num_pairs=5),
    "phop": dict(num_symbols=3, seq_len=20, max_hops=4),
    "mano": dict(max_ops=5),
    "mad_in_context_recall": dict(seq_len=32),
    "mad_fuzzy_recall": dict(seq_len=40),
    "mad_noisy_recall": dict(seq_len=32),
    "mad_selective_copying": dict(seq_len=30, num_tokens=6),
    "mad_compression": dict(seq_len=16),
    "mad_memorization": dict(vocab_size=32, seq_len=16),
}
SPLITS = ["train", "val"]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_registry_names_every_task():
    assert set(TASKS) == set(SMALL)


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("name", sorted(SMALL))
def test_shapes_dtypes_and_token_ranges(name, split):
    task = TASKS[name](**SMALL[name])
    batch = task.batch(split=split, batch_size=6, generator=_gen(0))
    assert batch.inputs.dtype == batch.targets.dtype == torch.int64
    assert batch.inputs.shape == batch.targets.shape == (6, task.seq_len)
    assert 0 <= batch.inputs.min() and batch.inputs.max() < task.vocab_size
    scored = batch.targets[batch.targets != IGNORE]
    assert scored.numel() > 0
    assert 0 <= scored.min() and scored.max() < task.vocab_size


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("name", sorted(SMALL))
def test_seed_fixes_the_stream(name, split):
    task = TASKS[name](**SMALL[name])

    def stream(seed):
        g = _gen(seed)
        return [task.batch(split=split, batch_size=4, generator=g) for _ in range(2)]

    first, again, other = stream(1), stream(1), stream(2)
    for a, b in zip(first, again):
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert not torch.equal(first[0].inputs, other[0].inputs)
    assert not torch.equal(first[0].inputs, first[1].inputs)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_train_and_val_differ_under_one_seed(name):
    task = TASKS[name](**SMALL[name])
    train = task.batch(split="train", batch_size=4, generator=_gen(3))
    val = task.batch(split="val", batch_size=4, generator=_gen(3))
    assert not torch.equal(train.inputs, val.inputs)


def test_unknown_split_is_refused():
    with pytest.raises(ValueError, match="split"):
        MQAR(**SMALL["mqar"]).batch(split="test", batch_size=2, generator=_gen(0))


def test_task_accuracy_counts_only_supervised_positions():
    targets = torch.tensor([[1, IGNORE, 2], [0, IGNORE, IGNORE]])
    argmax = torch.tensor([[1, 0, 0], [0, 2, 2]])  # right, unscored, wrong / right, unscored x2
    logits = torch.nn.functional.one_hot(argmax, 3).float()
    assert task_accuracy(logits, targets) == pytest.approx(2 / 3)
    assert math.isnan(task_accuracy(logits, torch.full((2, 3), IGNORE)))


# MQAR

def test_mqar_answers_are_the_values_paired_with_the_queried_keys():
    V, T, D = 64, 48, 5
    batch = mqar_batch(vocab_size=V, seq_len=T, num_pairs=D, batch_size=16, generator=_gen(0))
    for inputs, targets in zip(batch.inputs.tolist(), batch.targets.tolist()):
        keys, values = inputs[0 : 2 * D : 2], inputs[1 : 2 * D : 2]
        assert len(set(keys)) == D and len(set(values)) == D
        assert all(1 <= k < V // 2 for k in keys) and all(V // 2 <= v < V for v in values)
        scored = [p for p, t in enumerate(targets) if t != IGNORE]
        # Only the D answers are supervised, each at an even offset after the context.
        assert len(scored) == D and all(p >= 2 * D and (p - 2 * D) % 2 == 0 for p in scored)
        paired = dict(zip(keys, values))
        assert sorted(inputs[p] for p in scored) == sorted(keys)
        assert all(targets[p] == paired[inputs[p]] for p in scored)


def test_mqar_queries_favour_short_gaps():
    D, T = 4, 256
    batch = mqar_batch(vocab_size=512, seq_len=T, num_pairs=D, batch_size=64, generator=_gen(0))
    offsets = (batch.targets != IGNORE).nonzero()[:, 1] - 2 * D
    # p(g) ~ g^-0.99 puts most of the mass on the first half of the query region.
    assert (offsets < (T - 2 * D) / 2).float().mean() > 0.7


@pytest.mark.parametrize(
    "config, message",
    [
        (dict(vocab_size=64, seq_len=19, num_pairs=5), "seq_len >= 4"),
        (dict(vocab_size=10, seq_len=48, num_pairs=5), "raise vocab_size"),
        (dict(vocab_size=64, seq_len=48, num_pairs=0), "num_pairs >= 1"),
    ],
    ids=["too-short-for-queries", "too-few-keys", "no-pairs"],
)
def test_mqar_rejects_impossible_configs(config, message):
    with pytest.raises(ValueError, match=message):
        MQAR(**config)


# p-hop

# X = 0 1 2 0 1 0 2 1, worked by hand: find(3) = 1 (X_0 = 0), find(4) = 2, find(5) = 4,
# find(6) = 3, find(7) = 5 and no earlier match for positions 0..2.
HAND_SYMBOLS = [0, 1, 2, 0, 1, 0, 2, 1]
N = None
HAND_ANSWERS = {
    0: [0, 1, 2, 0, 1, 0, 2, 1],
    1: [N, N, N, 1, 2, 1, 0, 0],
    2: [N, N, N, N, N, 2, 1, 1],
    3: [N, N, N, N, N, N, N, 2],
    4: [N] * 8,
}


@pytest.mark.parametrize("hops", sorted(HAND_ANSWERS), ids=[f"k{k}" for k in sorted(HAND_ANSWERS)])
def test_phop_reference_matches_hand_worked_hops(hops):
    assert phop_targets_ref(HAND_SYMBOLS, hops=hops) == HAND_ANSWERS[hops]


def test_phop_batched_targets_match_hand_worked_hops():
    hops = sorted(HAND_ANSWERS)
    symbols = torch.tensor([HAND_SYMBOLS] * len(hops))
    got = phop_targets(symbols, torch.tensor(hops), none_token=9)
    want = [[9 if a is None else a for a in HAND_ANSWERS[k]] for k in hops]
    assert got.tolist() == want


@pytest.mark.parametrize("last_only", [False, True], ids=["every-position", "last-only"])
def test_phop_batch_follows_the_reference(last_only):
    task = PHop(num_symbols=3, seq_len=40, min_hops=1, max_hops=5, last_only=last_only)
    batch = task.batch(split="train", batch_size=12, generator=_gen(0))
    seen_hops = set()
    for inputs, targets in zip(batch.inputs.tolist(), batch.targets.tolist()):
        hops = inputs[0] - task.hop_token(0)
        seen_hops.add(hops)
        symbols = inputs[1:]
        assert 1 <= hops <= 5
        assert all(a != b for a, b in zip(symbols, symbols[1:]))
        want = [task.none_token if a is None else a for a in phop_targets_ref(symbols, hops=hops)]
        assert targets[0] == IGNORE
        if last_only:
            assert targets[:-1] == [IGNORE] * (len(targets) - 1) and targets[-1] == want[-1]
        else:
            assert targets[1:] == want
    assert len(seen_hops) > 1


def test_phop_batched_targets_agree_with_reference_on_random_rows():
    batch = phop_batch(num_symbols=4, seq_len=60, min_hops=0, max_hops=8, batch_size=16, generator=_gen(5))
    hops = batch.inputs[:, 0] - 5
    for row, k in zip(batch.inputs[:, 1:].tolist(), hops.tolist()):
        want = [4 if a is None else a for a in phop_targets_ref(row, hops=k)]
        assert phop_targets(torch.tensor([row]), torch.tensor([k]), none_token=4)[0].tolist() == want


# Mano: tokens for M = 23 are numbers 0..22, then + = 23, - = 24, * = 25.
PLUS, MINUS, TIMES = 23, 24, 25


@pytest.mark.parametrize(
    "prefix, value",
    [
        ([7], 7),
        ([MINUS, 5, 7], 21),  # 5 - 7 = -2 = 21 (mod 23)
        ([TIMES, PLUS, 3, 4, MINUS, 20, 22], 9),  # (3 + 4) * (20 - 22) = 7 * 21 = 147 = 9
        ([PLUS, TIMES, 22, 22, 1], 2),  # 22 * 22 + 1 = 485 = 2
    ],
    ids=["leaf", "minus-wraps", "times-of-sums", "square-plus-one"],
)
def test_mano_value_of_hand_written_expressions(prefix, value):
    assert mano_value(prefix, modulus=23) == value


@pytest.mark.parametrize("prefix", [[PLUS, 3], [3, 4]], ids=["missing-operand", "two-leaves"])
def test_mano_value_rejects_malformed_expressions(prefix):
    with pytest.raises(ValueError):
        mano_value(prefix, modulus=23)


@pytest.mark.parametrize("split", SPLITS)
def test_mano_rows_follow_the_layout_and_answer_correctly(split):
    task = Mano(max_ops=6, modulus=23)
    bos, pad = 26, 27
    batch = task.batch(split=split, batch_size=32, generator=_gen(0))
    lengths = set()
    for inputs, targets in zip(batch.inputs.tolist(), batch.targets.tolist()):
        ops = inputs[1] - pad
        lengths.add(ops)
        answer_at = 2 * ops + 3
        assert inputs[0] == bos and 1 <= ops <= 6
        assert inputs[answer_at] == pad + 6 + ops
        assert inputs[answer_at + 1 :] == [pad] * (task.seq_len - answer_at - 1)
        prefix = inputs[2:answer_at]
        assert sum(t >= 23 for t in prefix) == ops
        assert [p for p, t in enumerate(targets) if t != IGNORE] == [answer_at]
        assert targets[answer_at] == mano_value(prefix, modulus=23)
    if split == "val":
        assert lengths == {6}
    else:
        assert len(lengths) > 2


def test_mano_splits_operators_between_subtrees_uniformly():
    # With two operators the left subtree holds 0 or 1 of them, each half the time (Mano's tree law).
    batch = mano_batch(max_ops=2, min_ops=2, batch_size=400, generator=_gen(0))
    left_is_operator = (batch.inputs[:, 3] >= 23).float().mean().item()
    assert 0.42 < left_is_operator < 0.58
