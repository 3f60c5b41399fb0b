"""Text corpora as token streams: documents -> split -> tokens -> random windows.

With no paths given the corpus is the installed Python standard library's own
source: present on every machine that can run archsearch, so the quickstart
needs no download. Documents go to train or validation by a hash of their name
(``documents.is_validation``), so the split never leaks a document across and
never changes. Every corpus, the stdlib's included, is tokenized once per
machine into memory-mapped files (``cache.py``), and a process keeps the
sources it opened, so a worker's later trials on the same corpus open nothing.
"""

from __future__ import annotations

import sys
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch

from archsearch.data import cache
from archsearch.data._base import Batch, Source
from archsearch.data.documents import (
    Document,
    file_documents,
    hub_documents,
    split_documents,
    stdlib_files,
    text_files,
)
from archsearch.data.tokenize import BYTE_VOCAB, BpeTokenizer, ByteTokenizer
from archsearch.errors import SpecError
from archsearch.space.training import DEFAULT_BPE_VOCAB


class TokenCorpus:
    """A Source over token streams: random windows of ``seq_len + 1`` tokens.

    ``splits`` maps "train" and "val" to 1-d token arrays (tensors, numpy
    arrays or memory maps); ``tokenizer`` turns ids back into text; ``label``
    names the corpus (its files) in errors.
    """

    def __init__(self, *, splits: dict, seq_len: int, vocab_size: int, tokenizer=None, label: str = "the corpus"):
        self.seq_len = seq_len
        self.vocab_size = vocab_size
        self.tokenizer = tokenizer
        self.splits = splits
        for split, tokens in splits.items():
            if len(tokens) <= seq_len + 1:
                raise SpecError(f"the {split} split of {label} has {len(tokens)} tokens, fewer than seq_len + 2 "
                                f"= {seq_len + 2}", field="data",
                                hint="add more text (files holding NUL bytes are skipped as binary), "
                                     "or lower data.seq_len or data.val_fraction")

    def batch(self, *, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        tokens = self.splits[split]
        starts_B = torch.randint(0, len(tokens) - self.seq_len - 1, (batch_size,), generator=generator)
        offsets_T = torch.arange(self.seq_len + 1)
        return _windows(tokens, starts_B[:, None] + offsets_T)

    def stream_batch(self, *, split: str, batch_size: int, step: int) -> Batch:
        """Batch ``step`` of consecutive streams, for models that carry a state across batches.

        The split is cut into ``batch_size`` equal lanes; row b of batch s is
        the s-th window of ``seq_len`` tokens of lane b, so it continues row b
        of batch s - 1 exactly (truncated backpropagation through time, as in
        Zaremba et al., https://arxiv.org/abs/1409.2329). A lane that runs out
        starts again from its beginning.
        """
        tokens = self.splits[split]
        lane = (len(tokens) - 1) // batch_size
        windows = lane // self.seq_len
        if windows < 1:
            raise SpecError(f"the {split} split has {len(tokens)} tokens, too few for {batch_size} streams of "
                            f"seq_len {self.seq_len}", field="data",
                            hint="add more text, or lower recipe.batch_size or data.seq_len")
        starts_B = torch.arange(batch_size) * lane + (step % windows) * self.seq_len
        return _windows(tokens, starts_B[:, None] + torch.arange(self.seq_len + 1))


def _windows(tokens, index_BT: torch.Tensor) -> Batch:
    """Next-token pairs from windows of ``seq_len + 1`` token positions, [B, T + 1]."""
    if isinstance(tokens, torch.Tensor):
        window_BT = tokens[index_BT].long()
    else:  # a memory map: numpy reads only the pages the windows touch
        window_BT = torch.from_numpy(np.asarray(tokens[index_BT.numpy()], dtype=np.int64))
    return Batch(inputs=window_BT[:, :-1], targets=window_BT[:, 1:])


class ByteCorpus(TokenCorpus):
    """Byte-level text from files (or the stdlib), held in memory as uint8 tensors."""

    def __init__(self, *, paths: list[str] | None = None, seq_len: int = 128,
                 val_fraction: float = 0.1, max_bytes: int = 4_000_000):
        files = stdlib_files() if paths is None else text_files(paths)
        splits = _byte_splits(file_documents(files, max_bytes=max_bytes), val_fraction=val_fraction,
                              max_bytes=max_bytes)
        super().__init__(splits=splits, seq_len=seq_len, vocab_size=BYTE_VOCAB, tokenizer=ByteTokenizer(),
                         label=corpus_label({"paths": paths}))


# Sources this process opened, by cache folder and seq_len: a Ray worker keeps
# them between trials. The folder's key hashes the corpus's identity, so an
# edited file names another folder and is never served stale.
_OPENED: dict[tuple[str, int], TokenCorpus] = {}


def open_text(data: dict) -> TokenCorpus:
    """The Source a dumped ``TextData`` describes: its tokens from the cache, tokenized first if missing."""
    folder = cache.load_or_build(cache.cache_root(data.get("cache_dir")), cache.cache_key(corpus_identity(data)),
                                 lambda tmp: _build(data, tmp))
    opened = (str(folder), data["seq_len"])
    if opened not in _OPENED:
        _OPENED[opened] = _open_folder(folder, data)
    return _OPENED[opened]


def _open_folder(folder: Path, data: dict) -> TokenCorpus:
    splits = {split: cache.read_tokens(folder, split) for split in cache.SPLITS}
    if data.get("tokenizer", "byte") == "bpe":
        vocab_size = data.get("vocab_size") or DEFAULT_BPE_VOCAB
        tokenizer = BpeTokenizer.load(folder / "tokenizer.json", vocab_size=vocab_size)
    else:
        tokenizer, vocab_size = ByteTokenizer(), BYTE_VOCAB
    return TokenCorpus(splits=splits, seq_len=data["seq_len"], vocab_size=vocab_size, tokenizer=tokenizer,
                       label=corpus_label(data))


def corpus_label(data: dict) -> str:
    """The corpus of a dumped ``TextData`` in words, for errors: its paths, hub dataset, or the stdlib."""
    if data.get("hub") is not None:
        return f"hub dataset '{data['hub']['name']}'"
    paths = data.get("paths")
    if paths is None:
        return "the Python standard library's source"
    shown = ", ".join(f"'{p}'" for p in paths[:3])
    return shown + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


def corpus_identity(data: dict) -> dict:
    """What determines a corpus's tokens: its documents (files with size and mtime, or the hub
    dataset), the split, and the tokenizer. The cache key hashes this; seq_len is not in it.

    The stdlib is named by its folder and the exact Python build, not file by
    file: an installed standard library does not change, and walking its
    ~1,800 files costs as much as reading them."""
    keys = ("text_field", "id_field", "val_fraction", "max_bytes", "tokenizer", "vocab_size")
    identity = {key: data.get(key) for key in keys}
    if data.get("hub") is not None:
        identity["hub"] = data["hub"]
        local = [Path(f) for f in data["hub"].get("data_files") or [] if Path(f).is_file()]
        identity["files"] = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in local]
    elif data.get("paths") is None:
        identity["stdlib"] = (sysconfig.get_paths()["stdlib"], sys.version)
    else:
        files = text_files(data["paths"])
        identity["files"] = [(str(f.path.resolve()), f.name, f.path.stat().st_size, f.path.stat().st_mtime_ns)
                             for f in files]
    return identity


def documents(data: dict) -> Iterator[Document]:
    """The documents of a dumped ``TextData``, in order (lazily: hub corpora stream)."""
    common = dict(text_field=data.get("text_field", "text"), id_field=data.get("id_field"))
    if data.get("hub") is not None:
        hub = data["hub"]
        return hub_documents(name=hub["name"], config=hub.get("config"), split=hub.get("split", "train"),
                             data_files=hub.get("data_files"), revision=hub.get("revision"),
                             streaming=hub.get("streaming", True), **common)
    files = stdlib_files() if data.get("paths") is None else text_files(data["paths"])
    return file_documents(files, max_bytes=data.get("max_bytes"), **common)


def _byte_splits(docs: Iterable[Document], *, val_fraction: float, max_bytes: int) -> dict[str, torch.Tensor]:
    """uint8 tensors of the train and validation bytes, each document followed by a newline."""
    texts = split_documents(docs, val_fraction=val_fraction, max_bytes=max_bytes)
    streams = _by_position([ByteTokenizer().encode_documents(t) for t in texts], val_fraction)
    return {split: torch.from_numpy(tokens.copy()) for split, tokens in zip(cache.SPLITS, streams)}


def _build(data: dict, folder: Path) -> dict:
    """Read, split and tokenize the corpus into ``folder``; the meta that describes it."""
    train, val = split_documents(documents(data), val_fraction=data["val_fraction"], max_bytes=data["max_bytes"])
    if data.get("tokenizer", "byte") == "bpe":
        vocab_size = data.get("vocab_size") or DEFAULT_BPE_VOCAB
        # Train on the train split only; with one document (split by position below) on its first part.
        fit_on = train if train and val else _head("\n".join(train + val), 1 - data["val_fraction"])
        tokenizer = BpeTokenizer.train(fit_on, vocab_size=vocab_size)
        tokenizer.save(folder / "tokenizer.json")
    else:
        tokenizer = ByteTokenizer()
    streams = _by_position([tokenizer.encode_documents(texts) for texts in (train, val)], data["val_fraction"])
    splits = {split: cache.write_tokens(folder / f"{split}.bin", tokens)
              for split, tokens in zip(cache.SPLITS, streams)}
    return {"splits": splits, "documents": {"train": len(train), "val": len(val)},
            "identity": corpus_identity(data)}


def _by_position(streams: list[np.ndarray], val_fraction: float) -> list[np.ndarray]:
    """The two streams, or, when one is empty (one document, or an unlucky hash), the whole cut by position."""
    train, val = streams
    if len(train) and len(val):
        return streams
    whole = np.concatenate([train, val])
    cut = int(len(whole) * (1 - val_fraction))
    return [whole[:cut], whole[cut:]]


def _head(text: str, fraction: float) -> list[str]:
    return [text[: int(len(text) * fraction)]]


__all__ = ["ByteCorpus", "Document", "Source", "TokenCorpus", "corpus_identity", "documents", "open_text",
           "stdlib_files", "text_files"]
