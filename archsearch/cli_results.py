"""Analyses of a store's completed trials (or of a CSV): ``pareto`` (the non-dominated
front), ``fit`` (scaling laws with bootstrap intervals) and ``compare`` (arms against a baseline)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Optional

import typer

from archsearch.cli_common import DEFAULT_STORE, JsonOpt, StoreOpt, StudyOpt, reading, user_errors
from archsearch.jsontext import strict_json

CsvOpt = Annotated[Optional[Path], typer.Option("--from-csv", help="read this CSV instead of a store")]
ByOpt = Annotated[Optional[str], typer.Option("--by", help="group by this column or axis "
                                                          "(default: family on a store, none on a CSV)")]
BootstrapOpt = Annotated[int, typer.Option(min=0, max=100_000, help="bootstrap resamples for the intervals")]
LevelOpt = Annotated[float, typer.Option(min=0.5, max=0.999, help="interval level")]


@user_errors
def pareto(objectives: Annotated[str, typer.Option(help="columns with directions, e.g. val_loss,params or "
                                                        "loss:min,params:min,speed:max")] = "val_loss,params",
           store: StoreOpt = DEFAULT_STORE, study: StudyOpt = None, from_csv: CsvOpt = None,
           matched: Annotated[str, typer.Option(help="target: compare a matched measure at its budget target; "
                                                     "achieved: the solver's raw value")] = "target",
           reference: Annotated[Optional[str], typer.Option(help="hypervolume reference point, one value per "
                                                                 "objective (default: worst + 10% of range)")]
           = None,
           extrapolate: Annotated[Optional[float], typer.Option(help="the front at this parameter count, "
                                                                     "from each group's L(N) fit")] = None,
           by: ByOpt = None, pool_arms: Annotated[bool, typer.Option(
               "--pool-arms", help="with --extrapolate: one L(N) over each group's arms, not one per arm")] = False,
           bootstrap: BootstrapOpt = 200, as_json: JsonOpt = False):
    """The non-dominated rows over two or more objectives, with the hypervolume."""
    from archsearch import analysis

    table = _analysis_table(store, study, from_csv)
    goals = analysis.parse_objectives(objectives)
    try:
        ref = [float(v) for v in reference.split(",")] if reference else None
    except ValueError:
        ref = [math.nan]
    if ref is not None and not all(math.isfinite(v) for v in ref):
        raise ValueError(f"--reference '{reference}': give one finite number per objective, e.g. 4.0,1e8,0")
    if extrapolate is not None and not (math.isfinite(extrapolate) and extrapolate > 0):
        raise ValueError(f"--extrapolate {extrapolate}: give a positive, finite parameter count, e.g. 1e9")
    if extrapolate is not None:
        front = analysis.extrapolated_front(table, goals, extrapolate, by=by or ("family" if from_csv is None
                                                                                   else None),
                                            pool_arms=pool_arms, bootstrap=bootstrap, reference=ref)
    else:
        front = analysis.pareto(table, goals, reference=ref, matched=matched)
    if not front.considered:
        raise ValueError(f"no row has a value for every objective ({', '.join(c for c, _ in goals)}) among "
                         f"{table.num_rows} read; nothing to compare (see `archsearch status` or the CSV)")
    if as_json:
        typer.echo(strict_json(front.to_dict(), indent=2))
        return
    from archsearch.terminal import lines
    from archsearch.terminal_results import front_table

    names = [c for c, _ in goals]
    if front.rows and "trial_id" not in front.rows[0]:  # CSV rows by number, extrapolated rows by group
        first = "index" if extrapolate is None else next(iter(front.rows[0]))  # the arm or group
        rows = [dict(row, index=i) for i, row in zip(front.indices, front.rows)]
        front_table(rows, [first, *names])
    else:
        front_table(front.rows, names)
    said = [f"note: {note}" for note in front.notes]
    if front.hypervolume is not None:
        said.append(f"hypervolume {front.hypervolume:.6g} ({front.hypervolume_fraction or 0:.1%} of the box up to "
                    f"the reference {', '.join(f'{v:.6g}' for v in front.reference)})")
    lines(said)


@user_errors
def fit(store: StoreOpt = DEFAULT_STORE, study: StudyOpt = None, from_csv: CsvOpt = None,
        by: Annotated[Optional[str], typer.Option("--by", help="group by this column or axis (default: family on a "
                                                               "store, none on a CSV); every group is still fitted "
                                                               "arm by arm (so --by arm, a looped study's axis, too)"
                                                               " unless --pool-arms")] = None,
        pool_arms: Annotated[bool, typer.Option("--pool-arms", help="one law over all the arms of each group (a "
                                                                    "trend across them, not a scaling law)")]
        = False,
        law: Annotated[str, typer.Option(help="laws to fit: N (params), C (compute), ND (Chinchilla)")] = "N,C,ND",
        n_col: Annotated[str, typer.Option(help="parameter count column")] = "params",
        d_col: Annotated[Optional[str], typer.Option(help="training tokens column (store: tokens)")] = None,
        flops_col: Annotated[Optional[str], typer.Option(help="training FLOPs column; tokens = FLOPs / 6N "
                                                              "when there is no tokens column")] = None,
        loss_col: Annotated[str, typer.Option(help="loss column")] = "val_loss",
        drop_highest: Annotated[int, typer.Option(min=0, help="leave out this many highest losses per group")] = 0,
        bootstrap: BootstrapOpt = 200, level: LevelOpt = 0.95,
        seed: Annotated[int, typer.Option(help="seed of the bootstrap resamples")] = 0,
        at: Annotated[Optional[list[str]], typer.Option(help="predict the loss at e.g. N=1e9,D=2e10 or C=1e21 "
                                                            "(repeatable)")] = None,
        compare: Annotated[Optional[str], typer.Option(help="effective-compute multiplier of B over A, as A,B")]
        = None,
        as_json: JsonOpt = False):
    """Scaling-law fits, one per arm (named as the report names it; a family of one arm by the family), with
    bootstrap intervals. An arm with too few sizes is listed as skipped, not fitted."""
    from archsearch import analysis

    table = _analysis_table(store, study, from_csv)
    points = [_point(text) for text in at or []]
    result = analysis.fit_scaling(
        table, laws=law.split(","), by=by or ("family" if from_csv is None else None), pool_arms=pool_arms,
        loss_col=loss_col, n_col=n_col, d_col=d_col or ("tokens" if from_csv is None else None), c_col=flops_col,
        drop_highest=drop_highest, bootstrap=bootstrap, level=level, seed=seed,
        progress=_fit_progress if table.num_rows >= FIT_PROGRESS_ROWS else None)
    out = result.to_dict()
    out["predictions"] = [dict(group=f.group, law=f.law.name, **f.predict(**p).to_dict())
                          for p in points for f in result.fits if set(f.law.variables) <= _with_d(p)]
    if compare:
        at_c = next((p["C"] for p in points if "C" in p), None)
        out["multipliers"] = [result.compute_multiplier(*result.pair(compare), compute=at_c)]
    if as_json:
        typer.echo(strict_json(out, indent=2))
        return
    from archsearch.terminal_results import fit_tables

    fit_tables(out)


@user_errors
def compare(baseline: Annotated[str, typer.Option(help="the arm every other is compared with: its label, or values "
                                                       "only it has, e.g. transformer or memory.aux=none,family=memory "
                                                       "(a protocol's baseline: iso-param or iso_flop)")],
            store: StoreOpt = DEFAULT_STORE, study: StudyOpt = None, from_csv: CsvOpt = None,
            by: Annotated[Optional[str], typer.Option(help="columns or axes that make an arm, comma-separated "
                                                           "(default: every axis that varies, arms alike but for their "
                                                           "family or match told apart as the report does; a CSV "
                                                           "must say)")]
            = None,
            within: Annotated[Optional[str], typer.Option(help="compare inside each group of these columns or "
                                                               "axes, e.g. family: each family's own baseline")]
            = None,
            metric: Annotated[str, typer.Option(help="the column compared, e.g. val_loss, gen_gap, val_accuracy")]
            = "val_loss",
            seed_col: Annotated[str, typer.Option(help="the column that pairs trials across arms")] = "seed",
            level: LevelOpt = 0.95,
            seed: Annotated[int, typer.Option(help="seed of sampled permutations (exact up to 13 pairs)")] = 0,
            pool: Annotated[bool, typer.Option("--pool", help="one test over every budget target (by default "
                                                              "each arm meets the baseline at its own target)")]
            = False,
            as_json: JsonOpt = False):
    """Each arm against a baseline over seeds: mean difference, interval, t and permutation p-values
    (paired by seed where both arms share their seeds, Welch otherwise), at each budget target apart.
    The permutation p-value is two-sided as scipy computes it: twice the smaller one-sided p-value."""
    from archsearch import analysis

    result = analysis.compare_arms(_analysis_table(store, study, from_csv), baseline=baseline, by=by, within=within,
                                   metric=metric, seed_col=seed_col, level=level, seed=seed, pool=pool)
    if as_json:
        typer.echo(strict_json(result.to_dict(), indent=2))
        return
    from archsearch.terminal_results import compare_table

    compare_table(result)


# Tables of this many rows or more: fit says on stderr which fit it is on (each takes seconds, not milliseconds).
FIT_PROGRESS_ROWS = 100_000


def _fit_progress(text: str) -> None:
    typer.echo(text, err=True)


def _analysis_table(store: Path, study: Optional[str], from_csv: Optional[Path]):
    """The rows fit and pareto read: a CSV, or the completed trials of a store."""
    from archsearch import analysis

    if from_csv is not None:
        return analysis.read_csv(from_csv)
    with reading(store, study) as db:
        return analysis.completed_trials(db, study)


def _point(text: str) -> dict[str, float]:
    """``N=1e9,D=2e10`` -> {"N": 1e9, "D": 2e10}."""
    point = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and number > 0):
            raise ValueError(f"--at '{text}': write NAME=NUMBER pairs of positive, finite numbers, e.g. N=1e9,D=2e10 "
                             "or C=1e21")
        point[name.strip().upper()] = number
        if name.strip().upper() not in ("N", "D", "C"):
            raise ValueError(f"--at '{text}': unknown variable '{name}'; use N, D or C")
    return point


def _with_d(point: dict) -> set[str]:
    return set(point) | ({"D"} if {"N", "C"} <= set(point) else set())
