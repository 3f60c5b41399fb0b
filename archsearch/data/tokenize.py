"""Tokenizers: bytes, or a byte-level BPE trained locally with the ``tokenizers`` library.

Both turn a list of documents into one token stream with a separator after
every document (a newline byte for bytes, ``<|endoftext|>`` for BPE), and
turn ids back into text. The BPE is trained on the train split only, so the
validation text is never seen, and saved as ``tokenizer.json`` beside the
token cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from archsearch.space.training import BYTE_VOCAB

END_OF_TEXT = "<|endoftext|>"
_ENCODE_CHUNK = 1024  # documents per encode_batch call: bounds memory, keeps the Rust threads busy


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every id below ``vocab_size``."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype)
    raise ValueError(f"vocab_size {vocab_size} does not fit in 32 bits")


class ByteTokenizer:
    """UTF-8 bytes as tokens; text decoded with ``surrogateescape`` round-trips exactly."""

    vocab_size = BYTE_VOCAB
    separator = ord("\n")

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8", "surrogateescape"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", "replace")

    def encode_documents(self, texts: Sequence[str]) -> np.ndarray:
        """uint8 [N]: every document's bytes followed by a newline."""
        out = bytearray()
        for text in texts:
            out += text.encode("utf-8", "surrogateescape")
            out.append(self.separator)
        return np.frombuffer(bytes(out), dtype=np.uint8)


class BpeTokenizer:
    """A byte-level BPE (GPT-2 style: any text encodes, nothing is unknown).

    ``vocab_size`` is the configured size, the model's vocabulary; a small
    corpus may run out of merges first, so the trained tokenizer can be smaller.
    """

    def __init__(self, tokenizer, *, vocab_size: int):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.separator = tokenizer.token_to_id(END_OF_TEXT)

    @classmethod
    def train(cls, texts: Sequence[str], *, vocab_size: int) -> BpeTokenizer:
        """Train on ``texts`` (the train split) to at most ``vocab_size`` tokens, ``<|endoftext|>`` = 0."""
        tokenizers = _tokenizers()
        tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
        tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = tokenizers.decoders.ByteLevel()
        trainer = tokenizers.trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=[END_OF_TEXT], show_progress=False,
            initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train_from_iterator((_valid_utf8(t) for t in texts), trainer=trainer, length=len(texts))
        return cls(tokenizer, vocab_size=vocab_size)

    @classmethod
    def load(cls, path: str | Path, *, vocab_size: int) -> BpeTokenizer:
        return cls(_tokenizers().Tokenizer.from_file(str(path)), vocab_size=vocab_size)

    def save(self, path: str | Path) -> None:
        self.tokenizer.save(str(path))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(_valid_utf8(text)).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids])

    def encode_documents(self, texts: Sequence[str]) -> np.ndarray:
        """[N] ids in the smallest dtype for ``vocab_size``: each document, then ``<|endoftext|>``."""
        dtype = token_dtype(self.vocab_size)
        pieces = []
        for start in range(0, len(texts), _ENCODE_CHUNK):
            chunk = [_valid_utf8(t) for t in texts[start:start + _ENCODE_CHUNK]]
            for encoding in self.tokenizer.encode_batch(chunk):
                pieces.append(np.asarray(encoding.ids + [self.separator], dtype=dtype))
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=dtype)


def _valid_utf8(text: str) -> str:
    # Files are read with surrogateescape (exact bytes); the Rust side takes only valid UTF-8.
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _tokenizers():
    try:
        import tokenizers
    except ImportError as err:  # optional dependency: fail at use, loudly
        raise ImportError("tokenizer: bpe needs the 'tokenizers' package: pip install tokenizers") from err
    return tokenizers


__all__ = ["BYTE_VOCAB", "END_OF_TEXT", "BpeTokenizer", "ByteTokenizer", "token_dtype"]
