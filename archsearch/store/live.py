"""The store's tables of trials as they train: each trial's training-loss curve
(``train_points``, a row every ``recipe.log_every`` steps) and where each
running trial is now (``trial_progress``, one row a trial, replaced every few
seconds). A mixin of ``Store``, which gives it ``_within`` (a write
transaction), ``sql`` (a read), ``_status`` (the status a reader sees) and
``version`` (a store older than these tables reads as having none)."""

from __future__ import annotations

import duckdb

from archsearch.store.values import _finite, _now, insert_rows, thinned_query

# The schema that first had these tables.
LIVE_SINCE = 4

LIVE_SCHEMA = """
CREATE TABLE IF NOT EXISTS train_points (
    trial_id VARCHAR, step BIGINT, tokens BIGINT, train_loss DOUBLE, lr DOUBLE, tokens_per_s DOUBLE,
    PRIMARY KEY (trial_id, step));
CREATE TABLE IF NOT EXISTS trial_progress (
    trial_id VARCHAR PRIMARY KEY, step BIGINT, total_steps BIGINT, tokens BIGINT, total_tokens BIGINT,
    train_loss DOUBLE, tokens_per_s DOUBLE, elapsed_s DOUBLE, updated_at TIMESTAMPTZ);
"""


class LiveTables:
    """Reads and writes of what running trials report between evaluations."""

    def add_train_points(self, points: list[tuple[str, dict]], *,
                         con: duckdb.DuckDBPyConnection | None = None) -> None:
        """Training-loss rows ``(trial_id, row)`` (step, tokens, train_loss, lr, tokens_per_s);
        a row of a step already stored (a resumed attempt) replaces it."""
        if points:
            with self._within(con) as con:
                insert_rows(con, "INSERT OR REPLACE INTO train_points",
                            ["trial_id", "step", "tokens", "train_loss", "lr", "tokens_per_s"],
                            [[trial_id, r["step"], r["tokens"], _finite(r["train_loss"]), r["lr"],
                              _finite(r.get("tokens_per_s"))] for trial_id, r in points], key=2)

    def record_progress(self, reports: dict[str, dict], *, con: duckdb.DuckDBPyConnection | None = None) -> None:
        """Where each running trial is (its latest ``train.progress`` report), by trial id."""
        if reports:
            now = _now()
            with self._within(con) as con:
                con.executemany("INSERT OR REPLACE INTO trial_progress VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                [[trial_id, r["step"], r["total_steps"], r["tokens"], r.get("total_tokens"),
                                  _finite(r.get("train_loss")), _finite(r.get("tokens_per_s")), r["elapsed_s"], now]
                                 for trial_id, r in reports.items()])

    def forget_progress(self, trial_ids: list[str], *, con: duckdb.DuckDBPyConnection | None = None) -> None:
        """Trials that stopped training (finished, failed, paused) have no progress to show."""
        if trial_ids:
            with self._within(con) as con:
                con.execute("DELETE FROM trial_progress WHERE trial_id IN (SELECT unnest(?::VARCHAR[]))",
                            [trial_ids])

    def progress(self, study: str | None = None) -> dict[str, dict]:
        """The latest progress report of each trial that trains now (``running``, its run alive), by
        trial id, with ``age_s``: seconds since the driver stored it."""
        if self.version < LIVE_SINCE:
            return {}
        where = f"{self._status('t.')} = 'running'"
        if study:
            where += " AND t.trial_id IN (SELECT trial_id FROM study_trials WHERE study = ?)"
        rows = self.sql("SELECT p.*, epoch(now() - p.updated_at) AS age_s FROM trial_progress p "
                        f"JOIN trials t USING (trial_id) WHERE {where} ORDER BY trial_id",
                        [study] if study else None).to_pylist()
        return {row.pop("trial_id"): row for row in rows}

    def train_points(self, trial_ids: list[str], points: int | None = None) -> list[dict]:
        """The training-loss rows of ``trial_ids``, by trial and step; with ``points``, thinned in
        the store to about that many a trial (its first and last kept)."""
        if self.version < LIVE_SINCE or not trial_ids:
            return []
        if points is None:
            return self.sql("SELECT * FROM train_points WHERE trial_id IN (SELECT unnest(?::VARCHAR[])) "
                            "ORDER BY trial_id, step", [trial_ids]).to_pylist()
        columns = ["trial_id", "step", "tokens", "train_loss", "lr", "tokens_per_s"]
        return self.sql(thinned_query("train_points", columns), [trial_ids, points, points]).to_pylist()
