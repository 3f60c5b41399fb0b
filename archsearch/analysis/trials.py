"""Store results as analysis tables: completed trials, and what each was matched on. Torch-free.

Every trial records the measure it was solved for (``match``), the budget
(``target``) and the value the solver reached (``achieved``). Trials matched
to one budget differ in that measure only by the solver's rounding, so fronts
compare it at the target by default.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from archsearch.analysis.tables import as_table

# The columns a match kind can land on; the one equal to ``achieved`` is the matched column
# (params matched with embeddings counted land on total_params).
MATCHED_COLUMNS = {
    "params": ("params", "total_params"),
    "iso_param": ("params", "total_params"),
    "flops": ("flops_per_token",),
    "iso_flop": ("flops_per_token",),
    "state": ("state",),
}


def completed_trials(store: Any, study: str | None = None) -> pa.Table:
    """The completed trials of ``study`` (or all) in ``store`` as an Arrow table;
    of a learning-rate sweep only each arm's best run."""
    trials = store.trials(study)
    done = pc.equal(trials.column("status"), "completed")
    counted = pc.or_kleene(pc.is_null(trials.column("sweep_group")), pc.fill_null(trials.column("sweep_best"), False))
    return trials.filter(pc.and_kleene(done, counted))


def matched_values(data: Any, columns: list[str]) -> tuple[dict[str, np.ndarray], list[str]]:
    """For each of ``columns`` that some trial was matched on, the column with
    those trials' values replaced by their target, and a note saying so.

    Tables without ``match``/``target``/``achieved`` (a CSV) come back unchanged.
    """
    table = as_table(data)
    if not {"match", "target", "achieved"} <= set(table.column_names):
        return {}, []
    match = table.column("match").to_pylist()
    target = np.asarray(table.column("target").to_numpy(zero_copy_only=False), dtype=float)
    achieved = np.asarray(table.column("achieved").to_numpy(zero_copy_only=False), dtype=float)
    out, notes = {}, []
    for column in columns:
        if column not in table.column_names or column not in {c for cs in MATCHED_COLUMNS.values() for c in cs}:
            continue
        values = np.asarray(table.column(column).to_numpy(zero_copy_only=False), dtype=float)
        matched = np.array([column in MATCHED_COLUMNS.get(m, ()) for m in match], dtype=bool)
        matched &= np.isclose(values, achieved, rtol=1e-9, atol=0)
        if matched.any():
            out[column] = np.where(matched, target, values)
            spread = np.nanmax(np.abs(achieved[matched] / target[matched] - 1))
            notes.append(f"{column}: the {int(matched.sum())} trials matched on {column} are compared at their "
                         f"budget target, not the achieved value (solver rounding, at most {spread:.2%}); "
                         "--matched achieved compares raw values")
    return out, notes
