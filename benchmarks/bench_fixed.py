"""Where a run's fixed cost goes: one one-step trial through ``run_study`` on a fresh Ray.

    python benchmarks/bench_fixed.py [--trials 1]

Times the whole ``run_study`` call and, inside it, ``start_ray`` (``ray.init``
of the private embedded instance), the first trial (a fresh worker's imports of
torch and the model code, and the trial), and ``ray.shutdown``. The rest is
the store (open, lock, study, trials) and the driver loop. Run it twice: the
first run on a machine also fills the token cache.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

SPACE = "name: bench\naxes:\n  family: transformer\n  num_layers: 2\nmodel:\n  head_dim: 8\n"
STUDY = """\
name: bench
space: space.yaml
budget: {{targets: [6000], tolerance: 0.02}}
data: {{kind: text, seq_len: 16, max_bytes: 200_000}}
recipe: {{steps: 1, batch_size: 4, warmup_steps: 0, eval_every: 1, eval_batches: 1}}
seeds: {seeds}
execution: {{max_parallel: 1}}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1)
    args = parser.parse_args()
    start = time.perf_counter()
    import ray

    import archsearch as A
    from archsearch.execute import driver

    imports = time.perf_counter() - start
    phases: dict[str, float] = {}

    def timed(name, fn):
        def wrapper(*a, **k):
            begin = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - begin
        return wrapper

    driver.start_ray = timed("ray.init", driver.start_ray)
    real_shutdown = ray.shutdown
    ray.shutdown = timed("ray.shutdown", real_shutdown)
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        (folder / "space.yaml").write_text(SPACE)
        (folder / "study.yaml").write_text(STUDY.format(seeds=list(range(args.trials))))
        study = A.load_study(folder / "study.yaml")
        start = time.perf_counter()
        summary = A.run_study(study, store=folder / "s.duckdb", show_progress=False)
        total = time.perf_counter() - start
        assert summary.completed == args.trials, summary
        store = A.open_store(folder / "s.duckdb")
        walls = [row["wall_time_s"] for row in store.trials(study.name).to_pylist() if row.get("wall_time_s") is not None]
    ray.shutdown = real_shutdown
    trained = sum(walls)
    print(f"imports (ray, archsearch) {imports:.2f} s")
    print(f"run_study {total:.2f} s for {args.trials} one-step trial(s):")
    for key in ("ray.init", "ray.shutdown"):
        print(f"  {key:<14} {phases.get(key, 0.0):.2f} s")
    print(f"  training      {trained:.2f} s (the trials' own wall time)")
    rest = total - sum(phases.values()) - trained
    print(f"  the rest      {rest:.2f} s (the store, the first worker's imports, the driver loop)")


if __name__ == "__main__":
    main()
