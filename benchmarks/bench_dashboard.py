"""How the dashboard and the report hold up on a large store.

Generates a store of ``--trials`` completed trials (10 arms: 2 families x 5
taper shapes, sizes spread over three decades) with ``--points`` metric rows
in all, written by DuckDB itself, then times one study view of the live app
(``app.refresh``, the work of one redraw: first with cold fit caches, then
warm) and writing the report, and prints the report's size::

    python benchmarks/bench_dashboard.py                       # 100,000 trials, 10M points
    python benchmarks/bench_dashboard.py --trials 10000 --points 1000000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import duckdb
from archsearch_dashboards.app import refresh
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--points", type=int, default=10_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "big.duckdb"
        start = time.perf_counter()
        generate(path, trials=args.trials, points=args.points)
        print(f"generated {args.trials:,} trials, {args.points:,} metric points in "
              f"{time.perf_counter() - start:.1f}s")
        for when in ("cold", "warm"):
            start = time.perf_counter()
            view = refresh(path, study="big")
            print(f"study view ({when} fit cache): {time.perf_counter() - start:.2f}s ({view['summary']})")
        start = time.perf_counter()
        with A.open_store(path, read_only=True) as db:
            report = write_report(db, Path(folder) / "big.html", study="big")
        print(f"report: {time.perf_counter() - start:.2f}s, {report.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
