"""What the driver costs per trial beyond training it: Ray tasks, the store,
checkpoints, streamed evaluation points.

    python benchmarks/bench_overhead.py [--trials 20] [--repeats 3]

Trains the same one-step trials three ways, one at a time (the driver with
``max_parallel: 1``, so nothing overlaps):

- ``train_trial`` in a plain loop (the floor),
- the same loop with a checkpoint folder per trial (what the driver asks of
  every trial, so a killed one resumes),
- ``run_study`` into a new store on an embedded Ray started beforehand.

Ray's start-up (``ray.init`` and the first worker's imports) is reported on
its own. Overhead per trial = (run_study - plain loop) / trials. Each of the
three is timed ``--repeats`` times, alternating, and the median is kept: on
a shared machine one run can be several times slower than the next.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

SPACE = """\
name: bench
axes:
  family: transformer
  num_layers: 2
model:
  head_dim: 8
"""

STUDY = """\
name: bench
space: space.yaml
budget:
  targets: [6000]
  tolerance: 0.02
data:
  kind: text
  paths: [{corpus}]
  seq_len: 16
recipe:
  steps: 1
  batch_size: 4
  warmup_steps: 0
  eval_every: 1
  eval_batches: 1
seeds: {seeds}
execution:
  max_parallel: 1
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import ray

    import archsearch as A
    from archsearch.execute.cluster import start_ray
    from archsearch.train import train_trial

    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        corpus = folder / "corpus"
        corpus.mkdir()
        for i in range(8):
            (corpus / f"doc{i}.txt").write_text(("the quick brown fox jumps over the lazy dog " * 80) + str(i))
        (folder / "space.yaml").write_text(SPACE)
        (folder / "study.yaml").write_text(STUDY.format(corpus=corpus, seeds=list(range(args.trials))))
        study = A.load_study(folder / "study.yaml")
        trials = A.plan(study)

        def loop(checkpoints: Path | None) -> float:
            start = time.perf_counter()
            for trial in trials:
                train_trial(spec=trial.spec, recipe=trial.recipe, data=trial.data, seed=trial.seed, threads=1,
                            checkpoint_dir=checkpoints / trial.trial_id if checkpoints else None)
            return time.perf_counter() - start

        loop(None)  # warm: imports, first-call costs
        start = time.perf_counter()
        ray_dir = start_ray(None)
        ray_init = time.perf_counter() - start
        start = time.perf_counter()
        ray.get(ray.remote(num_cpus=1)(_warm_worker).remote())
        worker = time.perf_counter() - start

        times: dict[str, list[float]] = {"loop": [], "checkpoints": [], "run_study": []}
        try:
            for repeat in range(args.repeats):
                times["loop"].append(loop(None))
                times["checkpoints"].append(loop(folder / f"cp-{repeat}"))
                start = time.perf_counter()
                summary = A.run_study(study, store=folder / f"s-{repeat}.duckdb", show_progress=False)
                times["run_study"].append(time.perf_counter() - start)
                assert summary.completed == len(trials), summary
        finally:
            ray.shutdown()
            import shutil

            shutil.rmtree(ray_dir, ignore_errors=True)

    n = len(trials)
    median = {k: statistics.median(v) for k, v in times.items()}
    print(f"trials: {n} one-step trials, one at a time; median of {args.repeats} (all runs in brackets)")
    print(f"Ray start-up: ray.init {ray_init:.2f} s, first worker with imports {worker:.2f} s")
    for key, label in (("loop", "train_trial loop"), ("checkpoints", "loop + checkpoints"),
                       ("run_study", "run_study")):
        runs = ", ".join(f"{t / n:.3f}" for t in times[key])
        print(f"{label:<20} {median[key] / n:.3f} s per trial  [{runs}]")
    print(f"overhead beyond the plain loop: {(median['run_study'] - median['loop']) / n:.3f} s per trial "
          f"(of which checkpoints {(median['checkpoints'] - median['loop']) / n:.3f})")


def _warm_worker() -> None:
    import archsearch.train  # noqa: F401  (torch and the model code, as a trial's first import)


if __name__ == "__main__":
    main()
