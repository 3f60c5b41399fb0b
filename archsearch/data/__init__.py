"""Data sources: byte-level text corpora and synthetic tasks, one protocol."""

from __future__ import annotations

from archsearch.data._base import IGNORE, Batch, Source


def make_source(data: dict) -> Source:
    """The Source a study's (dumped) data config describes."""
    kind = data["kind"]
    if kind == "text":
        from archsearch.data.text import ByteCorpus

        return ByteCorpus(paths=data["paths"], seq_len=data["seq_len"],
                          val_fraction=data["val_fraction"], max_bytes=data["max_bytes"])
    if kind == "mqar":
        from archsearch.data.synthetic import MQAR

        return MQAR(seq_len=data["seq_len"], vocab_size=data["vocab_size"], num_pairs=data["num_pairs"])
    raise ValueError(f"unknown data kind {kind!r}")


__all__ = ["IGNORE", "Batch", "Source", "make_source"]
