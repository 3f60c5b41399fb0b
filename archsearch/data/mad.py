"""The six MAD synthetic tasks as data sources, and the split helpers every synthetic task shares.

MAD: Poli et al. 2024, "Mechanistic Design and Scaling of Hybrid Architectures",
https://arxiv.org/abs/2403.17844. Each task is a frozen, keyword-only dataclass
following the ``Source`` protocol; defaults are the paper's baseline settings.
MAD's own harness trains on every next token and scores only the answers; here
targets are ``IGNORE`` wherever the next token cannot be inferred, so the train
loss measures the skill rather than the noise. Where MAD's format needs a model
head this protocol cannot express (compression), the class docstring says how
the task was recast.

``synthetic.py`` imports this module to build its ``TASKS`` registry, so the
helpers both modules use live here and imports stay one-way.

Dimensions: B batch, T time (``seq_len``), P key-value slots, K keys, N content tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from archsearch.data._base import IGNORE, Batch

SPLITS = ("train", "val")
_SEED_RANGE = 2**62


def split_generator(split: str, generator: torch.Generator) -> torch.Generator:
    """The generator a synthetic source draws ``split`` from.

    "train" uses the caller's generator as is. "val" seeds a fresh generator from one
    draw of the caller's, so the same seed never yields the same train and val
    streams, and a seeded caller still gets a reproducible val stream.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if split == "train":
        return generator
    seed = int(torch.randint(0, _SEED_RANGE, (1,), generator=generator))
    return torch.Generator().manual_seed(seed)


def row_rngs(batch_size: int, generator: torch.Generator) -> list[random.Random]:
    """One Python RNG per row, seeded from ``generator``, for rows built by loops (trees, motifs)."""
    seeds = torch.randint(0, _SEED_RANGE, (batch_size,), generator=generator).tolist()
    return [random.Random(seed) for seed in seeds]


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _recall_batch(*, vocab_size: int, seq_len: int, noise_vocab_size: int, frac_noise: float,
                  split: str, batch_size: int, generator: torch.Generator) -> Batch:
    """Shared body of in-context recall and noisy recall (MAD uses one generator for both)."""
    g = split_generator(split, generator)
    B, T = batch_size, seq_len
    P = T // 2 - 1  # pair slots before the final [QUERY, key]
    num_content = vocab_size - 1 - noise_vocab_size
    K = num_content // 2
    query_token = vocab_size - 1
    # One random key -> value table per sequence: a key that recurs repeats its value.
    table_BK = K + torch.randint(0, num_content - K, (B, K), generator=g)
    keys_BP = torch.randint(0, K, (B, P), generator=g)
    values_BP = table_BK.gather(1, keys_BP)
    noise_BP = torch.rand(B, P, generator=g) < frac_noise
    # At least one real pair per sequence, so there is always a key to query.
    noise_BP[torch.arange(B), torch.randint(0, P, (B,), generator=g)] = False
    noise_BP2 = num_content + torch.randint(0, max(noise_vocab_size, 1), (B, P, 2), generator=g)
    real_BP = ~noise_BP

    inputs_BT = torch.empty(B, T, dtype=torch.long)
    inputs_BT[:, 0 : 2 * P : 2] = torch.where(noise_BP, noise_BP2[..., 0], keys_BP)
    inputs_BT[:, 1 : 2 * P : 2] = torch.where(noise_BP, noise_BP2[..., 1], values_BP)
    presented_BK = torch.zeros(B, K).scatter_add_(1, keys_BP, real_BP.float()) > 0
    probe_B = torch.multinomial(presented_BK.float(), 1, generator=g).squeeze(1)
    inputs_BT[:, T - 2] = query_token
    inputs_BT[:, T - 1] = probe_B

    targets_BT = torch.full((B, T), IGNORE, dtype=torch.long)
    targets_BT[:, T - 1] = table_BK.gather(1, probe_B[:, None]).squeeze(1)
    if split == "train":
        # A value is inferable only if its key was shown (as a real pair) earlier in the sequence.
        same_BPP = (keys_BP[:, :, None] == keys_BP[:, None, :]) & real_BP[:, None, :]
        earlier_PP = torch.ones(P, P, dtype=torch.bool).tril(diagonal=-1)
        seen_BP = (same_BPP & earlier_PP).any(dim=2) & real_BP
        # The target at a key's position is the value that follows it.
        targets_BT[:, 0 : 2 * P : 2] = torch.where(seen_BP, values_BP, IGNORE)
    return Batch(inputs=inputs_BT, targets=targets_BT)


def _check_recall(vocab_size: int, seq_len: int, noise_vocab_size: int, frac_noise: float) -> None:
    num_content = vocab_size - 1 - noise_vocab_size
    _require(num_content >= 2, f"recall needs at least one key and one value token: vocab_size={vocab_size} "
             f"minus the query token and {noise_vocab_size} noise tokens leaves {num_content}; "
             "raise vocab_size")
    _require(seq_len >= 4 and seq_len % 2 == 0,
             f"recall needs an even seq_len >= 4 (key-value pairs, then query and key), got {seq_len}")
    _require(0 <= frac_noise < 1, f"frac_noise must be in [0, 1), got {frac_noise}")
    _require(frac_noise == 0 or noise_vocab_size >= 1, "frac_noise > 0 needs noise_vocab_size >= 1")


@dataclass(frozen=True, kw_only=True)
class InContextRecall:
    """MAD in-context recall: pairs ``k v k v ...`` then ``QUERY k``; predict ``k``'s value.

    Vocab (V = vocab_size): keys [0, (V-1)//2), values [(V-1)//2, V-1), QUERY = V-1.
    Layout: ``T/2 - 1`` pairs, each key uniform, its value fixed per sequence by a random
    table (values may repeat across keys), then ``QUERY k*`` with ``k*`` uniform over the
    keys shown. Targets: at ``k*`` its value. On "train" also at every key shown before,
    its value (MAD trains on all next tokens; the uninferable ones are dropped); on "val"
    only the final query, as MAD scores it.
    """

    vocab_size: int = 16
    seq_len: int = 128

    def __post_init__(self) -> None:
        _check_recall(self.vocab_size, self.seq_len, 0, 0.0)

    def batch(self, *, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        """inputs, targets: int64 [batch_size, seq_len]."""
        return _recall_batch(vocab_size=self.vocab_size, seq_len=self.seq_len, noise_vocab_size=0,
                             frac_noise=0.0, split=split, batch_size=batch_size, generator=generator)


@dataclass(frozen=True, kw_only=True)
class NoisyRecall:
    """MAD noisy in-context recall: in-context recall with noise pairs mixed in.

    Vocab: with C = V - 1 - noise_vocab_size, keys [0, C//2), values [C//2, C), noise
    tokens [C, V-1), QUERY = V-1. Each pair slot independently becomes two uniform noise
    tokens with probability ``frac_noise`` (one slot per sequence is kept real). Noise
    never counts as a presentation. Targets as in ``InContextRecall``.
    """

    vocab_size: int = 32
    seq_len: int = 128
    noise_vocab_size: int = 16
    frac_noise: float = 0.2

    def __post_init__(self) -> None:
        _check_recall(self.vocab_size, self.seq_len, self.noise_vocab_size, self.frac_noise)

    def batch(self, *, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        """inputs, targets: int64 [batch_size, seq_len]."""
        return _recall_batch(vocab_size=self.vocab_size, seq_len=self.seq_len,
                             noise_vocab_size=self.noise_vocab_size, frac_noise=self.frac_noise,
                             split=split, batch_size=batch_size, generator=generator)


@dataclass(frozen=True, kw_only=True)
class FuzzyRecall:
    """MAD fuzzy in-context recall: keys and values are runs of 1..max_*_len tokens.

    Vocab: with C = V - 2, key tokens [0, C//2), value tokens [C//2, C), PAD = V-2,
    QUERY = V-1. A key (or value) is a run of distinct tokens from its half; the halves
    are disjoint, so runs delimit themselves. Layout: left padding, then shuffled pairs
    (the probe pair among them; a recurring key repeats its value), then
    ``QUERY key* value*``. Targets: the tokens of ``value*``, each at the position before
    it. On "train" also every value token of a key shown before. On "val" every key has
    max_key_len tokens, as MAD prompts at the longest key.
    Choices: pairs are drawn until fewer than max_key_len + max_value_len slots remain
    (MAD's stop rule), and the probe pair's place is uniform over the pairs. A key that is a
    sub-run of another makes some train targets ambiguous; that ambiguity is the task.
    """

    vocab_size: int = 16
    seq_len: int = 128
    max_key_len: int = 3
    max_value_len: int = 3

    def __post_init__(self) -> None:
        num_key_tokens = (self.vocab_size - 2) // 2
        num_value_tokens = self.vocab_size - 2 - num_key_tokens
        _require(num_key_tokens >= self.max_key_len >= 1 and num_value_tokens >= self.max_value_len >= 1,
                 f"fuzzy recall draws a key as max_key_len={self.max_key_len} distinct tokens from "
                 f"{num_key_tokens} and a value as max_value_len={self.max_value_len} from "
                 f"{num_value_tokens}; raise vocab_size or lower the motif lengths")
        longest = 2 * (self.max_key_len + self.max_value_len)
        _require(self.seq_len >= longest, f"fuzzy recall needs seq_len >= {longest} (the probe pair twice), "
                 f"got {self.seq_len}")

    def batch(self, *, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        """inputs, targets: int64 [batch_size, seq_len]."""
        rows = [self._row(rng, split) for rng in row_rngs(batch_size, split_generator(split, generator))]
        tokens_BS = torch.tensor([tokens for tokens, _ in rows], dtype=torch.long)
        scored_BS = torch.tensor([scored for _, scored in rows], dtype=torch.bool)
        # Next-token pairs: the target at p is token p + 1 when that token is scored.
        targets_BT = torch.where(scored_BS[:, 1:], tokens_BS[:, 1:], IGNORE)
        return Batch(inputs=tokens_BS[:, :-1], targets=targets_BT)

    def _row(self, rng: random.Random, split: str) -> tuple[list[int], list[bool]]:
        """``seq_len + 1`` tokens and, for each, whether predicting it is scored."""
        num_content = self.vocab_size - 2
        key_vocab, value_vocab = range(num_content // 2), range(num_content // 2, num_content)

        def new_key() -> tuple[int, ...]:
            size = self.max_key_len if split == "val" else rng.randint(1, self.max_key_len)
            return tuple(rng.sample(key_vocab, size))

        def new_value() -> tuple[int, ...]:
            return tuple(rng.sample(value_vocab, rng.randint(1, self.max_value_len)))

        probe_key, probe_value = new_key(), new_value()
        table = {probe_key: probe_value}
        keys = [probe_key]
        room = self.seq_len - 2 * (len(probe_key) + len(probe_value))
        while room >= self.max_key_len + self.max_value_len:
            key = new_key()
            if key not in table:
                table[key] = new_value()
            keys.append(key)
            room -= len(key) + len(table[key])
        rng.shuffle(keys)

        tokens, scored = [self.vocab_size - 2] * room, [False] * room
        shown: set[tuple[int, ...]] = set()
        for key in keys:
            tokens += [*key, *table[key]]
            scored += [False] * len(key) + [split == "train" and key in shown] * len(table[key])
            shown.add(key)
        tokens += [self.vocab_size - 1, *probe_key, *probe_value]
        scored += [False] * (1 + len(probe_key)) + [True] * len(probe_value)
        return tokens, scored


@dataclass(frozen=True, kw_only=True)
class SelectiveCopying:
    """MAD selective copying: copy the content tokens scattered among blanks, in order.

    Vocab: content [0, V-2), BLANK = V-2, COPY = V-1. Layout (n = num_tokens): a context
    of ``seq_len - n - 1`` positions holding n uniform content tokens at uniformly chosen
    positions (order kept) and BLANK elsewhere, then COPY, then n BLANKs. Targets: the
    i-th content token at the i-th BLANK after COPY (MAD's layout: the answer slots
    carry no hint of what to write).
    Choice: MAD inserts blanks at random indices; here the content positions are a
    uniform subset of the context, which is the same in spirit and exactly seedable.
    """

    vocab_size: int = 16
    seq_len: int = 256
    num_tokens: int = 16

    def __post_init__(self) -> None:
        _require(self.vocab_size >= 3, f"selective copying needs vocab_size >= 3, got {self.vocab_size}")
        _require(self.num_tokens >= 1 and self.seq_len >= 2 * self.num_tokens + 2,
                 f"selective copying needs seq_len >= 2 * num_tokens + 2 (context with at least one blank, "
                 f"COPY, answers), got seq_len={self.seq_len}, num_tokens={self.num_tokens}")

    def batch(self, *, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        """inputs, targets: int64 [batch_size, seq_len]."""
        g = split_generator(split, generator)
        B, T, N = batch_size, self.seq_len, self.num_tokens
        context = T - N - 1
        blank, copy = self.vocab_size - 2, self.vocab_size - 1
        content_BN = torch.randint(0, self.vocab_size - 2, (B, N), generator=g)
        where_BN = torch.rand(B, context, generator=g).argsort(dim=1)[:, :N].sort(dim=1).values
        inputs_BT = torch.full((B, T), blank, dtype=torch.long)
        inputs_BT[:, :context] = inputs_BT[:, :context].scatter(1, where_BN, content_BN)
        inputs_BT[:, context] = copy
        targets_BT = torch.full((B, T), IGNORE, dtype=torch.long)
        targets_BT[:, context + 1 :] = content_BN
        return Batch(inputs=inputs_BT, targets=targets_BT)


@dataclass(frozen=True, kw_only=True)
class Compression:
    """MAD compression, recast as next-token prediction: read a sequence, then rewrite it blind.

    Vocab: content [0, V-2), COMPRESS = V-2, RECALL = V-1. Layout (m = seq_len / 2):
    m uniform content tokens, COMPRESS, then m-1 RECALL tokens. Targets: token 1 at
    COMPRESS and token j+1 at the j-th RECALL.
    Choice: MAD pools the encoder's last state and decodes every token with an MLP plus
    a position embedding, a head this protocol cannot express. Here the decoder's only
    inputs are RECALL and position as well, so a recurrent model must carry the whole
    sequence in its state; attention can still look back, so this recast measures
    state capacity for recurrent mixers only. seq_len 64 gives 32 tokens, near MAD's 31.
    """

    vocab_size: int = 16
    seq_len: int = 64

    def __post_init__(self) -> None:
        _require(self.vocab_size >= 3, f"compression needs vocab_size >= 3, got {self.vocab_size}")
        _require(self.seq_len >= 2 and self.seq_len % 2 == 0,
                 f"compression needs an even seq_len >= 2 (m tokens, COMPRESS, m-1 RECALL), "
                 f"got {self.seq_len}")

    def batch(self, *, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        """inputs, targets: int64 [batch_size, seq_len]."""
        g = split_generator(split, generator)
        B, N = batch_size, self.seq_len // 2
        content_BN = torch.randint(0, self.vocab_size - 2, (B, N), generator=g)
        inputs_BT = torch.full((B, 2 * N), self.vocab_size - 1, dtype=torch.long)
        inputs_BT[:, :N] = content_BN
        inputs_BT[:, N] = self.vocab_size - 2
        targets_BT = torch.full((B, 2 * N), IGNORE, dtype=torch.long)
        targets_BT[:, N:] = content_BN
        return Batch(inputs=inputs_BT, targets=targets_BT)


@dataclass(frozen=True, kw_only=True)
class Memorization:
    """MAD memorization: one fixed key -> value table, learned into the weights.

    Vocab: keys [0, K) with K = (V-1)//2, values [K, V-1), INSERT = V-1. The table maps
    the keys one-to-one onto values and depends only on ``seed`` (never on the batch
    generator), so every batch and both splits ask about the same facts. Layout:
    ``k INSERT k INSERT ...`` with uniform keys; the target at each INSERT is its key's
    value. Values never appear in the inputs, so the context cannot give them away.
    """

    vocab_size: int = 256
    seq_len: int = 32
    seed: int = 12345

    def __post_init__(self) -> None:
        _require(self.vocab_size >= 3, f"memorization needs vocab_size >= 3, got {self.vocab_size}")
        _require(self.seq_len >= 2 and self.seq_len % 2 == 0,
                 f"memorization needs an even seq_len >= 2 (key, INSERT pairs), got {self.seq_len}")

    def table(self) -> torch.Tensor:
        """int64 [K]: the value token of each key token."""
        num_keys = (self.vocab_size - 1) // 2
        num_values = self.vocab_size - 1 - num_keys
        own = torch.Generator().manual_seed(self.seed)
        return num_keys + torch.randperm(num_values, generator=own)[:num_keys]

    def batch(self, *, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        """inputs, targets: int64 [batch_size, seq_len]."""
        g = split_generator(split, generator)
        table_K = self.table()
        keys_BP = torch.randint(0, len(table_K), (batch_size, self.seq_len // 2), generator=g)
        inputs_BT = torch.full((batch_size, self.seq_len), self.vocab_size - 1, dtype=torch.long)
        inputs_BT[:, 0::2] = keys_BP
        targets_BT = torch.full((batch_size, self.seq_len), IGNORE, dtype=torch.long)
        targets_BT[:, 1::2] = table_K[keys_BP]
        return Batch(inputs=inputs_BT, targets=targets_BT)


MAD_TASKS: dict[str, type] = {
    "mad_in_context_recall": InContextRecall,
    "mad_fuzzy_recall": FuzzyRecall,
    "mad_noisy_recall": NoisyRecall,
    "mad_selective_copying": SelectiveCopying,
    "mad_compression": Compression,
    "mad_memorization": Memorization,
}
