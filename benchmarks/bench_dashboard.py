"""How the dashboard and the report hold up on a large store.

Generates a store of ``--trials`` completed trials (10 arms: 2 families x 5
taper shapes, sizes spread over three decades) with ``--points`` metric rows
in all, written by DuckDB itself. Then, in a new process as ``archsearch
dashboard`` starts one: the app's start (imports, ``create_app``), the first
study view after it (``app.refresh``: every fit, query and figure from cold)
and redraws of it (best of three: what the app does every few seconds, fits
kept), and the view's fits again, as it fits them and with L-BFGS from the
grid of starts; then writing the report, and the report's size. The machine's load
average is printed before and after, since timings on a shared machine move with it::

    python benchmarks/bench_dashboard.py                       # 100,000 trials, 10M points
    python benchmarks/bench_dashboard.py --trials 10000 --points 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
from archsearch_dashboards.report import write_report

import archsearch as A

SHAPES = ("uniform", "cosine", "linear", "reverse", "bottleneck")


def generate(path: Path, *, trials: int, points: int) -> None:
    with A.open_store(path) as store:
        store.add_study(name="big", path="big.yaml", config={})
    per_trial = max(points // trials, 1)
    spec = json.dumps({"family": "transformer", "layers": [{"mixer": "attention", "mlp_width": w}
                                                           for w in (96, 64, 32)], "structure": "stack",
                       "options": {}})
    families = "['transformer', 'mamba']"
    shapes = "[" + ", ".join(f"'{s}'" for s in SHAPES) + "]"
    con = duckdb.connect(str(path))
    con.execute(f"""
        CREATE TEMP TABLE g AS SELECT i, {families}[1 + i % 2] AS family, {shapes}[1 + (i // 2) % 5] AS shape,
            CAST(1000 * pow(1000, hash(i) % 1000000 / 1e6) AS BIGINT) AS params FROM range({trials}) t(i)""")
    con.execute(f"""
        INSERT INTO trials (trial_id, family, axes, seed, match, target, params, total_params, flops_per_token,
            match_error, achieved, d_model, num_layers, spec, recipe, data, status, val_loss, train_loss,
            val_accuracy, steps, tokens, wall_time_s, tokens_per_s, created_at)
        SELECT 't' || i, family, json_object('family', family, 'taper.shape', shape), 0, 'params', params,
            params, params + 4096, 6.0 * params, 0.0, params, 64, 3, '{spec}', '{{}}', '{{}}', 'completed',
            2 + 3 * pow(params, -0.3) * (1 + (i % 10) / 20) + (hash(i * 7) % 1000) / 1e5, 2.0, 0.3,
            {per_trial}, {per_trial * 64}, 1.0, 1000.0, now() FROM g""")
    con.execute("INSERT INTO study_trials SELECT 'big', 't' || i FROM g")
    con.execute(f"""
        INSERT INTO metrics SELECT 't' || i, s, s * 64, 3.0, 2 + 3 / (s + 1), 0.3, 1e-3, NULL, NULL
        FROM range({trials}) t(i), range(1, {per_trial + 1}) u(s)""")
    con.close()


def views(path: Path) -> dict:
    """Seconds to start the app, draw the first study view, and redraw it (run in a new process)."""
    start = time.perf_counter()
    from archsearch_dashboards.app import create_app, refresh

    create_app(path)
    started = time.perf_counter()
    summary = refresh(path, study="big")["summary"]
    first = time.perf_counter()
    redraws = []
    for _ in range(3):
        begin = time.perf_counter()
        refresh(path, study="big")
        redraws.append(time.perf_counter() - begin)
    return {"start": started - start, "first": first - started, "redraw": min(redraws), "summary": summary,
            **fits()}


def fits() -> dict:
    """The scaling view's own fits again (the points each arm was fitted on), as
    the view fits them and with L-BFGS from the 150-start grid: seconds of each."""
    import numpy as np
    import scipy.optimize  # noqa: F401  (its import is not the fits' time)
    from archsearch_dashboards.scaling import _FIT_CACHE

    from archsearch.analysis import fit_law

    out = {"arms": 0, "fast": 0.0, "lbfgs": 0.0}
    for points, bootstrap in _FIT_CACHE:
        sizes, losses = np.array(points).T
        for name, options in (("fast", dict(grid=False)), ("lbfgs", dict(solver="lbfgs"))):
            begin = time.perf_counter()
            fit_law({"N": sizes}, losses, "N", bootstrap=bootstrap, **options)
            out[name] += time.perf_counter() - begin
        out["arms"] += 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--points", type=int, default=10_000_000)
    parser.add_argument("--views-of", type=Path, help=argparse.SUPPRESS)  # the new process's part
    args = parser.parse_args()
    if args.views_of:
        print(json.dumps(views(args.views_of)))
        return
    print(f"load average before: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "big.duckdb"
        start = time.perf_counter()
        generate(path, trials=args.trials, points=args.points)
        print(f"generated {args.trials:,} trials, {args.points:,} metric points in "
              f"{time.perf_counter() - start:.1f}s")
        out = subprocess.run([sys.executable, __file__, "--views-of", str(path)], capture_output=True, text=True,
                             check=True)
        seconds = json.loads(out.stdout.splitlines()[-1])
        print(f"app start (new process: imports, create_app): {seconds['start']:.2f}s")
        print(f"first study view after start: {seconds['first']:.2f}s ({seconds['summary']})")
        print(f"redraw of the view (best of 3): {seconds['redraw']:.2f}s "
              f"(first view / redraw: {seconds['first'] / seconds['redraw']:.2f})")
        print(f"the view's {seconds['arms']} fits again: {seconds['fast']:.2f}s as the view fits them, "
              f"{seconds['lbfgs']:.2f}s with L-BFGS from the grid ({seconds['lbfgs'] / seconds['fast']:.0f}x)")
        start = time.perf_counter()
        with A.open_store(path, read_only=True) as db:
            report = write_report(db, Path(folder) / "big.html", study="big")
        print(f"report: {time.perf_counter() - start:.2f}s, {report.stat().st_size / 1e6:.1f} MB")
    print(f"load average after: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
