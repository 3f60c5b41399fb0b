"""What the driver costs per trial beyond training it: Ray tasks, the store,
checkpoints, streamed evaluation points and progress; beside what Ray Tune and
Optuna cost to run the same trials.

    python benchmarks/bench_overhead.py [--trials 20] [--repeats 3] [--no-tune]

Trains the same one-step trials these ways, one at a time (the driver with
``max_parallel: 1``, so nothing overlaps):

- ``train_trial`` in a plain loop (the floor),
- the same loop with a checkpoint folder per trial (what the driver asks of
  every trial, so a killed one resumes),
- ``run_study`` into a new store on an embedded Ray started beforehand,
- a Ray Tune ``Tuner`` over the same trials on that Ray (a function
  trainable that calls ``train_trial`` and reports its result),
- an Optuna study on a new SQLite file whose objective calls ``train_trial``
  in this process (the storage a shared Optuna study would use).

Each is timed on ``--trials`` trials and on twice as many: the difference is
what one more trial costs ("per trial"), the rest what a run costs whatever
its size ("fixed": opening the store, planning, preflight checks); "all in"
is the first's time over its trials. Ray's start-up (``ray.init`` and the
first worker's imports) is reported on its own, and one run_study before
the timing pays the driver's first-call costs. The overhead of run_study
is its per-trial cost less the plain loop's. Each is timed ``--repeats``
times, alternating, and the median is kept: on a shared machine one run can
be several times slower than the next.
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
    parser.add_argument("--no-tune", action="store_true", help="leave out Ray Tune (the slowest)")
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
        studies = {}
        for size, seeds in (("n", range(args.trials)), ("2n", range(args.trials, 3 * args.trials))):
            (folder / f"{size}.yaml").write_text(STUDY.format(corpus=corpus, seeds=list(seeds)))
            studies[size] = A.load_study(folder / f"{size}.yaml")
        trials = {size: A.plan(study) for size, study in studies.items()}

        def loop(planned: list, checkpoints: Path | None) -> float:
            start = time.perf_counter()
            for trial in planned:
                train_trial(spec=trial.spec, recipe=trial.recipe, data=trial.data, seed=trial.seed, threads=1,
                            checkpoint_dir=checkpoints / trial.trial_id if checkpoints else None)
            return time.perf_counter() - start

        def run(size: str, store: Path) -> float:
            start = time.perf_counter()
            summary = A.run_study(studies[size], store=store, show_progress=False)
            assert summary.completed == len(trials[size]), summary
            return time.perf_counter() - start

        loop(trials["n"], None)  # warm: imports, first-call costs
        start = time.perf_counter()
        ray_dir = start_ray(None)
        ray_init = time.perf_counter() - start
        start = time.perf_counter()
        ray.get(ray.remote(num_cpus=1)(_warm_worker).remote())
        worker = time.perf_counter() - start
        # first-call costs (imports, the task's export) paid before the timing
        run("n", folder / "warm.duckdb")
        _optuna(trials["n"][:2], folder / "warm.db")
        if not args.no_tune:
            _tune(trials["n"][:2], folder / "warm-tune")

        methods = {"loop": lambda size, where: loop(trials[size], None),
                   "checkpoints": lambda size, where: loop(trials[size], where),
                   "run_study": lambda size, where: run(size, where.with_suffix(".duckdb")),
                   "optuna": lambda size, where: _optuna(trials[size], where.with_suffix(".db"))}
        if not args.no_tune:
            methods["tune"] = lambda size, where: _tune(trials[size], where)
        times: dict[str, dict[str, list[float]]] = {m: {"n": [], "2n": []} for m in methods}
        # alternating, so a slow spell hits all alike; Ray Tune after the others, as the actors it
        # leaves behind for a while hold the CPUs the next run_study would take
        rounds = [[m for m in methods if m != "tune"]] * args.repeats + [["tune"]] * args.repeats * ("tune" in methods)
        try:
            for repeat, chosen in enumerate(rounds):
                for method in chosen:
                    for size in ("n", "2n"):
                        times[method][size].append(methods[method](size, folder / f"{method}-{size}-{repeat}"))
        finally:
            ray.shutdown()
            import shutil

            shutil.rmtree(ray_dir, ignore_errors=True)

    n = args.trials
    print(f"{n} and {2 * n} one-step trials, one at a time; medians of {args.repeats} runs each")
    print(f"Ray start-up: ray.init {ray_init:.2f} s, first worker with imports {worker:.2f} s")
    print(f"{'':<20} {'per trial':>10} {'fixed':>8} {'all in':>8}   per trial in each run")
    per = {}
    for key, label in (("loop", "train_trial loop"), ("checkpoints", "loop + checkpoints"),
                       ("run_study", "run_study"), ("optuna", "Optuna on SQLite"), ("tune", "Ray Tune Tuner")):
        if key not in times:
            continue
        # the cost of one more trial: the difference between the runs of 2n and of n trials
        slopes = [(big - small) / n for small, big in zip(times[key]["n"], times[key]["2n"])]
        per[key] = statistics.median(slopes)
        fixed = statistics.median(small - n * slope for small, slope in zip(times[key]["n"], slopes))
        whole = statistics.median(times[key]["n"]) / n
        runs = ", ".join(f"{slope:.3f}" for slope in slopes)
        print(f"{label:<20} {per[key]:>8.3f} s {fixed:>6.2f} s {whole:>6.3f} s   [{runs}]")
    print(f"run_study beyond the plain loop: {per['run_study'] - per['loop']:.3f} s per trial "
          f"(of which checkpoints {per['checkpoints'] - per['loop']:.3f})")


def _optuna(trials: list, storage: Path) -> float:
    """An Optuna study on SQLite that asks for each trial by its seed and trains it in this process."""
    import optuna

    from archsearch.train import train_trial

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    start = time.perf_counter()
    study = optuna.create_study(storage=f"sqlite:///{storage}", study_name="bench",
                                sampler=optuna.samplers.GridSampler({"index": list(range(len(trials)))}))

    def objective(trial) -> float:
        chosen = trials[trial.suggest_categorical("index", list(range(len(trials))))]
        return train_trial(spec=chosen.spec, recipe=chosen.recipe, data=chosen.data, seed=chosen.seed,
                           threads=1).val_loss

    study.optimize(objective, n_trials=len(trials))
    return time.perf_counter() - start


def _tune(trials: list, folder: Path) -> float:
    """A Ray Tune ``Tuner`` over the trials, one at a time, each a function trainable that trains
    its trial and reports the result."""
    import os

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with verbose=0, no table per run in the output
    from ray import tune

    payloads = [dict(spec=t.spec.to_dict(), recipe=t.recipe, data=t.data, seed=t.seed) for t in trials]
    start = time.perf_counter()
    tuner = tune.Tuner(tune.with_resources(_tune_trainable, {"cpu": 1}),
                       param_space={"payload": tune.grid_search(payloads)},
                       tune_config=tune.TuneConfig(max_concurrent_trials=1),
                       run_config=tune.RunConfig(storage_path=str(folder.resolve()), verbose=0))
    results = tuner.fit()
    assert not results.errors, results.errors
    return time.perf_counter() - start


def _tune_trainable(config: dict) -> None:
    from ray import tune

    from archsearch.arch.spec import ArchSpec
    from archsearch.train import train_trial

    payload = config["payload"]
    result = train_trial(spec=ArchSpec.from_dict(payload["spec"]), recipe=payload["recipe"], data=payload["data"],
                         seed=payload["seed"], threads=1)
    tune.report({"val_loss": result.val_loss})


def _warm_worker() -> None:
    import archsearch.train  # noqa: F401  (torch and the model code, as a trial's first import)


if __name__ == "__main__":
    main()
