"""Does search pay? Grid, random, TPE and ASHA over each, on the same curves.

    python benchmarks/bench_search.py --work DIR [--orders 10] [--real PAIRS] [--ladder]

1. Trains a 24-point grid (Transformer++ and Gated DeltaNet x 2, 3, 4, 6 layers x uniform,
   cosine and reverse tapers, iso-parameter, WSD schedule, evaluated every 15 steps) through
   ``archsearch run`` into DIR/grid.duckdb, its wall time kept; a finished grid is reused.
2. Replays six searches over those curves, each over ``--orders`` seeds (the grid and ASHA over
   it: shuffled orders): grid, random, TPE, ASHA over the grid, ASHA over random, ASHA over TPE.
   The replay is exact: with WSD every rung below the last lies in the stable phase, so a trial
   stopped at a rung and continued later passes through the weights of the uninterrupted run
   (tests/test_halving.py checks that), and the loss ASHA sees at a rung is the curve's there.
   Two workers; the clock is tokens trained, so a worker's job ends after its tokens.
   Prints, per search, the median and range of the share of the grid's tokens spent until a
   trial trained to the end reaches the grid's best, within 1% and within 2% of it; then for
   two objectives (val_loss, flops_per_token) the share of the grid front's hypervolume that
   the trials trained to the end reach at a share of the grid's tokens.
3. ``--real PAIRS``: the grid and ASHA over TPE through ``archsearch run``, PAIRS times each in
   ABBA order, each into a fresh store, so relaunches and checkpoints count: wall times, jobs,
   tokens and best, with the load average at each start.
4. ``--ladder``: the fidelity ladder on the same points (an MQAR probe, ``keep: 1`` so every point
   has both) through ``archsearch run`` on a copy of the grid's store (its text trials are done):
   Spearman's rho between the probe's ranking and the text's, with its 95% interval.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEPS, RUNGS, ETA = 135, 3, 3
STUDY = """\
name: {name}
space:
  axes:
    family: [transformer, gdn]
    num_layers: [2, 3, 4, 6]
    taper: {{shape: [uniform, cosine, reverse], ratio: 3.0}}
  model: {{head_dim: 16, multiple_of: 8}}
budget: {{targets: [60000], tolerance: 0.02}}
data: {{kind: text, seq_len: 64}}
recipe: {{steps: {steps}, batch_size: 8, lr: 3.0e-3, schedule: wsd, decay_fraction: 0.2, warmup_steps: 10,
          eval_every: 15, eval_batches: 4}}
execution: {{max_parallel: 2, threads_per_trial: 1}}
search: {search}
"""
PROBE = ("{probe: {data: {kind: mqar, seq_len: 64, vocab_size: 256, num_pairs: 8}, keep: 1.0, recipe: {steps: 135, "
         "batch_size: 8, lr: 3.0e-3, schedule: wsd, decay_fraction: 0.2, warmup_steps: 10, eval_every: 45, "
         "eval_batches: 4}}}")
SEARCHES = {  # name -> (sampler, fidelity)
    "grid": ("grid", None), "random": ("random", None), "TPE": ("tpe", None),
    "ASHA over grid": ("grid", "asha"), "ASHA over random": ("random", "asha"), "ASHA over TPE": ("tpe", "asha"),
}
TWO_OBJECTIVE = {**SEARCHES, "NSGA-II": ("nsga2", None), "ASHA over NSGA-II": ("nsga2", "asha")}


def study_text(name: str, sampler: str, fidelity: str | None, *, seed: int = 0, objectives: str = "[val_loss:min]",
               trials: int = 24) -> str:
    parts = [f"sampler: {sampler}", f"objectives: {objectives}"]
    if sampler != "grid":
        parts += [f"trials: {trials}", f"seed: {seed}"]
    if fidelity:
        parts.append(f"fidelity: {{kind: {fidelity}, rungs: {RUNGS}, eta: {ETA}}}")
    return STUDY.format(name=name, steps=STEPS, search="{" + ", ".join(parts) + "}")


def load(folder: Path, text: str):
    import archsearch as A

    path = folder / "study.yaml"
    path.write_text(text)
    return A.load_study(path)


def archsearch_run(study_path: Path, store: Path) -> float:
    """``archsearch run``, timed from outside (Ray's start and every relaunch count)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "archsearch.cli", "run", str(study_path), "--store", str(store),
                    "--no-progress"], check=True, cwd=store.parent)  # its report goes beside the store
    return time.perf_counter() - start


def grid_curves(work: Path) -> tuple[dict, dict]:
    """trial id -> {step: val_loss} and the grid's run facts, training the grid first if need be."""
    import archsearch as A

    store, facts_path = work / "grid.duckdb", work / "grid.json"
    if not facts_path.exists():
        path = work / "grid.yaml"
        path.write_text(study_text("bench_search_grid", "grid", None))
        wall = archsearch_run(path, store)
        facts_path.write_text(json.dumps({"wall_s": wall}))
    with A.open_store(store, read_only=True) as db:
        curves: dict[str, dict[int, float]] = {}
        for row in db.metrics("bench_search_grid").to_pylist():
            curves.setdefault(row["trial_id"], {})[row["step"]] = row["val_loss"]
        trials = db.trials("bench_search_grid").to_pylist()
    facts = json.loads(facts_path.read_text())
    facts["trained_wall_s"] = sum(t["wall_time_s"] for t in trials)
    return curves, facts


def replay(searcher, curves: dict, *, width: int = 2) -> list[tuple[float, str]]:
    """Drive ``searcher`` over the grid's curves with ``width`` workers, the clock counting tokens
    (as steps). Returns (steps spent by all workers when it ended, trial id) per trial trained to
    its end, in the order they ended."""
    clock, busy, ended, started = 0.0, [], [], {}  # busy: heap of (end, order, job, start)
    order = 0
    while True:
        for job in searcher.ask(width - len(busy)):
            stop = STEPS if job.stop_at is None else math.ceil(job.stop_at * STEPS)
            from_step = started.get(job.trial.trial_id, 0)  # a promoted trial continues from its checkpoint
            heapq.heappush(busy, (clock + stop - from_step, order, job, clock))
            started[job.trial.trial_id] = stop
            order += 1
        if not busy:
            return ended
        clock, _, job, _ = heapq.heappop(busy)
        stop = STEPS if job.stop_at is None else math.ceil(job.stop_at * STEPS)
        spent = sum(done for done in started.values()) - sum(end - clock for end, *_ in busy)
        searcher.tell(job, dict(val_loss=curves[job.trial.trial_id][stop], tokens=stop,
                                flops_per_token=job.trial.flops_per_token))
        if job.stop_at is None:
            ended.append((spent, job.trial.trial_id))


def searcher_for(name: str, spec: tuple, seed: int, folder: Path, grid_trials: list, objectives: str):
    from archsearch.search import GridSearch, HalvingSearch, SampledSearch, parse_objectives

    sampler, fidelity = spec
    if sampler == "grid":
        inner = GridSearch(random.Random(seed).sample(grid_trials, len(grid_trials)))
    else:
        study = load(folder, study_text("replay", sampler, None, seed=seed, objectives=objectives))
        journal = folder / f"{name}-{seed}-{objectives.count(',') + 1}.journal".replace(" ", "_")
        inner = SampledSearch(study, journal=journal, known={})
    if fidelity is None:
        return inner
    return HalvingSearch(inner, objectives=parse_objectives(objectives.strip("[]").split(", ")), rungs=RUNGS,
                         eta=ETA, kind=fidelity)


def reached(ended: list, final: dict, target: float) -> float:
    """Steps spent when the best trial trained to the end first was at most ``target``; inf: never."""
    return next((spent for spent, trial_id in ended if final[trial_id] <= target), math.inf)


def hypervolume_2d(points, reference) -> float:
    """Area dominated by ``points`` (both minimised) up to ``reference``."""
    front = sorted(p for p in points if p[0] < reference[0] and p[1] < reference[1])
    area, best_y = 0.0, reference[1]
    for x, y in front:
        if y < best_y:
            area += (reference[0] - x) * (best_y - y)
            best_y = y
    return area


def spread(values: list[float]) -> str:
    """Median [min-max] as shares, 'never' for a search that did not get there."""
    if all(math.isinf(v) for v in values):
        return "never"
    missed = sum(math.isinf(v) for v in values)
    text = f"{statistics.median(values):.1%} [{min(values):.1%}-{max(values):.1%}]".replace("inf%", "never")
    return text + (f", missed {missed}/{len(values)}" if missed else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True, help="folder for the grid's store (reused) and runs")
    parser.add_argument("--orders", type=int, default=10, help="seeds (samplers) or shuffled orders (grid) per search")
    parser.add_argument("--real", type=int, default=0, metavar="PAIRS",
                        help="also time PAIRS runs each of the grid and ASHA over TPE through `archsearch run`")
    parser.add_argument("--ladder", action="store_true", help="also measure the MQAR probe ladder's rank correlation")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    import archsearch as A

    curves, facts = grid_curves(args.work)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        grid_trials = A.plan(load(folder, study_text("bench_search_grid", "grid", None)))
        final = {t.trial_id: curves[t.trial_id][STEPS] for t in grid_trials}
        grid_steps = len(grid_trials) * STEPS
        best = min(final.values())
        first_rung = {t.trial_id: curves[t.trial_id][STEPS // ETA ** (RUNGS - 1)] for t in grid_trials}
        top_at_rung = min(first_rung, key=first_rung.get)
        print(f"grid: {len(grid_trials)} points x {STEPS} steps, `archsearch run` wall {facts['wall_s']:.0f} s; "
              f"best val_loss {best:.4f}; the best at the first rung ({first_rung[top_at_rung]:.4f}) ends "
              f"{final[top_at_rung]:.4f}, rank {sorted(final.values()).index(final[top_at_rung]) + 1} of "
              f"{len(final)}")
        print("\nshare of the grid's tokens spent until a trial trained to the end reaches the grid's best "
              f"(median [range] over {args.orders} seeds/orders)\n")
        print("| search | the best | within 1% | within 2% | tokens spent in all |\n"
              "| --- | ---: | ---: | ---: | ---: |")
        for name, spec in SEARCHES.items():
            rows = [[], [], [], []]
            for seed in range(args.orders):
                ended = replay(searcher_for(name, spec, seed, folder, grid_trials, "[val_loss:min]"), curves)
                for column, tolerance in enumerate((0.0, 0.01, 0.02)):
                    rows[column].append(reached(ended, final, best * (1 + tolerance)) / grid_steps)
                rows[3].append(max((s for s, _ in ended), default=0.0) / grid_steps)
            print(f"| {name} | " + " | ".join(spread(column) for column in rows) + " |", flush=True)
        two_objectives(args, folder, curves, grid_trials, final, grid_steps)
    if args.real:
        real_run(args.work, final, pairs=args.real)
    if args.ladder:
        ladder(args.work)


def two_objectives(args, folder, curves, grid_trials, final, grid_steps) -> None:
    flops = {t.trial_id: t.flops_per_token for t in grid_trials}
    points = {i: (final[i], flops[i]) for i in final}
    reference = (max(p[0] for p in points.values()) * 1.01, max(p[1] for p in points.values()) * 1.01)
    grid_hv = hypervolume_2d(points.values(), reference)
    shares = (0.1, 0.2, 0.3, 0.5)
    print("\ntwo objectives (val_loss, flops_per_token): share of the grid front's hypervolume reached by the "
          f"trials trained to the end, by share of the grid's tokens spent (median [range], {args.orders} "
          "seeds/orders; reference 1.01 x the worst of each)\n")
    print("| search | " + " | ".join(f"at {s:.0%}" for s in shares) + " | 99% of it after |\n| --- |"
          + " ---: |" * (len(shares) + 1))
    for name, spec in TWO_OBJECTIVE.items():
        columns = [[] for _ in range(len(shares) + 1)]
        for seed in range(args.orders):
            searcher = searcher_for(name, spec, seed, folder, grid_trials, "[val_loss:min, flops_per_token:min]")
            ended = replay(searcher, curves)
            for column, share in enumerate(shares):
                done = [points[i] for spent, i in ended if spent <= share * grid_steps]
                columns[column].append(hypervolume_2d(done, reference) / grid_hv)
            columns[-1].append(next((spent / grid_steps for k, (spent, _) in enumerate(ended)
                                     if hypervolume_2d([points[i] for _, i in ended[:k + 1]], reference)
                                     >= 0.99 * grid_hv), math.inf))
        cells = [f"{statistics.median(c):.1%} [{min(c):.1%}-{max(c):.1%}]" for c in columns[:-1]]
        print(f"| {name} | " + " | ".join(cells) + f" | {spread(columns[-1])} |", flush=True)


def real_run(work: Path, final: dict, *, pairs: int) -> None:
    """ASHA over TPE and the grid through ``archsearch run``, in ABBA order (grid, ASHA, ASHA, grid,
    ...), each into a fresh store, so a load that drifts over the runs weighs on both alike: wall
    times, tokens and best, and the load average each run started at."""
    import archsearch as A

    runs = {"grid": ("grid", None), "ASHA over TPE": ("tpe", "asha")}
    order = [name for k in range(pairs) for name in (("grid", "ASHA over TPE") if k % 2 == 0
                                                      else ("ASHA over TPE", "grid"))]
    grid_tokens = STEPS * 8 * 64 * len(final)
    walls: dict[str, list[float]] = {name: [] for name in runs}
    print("\nreal runs through `archsearch run` (24 proposals, two trials at a time), ABBA order\n")
    print("| run | load average at start | wall s | jobs | tokens (share of the grid's) | best val_loss |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: |")
    for k, name in enumerate(order):
        slug = f"real_{k}_{runs[name][0]}"
        path, store = work / f"{slug}.yaml", work / f"{slug}.duckdb"
        for old in work.glob(f"{slug}.duckdb*"):
            old.unlink()
        path.write_text(study_text(f"bench_search_{slug}", *runs[name]))
        load = os.getloadavg()[0]
        wall = archsearch_run(path, store)
        walls[name].append(wall)
        with A.open_store(store, read_only=True) as db:
            trials = db.trials(f"bench_search_{slug}").to_pylist()
            jobs = sum(len(r) for r in db.rung_rows().values()) if runs[name][1] else len(trials)
        tokens = sum(t["tokens"] or 0 for t in trials)
        found = min(t["val_loss"] for t in trials if t["status"] == "completed")
        print(f"| {name} | {load:.1f} | {wall:.0f} | {jobs} | {tokens:,} ({tokens / grid_tokens:.1%}) | "
              f"{found:.4f} |", flush=True)
    ratio = statistics.median(walls["ASHA over TPE"]) / statistics.median(walls["grid"])
    print(f"\nASHA over TPE's wall time, median over {pairs} run(s), against the grid's: {ratio:.0%}")


def ladder(work: Path) -> None:
    """The probe ladder over the grid's points, its text trials taken from a copy of the grid's store."""
    import shutil

    import archsearch as A

    path, store = work / "ladder.yaml", work / "ladder.duckdb"
    if not store.exists():
        shutil.copy(work / "grid.duckdb", store)
    path.write_text(STUDY.format(name="bench_search_ladder", steps=STEPS, search=PROBE))
    wall = archsearch_run(path, store)
    with A.open_store(store, read_only=True) as db:
        row = db.sql("SELECT points, spearman, low, high FROM fidelity_ladders WHERE study = ?",
                     ["bench_search_ladder"]).to_pylist()[0]
    print(f"\nfidelity ladder (MQAR probe, {row['points']} points, {wall:.0f} s): Spearman's rho between the probe's "
          f"ranking and the text's {row['spearman']:+.2f} [{row['low']:+.2f}, {row['high']:+.2f}] (95% bootstrap)")


if __name__ == "__main__":
    main()
