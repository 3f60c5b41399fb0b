"""Token files on disk, memory-mapped, keyed by what made them.

A corpus is tokenized once: its token streams (``train.bin``, ``val.bin``),
``meta.json`` and, for BPE, ``tokenizer.json`` land in
``<cache_dir>/<key>/``, where the key hashes the corpus identity (files with
their sizes and modification times, or the hub dataset and revision), the
split, and the tokenizer. Every later trial, in this process or another, maps
the same files. The folder is built under a temporary name and renamed into
place, so a reader never sees half a cache; a lock file keeps parallel trials
(Ray workers on one machine) from tokenizing the same corpus twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

FORMAT_VERSION = 2
SPLITS = ("train", "val")


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir``, else ``$ARCHSEARCH_CACHE``, else ``~/.cache/archsearch``; the ``tokens`` folder in it."""
    root = cache_dir or os.environ.get("ARCHSEARCH_CACHE") or Path.home() / ".cache" / "archsearch"
    return Path(root).expanduser() / "tokens"


def cache_key(identity: dict) -> str:
    """A short stable hash of a JSON-able description of a corpus and its tokenizer."""
    blob = json.dumps({"format": FORMAT_VERSION, **identity}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def load_or_build(root: Path, key: str, build: Callable[[Path], dict]) -> Path:
    """The folder ``root / key``, built first by ``build(tmp_folder) -> meta`` if missing.

    ``build`` writes its files into the temporary folder it is given and returns
    what ``meta.json`` should hold beside them.
    """
    final = root / key
    if (final / "meta.json").exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f"{key}.lock"):
        if (final / "meta.json").exists():  # another process built it while we waited
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
        try:
            tmp.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
            meta = build(tmp)
            _write_json(tmp / "meta.json", meta)
            try:
                os.rename(tmp, final)
            except OSError:
                if not (final / "meta.json").exists():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)  # another process won the race
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def write_tokens(path: Path, tokens: np.ndarray) -> dict:
    """Write ``tokens`` raw to ``path``; returns the dtype and length for ``meta.json``."""
    with path.open("wb") as out:
        tokens.tofile(out)
        out.flush()
        os.fsync(out.fileno())
    return {"dtype": tokens.dtype.name, "length": int(tokens.size)}


def read_tokens(folder: Path, split: str) -> np.ndarray:
    """The ``split`` token stream of a cache folder, memory-mapped read-only: [N] of the stored dtype."""
    info = json.loads((folder / "meta.json").read_text())["splits"][split]
    if info["length"] == 0:
        return np.zeros(0, dtype=info["dtype"])
    return np.memmap(folder / f"{split}.bin", dtype=info["dtype"], mode="r", shape=(info["length"],))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # no POSIX locks (Windows): the atomic rename still keeps the cache whole
        yield
        return
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=1, sort_keys=True))


__all__ = ["cache_key", "cache_root", "load_or_build", "read_tokens", "write_tokens"]
