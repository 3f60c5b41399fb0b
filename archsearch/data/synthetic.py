"""Synthetic tasks made on the fly: MQAR, p-hop induction and Mano, plus the task registry.

Each task is a frozen, keyword-only dataclass following the ``Source`` protocol,
beside a pure function that draws one batch from a ``torch.Generator``; the
function is the spec, the class adds the split. Splits: "train" draws from the
caller's generator, "val" from a generator seeded by one draw of it
(``mad.split_generator``), so one seed never gives the same train and val stream.
Mano's val split is also a different distribution: only the longest expressions.

``TASKS`` names every synthetic task, the MAD suite included, so a study file can
pick one by name; ``task_accuracy`` scores logits on the supervised positions only.

Dimensions: B batch, T time (``seq_len``), D key-value pairs, N symbols of a p-hop
sequence (T - 1), S alphabet size, V vocabulary.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from archsearch.data._base import IGNORE, Batch
from archsearch.data.mad import MAD_TASKS, row_rngs, split_generator


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def task_accuracy(logits_BTV: torch.Tensor, targets_BT: torch.Tensor) -> float:
    """Fraction of supervised positions (targets != IGNORE) where the argmax logit is the target.

    logits [B, T, V], targets int64 [B, T]. NaN when nothing is supervised.
    """
    scored_BT = targets_BT != IGNORE
    if not scored_BT.any():
        return float("nan")
    hits_BT = (logits_BTV.argmax(dim=-1) == targets_BT) & scored_BT
    return hits_BT.sum().item() / scored_BT.sum().item()


def _check_mqar(vocab_size: int, seq_len: int, num_pairs: int, power_a: float) -> None:
    _require(num_pairs >= 1, f"MQAR needs num_pairs >= 1, got {num_pairs}")
    _require(4 * num_pairs <= seq_len,
             f"MQAR needs seq_len >= 4 * num_pairs (2D context tokens, then D queries at even offsets); "
             f"got seq_len={seq_len}, num_pairs={num_pairs}: raise seq_len to {4 * num_pairs} "
             f"or lower num_pairs to {seq_len // 4}")
    _require(vocab_size // 2 - 1 >= num_pairs,
             f"MQAR draws num_pairs={num_pairs} distinct keys from [1, vocab_size // 2), which holds "
             f"{vocab_size // 2 - 1}; raise vocab_size to at least {2 * (num_pairs + 1)} "
             f"(Zoology uses vocab_size > seq_len)")
    _require(power_a > 0, f"MQAR's gap law p(g) ~ g^(a-1) needs power_a > 0, got {power_a}")


def mqar_batch(*, vocab_size: int, seq_len: int, num_pairs: int, power_a: float = 0.01,
               batch_size: int, generator: torch.Generator) -> Batch:
    """Multi-query associative recall (Zoology, https://arxiv.org/abs/2312.04927).

    inputs, targets: int64 [batch_size, seq_len]. Positions [0, 2D) hold
    ``k1 v1 ... kD vD`` (D = num_pairs), keys distinct in [1, V/2), values distinct in
    [V/2, V). The rest is uniform filler from [0, V) with each key placed once more as a
    query at ``2D + 2g``, gaps g distinct with p(g) ~ (g+1)^(a-1), a = power_a. The
    target at a query is its key's value; every other target is IGNORE.
    """
    _check_mqar(vocab_size, seq_len, num_pairs, power_a)
    B, T, D, V = batch_size, seq_len, num_pairs, vocab_size
    half = V // 2
    # The first D of a random permutation: distinct keys and distinct values per row.
    keys_BD = torch.rand(B, half - 1, generator=generator).argsort(dim=1)[:, :D] + 1
    values_BD = torch.rand(B, V - half, generator=generator).argsort(dim=1)[:, :D] + half
    slots = (T - 2 * D) // 2
    # Zoology's power law with a << 1 puts most queries soon after the context, a few far away.
    weight_S = torch.arange(1, slots + 1, dtype=torch.float64) ** (power_a - 1)
    gaps_BD = torch.multinomial(weight_S.expand(B, slots), D, replacement=False, generator=generator)
    query_BD = 2 * D + 2 * gaps_BD

    inputs_BT = torch.randint(0, V, (B, T), generator=generator)
    inputs_BT[:, 0 : 2 * D : 2] = keys_BD
    inputs_BT[:, 1 : 2 * D : 2] = values_BD
    inputs_BT.scatter_(1, query_BD, keys_BD)
    targets_BT = torch.full((B, T), IGNORE, dtype=torch.long)
    targets_BT.scatter_(1, query_BD, values_BD)
    return Batch(inputs=inputs_BT, targets=targets_BT)


@dataclass(frozen=True, kw_only=True)
class MQAR:
    """Multi-query associative recall as a Source; the layout is ``mqar_batch``'s.

    Defaults follow the Zoology sweep. The check is on what the generator needs
    (enough distinct keys, room for the queries) rather than Zoology's stricter
    vocab_size > seq_len, so long-context runs need not grow the vocabulary.
    """

    vocab_size: int = 8192
    seq_len: int = 256
    num_pairs: int = 16
    power_a: float = 0.01

    def __post_init__(self) -> None:
        _check_mqar(self.vocab_size, self.seq_len, self.num_pairs, self.power_a)

    def batch(self, *, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        """inputs, targets: int64 [batch_size, seq_len]; both splits share the distribution."""
        return mqar_batch(vocab_size=self.vocab_size, seq_len=self.seq_len, num_pairs=self.num_pairs,
                          power_a=self.power_a, batch_size=batch_size,
                          generator=split_generator(split, generator))


def phop_targets_ref(symbols: Sequence[int], *, hops: int) -> list[int | None]:
    """The spec: the hop_k symbol at each position of one sequence, None for ⊥. O(T·k).

    Sanford, Hsu, Telgarsky 2024, https://arxiv.org/abs/2402.09268. With
    find(p) = 1 + max{q < p : X_q = X_p} (⊥ when no such q), hop_0(i) = i and
    hop_j(i) = find(hop_{j-1}(i)); the answer at i is X[hop_k(i)], or ⊥ once any hop is ⊥.
    """
    previous: list[int | None] = []  # previous[p] = max{q < p : X_q = X_p}
    last_seen: dict[int, int] = {}
    for p, symbol in enumerate(symbols):
        previous.append(last_seen.get(symbol))
        last_seen[symbol] = p
    answers: list[int | None] = []
    for i in range(len(symbols)):
        position: int | None = i
        for _ in range(hops):
            q = previous[position]
            position = None if q is None else q + 1
            if position is None:
                break
        answers.append(None if position is None else symbols[position])
    return answers


def phop_targets(symbols_BN: torch.Tensor, hops_B: torch.Tensor, *, none_token: int) -> torch.Tensor:
    """Batched ``phop_targets_ref``: int64 [B, N] symbols, [B] hop counts -> int64 [B, N] answers.

    ⊥ becomes ``none_token``. Same result as the reference, one gather per hop.
    """
    B, N = symbols_BN.shape
    position_N = torch.arange(N)
    num_symbols = int(symbols_BN.max()) + 1 if symbols_BN.numel() else 1
    # Last position holding each symbol up to p (a running max), then shifted so p sees only q < p.
    seen_BNS = torch.where(F.one_hot(symbols_BN, num_symbols).bool(), position_N[None, :, None], -1)
    last_BNS = seen_BNS.cummax(dim=1).values
    before_BNS = torch.cat([torch.full_like(last_BNS[:, :1], -1), last_BNS[:, :-1]], dim=1)
    previous_BN = before_BNS.gather(2, symbols_BN[..., None]).squeeze(-1)

    position_BN = position_N.expand(B, N).clone()
    alive_BN = torch.ones(B, N, dtype=torch.bool)
    for step in range(int(hops_B.max()) if B else 0):
        hopping_B1 = (hops_B > step)[:, None]
        q_BN = previous_BN.gather(1, position_BN)
        alive_BN &= (q_BN >= 0) | ~hopping_B1
        position_BN = torch.where(hopping_B1 & (q_BN >= 0), q_BN + 1, position_BN)
    return torch.where(alive_BN, symbols_BN.gather(1, position_BN), none_token)


def _check_phop(num_symbols: int, seq_len: int, min_hops: int, max_hops: int) -> None:
    _require(num_symbols >= 2, f"p-hop needs num_symbols >= 2 (adjacent symbols differ), got {num_symbols}")
    _require(seq_len >= 2, f"p-hop needs seq_len >= 2 (hop token, then symbols), got {seq_len}")
    _require(0 <= min_hops <= max_hops, f"p-hop needs 0 <= min_hops <= max_hops, got {min_hops}, {max_hops}")


def phop_batch(*, num_symbols: int, seq_len: int, min_hops: int, max_hops: int, last_only: bool = False,
               batch_size: int, generator: torch.Generator) -> Batch:
    """p-hop induction: inputs, targets int64 [batch_size, seq_len].

    Vocab (S = num_symbols): symbols [0, S), NONE (⊥) = S, hop token ⟨k⟩ = S + 1 + k - min_hops.
    Row: k ~ U{min_hops..max_hops}; symbols X of length T - 1, X_0 uniform and each
    next one uniform over the other S - 1. inputs = [⟨k⟩, X_0 .. X_{T-2}], targets =
    [IGNORE, answer_k(0) .. answer_k(T-2)] (see ``phop_targets_ref``). With
    ``last_only`` only the final position is scored (the Saunshi et al. variant).
    """
    _check_phop(num_symbols, seq_len, min_hops, max_hops)
    B, N = batch_size, seq_len - 1
    first_B1 = torch.randint(0, num_symbols, (B, 1), generator=generator)
    # A nonzero shift mod S is uniform over the S - 1 symbols that differ from the last one.
    shifts_BN = torch.randint(1, num_symbols, (B, N), generator=generator)
    shifts_BN[:, 0] = 0
    symbols_BN = (first_B1 + shifts_BN.cumsum(dim=1)) % num_symbols
    hops_B = torch.randint(min_hops, max_hops + 1, (B,), generator=generator)

    answers_BN = phop_targets(symbols_BN, hops_B, none_token=num_symbols)
    hop_token_B1 = (num_symbols + 1 + hops_B - min_hops)[:, None]
    inputs_BT = torch.cat([hop_token_B1, symbols_BN], dim=1)
    # The hop token is an instruction, not a question: nothing is scored there.
    targets_BT = torch.cat([torch.full((B, 1), IGNORE), answers_BN], dim=1)
    if last_only:
        targets_BT[:, :-1] = IGNORE
    return Batch(inputs=inputs_BT, targets=targets_BT)


@dataclass(frozen=True, kw_only=True)
class PHop:
    """p-hop induction as a Source; layout and vocab are ``phop_batch``'s.

    Defaults are the reference run (hop-induction-heads ``width4-depth3``). Choice: the
    reference scores a BLANK target at the hop token; here it is IGNORE, so the vocab
    has no BLANK and is S + 1 + (max_hops - min_hops + 1). Both splits share the
    distribution.
    """

    num_symbols: int = 4
    seq_len: int = 100
    min_hops: int = 0
    max_hops: int = 16
    last_only: bool = False

    def __post_init__(self) -> None:
        _check_phop(self.num_symbols, self.seq_len, self.min_hops, self.max_hops)

    @property
    def none_token(self) -> int:
        return self.num_symbols

    def hop_token(self, hops: int) -> int:
        """The token that opens a row asking for ``hops`` hops."""
        return self.num_symbols + 1 + hops - self.min_hops

    @property
    def vocab_size(self) -> int:
        return self.num_symbols + 1 + self.max_hops - self.min_hops + 1

    def batch(self, *, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        """inputs, targets: int64 [batch_size, seq_len]."""
        return phop_batch(num_symbols=self.num_symbols, seq_len=self.seq_len, min_hops=self.min_hops,
                          max_hops=self.max_hops, last_only=self.last_only, batch_size=batch_size,
                          generator=split_generator(split, generator))


OPERATORS = ("+", "-", "*")


def _apply(operator: int, left: int, right: int, modulus: int) -> int:
    if operator == 0:
        return (left + right) % modulus
    if operator == 1:
        return (left - right) % modulus
    return (left * right) % modulus


def mano_value(prefix: Sequence[int], *, modulus: int) -> int:
    """Value mod ``modulus`` of a prefix expression: a token t < modulus is the number t,
    ``modulus + i`` is ``OPERATORS[i]``. Raises ValueError if the expression is malformed."""
    stack: list[int] = []
    # Right to left, every operator finds its left operand on top of the stack.
    for token in reversed(prefix):
        if token < modulus:
            stack.append(token)
            continue
        if len(stack) < 2:
            raise ValueError(f"operator {token} lacks operands in {list(prefix)}")
        left, right = stack.pop(), stack.pop()
        stack.append(_apply(token - modulus, left, right, modulus))
    if len(stack) != 1:
        raise ValueError(f"{list(prefix)} is not one prefix expression")
    return stack[0]


def _random_expression(num_ops: int, modulus: int, rng: random.Random) -> tuple[list[int], int]:
    """A random binary tree with ``num_ops`` operators: prefix tokens and value."""
    if num_ops == 0:
        leaf = rng.randrange(modulus)
        return [leaf], leaf
    operator = rng.randrange(len(OPERATORS))
    # Mano's tree law: the left subtree takes U{0..num_ops-1} of the remaining operators.
    left_ops = rng.randrange(num_ops)
    left, left_value = _random_expression(left_ops, modulus, rng)
    right, right_value = _random_expression(num_ops - 1 - left_ops, modulus, rng)
    return [modulus + operator, *left, *right], _apply(operator, left_value, right_value, modulus)


def mano_batch(*, max_ops: int, modulus: int = 23, min_ops: int = 1,
               batch_size: int, generator: torch.Generator) -> Batch:
    """Mano (Physics of LMs 4.1, https://arxiv.org/abs/2512.17351): inputs, targets [batch_size, 2L + 4].

    Vocab (M = modulus, L = max_ops): numbers [0, M); operators +, -, * = M, M+1, M+2;
    BOS = M+3; PAD = M+4; length token ⟨l⟩ = M+4+l and answer marker ⟨=l⟩ = M+4+L+l for
    l in 1..L. Row with l ~ U{min_ops..max_ops} operators: [BOS, ⟨l⟩, prefix expression
    (2l+1 tokens), ⟨=l⟩], right-padded with PAD. The only target is the value mod M,
    at the ⟨=l⟩ position.
    """
    _require(1 <= min_ops <= max_ops, f"Mano needs 1 <= min_ops <= max_ops, got {min_ops}, {max_ops}")
    _require(modulus >= 2, f"Mano needs modulus >= 2, got {modulus}")
    T = 2 * max_ops + 4
    bos, pad = modulus + 3, modulus + 4
    inputs, targets = [], []
    for rng in row_rngs(batch_size, generator):
        num_ops = rng.randint(min_ops, max_ops)
        prefix, value = _random_expression(num_ops, modulus, rng)
        row = [bos, pad + num_ops, *prefix, pad + max_ops + num_ops]
        inputs.append(row + [pad] * (T - len(row)))
        targets.append([IGNORE] * (len(row) - 1) + [value] + [IGNORE] * (T - len(row)))
    return Batch(inputs=torch.tensor(inputs, dtype=torch.long).view(batch_size, T),
                 targets=torch.tensor(targets, dtype=torch.long).view(batch_size, T))


@dataclass(frozen=True, kw_only=True)
class Mano:
    """Mano as a Source: "train" has 1..max_ops operators, "val" exactly max_ops.

    Layout and vocab are ``mano_batch``'s. Choices: operators are Mano's ``asm`` set
    (+, -, *); the reference's random "knowledge augmentation" (alias operator ids,
    +0/1 on the length tokens, two BOS ids) is left out, as its author says it hardly
    matters; one expression per row, padded, rather than packed.
    """

    max_ops: int = 10
    modulus: int = 23

    def __post_init__(self) -> None:
        _require(self.max_ops >= 1, f"Mano needs max_ops >= 1, got {self.max_ops}")
        _require(self.modulus >= 2, f"Mano needs modulus >= 2, got {self.modulus}")

    @property
    def vocab_size(self) -> int:
        return self.modulus + 5 + 2 * self.max_ops

    @property
    def seq_len(self) -> int:
        return 2 * self.max_ops + 4

    def batch(self, *, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        """inputs, targets: int64 [batch_size, 2 * max_ops + 4]."""
        g = split_generator(split, generator)
        min_ops = self.max_ops if split == "val" else 1
        return mano_batch(max_ops=self.max_ops, modulus=self.modulus, min_ops=min_ops,
                          batch_size=batch_size, generator=g)


TASKS: dict[str, type] = {"mqar": MQAR, "phop": PHop, "mano": Mano, **MAD_TASKS}
