"""Write the tables of docs/findings/*.md from the results committed beside them.

    python tools/findings_tables.py           # rewrite every generated table of every page
    python tools/findings_tables.py --check   # exit 1, naming each table that differs from its data

A page's results are the Parquet export of its study's store, in
docs/findings/data/<page>/ (``archsearch export --parquet docs/findings/data/<page>
--store STORE``). A generated table sits between two comment lines that say
what it is, and this script owns every line between them:

    <!-- table compare study=tlm_taper_smoke baseline=uniform within=family lower=cosine higher=reverse -->
    | ... |
    <!-- /table -->

Kinds of table (both take ``families=a,b`` to keep only those families' trials, and
``where=k:v|w,k2:u`` to keep only the rows whose column or axis ``k`` is ``v`` or ``w`` and
``k2`` is ``u``):

- ``arms study=S by=a,b [metrics=val_loss,train_loss,gen_gap]``: each arm's
  seeds, parameters, and each metric's mean with its 95% t-interval.
- ``compare study=S baseline=B [within=w] [by=a,b] [metric=m] [lower=x,y]
  [higher=z] [effect=e]``: ``archsearch compare`` over the study (each arm
  against the baseline, paired by seed, Holm over every row of the table),
  and the verdict of docs/findings/README.md for each arm the paper makes a
  claim about: ``lower``/``higher`` name the arms (a word of their label,
  or ``*`` for all) the paper says beat or lose to the baseline on the metric
  (lower is better for a loss); ``effect`` the size of the paper's effect in
  the metric's units, where the page can state it: ``effect=e`` for every arm, or
  ``effect=cosine:0.03,step_late:0.015`` per arm (a word of its label; an arm not named
  has none); ``pool=true`` tests over every budget
  target at once (``compare --pool``: a protocol's baselines are matched to their arm's
  parameters, not the study's target).

Either kind reads the study's analyses instead of its trials with ``analysis=A`` (``rho``,
``prune``, ``wanda``, ``exit``: the rows ``archsearch analyze`` wrote to the store's
``layer_profiles``, which the export carries). Each analysis row becomes a row of its trial with
the row's setting (``mode``, ``ranking``, ``removed``, ``threshold``, ...) and, for a per-layer
row, ``layer`` added to the trial's axes, and the row's metrics as columns (``rho``,
``measured``, ``perplexity``, ...); ``log_M`` is the natural log of metric ``M`` (a perplexity
as a loss, so a ratio of perplexities is a difference). The calibration's own seed is not the
trial's and is left out; a setting of null (the exit analysis's every-loop point) reads ``none``.

tests/test_findings_tables.py runs ``--check``, so a page cannot drift from its data.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

from archsearch.units import axis_value

ROOT = Path(__file__).resolve().parent.parent
FINDINGS = ROOT / "docs" / "findings"
OPEN = re.compile(r"^<!-- table (\w+)((?: [\w.]+=\S+)*) -->$")
CLOSE = "<!-- /table -->"
ALPHA = 0.05  # the family-wise error of the verdicts: 95% intervals, Holm at 0.05


class ParquetResults:
    """A store's Parquet export read as the analysis reads a store: ``trials(study)``."""

    def __init__(self, folder: Path):
        if not (folder / "trials.parquet").exists():
            raise FileNotFoundError(f"{folder}: no trials.parquet (archsearch export --parquet {folder} --store ...)")
        self.folder = folder

    def trials(self, study: str | None = None):
        import duckdb

        trials, links = (str(self.folder / f"{name}.parquet") for name in ("trials", "study_trials"))
        query = (f"SELECT t.*, t.val_loss - t.train_loss AS gen_gap FROM read_parquet('{trials}') t "
                 f"JOIN read_parquet('{links}') st USING (trial_id) WHERE st.study = ? "
                 "ORDER BY t.created_at, t.trial_id")
        with duckdb.connect() as con:
            return con.sql(query, params=[study]).to_arrow_table()


def completed(page: str, study: str, families: str | None = None, *, analysis: str | None = None,
              where: str | None = None, metrics: tuple[str, ...] = ()):
    """The study's completed trials in the page's data; ``families`` (comma-separated) keeps those;
    ``analysis``: the trials' rows of that analysis instead (see the module docstring), those
    holding every one of ``metrics``; ``where``: only the rows it names."""
    import pyarrow.compute as pc

    from archsearch import analysis as analyses

    table = analyses.completed_trials(ParquetResults(FINDINGS / "data" / page), study)
    if families:
        table = table.filter(pc.is_in(table.column("family"), value_set=pa_strings(families.split(","))))
    if analysis:
        table = profile_rows(page, table, analysis, metrics)
    if where:
        table = kept(table, where)
    if table.num_rows == 0:
        raise ValueError(f"{page}: no completed trials of study '{study}' in docs/findings/data/{page}"
                         + (f" with {analysis} rows" if analysis else "") + (f" where {where}" if where else ""))
    return table


CALIBRATION_SEED = "seed"  # a setting's calibration seed, not the trial's


def profile_rows(page: str, trials, analysis: str, metrics: tuple[str, ...]):
    """One row per trial, setting and layer of ``analysis`` in the page's ``layer_profiles``:
    the trial's columns, its axes with the setting (and layer) added, and a column per metric."""
    import duckdb
    import pyarrow as pa

    folder = FINDINGS / "data" / page
    profiles = folder / "layer_profiles.parquet"
    with duckdb.connect() as con:
        found = con.sql(f"SELECT trial_id, setting, layer, metric, value FROM read_parquet('{profiles}') "
                        "WHERE analysis = ? ORDER BY trial_id, created_at", params=[analysis]).fetchall()
    by_trial = {row["trial_id"]: row for row in trials.to_pylist()}
    wanted = {m.removeprefix("log_") for m in metrics}
    grouped: dict[tuple, dict] = {}
    for trial_id, setting, layer, metric, value in found:
        if trial_id not in by_trial or metric not in wanted:
            continue
        # a setting of null (``analyze exit``'s every-loop point) reads "none", so it can name an arm
        setting = {k: "none" if v is None else v for k, v in json.loads(setting).items() if k != CALIBRATION_SEED}
        key = (trial_id, json.dumps(setting, sort_keys=True), layer)
        row = grouped.setdefault(key, {"setting": setting, "layer": layer, "values": {}})
        row["values"][metric] = value
    rows = []
    for (trial_id, _, _), found_row in grouped.items():
        values = found_row["values"]
        if not all(m.removeprefix("log_") in values for m in metrics):
            continue
        trial = dict(by_trial[trial_id])
        axes = json.loads(trial["axes"]) if isinstance(trial["axes"], str) else dict(trial["axes"] or {})
        axes.update(found_row["setting"])
        if found_row["layer"] is not None:
            axes["layer"] = found_row["layer"]
        trial["axes"] = json.dumps(axes)
        for metric in metrics:
            value = values[metric.removeprefix("log_")]
            trial[metric] = math.log(value) if metric.startswith("log_") else value
        rows.append(trial)
    if not rows:
        return trials.slice(0, 0)
    return pa.Table.from_pylist(rows)


def kept(table, where: str):
    """The rows of ``table`` that ``where`` (``k:v|w,k2:u``) names: column or axis k is v or w, and so on."""
    conditions = []
    for part in where.split(","):
        key, _, allowed = part.partition(":")
        if not key or not allowed:
            raise ValueError(f"where={where}: give key:value|value pairs separated by commas")
        conditions.append((key, set(allowed.split("|"))))
    axes = [json.loads(a) if isinstance(a, str) else (a or {}) for a in table.column("axes").to_pylist()]
    columns = {key: table.column(key).to_pylist() for key, _ in conditions if key in table.column_names}
    keep = []
    for i, row in enumerate(axes):
        ok = True
        for key, allowed in conditions:
            if key in row:
                value = row[key]
            elif key in columns:
                value = columns[key][i]
            else:
                ok = False
                break
            if not {str(value), json.dumps(value)} & allowed:
                ok = False
                break
        keep.append(ok)
    return table.filter(pa_bools(keep))


def pa_bools(values: list[bool]):
    import pyarrow as pa

    return pa.array(values, type=pa.bool_())


def pa_strings(values: list[str]):
    import pyarrow as pa

    return pa.array(values, type=pa.string())


def verdict(row, *, claim: str | None, effect: float | None) -> str:
    """docs/findings/README.md's rule for one arm against its baseline ("lower" or "higher": the
    direction the paper states for the arm's metric)."""
    if claim is None:
        return "—"
    if row.low is None or row.p_holm is None:
        return "inconclusive"
    sign = -1 if claim == "lower" else 1
    if row.p_holm < ALPHA and (row.high < 0 or row.low > 0):
        return "held" if sign * row.difference > 0 else "contradicted"
    # the paper's effect lies outside the interval on its own side: this scale would have shown it
    if effect is not None and (row.low > -effect if claim == "lower" else row.high < effect):
        return "not supported"
    return "inconclusive"


def claim_of(label: str, options: dict) -> str | None:
    words = label.split()
    for direction in ("lower", "higher"):
        terms = [t for t in options.get(direction, "").split(",") if t]
        if "*" in terms or label in terms or any(t in words for t in terms):
            return direction
    return None


def effect_of(label: str, options: dict) -> float | None:
    """The paper's effect size for the arm ``label``: ``effect=e`` for every arm, or
    ``effect=word:e,word2:e2`` per arm (a word of its label); None where the page states none."""
    text = options.get("effect")
    if text is None:
        return None
    if ":" not in text:
        return float(text)
    words = label.split()
    for part in text.split(","):
        word, _, value = part.partition(":")
        if word == label or word in words:
            return float(value)
    return None


def compare_table(page: str, options: dict) -> list[str]:
    from archsearch import analysis

    metric = options.get("metric", "val_loss")
    data = completed(page, options["study"], options.get("families"), analysis=options.get("analysis"),
                     where=options.get("where"), metrics=(metric,))
    result = analysis.compare_arms(data, baseline=options["baseline"], by=options.get("by"),
                                   within=options.get("within"), metric=metric, pool=options.get("pool") == "true")
    grouped = bool(result.within)
    head = (["group"] if grouped else []) + [
        "arm", "seeds", f"minus {result.baseline} (mean ± 95%)", "seeds lower", "paired t p", "sign-flip p",
        "Holm p", "paper says", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in result.differences:
        claim = claim_of(row.arm, options)
        half = (row.high - row.low) / 2 if row.low is not None else math.nan
        cells = ([row.group] if grouped else []) + [
            row.arm, str(row.n), f"{row.difference:+.4f} ± {half:.4f}",
            f"{row.below}/{row.pairs}" if row.paired else "unpaired", _p(row.p_value), _p(row.p_permutation),
            _p(row.p_holm), claim or "—", verdict(row, claim=claim, effect=effect_of(row.arm, options))]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def arms_table(page: str, options: dict) -> list[str]:
    import numpy as np
    from scipy import stats

    by = options["by"].split(",")
    metrics = options.get("metrics", "val_loss").split(",")
    data = completed(page, options["study"], options.get("families"), analysis=options.get("analysis"),
                     where=options.get("where"), metrics=tuple(metrics))
    columns = {name: data.column(name).to_pylist() for name in ["params", "seed", *metrics]}
    axes = [json.loads(a) if isinstance(a, str) else a for a in data.column("axes").to_pylist()]
    arms: dict[str, list[int]] = {}
    for i, row in enumerate(axes):
        label = " ".join(axis_value(row[key] if key in row else data.column(key)[i].as_py()) for key in by
                         if key in row or key in data.column_names)
        arms.setdefault(label, []).append(i)
    head = ["arm", "seeds", "params"] + [f"{m} (mean ± 95%)" for m in metrics]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for label in sorted(arms):
        rows = arms[label]
        params = sorted({columns["params"][i] for i in rows})
        cells = [label, str(len(rows)), ", ".join(f"{p:,}" for p in params)]
        for metric in metrics:
            values = np.array([columns[metric][i] for i in rows], dtype=float)
            if len(values) < 2:  # one seed: no interval
                cells.append(f"{values.mean():.4f} ± —")
                continue
            half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
            cells.append(f"{values.mean():.4f} ± {half:.4f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _p(value: float | None) -> str:
    return "—" if value is None else (f"{value:.2g}" if value < 0.001 else f"{value:.3f}")


KINDS = {"compare": compare_table, "arms": arms_table}


def rewrite(page: Path) -> tuple[str, list[str]]:
    """The page with every generated table written afresh, and the tables that changed."""
    lines = page.read_text().split("\n")
    out, changed, i = [], [], 0
    while i < len(lines):
        out.append(lines[i])
        match = OPEN.match(lines[i])
        i += 1
        if not match:
            continue
        end = lines.index(CLOSE, i)
        options = dict(part.split("=", 1) for part in match.group(2).split())
        table = KINDS[match.group(1)](page.stem, options)
        if lines[i:end] != table:
            changed.append(f"{page.relative_to(ROOT)}:{i}: {match.group(1)} {options.get('study', '')}")
        out += table
        i = end
    return "\n".join(out), changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page's table differs from its data")
    args = parser.parse_args(argv)
    stale = []
    for page in sorted(FINDINGS.glob("*.md")):
        text, changed = rewrite(page)
        stale += changed
        if changed and not args.check:
            page.write_text(text)
    for line in stale:
        print(("stale: " if args.check else "rewrote: ") + line)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
