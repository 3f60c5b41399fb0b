"""Where a run's fixed cost goes: one-step trials through ``run_study`` on a fresh Ray, phase by phase.

    python benchmarks/bench_fixed.py [--trials 3] [--repeats 3] [--against NAME=PATH ...]

Each repeat is a fresh process (so ``ray.init``, the workers and every import
start cold) that runs a small grid study into a new store and prints a
timeline, in seconds from the call of ``run_study``:

- ``ray.init``: the span of ``ray.init`` (its start shows how much of the
  store's preparation and the planning ran before it, or beside it);
- ``before Ray``: the store, the searcher and the planning up to the first
  trial's submission, less whatever ran beside ``ray.init``;
- ``first task``: from the first trial's submission until its worker runs it
  (a fresh worker unpickles the task's module), then ``worker imports``: torch,
  the model and data code, unless a warm-up already imported them;
- ``per trial``: the steady cost of a later one-step trial (last result minus
  first, over trials - 1), and ``fixed``: ``run_study`` less trials x per trial;
- ``ray.shutdown``; ``after exit``: from the run's last line to its process's
  end; ``exit``: the process's whole wall time (interpreter start to exit);
  ``leaked procs``: how many processes the run started outlived it.

``--against NAME=PATH`` also times another checkout's ``archsearch`` package
(PATH holds it, as ``git archive BASE archsearch | tar -x -C PATH`` makes
one), each repeat interleaved with this checkout's, so a change is measured
before and after on the same machine load. Medians are printed; the load
average is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
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
ROWS = ("ray.init", "before Ray", "first task", "worker imports", "first trial", "per trial", "ray.shutdown",
        "run_study", "fixed", "after exit", "exit")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--against", action="append", default=[], metavar="NAME=PATH",
                        help="another checkout's archsearch package to time in the same rounds")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(Path(args.child), trials=args.trials)
    trees = {"this checkout": None} | dict(item.split("=", 1) for item in args.against)
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    loads = [os.getloadavg()[0]]
    for repeat in range(args.repeats):
        for name, tree in (trees.items() if repeat % 2 == 0 else reversed(trees.items())):
            runs[name].append(_one_run(tree, trials=args.trials))
            loads.append(os.getloadavg()[0])
    print(f"{args.trials} one-step trial(s) per run, medians of {args.repeats} fresh processes, "
          f"load average {min(loads):.1f}-{max(loads):.1f} over the runs")
    print(f"{'s':<16}" + "".join(f"{name:>16}" for name in trees))
    for row in ROWS:
        print(f"{row:<16}" + "".join(f"{statistics.median(r[row] for r in runs[name]):>16.2f}" for name in trees))
    print(f"{'leaked procs':<16}" + "".join(f"{max(r['leaked'] for r in runs[name]):>16d}" for name in trees))
    for name in trees:
        print(f"{name}: run_study " + ", ".join(f"{r['run_study']:.2f}" for r in runs[name])
              + "; ray.init started at " + ", ".join(f"{r['ray.init at']:.2f}" for r in runs[name])
              + f"; trial on a warm worker {sum(r['warm'] for r in runs[name])} of {len(runs[name])}"
              + f"; driver imported torch {sum(r['driver torch'] for r in runs[name])} of {len(runs[name])}")


def _one_run(tree: str | None, *, trials: int) -> dict:
    """One fresh process timing one run; the archsearch it imports is ``tree``'s or this checkout's."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(tree).resolve()), env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory(prefix="bench-fixed-") as name:
        start = time.perf_counter()
        # The study's folder as the working directory: Ray puts the driver's on the workers' path.
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", name, "--trials", str(trials)],
                              cwd=name, env=env, capture_output=True, text=True, timeout=600)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"the timed run failed:\n{done.stderr[-3000:]}")
        ended = time.time()
        figures = json.loads(done.stdout.strip().splitlines()[-1])
    # Every process the run's driver had started, looked for once it has exited.
    leaked = [pid for pid in figures.pop("processes") if Path(f"/proc/{pid}").exists()]
    expected = Path(tree).resolve() if tree else Path(__file__).resolve().parents[1]
    assert all(Path(path).is_relative_to(expected) for path in figures.pop("code")), (expected, figures)
    return figures | {"exit": wall, "after exit": ended - figures.pop("printed"), "leaked": len(leaked)}


def _child(folder: Path, *, trials: int) -> None:
    """Runs in the timed process: ``run_study`` with timestamps taken around Ray's and the driver's calls."""
    import ray

    import archsearch as A
    from archsearch.execute import driver

    events: dict[str, float] = {}
    log = folder / "worker.json"

    def stamp(name, fn):
        def wrapper(*a, **k):
            events.setdefault(f"{name} start", time.time())
            try:
                return fn(*a, **k)
            finally:
                events[f"{name} end"] = time.time()
        return wrapper

    original_task, original_take = driver._trial_task, driver._Drain._take

    def timed_task(payload):
        """The trial's task, noting in the worker when it began and when its imports were done."""
        began, warm = time.time(), "torch" in sys.modules
        import archsearch.train  # noqa: F401  (what the trial's first lines import)
        import archsearch as package

        if not log.exists():
            log.write_text(json.dumps(dict(began=began, imported=time.time(), warm=warm, code=package.__file__)))
        yield from original_task(payload)

    results: list[float] = []

    def take(self, generator):
        ended = original_take(self, generator)
        results.extend(time.time() for _ in ended)
        return ended

    processes: list[int] = []
    real_init, real_shutdown = ray.init, ray.shutdown

    def shutdown(*a, **k):
        import psutil

        processes.extend(child.pid for child in psutil.Process().children(recursive=True))
        return real_shutdown(*a, **k)

    ray.init = stamp("ray.init", real_init)
    ray.shutdown = stamp("ray.shutdown", shutdown)
    driver._trial_task, driver._Drain._take = timed_task, take
    driver._Drain._submit = stamp("submit", driver._Drain._submit)
    (folder / "space.yaml").write_text(SPACE)
    (folder / "study.yaml").write_text(STUDY.format(seeds=list(range(trials))))
    study = A.load_study(folder / "study.yaml")
    start = time.time()
    summary = A.run_study(study, store=folder / "s.duckdb", show_progress=False)
    end = time.time()
    assert summary.completed == trials, summary
    worker = json.loads(log.read_text())
    walls = [row["wall_time_s"] for row in A.open_store(folder / "s.duckdb").trials(study.name).to_pylist()]
    span = lambda name: events[f"{name} end"] - events[f"{name} start"]  # noqa: E731
    per_trial = (results[-1] - results[0]) / (trials - 1) if trials > 1 else float("nan")
    init_at = events["ray.init start"] - start
    # What the driver did before the first trial, less what ran beside ray.init (its own thread, if any).
    before = events["submit start"] - start - span("ray.init")
    print(json.dumps({
        "ray.init": span("ray.init"), "ray.init at": init_at, "before Ray": before,
        "first task": worker["began"] - events["submit start"], "worker imports": worker["imported"] - worker["began"],
        "first trial": results[0] - events["submit start"], "per trial": per_trial,
        "ray.shutdown": span("ray.shutdown"), "run_study": end - start,
        "fixed": end - start - trials * (per_trial if trials > 1 else min(walls)),
        "driver torch": "torch" in sys.modules, "warm": worker["warm"], "code": [A.__file__, worker["code"]], "processes": processes,
        "printed": time.time()}))


if __name__ == "__main__":
    main()
