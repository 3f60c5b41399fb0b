"""The store's tables beside the trials: rungs of multi-fidelity trials, a
sampled search's proposals, fidelity ladders, analyses of trained models,
kernel preflights and study checks. A mixin of ``Store``, which gives it ``_within`` (a write
transaction) and ``sql`` (a read)."""

from __future__ import annotations

import json

import duckdb
import pyarrow as pa

from archsearch.store.values import _finite, _now, code_version, insert_rows


class SideTables:
    """Reads and writes of the tables that sit beside ``trials``."""

    def record_rung(self, trial_id: str, rung: int, fraction: float, result: dict, *,
                    con: duckdb.DuckDBPyConnection | None = None) -> None:
        """A multi-fidelity trial reached ``rung`` (``fraction`` of its tokens)."""
        with self._within(con) as con:
            con.execute("INSERT OR REPLACE INTO trial_rungs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        [trial_id, rung, fraction, result["steps"], result["tokens"], _finite(result["val_loss"]),
                         _finite(result["val_accuracy"]), _now()])

    def record_proposals(self, study: str, records: list[dict], *,
                         con: duckdb.DuckDBPyConnection | None = None) -> None:
        """A sampled search's finished proposals: the point, its trials and the
        objective values the sampler was told (None for a failed proposal)."""
        if not records:
            return
        now = _now()
        with self._within(con) as con:
            con.executemany(
                "INSERT OR REPLACE INTO search_proposals VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [[study, r["number"], json.dumps(r["point"], default=str), json.dumps(r["trial_ids"]),
                  json.dumps(r["objectives"]), json.dumps(r["values"]), r["state"], now] for r in records])

    def record_ladder(self, study: str, ladder: dict, *, con: duckdb.DuckDBPyConnection | None = None) -> None:
        """The rank correlation between a study's probe and its own data."""
        with self._within(con) as con:
            con.execute("INSERT OR REPLACE INTO fidelity_ladders VALUES (?, ?, ?, ?, ?, ?)",
                        [study, ladder["points"], ladder["spearman"], ladder["low"], ladder["high"], _now()])

    def record_profile(self, trial_id: str, analysis: str, rows: list[dict], *,
                       con: duckdb.DuckDBPyConnection | None = None) -> None:
        """An analysis of a trained trial: rows of ``setting`` (a dict), ``layer``
        (None for the whole model), ``metric`` and ``value``. Rows already stored
        for the same trial, analysis and setting are replaced."""
        now = _now()
        blobs = [json.dumps(row.get("setting") or {}, sort_keys=True) for row in rows]
        with self._within(con) as con:
            for blob in set(blobs):
                con.execute("DELETE FROM layer_profiles WHERE trial_id = ? AND analysis = ? "
                            "AND setting::VARCHAR = ?", [trial_id, analysis, blob])
            insert_rows(con, "INSERT INTO layer_profiles",
                        ["trial_id", "analysis", "setting", "layer", "metric", "value", "code_version", "created_at"],
                        [[trial_id, analysis, blob, row.get("layer"), row["metric"], float(row["value"]),
                          code_version(), now] for row, blob in zip(rows, blobs)])

    def record_kernel_preflight(self, study: str, failures: dict[str, str], *,
                                con: duckdb.DuckDBPyConnection | None = None) -> None:
        """The kernels a study's preflight found broken on its device, {op: why}; those ops ran
        their PyTorch path. Kept in meta (no new table)."""
        with self._within(con) as con:
            con.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [f"kernel_preflight:{study}", json.dumps(failures)])

    def kernel_preflight(self, study: str) -> dict[str, str]:
        """The last preflight's failures for ``study`` ({} when all passed or none ran)."""
        rows = self.sql("SELECT value FROM meta WHERE key = ?", [f"kernel_preflight:{study}"]).to_pylist()
        return json.loads(rows[0]["value"]) if rows else {}

    def record_check(self, study: str, check: str, result: dict, *,
                     con: duckdb.DuckDBPyConnection | None = None) -> None:
        """The outcome of a study's check (``checks: [causal]``): ``passed``, what
        it covered, the failure line; the last run's, kept in meta beside the preflight."""
        result = {**result, "ran_at": _now().isoformat(timespec="seconds")}
        with self._within(con) as con:
            con.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [f"check:{check}:{study}", json.dumps(result)])

    def checks(self, study: str | None = None) -> list[dict]:
        """The checks recorded for ``study`` (or every study), each with ``study`` and ``check``."""
        out = []
        for row in self.sql("SELECT key, value FROM meta WHERE key LIKE 'check:%' ORDER BY key").to_pylist():
            _, check, name = row["key"].split(":", 2)
            if study is None or name == study:
                out.append({"study": name, "check": check, **json.loads(row["value"])})
        return out

    def layer_profiles(self, trial_id: str | None = None, analysis: str | None = None) -> pa.Table:
        """Stored analyses of trained trials (``record_profile`` rows), optionally of one trial or analysis."""
        given = {"trial_id": trial_id, "analysis": analysis}
        where = " AND ".join(f"{name} = ?" for name, value in given.items() if value is not None) or "TRUE"
        return self.sql(f"SELECT * FROM layer_profiles WHERE {where} "
                        "ORDER BY trial_id, analysis, setting::VARCHAR, layer NULLS FIRST, metric",
                        [value for value in given.values() if value is not None])

    def ladders(self, study: str | None = None) -> pa.Table:
        """Each study's probe-to-data rank correlation (fidelity ladders only)."""
        if study is None:
            return self.sql("SELECT * FROM fidelity_ladders ORDER BY study")
        return self.sql("SELECT * FROM fidelity_ladders WHERE study = ?", [study])

    def rung_rows(self) -> dict[str, dict[int, dict]]:
        """Every multi-fidelity trial's rungs reached: trial id -> rung -> row."""
        out: dict[str, dict[int, dict]] = {}
        for row in self.sql("SELECT * FROM trial_rungs ORDER BY trial_id, rung").to_pylist():
            out.setdefault(row["trial_id"], {})[row["rung"]] = row
        return out

    def proposals(self, study: str) -> pa.Table:
        """A sampled search's proposals, in the order they were asked."""
        return self.sql("SELECT * FROM search_proposals WHERE study = ? ORDER BY number", [study])
