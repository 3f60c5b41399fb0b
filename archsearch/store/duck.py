"""The results store: studies, trials and per-evaluation metrics in DuckDB.

One row per trial, keyed by the trial id (a hash of spec, recipe, data and
seed), so a trial finished by any study is never trained again. A study links
to its trials through ``study_trials``. Reads come back as Arrow tables.
Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from archsearch.errors import StoreError

# Bump when a table changes shape; an older store is refused with a clear line.
SCHEMA_VERSION = 2

SCHEMA = """
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
    code_version VARCHAR, created_at TIMESTAMPTZ, finished_at TIMESTAMPTZ);
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
"""


@lru_cache(maxsize=1)
def code_version() -> str:
    """Package version plus the git commit (and '+dirty') when run from a checkout."""
    from archsearch import __version__

    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return __version__
    return f"{__version__}+{sha}{'.dirty' if dirty else ''}" if sha else __version__


def _now() -> datetime:
    return datetime.now(timezone.utc)


class Store:
    """A DuckDB file of results. Open with ``open_store(path)``."""

    def __init__(self, path: str | Path, *, read_only: bool = False):
        self.path = str(path)
        try:
            self.db = duckdb.connect(self.path, read_only=read_only)
        except duckdb.IOException as err:
            raise StoreError(f"cannot open store {self.path}: {str(err).splitlines()[0]}") from None
        tables = {row[0] for row in self.db.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        if not read_only and not tables:  # a new store
            self.db.execute(SCHEMA)
            self.db.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
        self._check_version()

    def _check_version(self) -> None:
        try:
            rows = self.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall()
        except duckdb.CatalogException:
            rows = []
        row = rows[0] if rows else None
        if row is None or row[0] != str(SCHEMA_VERSION):
            self.db.close()
            raise StoreError(f"{self.path} was written by another version of archsearch (schema "
                             f"{row[0] if row else 'unknown'}, this one reads {SCHEMA_VERSION}); "
                             "use a new --store path")

    def close(self) -> None:
        self.db.close()

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
        self.db.execute(
            "INSERT INTO studies VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
            "path = excluded.path, config = excluded.config, code_version = excluded.code_version, "
            "updated_at = excluded.updated_at",
            [name, path, blob, code_version(), now, now])
        rows = self.db.execute("SELECT version, config_hash FROM study_versions WHERE study = ? "
                               "ORDER BY version DESC LIMIT 1", [name]).fetchall()
        last = rows[0] if rows else None
        if last is not None and last[1] == digest:
            return last[0]
        version = 1 if last is None else last[0] + 1
        self.db.execute("INSERT INTO study_versions VALUES (?, ?, ?, ?, ?, ?, ?)",
                        [name, version, digest, blob, text, code_version(), now])
        return version

    def study_versions(self, study: str) -> pa.Table:
        """Every version of a study's resolved config and file text, oldest first."""
        return self.sql("SELECT * FROM study_versions WHERE study = ? ORDER BY version", [study])

    def add_trials(self, study: str, trials: list[dict]) -> None:
        """Register planned trials (``PlannedTrial.to_dict()`` rows); keeps finished ones as they are."""
        now = _now()
        rows = [[t["trial_id"], t["spec"]["family"], json.dumps(t["axes"]), t["seed"], t["match"], t["target"],
                 t["params"], t["total_params"], t["flops_per_token"], t["match_error"], t.get("achieved"),
                 t.get("state"), t["d_model"], t["num_layers"], t.get("sweep_group"), json.dumps(t["spec"]),
                 json.dumps(t["recipe"]), json.dumps(t["data"]), "planned", code_version(), now] for t in trials]
        if rows:
            self.db.executemany(
                "INSERT INTO trials (trial_id, family, axes, seed, match, target, params, total_params, "
                "flops_per_token, match_error, achieved, state, d_model, num_layers, sweep_group, spec, recipe, "
                "data, status, code_version, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (trial_id) DO NOTHING", rows)
            self.db.executemany("INSERT INTO study_trials VALUES (?, ?) ON CONFLICT DO NOTHING",
                                [[study, t["trial_id"]] for t in trials])

    def mark_running(self, trial_id: str, *, new_attempt: bool = True) -> None:
        self.db.execute("UPDATE trials SET status = 'running', attempts = attempts + ? WHERE trial_id = ?",
                        [int(new_attempt), trial_id])

    def record_rung(self, trial_id: str, rung: int, fraction: float, result: dict) -> None:
        """A multi-fidelity trial reached ``rung`` (``fraction`` of its tokens)."""
        self.db.execute("INSERT OR REPLACE INTO trial_rungs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        [trial_id, rung, fraction, result["steps"], result["tokens"], result["val_loss"],
                         result["val_accuracy"], _now()])

    def pause(self, trial_id: str, result: dict) -> None:
        """A trial stopped at a rung, waiting for promotion: its results and
        curve so far are kept; it is not completed."""
        self.finish(trial_id, result)
        self.db.execute("UPDATE trials SET status = 'paused', sweep_best = NULL WHERE trial_id = ?", [trial_id])

    def prune(self, trial_id: str, *, rung: int, rungs: int) -> None:
        """A paused trial the search will not promote: ``pruned`` at its rung."""
        self.db.execute("UPDATE trials SET status = 'pruned', error = ? WHERE trial_id = ?",
                        [f"pruned at rung {rung + 1} of {rungs}", trial_id])

    def finish(self, trial_id: str, result: dict) -> None:
        """Record a completed trial and its evaluation curve."""
        self.db.execute(
            "UPDATE trials SET status = 'completed', error = NULL, train_loss = ?, val_loss = ?, val_accuracy = ?, "
            "steps = ?, tokens = ?, wall_time_s = ?, tokens_per_s = ?, code_version = ?, finished_at = ? "
            "WHERE trial_id = ?",
            [result["train_loss"], result["val_loss"], result["val_accuracy"], result["steps"], result["tokens"],
             result["wall_time_s"],
             result["tokens_per_s"], code_version(), _now(), trial_id])
        self._mark_sweep_best(trial_id)
        self.db.execute("DELETE FROM metrics WHERE trial_id = ?", [trial_id])
        if result["curve"]:
            # loop_fraction and loop_time_ratio: looped models with early exits only (NULL otherwise)
            self.db.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                [[trial_id, r["step"], r["tokens"], r["train_loss"], r["val_loss"],
                                  r["val_accuracy"], r["lr"], r.get("loop_fraction"), r.get("loop_time_ratio")]
                                 for r in result["curve"]])

    def _mark_sweep_best(self, trial_id: str) -> None:
        """Within a learning-rate sweep, mark the completed run with the lowest
        validation loss as the one that counts; the others stay stored."""
        self.db.execute(
            "UPDATE trials SET sweep_best = (trial_id = (SELECT arg_min(trial_id, val_loss) FROM trials "
            "WHERE sweep_group = g.sweep_group AND status = 'completed')) "
            "FROM (SELECT sweep_group FROM trials WHERE trial_id = ?) g "
            "WHERE trials.sweep_group = g.sweep_group AND trials.sweep_group IS NOT NULL", [trial_id])

    def fail(self, trial_id: str, error: str) -> None:
        self.db.execute("UPDATE trials SET status = 'failed', error = ?, finished_at = ? WHERE trial_id = ?",
                        [error, _now(), trial_id])

    def record_proposals(self, study: str, records: list[dict]) -> None:
        """A sampled search's finished proposals: the point, its trials and the
        objective values the sampler was told (None for a failed proposal)."""
        if not records:
            return
        now = _now()
        self.db.executemany(
            "INSERT OR REPLACE INTO search_proposals VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [[study, r["number"], json.dumps(r["point"], default=str), json.dumps(r["trial_ids"]),
              json.dumps(r["objectives"]), json.dumps(r["values"]), r["state"], now] for r in records])

    def record_ladder(self, study: str, ladder: dict) -> None:
        """The rank correlation between a study's probe and its own data."""
        self.db.execute("INSERT OR REPLACE INTO fidelity_ladders VALUES (?, ?, ?, ?, ?, ?)",
                        [study, ladder["points"], ladder["spearman"], ladder["low"], ladder["high"], _now()])

    def record_kernel_preflight(self, study: str, failures: dict[str, str]) -> None:
        """The kernels a study's preflight found broken on its device, {op: why}; those ops ran
        their PyTorch path. Kept in meta (no new table, so stores stay readable across versions)."""
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [f"kernel_preflight:{study}", json.dumps(failures)])

    # reading

    def kernel_preflight(self, study: str) -> dict[str, str]:
        """The last preflight's failures for `study` ({} when all passed or none ran)."""
        rows = self.sql("SELECT value FROM meta WHERE key = ?", [f"kernel_preflight:{study}"]).to_pylist()
        return json.loads(rows[0]["value"]) if rows else {}

    def ladders(self, study: str | None = None) -> pa.Table:
        """Each study's probe-to-data rank correlation (fidelity ladders only)."""
        if study is None:
            return self.sql("SELECT * FROM fidelity_ladders ORDER BY study")
        return self.sql("SELECT * FROM fidelity_ladders WHERE study = ?", [study])

    def trial_rows(self) -> dict[str, dict]:
        """Every trial's plan and result columns by trial id (for searches
        that must not train a finished trial again)."""
        table = self.sql("SELECT trial_id, status, params, flops_per_token, state, val_loss, val_accuracy, "
                         "tokens, tokens_per_s FROM trials")
        return {row["trial_id"]: row for row in table.to_pylist()}

    def rung_rows(self) -> dict[str, dict[int, dict]]:
        """Every multi-fidelity trial's rungs reached: trial id -> rung -> row."""
        out: dict[str, dict[int, dict]] = {}
        for row in self.sql("SELECT * FROM trial_rungs ORDER BY trial_id, rung").to_pylist():
            out.setdefault(row["trial_id"], {})[row["rung"]] = row
        return out

    def proposals(self, study: str) -> pa.Table:
        """A sampled search's proposals, in the order they were asked."""
        return self.sql("SELECT * FROM search_proposals WHERE study = ? ORDER BY number", [study])

    def completed_ids(self) -> set[str]:
        return {row[0] for row in self.db.execute(
            "SELECT trial_id FROM trials WHERE status = 'completed'").fetchall()}

    def studies(self) -> pa.Table:
        return self.sql("SELECT s.name, s.path, s.updated_at, count(t.trial_id) AS trials, "
                        "count(*) FILTER (WHERE t.status = 'completed') AS completed, "
                        "count(*) FILTER (WHERE t.status = 'failed') AS failed "
                        "FROM studies s LEFT JOIN study_trials st ON st.study = s.name "
                        "LEFT JOIN trials t ON t.trial_id = st.trial_id GROUP BY ALL ORDER BY s.name")

    def trials(self, study: str | None = None) -> pa.Table:
        """Trials as an Arrow table, for one study or all."""
        if study is None:
            return self.sql("SELECT * FROM trials ORDER BY created_at, trial_id")
        return self.sql("SELECT t.* FROM trials t JOIN study_trials st USING (trial_id) "
                        "WHERE st.study = ? ORDER BY t.created_at, t.trial_id", [study])

    def metrics(self, study: str | None = None) -> pa.Table:
        """Per-evaluation rows (trial_id, step, tokens, losses, lr; loop_fraction and loop_time_ratio for
        looped models with early exits)."""
        if study is None:
            return self.sql("SELECT * FROM metrics ORDER BY trial_id, step")
        return self.sql("SELECT m.* FROM metrics m JOIN study_trials st USING (trial_id) "
                        "WHERE st.study = ? ORDER BY m.trial_id, m.step", [study])

    def sql(self, query: str, params: list | None = None) -> pa.Table:
        """Run any SQL over the store; the result as an Arrow table."""
        return self.db.sql(query, params=params or None).to_arrow_table()

    def export_parquet(self, folder: str | Path) -> list[Path]:
        """Write every table as ``folder/<table>.parquet``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        out = []
        for table in ("studies", "trials", "study_trials", "metrics"):
            path = folder / f"{table}.parquet"
            quoted = path.as_posix().replace("'", "''")
            self.db.execute(f"COPY {table} TO '{quoted}' (FORMAT parquet)")
            out.append(path)
        return out


def checkpoint_dir(store: str | Path, trial_id: str) -> Path:
    """Where a trial keeps its checkpoints and final model: beside the store,
    so a rerun of the study finds them (on a cluster, put the store on shared
    storage)."""
    store = Path(store).resolve()
    return store.parent / f"{store.stem}.checkpoints" / trial_id


def open_store(path: str | Path = "archsearch.duckdb", *, read_only: bool = False,
               must_exist: bool = False) -> Store:
    """Open (or create) the store at ``path``."""
    if (read_only or must_exist) and not Path(path).exists():
        raise StoreError(f"no store at {path}; run a study first (archsearch run STUDY) or pass --store PATH")
    return Store(path, read_only=read_only)
