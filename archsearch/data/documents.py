"""Documents from local files or a Hugging Face ``datasets`` corpus, and the split.

A document is a name and its text. Its name decides its split (a hash, so the
split is stable and never leaks a document across); for a plain text file the
name is its path under the folder named in ``data.paths`` (or, for a file named
itself, its file name), so a corpus copied, moved or reached through a symlink
splits the same; for a row of a jsonl or parquet file that file name and the
row (or the row's ``id_field``), for a hub corpus the dataset and row (or
``id_field``).

Formats by suffix: ``.jsonl`` / ``.ndjson`` (one JSON object a line),
``.parquet``; every other file is one document of text, and binary files
(holding NUL bytes) are skipped. Text is decoded with ``surrogateescape`` so
that byte-level tokens are the file's exact bytes. Only regular files are
read (a pipe or a device named in ``data.paths`` is an error), and never more
than ``max_bytes`` of one file or one jsonl line, whatever its size on disk.
Every error names the file.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from archsearch.errors import SpecError
from archsearch.files import FileKindError, kind_problem, read_head

JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)


@dataclass(frozen=True)
class Document:
    name: str
    text: str


@dataclass(frozen=True)
class SourceFile:
    """A file of a corpus: where it is, and the name its documents go by (where it sits in the corpus)."""

    path: Path
    name: str


def stdlib_files() -> list[SourceFile]:
    """The standard library's .py files, sorted; installed packages excluded."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return _under(root, "*.py", lambda rel: "site-packages" not in rel.parts and "dist-packages" not in rel.parts)


def text_files(paths: list[str]) -> list[SourceFile]:
    """The files named, and every non-hidden file under the folders named."""
    out: list[SourceFile] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            out.extend(_under(path, "*", lambda rel: not any(part.startswith(".") for part in rel.parts)))
        elif path.is_file():
            out.append(SourceFile(path, path.name))
        else:
            raise SpecError(f"text path {kind_problem(path) or 'is not a regular file'}", path=raw,
                            field="data.paths", hint="name text files, or folders of them")
    return out


def _under(root: Path, pattern: str, keep: Callable[[Path], bool]) -> list[SourceFile]:
    """The regular files under ``root`` matching ``pattern`` that ``keep(relative path)`` accepts, sorted."""
    found = sorted((p.relative_to(root), p) for p in root.rglob(pattern))
    return [SourceFile(path, rel.as_posix()) for rel, path in found if keep(rel) and path.is_file()]


def file_documents(files: Iterable[SourceFile], *, text_field: str = "text", id_field: str | None = None,
                   max_bytes: int | None = None) -> Iterator[Document]:
    """Every document of ``files`` in order: one per text file, one per jsonl line or parquet row.

    A text file is read only up to ``max_bytes`` (default: all of it), and a
    file is opened only when the reader asks for its documents, so a reader
    that stops at ``max_bytes`` never touches the rest.
    """
    for file in files:
        path = file.path
        suffix = path.suffix.lower()
        if suffix in JSONL_SUFFIXES:
            yield from _jsonl_documents(file, text_field, id_field, max_bytes)
        elif suffix in PARQUET_SUFFIXES:
            yield from _parquet_documents(file, text_field, id_field)
        else:
            try:
                data = read_head(path, -1 if max_bytes is None else max_bytes)
            except FileKindError as err:
                raise SpecError(f"text file {err}", path=str(path), field="data.paths",
                                hint="name regular text files") from None
            if b"\x00" not in data:  # binary files are not text
                yield Document(file.name, data.decode("utf-8", "surrogateescape"))


def hub_documents(*, name: str, config: str | None = None, split: str = "train",
                  data_files: list[str] | None = None, revision: str | None = None, streaming: bool = True,
                  text_field: str = "text", id_field: str | None = None) -> Iterator[Document]:
    """The rows of a Hugging Face ``datasets`` corpus as documents, in the dataset's order.

    Streaming reads rows as they arrive, so a corpus larger than the disk is
    read only as far as ``max_bytes`` asks. Needs the ``datasets`` package.
    """
    try:
        import datasets
    except ImportError as err:  # optional dependency: fail at use, loudly
        raise ImportError("hub corpora need the 'datasets' package: pip install 'archsearch[hub]'") from err
    kwargs = {"split": split, "streaming": streaming}
    if data_files is not None:
        kwargs["data_files"] = data_files
    if revision is not None:
        kwargs["revision"] = revision
    rows = datasets.load_dataset(name, config, **kwargs)
    label = "/".join(part for part in (name, config, split) if part)
    for index, row in enumerate(rows):
        if text_field not in row:
            raise SpecError(f"hub rows of {label} have no field '{text_field}' (fields: {', '.join(row)})",
                            field="data.text_field", hint="name the text column")
        yield Document(_row_name(label, index, row, id_field), row[text_field])


def is_validation(name: str, fraction: float) -> bool:
    """Whether the document called ``name`` belongs to the validation split (a hash, so stable)."""
    digest = int.from_bytes(hashlib.sha1(name.encode("utf-8", "surrogateescape")).digest()[:4], "big")
    return digest / 2**32 < fraction


def split_documents(documents: Iterable[Document], *, val_fraction: float,
                    max_bytes: int) -> tuple[list[str], list[str]]:
    """Train and validation texts, in document order, reading at most ``max_bytes`` of UTF-8.

    The last document read is cut to fit. Each split's byte count includes one
    separator per document, as the corpus joins them with one.
    """
    splits: tuple[list[str], list[str]] = ([], [])
    total = 0
    for doc in documents:
        data = doc.text.encode("utf-8", "surrogateescape")[: max_bytes - total]
        splits[is_validation(doc.name, val_fraction)].append(data.decode("utf-8", "surrogateescape"))
        total += len(data) + 1
        if total >= max_bytes:
            break
    return splits


def _jsonl_documents(file: SourceFile, text_field: str, id_field: str | None,
                     max_bytes: int | None) -> Iterator[Document]:
    path = file.path
    limit = -1 if max_bytes is None else max_bytes + 1
    with path.open(encoding="utf-8", errors="surrogateescape") as lines:
        # readline with a limit: one endless line costs max_bytes, not the file
        for number, line in enumerate(iter(lambda: lines.readline(limit), ""), start=1):
            if not line.strip():
                continue
            if max_bytes is not None and len(line) > max_bytes:
                raise SpecError(f"line longer than data.max_bytes ({max_bytes:,})", path=str(path), line=number,
                                field="data.paths", hint="jsonl holds one JSON object a line")
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise SpecError(f"not JSON ({err.msg})", path=str(path), line=number, field="data.paths",
                                hint="jsonl holds one JSON object a line") from None
            if not isinstance(row, dict) or text_field not in row:
                raise SpecError(f"no field '{text_field}'", path=str(path), line=number, field="data.text_field",
                                hint="name the field that holds the text")
            yield Document(_row_name(file.name, number, row, id_field), row[text_field])


def _parquet_documents(file: SourceFile, text_field: str, id_field: str | None) -> Iterator[Document]:
    import pyarrow.parquet as pq

    path = file.path
    table = pq.ParquetFile(path)
    names = table.schema_arrow.names
    if text_field not in names:
        raise SpecError(f"no column '{text_field}' (columns: {', '.join(names)})", path=str(path),
                        field="data.text_field", hint="name the text column")
    columns = [text_field] + ([id_field] if id_field and id_field != text_field else [])
    index = 0
    for batch in table.iter_batches(columns=columns, batch_size=1024):
        for row in batch.to_pylist():
            yield Document(_row_name(file.name, index, row, id_field), row[text_field] or "")
            index += 1


def _row_name(where: str, index: int, row: dict, id_field: str | None) -> str:
    if id_field is None:
        return f"{where}#{index}"
    if id_field not in row:
        raise SpecError(f"{where}: row {index} has no field '{id_field}'", field="data.id_field",
                        hint="name a column every row has, or leave id_field out")
    return str(row[id_field])


__all__ = ["Document", "SourceFile", "file_documents", "hub_documents", "is_validation", "split_documents", "stdlib_files",
           "text_files"]
