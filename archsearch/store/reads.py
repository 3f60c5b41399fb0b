"""Reads of studies, trials and curves as Arrow tables or rows (a trial left running by
a driver that is gone reads as interrupted), and the Parquet export of every table. A
mixin of ``Store``, which gives it ``sql`` and ``_connect``."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow as pa

from archsearch.files import output_problem
from archsearch.store import portable as portable_paths
from archsearch.store.runlock import run_alive
from archsearch.store.schema import GEN_GAP, TABLES


class TrialReads:
    """The reading half of ``Store`` for the studies, trials and metrics tables."""

    def study_versions(self, study: str) -> pa.Table:
        """Every version of a study's resolved config and file text, oldest first."""
        return self.sql("SELECT * FROM study_versions WHERE study = ? ORDER BY version", [study])

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
    def export_parquet(self, folder: str | Path, *, portable: bool = False) -> list[Path]:
        """Write every table as ``folder/<table>.parquet`` (one consistent snapshot).

        ``portable`` writes the store's study, data and cache paths relative to the current
        folder (or by name when outside it) and adds ``data_files.parquet``: each data file's
        shared name, bytes and sha256, so the export can be shared and its data checked."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        out = []
        with self._connect() as con:
            # a store older than a table (read as it is) exports what it has
            present = {row[0] for row in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
            names: dict[str, str] = {}
            if portable:
                data, other = portable_paths.store_paths(con, present)
                here = Path.cwd().resolve()
                names = {path: portable_paths.shared_name(path, here) for path in data + other}
                con.register("_data_files", portable_paths.describe_files(data, names))
            tables = [name for name in TABLES if name in present] + ([portable_paths.DATA_FILES] if portable else [])
            for table in tables:
                path = folder / f"{table}.parquet"
                problem = output_problem(path)
                if problem is not None:  # a named pipe there would block the COPY until someone reads it
                    raise OSError(f"{path} {problem}")
                if table == portable_paths.DATA_FILES:
                    query = "SELECT * FROM _data_files"
                else:
                    columns = con.execute("SELECT column_name, data_type FROM information_schema.columns "
                                          "WHERE table_name = ? ORDER BY ordinal_position", [table]).fetchall()
                    query = f"SELECT {', '.join(portable_paths.rewrite(c, k, names) for c, k in columns)} FROM {table}"
                quoted = path.as_posix().replace("'", "''")
                try:
                    con.execute(f"COPY ({query}) TO '{quoted}' (FORMAT parquet)")
                except duckdb.IOException as err:
                    if path.as_posix() not in str(err):
                        raise  # reading the store failed, not writing the export
                    raise OSError(str(err).splitlines()[0]) from None
                out.append(path)
        return out
