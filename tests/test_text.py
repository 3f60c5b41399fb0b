"""Byte-level corpora: document-level split, seeded windows, clear errors."""

from __future__ import annotations

import pytest
import torch

from archsearch.data.text import ByteCorpus, stdlib_files
from archsearch.errors import SpecError


def test_windows_are_next_byte_pairs(corpus):
    source = ByteCorpus(paths=[str(corpus)], seq_len=24)
    batch = source.batch(split="train", batch_size=5, generator=torch.Generator().manual_seed(0))
    assert batch.inputs.shape == batch.targets.shape == (5, 24)
    assert torch.equal(batch.inputs[:, 1:], batch.targets[:, :-1])
    assert batch.inputs.dtype == torch.int64 and int(batch.inputs.max()) < 256


def test_no_document_lands_in_both_splits(tmp_path):
    for i in range(40):
        (tmp_path / f"d{i}.txt").write_text(f"<doc {i:03d}>" * 20 + "\n")
    source = ByteCorpus(paths=[str(tmp_path)], seq_len=8, val_fraction=0.25)
    train, val = (bytes(source.splits[s].tolist()).decode() for s in ("train", "val"))
    for i in range(40):
        tag = f"<doc {i:03d}>"
        assert (tag in train) != (tag in val)
    assert 0 < len(val) < len(train)


def test_same_generator_seed_same_batch(corpus):
    source = ByteCorpus(paths=[str(corpus)], seq_len=16)
    one = source.batch(split="val", batch_size=3, generator=torch.Generator().manual_seed(7))
    two = source.batch(split="val", batch_size=3, generator=torch.Generator().manual_seed(7))
    assert torch.equal(one.inputs, two.inputs)


def test_too_little_text_says_what_to_change(tmp_path):
    (tmp_path / "tiny.txt").write_text("hello")
    with pytest.raises(SpecError, match="seq_len"):
        ByteCorpus(paths=[str(tmp_path)], seq_len=64)


def test_missing_path_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        ByteCorpus(paths=[str(tmp_path / "nope")])


def test_the_default_corpus_is_the_installed_stdlib():
    files = stdlib_files()
    assert any(p.name == "os.py" for p in files)
    assert not any("site-packages" in p.parts for p in files)
