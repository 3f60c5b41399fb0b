"""The run's store writer: work lands in the order it was handed over, what queues while a
transaction is written rides along in the next one, and an error writing reaches the driver."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import pytest

import archsearch as A
from archsearch.errors import StoreFullError
from archsearch.execute.writer import StoreWriter


class CountedStore:
    """A store whose transactions are counted, the first held open until ``release`` is set."""

    def __init__(self, db):
        self.db, self.transactions, self.entered, self.release = db, 0, threading.Event(), threading.Event()

    @contextmanager
    def transaction(self):
        self.transactions += 1
        if self.transactions == 1:
            self.entered.set()
            assert self.release.wait(30)
        with self.db.transaction() as con:
            yield con


def note(value: int):
    return lambda con: con.execute("INSERT INTO meta VALUES (?, ?)", [f"order:{value}", str(value)])


def noted(db) -> list[int]:
    return [int(r["value"]) for r in db.sql("SELECT value FROM meta WHERE key LIKE 'order:%' ORDER BY rowid")
            .to_pylist()]


def test_work_lands_in_order_and_what_queues_meanwhile_shares_one_transaction(tmp_path):
    db = A.open_store(tmp_path / "s.duckdb")
    counted = CountedStore(db)
    writer = StoreWriter(counted)
    writer.put(note(0))
    assert counted.entered.wait(30)  # its transaction is held open
    for value in range(1, 6):
        writer.put(note(value))
    counted.release.set()
    writer.flush()
    assert noted(db) == [0, 1, 2, 3, 4, 5]
    assert counted.transactions == 2  # the first, then the five that queued behind it
    writer.close()


def test_an_error_writing_reaches_the_driver_and_later_work_is_dropped(tmp_path):
    db = A.open_store(tmp_path / "s.duckdb")
    writer = StoreWriter(db)

    def full(con):
        raise StoreFullError("the disk holding s.duckdb is full", path="s.duckdb")

    writer.put(note(1))
    writer.put(full)
    with pytest.raises(StoreFullError, match="is full"):
        writer.flush()
    writer.put(note(2))
    writer.close()
    # the failed batch rolled back whole; nothing after it was written
    assert 2 not in noted(db)
