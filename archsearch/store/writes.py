"""Writes of studies and trials: a study and its versions, planned trials, and each
trial's way through training (running, paused at a rung, pruned, finished with its
curve, sharing a twin's result, failed). A mixin of ``Store``, which gives it
``transaction`` and ``_within`` (the caller's write transaction, or one of its own)."""

from __future__ import annotations

import hashlib
import json
import math

import duckdb

from archsearch.store.schema import METRIC_COLUMNS, TRIAL_COLUMNS
from archsearch.store.values import _finite, _now, code_version, insert_rows


class TrialWrites:
    """The writing half of ``Store`` for the studies, trials and metrics tables."""

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


def divergence(result: dict) -> str | None:
    """Why a trained trial counts as diverged, or None."""
    for name in ("val_loss", "train_loss"):
        if not math.isfinite(result[name]):
            return (f"{name} is {result[name]} after {result['steps']} steps (training diverged; "
                    "lower recipe.lr or weight_decay)")
    return None


def _metric_row(trial_id: str, row: dict) -> list:
    # loop_fraction and loop_time_ratio: looped models with early exits only (NULL otherwise)
    return [trial_id, row["step"], row["tokens"], _finite(row["train_loss"]), _finite(row["val_loss"]),
            _finite(row["val_accuracy"]), row["lr"], row.get("loop_fraction"), row.get("loop_time_ratio")]
