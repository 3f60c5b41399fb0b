"""Hostile data files: text is read up to ``max_bytes`` however large the file,
non-regular files are refused, and every data error names the file.

The large files are sparse (a little text, then a hole up to 2 GB), so they
cost no disk; each read runs in a forked child under the same time and
1 GB address-space limit as the hostile study corpus, so reading one whole
fails the test instead of filling memory.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from archsearch.data.documents import file_documents, text_files
from archsearch.data.text import open_text
from archsearch.errors import SpecError
from archsearch.space.training import TextData
from tests.test_hostile_files import in_limits

HOLE = 2 << 30  # a 2 GB file that holds 64 kB of text


def text_data(paths: list[Path], **fields) -> dict:
    return TextData(paths=[str(p) for p in paths], seq_len=16, **fields).model_dump()


def sparse(path: Path, head: bytes) -> Path:
    with path.open("wb") as file:
        file.write(head)
        file.truncate(HOLE)
    return path


def corpus_sizes(data: dict) -> tuple[int, int]:
    source = open_text(data)
    return len(source.splits["train"]), len(source.splits["val"])


def test_a_2gb_text_file_is_read_only_up_to_max_bytes(tmp_path):
    big = sparse(tmp_path / "big.txt", b"the quick brown fox jumps over the lazy dog\n" * 1500)
    status, value = in_limits(corpus_sizes, text_data([big], max_bytes=32_768))
    assert status == "ok", value
    assert sum(value) <= 32_768 + 1  # the text read, and the newline that ends its document


def test_an_endless_jsonl_line_is_refused_naming_file_and_line(tmp_path):
    big = sparse(tmp_path / "rows.jsonl", b'{"text": "one row"}\n{"text": "')
    status, value = in_limits(corpus_sizes, text_data([big], max_bytes=32_768))
    assert status == "raised" and value[0] == "SpecError", value
    assert f"{big}:2: data.paths: line longer than data.max_bytes" in value[1]


def test_an_empty_split_names_the_corpus(tmp_path):
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"\x00\x01" * 5000)  # NUL bytes: skipped as binary, so no text at all
    with pytest.raises(SpecError, match=r"the train split of '.*weights\.bin' has 0 tokens.*skipped as binary"):
        open_text(text_data([binary]))


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "loop"])
def test_a_data_path_that_is_not_a_file_is_refused_by_name(tmp_path, kind):
    """The planner checks paths when it loads a study; the reader checks again when a worker
    opens them, since a path can change between the two."""
    odd = tmp_path / "odd.txt"
    if kind == "fifo":
        os.mkfifo(odd)
    elif kind == "dev_zero":
        odd.symlink_to("/dev/zero")
    else:
        odd.symlink_to("odd.txt")
    expect = {"fifo": "is a named pipe", "dev_zero": "is a device", "loop": "is a symlink loop"}[kind]
    status, value = in_limits(corpus_sizes, text_data([odd]))
    assert status == "raised" and value[0] == "SpecError", value
    assert str(odd) in value[1] and expect in value[1], value


def test_a_jsonl_error_names_file_and_line(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "fine"}\n\n{"text": oops}\n')
    with pytest.raises(SpecError) as caught:
        list(file_documents(text_files([str(rows)])))
    assert (caught.value.path, caught.value.line, caught.value.field) == (str(rows), 3, "data.paths")
    assert str(caught.value).startswith(f"{rows}:3: data.paths: not JSON")
