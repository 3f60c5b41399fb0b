"""The results store: studies, trials and per-evaluation metrics in DuckDB.

One row per trial, keyed by the trial id (a hash of spec, recipe, data and
seed), so a trial finished by any study is never trained again. A row whose
``same_as`` names another trial was not trained itself: another arm planned
the same model, and the row holds that trial's result. A study links to its
trials through ``study_trials``. Reads come back as Arrow tables. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from archsearch.errors import StoreError, StoreFullError
from archsearch.files import kind_problem, output_problem
from archsearch.store.live import LIVE_SCHEMA, LiveTables
from archsearch.store.side import SideTables
from archsearch.store.values import _finite, _now, code_version, insert_rows
from archsearch.store.runlock import run_alive

# Bump when a table changes shape; an older store is refused with a clear line, unless
# MIGRATIONS takes it forward (done when it is opened for writing; a reader reads it as it is).
SCHEMA_VERSION = 4
# version -> the SQL that makes a store of that version the next one
MIGRATIONS = {
    "2": "ALTER TABLE trials ADD COLUMN IF NOT EXISTS same_as VARCHAR",  # 3: twins share one training
    "3": LIVE_SCHEMA,  # 4: training-loss curves and running trials' progress
}

# layer_profiles: analyses of trained models (archsearch inspect), one row per layer or
# setting and metric.
SCHEMA = """
CREATE TABLE IF NOT EXISTS layer_profiles (
    trial_id VARCHAR, analysis VARCHAR, setting JSON, layer INTEGER, metric VARCHAR, value DOUBLE,
    code_version VARCHAR, created_at TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE IF NOT EXISTS studies (
    name VARCHAR PRIMARY KEY, path VARCHAR, config JSON, code_version VARCHAR,
    created_at TIMESTAMPTZ, updated_at TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS trials (
    trial_id VARCHAR PRIMARY KEY, family VARCHAR, axes JSON, seed INTEGER,
    match VARCHAR, target DOUBLE, params BIGINT, total_params BIGINT,
    flops_per_token DOUBLE, match_error DOUBLE, achieved DOUBLE, state BIGINT, d_model INTEGER,
    num_layers INTEGER, sweep_group VARCHAR, sweep_best BOOLEAN,
    spec JSON, recipe JSON, data JSON,
    status VARCHAR, attempts INTEGER DEFAULT 0, error VARCHAR,
    train_loss DOUBLE, val_loss DOUBLE, val_accuracy DOUBLE, steps BIGINT, tokens BIGINT,
    wall_time_s DOUBLE, tokens_per_s DOUBLE,
    code_version VARCHAR, created_at TIMESTAMPTZ, finished_at TIMESTAMPTZ, same_as VARCHAR);
CREATE TABLE IF NOT EXISTS study_versions (
    study VARCHAR, version INTEGER, config_hash VARCHAR, config JSON, text VARCHAR, code_version VARCHAR,
    created_at TIMESTAMPTZ, PRIMARY KEY (study, version));
CREATE TABLE IF NOT EXISTS study_trials (
    study VARCHAR, trial_id VARCHAR, PRIMARY KEY (study, trial_id));
CREATE TABLE IF NOT EXISTS search_proposals (
    study VARCHAR, number INTEGER, point JSON, trial_ids JSON, objectives JSON, "values" JSON,
    state VARCHAR, finished_at TIMESTAMPTZ, PRIMARY KEY (study, number));
CREATE TABLE IF NOT EXISTS trial_rungs (
    trial_id VARCHAR, rung INTEGER, fraction DOUBLE, steps BIGINT, tokens BIGINT, val_loss DOUBLE,
    val_accuracy DOUBLE, finished_at TIMESTAMPTZ, PRIMARY KEY (trial_id, rung));
CREATE TABLE IF NOT EXISTS fidelity_ladders (
    study VARCHAR PRIMARY KEY, points INTEGER, spearman DOUBLE, low DOUBLE, high DOUBLE, finished_at TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS metrics (
    trial_id VARCHAR, step BIGINT, tokens BIGINT, train_loss DOUBLE, val_loss DOUBLE, val_accuracy DOUBLE,
    lr DOUBLE, loop_fraction DOUBLE, loop_time_ratio DOUBLE,
    PRIMARY KEY (trial_id, step));
""" + LIVE_SCHEMA


# The generalisation gap at the end of training, a column of every trials read: the last
# evaluation's validation loss minus the training loss beside it, the mean objective of the
# last 10 training steps (memory arms with aux and exit-gate models: their auxiliary terms
# included). Computed, not stored, so stores written before it have it too.
GEN_GAP = "val_loss - train_loss AS gen_gap"

# Every table of the store, in the order export writes them.
TABLES = ("studies", "study_versions", "trials", "study_trials", "metrics", "train_points", "trial_rungs",
          "search_proposals", "fidelity_ladders", "layer_profiles")


class Store(SideTables, LiveTables):
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

    # writing

    def add_study(self, *, name: str, path: str, config: dict, text: str | None = None) -> int:
        """Register a study, or update it; a changed resolved config (a grown
        grid, another seed, a larger trial budget) is kept as a new version
        beside the old ones, with the file's text. Returns the version number."""
        now = _now()
        blob = json.dumps(config, sort_keys=True)
        digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
        with self.transaction() as con:
            con.execute(
                "INSERT INTO studies VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                "path = excluded.path, config = excluded.config, code_version = excluded.code_version, "
                "updated_at = excluded.updated_at",
                [name, path, blob, code_version(), now, now])
            rows = con.execute("SELECT version, config_hash FROM study_versions WHERE study = ? "
                               "ORDER BY version DESC LIMIT 1", [name]).fetchall()
            last = rows[0] if rows else None
            if last is not None and last[1] == digest:
                return last[0]
            version = 1 if last is None else last[0] + 1
            con.execute("INSERT INTO study_versions VALUES (?, ?, ?, ?, ?, ?, ?)",
                        [name, version, digest, blob, text, code_version(), now])
        return version

    def study_versions(self, study: str) -> pa.Table:
        """Every version of a study's resolved config and file text, oldest first."""
        return self.sql("SELECT * FROM study_versions WHERE study = ? ORDER BY version", [study])

    def add_trials(self, study: str, trials: list[dict], *, con: duckdb.DuckDBPyConnection | None = None) -> None:
        """Register planned trials (``PlannedTrial.to_dict()`` rows); keeps finished ones as they are.
        A trial not trained yet takes the twin it will share a training with (``same_as``) of the plan."""
        now = _now()
        rows = [[t["trial_id"], t["spec"]["family"], json.dumps(t["axes"]), t["seed"], t["match"], t["target"],
                 t["params"], t["total_params"], t["flops_per_token"], t["match_error"], t.get("achieved"),
                 t.get("state"), t["d_model"], t["num_layers"], t.get("sweep_group"), json.dumps(t["spec"]),
                 json.dumps(t["recipe"]), json.dumps(t["data"]), "planned", code_version(), now, t.get("same_as")]
                for t in trials]
        if not rows:
            return
        with self._within(con) as con:
            insert_rows(con, "INSERT INTO trials", TRIAL_COLUMNS, rows, key=1,
                        tail="ON CONFLICT (trial_id) DO UPDATE SET same_as = excluded.same_as "
                             "WHERE trials.status IN ('planned', 'interrupted', 'failed', 'diverged')")
            insert_rows(con, "INSERT INTO study_trials", ["study", "trial_id"],
                        [[study, t["trial_id"]] for t in trials], key=2, tail="ON CONFLICT DO NOTHING")

    def mark_interrupted(self) -> int:
        """Trials a dead run left ``running`` become ``interrupted``; call only
        while holding the store's run lock. Returns how many."""
        with self.transaction() as con:
            (count,) = con.execute("SELECT count(*) FROM trials WHERE status = 'running'").fetchone()
            con.execute("UPDATE trials SET status = 'interrupted' WHERE status = 'running'")
        return count

    def mark_running(self, trial_id: str, *, new_attempt: bool = True,
                     con: duckdb.DuckDBPyConnection | None = None) -> None:
        """The trial trains now: a new attempt (``attempts`` counts them), or a promotion."""
        with self._within(con) as con:
            con.execute("UPDATE trials SET status = 'running', attempts = attempts + ? WHERE trial_id = ?",
                        [int(new_attempt), trial_id])

    def pause(self, trial_id: str, result: dict, *, con: duckdb.DuckDBPyConnection | None = None) -> str:
        """A trial stopped at a rung, waiting for promotion: its results and
        curve so far are kept; it is not completed (``diverged`` if its loss
        already is). Returns the status written."""
        with self._within(con) as con:
            if self.finish(trial_id, result, con=con) == "diverged":
                return "diverged"
            con.execute("UPDATE trials SET status = 'paused', sweep_best = NULL WHERE trial_id = ?", [trial_id])
        return "paused"

    def prune(self, trial_id: str, *, rung: int, rungs: int, con: duckdb.DuckDBPyConnection | None = None) -> None:
        """A paused trial the search will not promote: ``pruned`` at its rung."""
        with self._within(con) as con:
            con.execute("UPDATE trials SET status = 'pruned', error = ? WHERE trial_id = ?",
                        [f"pruned at rung {rung + 1} of {rungs}", trial_id])

    def add_points(self, points: list[tuple[str, dict]], *, con: duckdb.DuckDBPyConnection | None = None) -> None:
        """Evaluation rows ``(trial_id, row)`` of trials still training, so a
        reader sees their curves grow; ``finish`` later writes the whole curve."""
        if points:
            with self._within(con) as con:
                insert_rows(con, "INSERT OR REPLACE INTO metrics", METRIC_COLUMNS,
                            [_metric_row(trial_id, row) for trial_id, row in points], key=2)

    def finish(self, trial_id: str, result: dict, *, con: duckdb.DuckDBPyConnection | None = None) -> str:
        """Record a trained trial and its evaluation curve in one transaction.

        A final loss that is NaN or infinite makes the trial ``diverged`` (with
        the reason in ``error``), never ``completed``. Returns the status written.
        """
        diverged = divergence(result)
        with self._within(con) as con:
            con.execute(
                "UPDATE trials SET status = ?, error = ?, train_loss = ?, val_loss = ?, val_accuracy = ?, "
                "steps = ?, tokens = ?, wall_time_s = ?, tokens_per_s = ?, code_version = ?, finished_at = ?, "
                "same_as = NULL WHERE trial_id = ?",
                ["diverged" if diverged else "completed", diverged, _finite(result["train_loss"]),
                 _finite(result["val_loss"]), _finite(result["val_accuracy"]), result["steps"], result["tokens"],
                 result["wall_time_s"], result["tokens_per_s"], code_version(), _now(), trial_id])
            self._mark_sweep_best(con, trial_id)
            con.execute("DELETE FROM metrics WHERE trial_id = ?", [trial_id])
            if result["curve"]:
                insert_rows(con, "INSERT INTO metrics", METRIC_COLUMNS,
                            [_metric_row(trial_id, row) for row in result["curve"]], key=2)
        return "diverged" if diverged else "completed"

    def share(self, trial_id: str, source: str, *, con: duckdb.DuckDBPyConnection | None = None) -> str:
        """Give ``trial_id`` the result and curve of ``source``, a trial that trained the same model
        (same spec, data, recipe and seed), without training it: its ``same_as`` then names the
        trial that did train (``source``, or the one ``source`` itself shares). Returns the status."""
        if trial_id == source:  # sharing with itself would delete its own curve
            raise LookupError(f"trial {trial_id} cannot share its own result")  # the driver's bug
        with self._within(con) as con:
            rows = con.execute("SELECT coalesce(same_as, trial_id), status FROM trials WHERE trial_id = ?",
                               [source]).fetchall()
            if not rows:
                raise LookupError(f"no trial {source} in {self.path} to share a result from")  # the driver's bug
            trained, status = rows[0]
            con.execute(
                "UPDATE trials SET status = s.status, error = s.error, train_loss = s.train_loss, "
                "val_loss = s.val_loss, val_accuracy = s.val_accuracy, steps = s.steps, tokens = s.tokens, "
                "wall_time_s = s.wall_time_s, tokens_per_s = s.tokens_per_s, code_version = s.code_version, "
                "finished_at = ?, same_as = ? FROM (SELECT * FROM trials WHERE trial_id = ?) s "
                "WHERE trials.trial_id = ?", [_now(), trained, source, trial_id])
            self._mark_sweep_best(con, trial_id)
            con.execute("DELETE FROM metrics WHERE trial_id = ?", [trial_id])
            con.execute("INSERT INTO metrics SELECT ? AS trial_id, * EXCLUDE (trial_id) FROM metrics "
                        "WHERE trial_id = ?", [trial_id, source])
            con.execute("DELETE FROM train_points WHERE trial_id = ?", [trial_id])
            con.execute("INSERT INTO train_points SELECT ? AS trial_id, * EXCLUDE (trial_id) FROM train_points "
                        "WHERE trial_id = ?", [trial_id, source])
        return status

    @staticmethod
    def _mark_sweep_best(con: duckdb.DuckDBPyConnection, trial_id: str) -> None:
        """Within a learning-rate sweep, mark the completed run with the lowest
        validation loss as the one that counts; the others stay stored."""
        con.execute(
            "UPDATE trials SET sweep_best = (trial_id = (SELECT arg_min(trial_id, val_loss) FROM trials "
            "WHERE sweep_group = g.sweep_group AND status = 'completed')) "
            "FROM (SELECT sweep_group FROM trials WHERE trial_id = ?) g "
            "WHERE trials.sweep_group = g.sweep_group AND trials.sweep_group IS NOT NULL", [trial_id])

    def fail(self, trial_id: str, error: str, *, status: str = "failed",
             con: duckdb.DuckDBPyConnection | None = None) -> None:
        """Record a trial that ended without a result (``failed``, or ``diverged``
        when training itself blew up)."""
        with self._within(con) as con:
            con.execute("UPDATE trials SET status = ?, error = ?, finished_at = ? WHERE trial_id = ?",
                        [status, error, _now(), trial_id])

    # reading

    def trial_rows(self) -> dict[str, dict]:
        """Every trial's plan and result columns by trial id (for searches
        that must not train a finished trial again)."""
        table = self.sql("SELECT trial_id, status, attempts, params, flops_per_token, state, val_loss, "
                         "val_accuracy, tokens, tokens_per_s, train_loss FROM trials")
        return {row["trial_id"]: row for row in table.to_pylist()}

    def completed_plans(self) -> list[dict]:
        """Every completed trial's id, the id of the trial that trained it (``trained``: itself, or
        the one it shares), its result columns and the plan that made it (spec, recipe, data as
        dicts, seed): what a driver needs to find a twin's result already in the store."""
        rows = self.sql("SELECT trial_id, coalesce(same_as, trial_id) AS trained, spec, recipe, data, seed, "
                        "train_loss, val_loss, val_accuracy, steps, "
                        "tokens, wall_time_s, tokens_per_s FROM trials WHERE status = 'completed' "
                        "ORDER BY finished_at, trial_id").to_pylist()
        return [{**row, **{name: json.loads(row[name]) for name in ("spec", "recipe", "data")}} for row in rows]

    def completed_ids(self) -> set[str]:
        return {row["trial_id"] for row in self.sql(
            "SELECT trial_id FROM trials WHERE status = 'completed'").to_pylist()}

    def _status(self, alias: str = "") -> str:
        """The status column as a reader should see it: a trial left
        ``running`` by a driver that is gone is ``interrupted``."""
        if run_alive(self.path):
            return f"{alias}status"
        return f"CASE WHEN {alias}status = 'running' THEN 'interrupted' ELSE {alias}status END"

    def studies(self) -> pa.Table:
        status = self._status("t.")
        return self.sql("SELECT s.name, s.path, s.updated_at, count(t.trial_id) AS trials, "
                        f"count(*) FILTER (WHERE {status} = 'completed') AS completed, "
                        f"count(*) FILTER (WHERE {status} = 'failed') AS failed, "
                        f"count(*) FILTER (WHERE {status} = 'diverged') AS diverged, "
                        f"count(*) FILTER (WHERE {status} = 'running') AS running, "
                        f"count(*) FILTER (WHERE {status} = 'interrupted') AS interrupted "
                        "FROM studies s LEFT JOIN study_trials st ON st.study = s.name "
                        "LEFT JOIN trials t ON t.trial_id = st.trial_id GROUP BY ALL ORDER BY s.name")

    def trials(self, study: str | None = None) -> pa.Table:
        """Trials as an Arrow table, for one study or all, with ``gen_gap`` (see GEN_GAP) last."""
        if study is None:
            return self.sql(f"SELECT * REPLACE ({self._status()} AS status), {GEN_GAP} FROM trials "
                            "ORDER BY created_at, trial_id")
        return self.sql(f"SELECT t.* REPLACE ({self._status('t.')} AS status), {GEN_GAP} FROM trials t "
                        "JOIN study_trials st USING (trial_id) WHERE st.study = ? ORDER BY t.created_at, t.trial_id",
                        [study])

    def metrics(self, study: str | None = None) -> pa.Table:
        """Per-evaluation rows (trial_id, step, tokens, losses, lr), those of
        trials still training included."""
        if study is None:
            return self.sql("SELECT * FROM metrics ORDER BY trial_id, step")
        return self.sql("SELECT m.* FROM metrics m JOIN study_trials st USING (trial_id) "
                        "WHERE st.study = ? ORDER BY m.trial_id, m.step", [study])

    def sql(self, query: str, params: list | None = None) -> pa.Table:
        """Run any SQL over the store; the result as an Arrow table."""
        with self._connect() as con:
            return con.sql(query, params=params or None).to_arrow_table()

    def export_parquet(self, folder: str | Path) -> list[Path]:
        """Write every table as ``folder/<table>.parquet`` (one consistent snapshot)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        out = []
        with self._connect() as con:
            # a store older than a table (read as it is) exports what it has
            present = {row[0] for row in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
            for table in (name for name in TABLES if name in present):
                path = folder / f"{table}.parquet"
                problem = output_problem(path)
                if problem is not None:  # a named pipe there would block the COPY until someone reads it
                    raise OSError(f"{path} {problem}")
                quoted = path.as_posix().replace("'", "''")
                try:
                    con.execute(f"COPY {table} TO '{quoted}' (FORMAT parquet)")
                except duckdb.IOException as err:
                    if path.as_posix() not in str(err):
                        raise  # reading the store failed, not writing the export
                    raise OSError(str(err).splitlines()[0]) from None
                out.append(path)
        return out


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


def divergence(result: dict) -> str | None:
    """Why a trained trial counts as diverged, or None."""
    for name in ("val_loss", "train_loss"):
        if not math.isfinite(result[name]):
            return (f"{name} is {result[name]} after {result['steps']} steps (training diverged; "
                    "lower recipe.lr or weight_decay)")
    return None


TRIAL_COLUMNS = ["trial_id", "family", "axes", "seed", "match", "target", "params", "total_params",
                 "flops_per_token", "match_error", "achieved", "state", "d_model", "num_layers", "sweep_group", "spec",
                 "recipe", "data", "status", "code_version", "created_at", "same_as"]
METRIC_COLUMNS = ["trial_id", "step", "tokens", "train_loss", "val_loss", "val_accuracy", "lr", "loop_fraction",
                  "loop_time_ratio"]


def _metric_row(trial_id: str, row: dict) -> list:
    # loop_fraction and loop_time_ratio: looped models with early exits only (NULL otherwise)
    return [trial_id, row["step"], row["tokens"], _finite(row["train_loss"]), _finite(row["val_loss"]),
            _finite(row["val_accuracy"]), row["lr"], row.get("loop_fraction"), row.get("loop_time_ratio")]


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
