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


def test_the_split_does_not_depend_on_where_the_corpus_lives(tmp_path):
    """A corpus copied to scratch, or reached through a symlink, splits document for document the same."""
    here = tmp_path / "here" / "corpus"
    here.mkdir(parents=True)
    for i in range(30):
        (here / f"d{i}.txt").write_text(f"<doc {i:03d}>" * 20 + "\n")
    copied = tmp_path / "elsewhere" / "deeper" / "copy"
    copied.parent.mkdir(parents=True)
    copied.symlink_to(here, target_is_directory=True)
    one, two = (ByteCorpus(paths=[str(p)], seq_len=8, val_fraction=0.25) for p in (here, copied))
    for split in ("train", "val"):
        assert torch.equal(one.splits[split], two.splits[split])


def test_a_corpus_under_a_hidden_folder_is_read(tmp_path):
    """Only hidden names inside the corpus are skipped, not a hidden folder that holds it."""
    corpus = tmp_path / ".cache" / "corpus"
    corpus.mkdir(parents=True)
    for i in range(10):
        (corpus / f"d{i}.txt").write_text(f"<doc {i:03d}>" * 20 + "\n")
    (corpus / ".notes.txt").write_text("<hidden>" * 20)
    source = ByteCorpus(paths=[str(corpus)], seq_len=8, val_fraction=0.25)
    text = "".join(bytes(source.splits[s].tolist()).decode() for s in ("train", "val"))
    assert all(f"<doc {i:03d}>" in text for i in range(10)) and "<hidden>" not in text


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
    assert not any("site-packages" in p.path.parts for p in files)
