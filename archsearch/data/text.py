"""Byte-level text corpora from local files, split by document.

With no paths given the corpus is the installed Python standard library's own
source: present on every machine that can run archsearch, so the quickstart
needs no download. Documents (files) go to train or validation by a hash of
their name, so the split never leaks a document across and never changes.
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import torch

from archsearch.data._base import Batch, Source
from archsearch.errors import SpecError

BYTE_VOCAB = 256


def stdlib_files() -> list[Path]:
    """The standard library's .py files, sorted; installed packages excluded."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py")
                  if "site-packages" not in p.parts and "dist-packages" not in p.parts)


def text_files(paths: list[str]) -> list[Path]:
    """The files named, and every non-hidden file under the folders named."""
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            out.extend(sorted(p for p in path.rglob("*")
                              if p.is_file() and not any(part.startswith(".") for part in p.parts)))
        elif path.is_file():
            out.append(path)
        else:
            raise SpecError(f"text path '{raw}' does not exist", field="data.paths", hint="check the path")
    return out


class ByteCorpus:
    """A Source over byte-level text: random windows of ``seq_len + 1`` bytes."""

    vocab_size = BYTE_VOCAB

    def __init__(self, *, paths: list[str] | None = None, seq_len: int = 128,
                 val_fraction: float = 0.1, max_bytes: int = 4_000_000):
        files = stdlib_files() if paths is None else text_files(paths)
        train, val = bytearray(), bytearray()
        for path in files:
            data = path.read_bytes()
            if b"\x00" in data:  # binary files are not text
                continue
            data = data[: max_bytes - len(train) - len(val)]
            target = val if _is_validation(str(path), val_fraction) else train
            target += data + b"\n"
            if len(train) + len(val) >= max_bytes:
                break
        if not val or not train:  # one document, or an unlucky hash: split by position
            whole = train + val
            cut = int(len(whole) * (1 - val_fraction))
            train, val = whole[:cut], whole[cut:]
        self.seq_len = seq_len
        self.splits = {"train": _as_tensor(train), "val": _as_tensor(val)}
        for split, tokens in self.splits.items():
            if len(tokens) <= seq_len + 1:
                raise SpecError(f"the {split} split has {len(tokens)} bytes, fewer than seq_len + 2",
                                field="data", hint="add more text, or lower data.seq_len or data.val_fraction")

    def batch(self, *, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        tokens = self.splits[split]
        starts_B = torch.randint(0, len(tokens) - self.seq_len - 1, (batch_size,), generator=generator)
        offsets_T = torch.arange(self.seq_len + 1)
        window_BT = tokens[starts_B[:, None] + offsets_T].long()
        return Batch(inputs=window_BT[:, :-1], targets=window_BT[:, 1:])


def _is_validation(name: str, fraction: float) -> bool:
    digest = int.from_bytes(hashlib.sha1(name.encode()).digest()[:4], "big")
    return digest / 2**32 < fraction


def _as_tensor(data: bytearray) -> torch.Tensor:
    return torch.frombuffer(data, dtype=torch.uint8).clone() if data else torch.zeros(0, dtype=torch.uint8)


__all__ = ["ByteCorpus", "Source", "stdlib_files", "text_files"]
