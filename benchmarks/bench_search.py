"""Does multi-fidelity search pay? ASHA against the full grid, on real training.

    python benchmarks/bench_search.py [--steps 270] [--eta 3] [--rungs 3]

Trains every point of a 24-point grid (2 families x 4 depths x 3 taper
shapes, iso-parameter, WSD schedule) to its full budget once, evaluating at
every rung boundary, then replays ASHA over those curves: single-objective
(val_loss) and two-objective (val_loss, FLOPs per token). The replay is exact,
not an approximation: with WSD every rung lies in the stable phase, so a trial
stopped at a rung and continued later passes through the same weights as the
uninterrupted run (tests/test_halving.py checks that equality), and the loss
ASHA sees at a rung is the uninterrupted curve's loss at that step.

Prints the grid's best, ASHA's best and the share of the grid's training
tokens ASHA spent; the front's hypervolume and ASHA's share of it.
"""

from __future__ import annotations

import argparse
import tempfile
import textwrap
import time
from pathlib import Path

STUDY = """\
name: bench_search
space:
  axes:
    family: [transformer, gdn]
    num_layers: [2, 3, 4, 6]
    taper: {{shape: [uniform, cosine, reverse], ratio: 3.0}}
  model: {{head_dim: 16, multiple_of: 8}}
budget: {{targets: [60000], tolerance: 0.02}}
data: {{kind: text, seq_len: 64}}
recipe: {{steps: {steps}, batch_size: 8, lr: 3.0e-3, schedule: wsd, decay_fraction: 0.2, warmup_steps: 10,
          eval_every: {every}, eval_batches: 4}}
search: {{fidelity: {{kind: asha, rungs: {rungs}, eta: {eta}}}}}
"""


def train_grid(study, trials):
    import archsearch as A

    curves = {}
    for index, trial in enumerate(trials):
        start = time.perf_counter()
        result = A.train_trial(spec=trial.spec, recipe=trial.recipe, data=trial.data, seed=trial.seed, threads=2)
        curves[trial.trial_id] = {row["step"]: row for row in result.curve}
        print(f"  {index + 1:2d}/{len(trials)} {trial.spec.family:11s} L{trial.spec.num_layers} "
              f"{trial.axes.get('taper.shape', 'uniform'):8s} val_loss {result.val_loss:.4f} "
              f"({time.perf_counter() - start:.1f} s)", flush=True)
    return curves


def replay(trials, curves, *, steps, rungs, eta, objectives, kind="asha", width=2):
    """ASHA over the grid's curves; returns (trial ids trained to the end, steps spent)."""
    import math

    from archsearch.search import GridSearch, HalvingSearch, parse_objectives

    search = HalvingSearch(GridSearch(trials), objectives=parse_objectives(objectives), rungs=rungs, eta=eta,
                           kind=kind)
    running, spent, done, trained = [], 0, [], {t.trial_id: 0 for t in trials}
    while True:
        running += search.ask(width - len(running))
        if not running:
            break
        job = running.pop(0)
        stop = steps if job.stop_at is None else math.ceil(job.stop_at * steps)
        spent += stop - trained[job.trial.trial_id]  # a promoted trial continues from its checkpoint
        trained[job.trial.trial_id] = stop
        row = curves[job.trial.trial_id][stop]
        flops = job.trial.flops_per_token
        search.tell(job, dict(val_loss=row["val_loss"], tokens=row["tokens"], flops_per_token=flops))
        if job.stop_at is None:
            done.append(job.trial.trial_id)
    return done, spent


def hypervolume_2d(points, reference):
    """Area dominated by ``points`` (both minimised) up to ``reference``."""
    front = sorted(p for p in points if p[0] < reference[0] and p[1] < reference[1])
    area, best_y = 0.0, reference[1]
    for x, y in front:
        if y < best_y:
            area += (reference[0] - x) * (best_y - y)
            best_y = y
    return area


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=270)
    parser.add_argument("--rungs", type=int, default=3)
    parser.add_argument("--eta", type=int, default=3)
    args = parser.parse_args()
    every = args.steps // args.eta ** (args.rungs - 1)
    import archsearch as A

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "study.yaml"
        path.write_text(textwrap.dedent(STUDY.format(steps=args.steps, every=every, rungs=args.rungs,
                                                     eta=args.eta)))
        study = A.load_study(path)
    trials = A.plan(study)
    print(f"grid: {len(trials)} trials x {args.steps} steps; ASHA rungs {args.rungs}, eta {args.eta}")
    start = time.perf_counter()
    curves = train_grid(study, trials)
    print(f"grid trained in {time.perf_counter() - start:.0f} s")
    final = {t.trial_id: curves[t.trial_id][args.steps]["val_loss"] for t in trials}
    grid_steps = len(trials) * args.steps

    best = min(final, key=final.get)
    done, spent = replay(trials, curves, steps=args.steps, rungs=args.rungs, eta=args.eta,
                         objectives=["val_loss:min"])
    found = min(done, key=final.get)
    print(f"single objective: grid best {final[best]:.4f} ({best}); ASHA best {final[found]:.4f} ({found}), "
          f"{final[found] / final[best] - 1:+.2%}; ASHA spent {spent / grid_steps:.1%} of the grid's tokens")

    flops = {t.trial_id: t.flops_per_token for t in trials}
    points = {i: (final[i], flops[i]) for i in final}
    reference = (max(p[0] for p in points.values()) * 1.01, max(p[1] for p in points.values()) * 1.01)
    grid_hv = hypervolume_2d(points.values(), reference)
    done, spent = replay(trials, curves, steps=args.steps, rungs=args.rungs, eta=args.eta,
                         objectives=["val_loss:min", "flops_per_token:min"])
    asha_hv = hypervolume_2d([points[i] for i in done], reference)
    print(f"two objectives (val_loss, flops_per_token): ASHA front reaches {asha_hv / grid_hv:.1%} of the grid "
          f"front's hypervolume with {spent / grid_steps:.1%} of its tokens (reference point: 1.01 x the worst "
          "of each)")


if __name__ == "__main__":
    main()
