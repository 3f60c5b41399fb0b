"""The run's writes to the store, on a thread of their own.

A DuckDB transaction that opens and closes the file costs 15 ms on an idle
machine and 50-100 ms on a loaded one. Made in the driver's loop, that cost
sat between one trial's end and the next trial's start. Here the loop hands
each pass's writes to a thread and goes on: a trial starts while the one
before it is being recorded, and whatever has queued while a transaction ran
goes into the next one together. Writes land in the order they were handed
over, each batch whole or not at all.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from archsearch.store import Store

Work = Callable[[Any], None]  # given the open transaction's connection


class StoreWriter:
    """Writes ``put`` work to ``db`` in order, in as few transactions as keep up with it.

    An error writing (a full disk, a store taken away) is raised in the driver's thread by the
    next ``put``, ``flush`` or ``close``; work handed over after it is dropped.
    """

    def __init__(self, db: Store):
        self.db = db
        self.pending: queue.Queue[Work | None] = queue.Queue()
        self.error: BaseException | None = None
        self.reported = False
        self.idle = threading.Condition()
        self.unwritten = 0  # work handed over and not yet committed (or dropped after an error)
        self.thread = threading.Thread(target=self._write, name="archsearch-store-writer", daemon=True)
        self.thread.start()

    def put(self, work: Work) -> None:
        self._raise()
        with self.idle:
            self.unwritten += 1
        self.pending.put(work)

    def flush(self) -> None:
        """Wait until everything handed over is in the store."""
        with self.idle:
            self.idle.wait_for(lambda: self.unwritten == 0)
        self._raise()

    def close(self) -> None:
        """Write what is left, then stop the thread."""
        self.pending.put(None)
        self.thread.join()
        self._raise()

    def _raise(self) -> None:
        """The error writing, once (later work is dropped all the same)."""
        if self.error is not None and not self.reported:
            self.reported = True
            raise self.error

    def _write(self) -> None:
        while True:
            batch = [self.pending.get()]
            while not self.pending.empty():  # everything that queued meanwhile rides along
                batch.append(self.pending.get_nowait())
            stop = None in batch
            work = [w for w in batch if w is not None]
            if work and self.error is None:
                try:
                    with self.db.transaction() as con:
                        for item in work:
                            item(con)
                except BaseException as err:  # raised in the driver's thread (see _raise)
                    self.error = err
            with self.idle:
                self.unwritten -= len(work)
                self.idle.notify_all()
            if stop:
                return
