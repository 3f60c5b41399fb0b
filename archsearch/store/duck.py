"""The results store: studies, trials and per-evaluation metrics in DuckDB.

One row per trial, keyed by the trial id (a hash of spec, recipe, data and
seed), so a trial finished by any study is never trained again. A row whose
``same_as`` names another trial was not trained itself: another arm planned
the same model, and the row holds that trial's result. A study links to its
trials through ``study_trials``. Reads come back as Arrow tables. Torch-free.

This module holds ``Store`` itself: opening the file for each piece of work,
transactions, the schema check, and a DuckDB error the file or its disk caused
turned into one line. Its tables are in ``schema``; its reads and writes are
mixins, ``reads``, ``writes``, ``side`` and ``live``.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from archsearch.errors import StoreError, StoreFullError
from archsearch.files import kind_problem
from archsearch.store.live import LiveTables
from archsearch.store.reads import TrialReads
from archsearch.store.schema import MIGRATIONS, SCHEMA, SCHEMA_VERSION
from archsearch.store.side import SideTables
from archsearch.store.writes import TrialWrites


class Store(TrialWrites, TrialReads, SideTables, LiveTables):
    """A DuckDB file of results. Open with ``open_store(path)``.

    DuckDB lets one process write a file and no other process read it while
    it does, so the store never keeps a connection: every read and every
    write transaction opens the file, does its work and closes it again
    (about 15 ms here). A reader then sees a running study at most one write
    behind, and a lock held by a short write on the other side is waited out
    (up to ``lock_wait_s``) instead of failing. Two stores in one process
    (read-only and read-write) never clash for the same reason.
    """

    def __init__(self, path: str | Path, *, read_only: bool = False, lock_wait_s: float | None = None):
        self.path = str(path)
        self.file = os.path.realpath(path)
        self.read_only = read_only
        # A writer waits longer: a reader's export may hold the file for seconds.
        self.lock_wait_s = lock_wait_s if lock_wait_s is not None else (20.0 if read_only else 120.0)
        with self._connect() as con:
            tables = {row[0] for row in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
            if not read_only and not tables:  # a new store
                con.execute(SCHEMA)
                con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
            self._check_version(con)

    @contextmanager
    def _connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection for one piece of work, closed after it. A DuckDB error the file or its
        disk caused (damaged, truncated, a full disk) becomes one StoreError naming the store."""
        deadline = time.monotonic() + self.lock_wait_s
        delay = 0.005
        while True:
            try:
                # the real path: DuckDB keeps its write-ahead log beside the name it opens, and a
                # symlink's name must not give one file two logs
                con = duckdb.connect(self.file, read_only=self.read_only)
                break
            except duckdb.IOException as err:
                if "lock" in str(err) and time.monotonic() > deadline:
                    raise StoreError(f"cannot open store {self.path}: {str(err).splitlines()[0]}; another process "
                                     "holds it: wait for it to finish, or pass another --store") from None
                if "lock" not in str(err):
                    raise _store_problem(self.path, err, read_only=self.read_only) from None
                time.sleep(delay)
                delay = min(2 * delay, 0.1)
            except duckdb.Error as err:
                raise _store_problem(self.path, err, read_only=self.read_only) from None
        try:
            yield con
        except (duckdb.InterruptException, RuntimeError) as err:
            # Ctrl-C while DuckDB works reaches us as its "Query interrupted"
            # error, not as KeyboardInterrupt: give the caller the interrupt it means
            if "interrupt" not in str(err).lower():
                raise
            raise KeyboardInterrupt from None
        except duckdb.Error as err:
            if not _from_the_file(err):
                raise  # a query of ours is wrong: our bug, with its traceback
            raise _store_problem(self.path, err, read_only=self.read_only) from None
        finally:
            con.close()

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A write transaction: everything inside lands together or not at all.

        Pass it as ``con=`` to the writing methods to group several writes.
        """
        with self._connect() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                yield con
            except BaseException:
                with suppress(duckdb.Error, RuntimeError):  # an interrupted one may be gone already
                    con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")

    @contextmanager
    def _within(self, con: duckdb.DuckDBPyConnection | None) -> Iterator[duckdb.DuckDBPyConnection]:
        """The caller's transaction, or a new one of its own."""
        if con is not None:
            yield con
            return
        with self.transaction() as own:
            yield own

    def _check_version(self, con: duckdb.DuckDBPyConnection) -> None:
        try:
            rows = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall()
        except duckdb.CatalogException:
            rows = []
        version = rows[0][0] if rows else None
        self.version = int(version) if version and version.isdigit() else 0
        if not self.read_only:
            while version in MIGRATIONS:  # each step whole or not at all
                con.execute("BEGIN TRANSACTION")
                con.execute(MIGRATIONS[version])
                version = str(int(version) + 1)
                con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [version])
                con.execute("COMMIT")
                self.version = int(version)
        if version != str(SCHEMA_VERSION) and not (self.read_only and version in MIGRATIONS):
            raise StoreError(f"{self.path} was written by another version of archsearch (schema "
                             f"{version or 'unknown'}, this one reads {SCHEMA_VERSION}); "
                             "use a new --store path")

    def close(self) -> None:
        """Nothing to release (no connection outlives a call); kept for ``with``."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def sql(self, query: str, params: list | None = None) -> pa.Table:
        """Run any SQL over the store; the result as an Arrow table."""
        with self._connect() as con:
            return con.sql(query, params=params or None).to_arrow_table()


# DuckDB's errors that a store's file or disk can cause, not a query of ours: reading a
# truncated or overwritten file, writing to a full disk, a commit that could not be written.
DAMAGE = (duckdb.IOException, duckdb.SerializationException, duckdb.InternalException,
          duckdb.TransactionException, duckdb.FatalException)
FULL_DISK = ("no space left", "disk quota", "file too large")
NO_ACCESS = ("read-only file system", "permission denied", "operation not permitted")


def _from_the_file(err: Exception) -> bool:
    """Whether a DuckDB error comes from the store's file or disk (a checksum that fails is a
    plain ``duckdb.Error``), not from the SQL that met it."""
    return isinstance(err, DAMAGE) or "corrupt" in str(err).lower()


def _store_problem(path: str, err: Exception, *, read_only: bool) -> StoreError:
    """One line for a DuckDB error a store's file or disk caused: full (free space, then resume),
    out of reach (permissions, a read-only disk) or damaged (restore it), with DuckDB's own first
    line as the reason."""
    reason = str(err).splitlines()[0] if str(err) else type(err).__name__
    if any(words in reason.lower() for words in FULL_DISK):
        return StoreFullError(f"cannot write store {path}: {reason}; the disk is full: free space on it, "
                              "then resume", path=path)
    if any(words in reason.lower() for words in NO_ACCESS):
        return StoreError(f"cannot open store {path}: {reason}; pass --store a path this user can "
                          f"{'read' if read_only else 'write'} (reading commands open a store read-only)")
    return StoreError(f"store {path} is damaged or not a DuckDB file archsearch wrote ({reason}); restore it "
                      "from a copy or from its Parquet export (docs/execution.md), or pass another --store")


def checkpoint_dir(store: str | Path, trial_id: str, *, storage: str | Path | None = None) -> Path | str:
    """Where a trial keeps its checkpoints and final model.

    By default beside the store, in a folder named after the store's whole
    file name (``cp.duckdb`` and ``cp.db`` never share one). With
    ``storage`` (the study's ``execution.storage``: a folder every node of a
    cluster reaches, or a URI such as ``s3://bucket/runs``, returned as a
    string), under it, in a folder named after the store's name and absolute
    path, so a trial retried on another node finds its checkpoint.
    """
    store = Path(store).resolve()
    if storage is None:
        return store.parent / f"{store.name}.checkpoints" / trial_id
    folder = f"{store.name}-{hashlib.sha256(str(store).encode()).hexdigest()[:10]}.checkpoints"
    if "://" in str(storage):
        return f"{str(storage).rstrip('/')}/{folder}/{trial_id}"
    return Path(storage).expanduser().resolve() / folder / trial_id


def open_store(path: str | Path = "archsearch.duckdb", *, read_only: bool = False,
               must_exist: bool = False) -> Store:
    """Open (or create) the store at ``path``.

    Safe while a study writes it from another process: reads see that
    study's finished trials and the curves of those still training.
    """
    problem = kind_problem(path)
    if problem == "does not exist" and not (read_only or must_exist):
        problem = None
    if problem == "does not exist":
        raise StoreError(f"no store at {path}; run a study first (archsearch run STUDY) or pass --store PATH")
    # DuckDB blocks opening a named pipe and reads a device: refuse what is not a file, the
    # store's write-ahead log included
    wal = f"{os.path.realpath(path)}.wal"
    if problem is None and os.path.lexists(wal):
        problem = kind_problem(wal)
        if problem is not None:
            problem = f"has a write-ahead log {wal} that {problem}"
    if problem is not None:
        raise StoreError(f"store {path} {problem}; pass --store a DuckDB file (or a new path)")
    return Store(path, read_only=read_only)
