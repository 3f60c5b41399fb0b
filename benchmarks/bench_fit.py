"""How long the Chinchilla L(N, D) fit takes, batched and with L-BFGS from the grid, side by side.

    python benchmarks/bench_fit.py [--bootstrap 200] [--rounds 1]

Fits tests/data/chinchilla_svg_extracted_data.csv less its 5 highest losses
(as Besiroglu et al. did) with ``solver="auto"`` (what ``archsearch fit``
runs: a scan over (alpha, beta), Newton steps over arrays) and with
``solver="lbfgs"`` (L-BFGS from all 4,500 grid starts, then one refit per
resample), and prints the wall and CPU (user + system) seconds of each, the
estimates of both, and the largest relative difference between them.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from archsearch.analysis import fit_law, read_csv

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "chinchilla_svg_extracted_data.csv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=1, help="times to repeat the batched fit")
    args = parser.parse_args()
    table = read_csv(DATA).sort_by("loss")
    table = table.slice(0, table.num_rows - 5)
    n = table.column("Model Size").to_numpy()
    d = table.column("Training FLOP").to_numpy() / (6 * n)
    loss = table.column("loss").to_numpy()
    for solver in ("auto", "lbfgs"):  # imports
        fit_law({"N": n[:20], "D": d[:20]}, loss[:20], "ND", bootstrap=2, grid=False, solver=solver)
    fits = {}
    for solver, rounds in (("auto", args.rounds), ("lbfgs", 1)):
        for _ in range(rounds):
            wall, cpu = time.perf_counter(), time.process_time()
            fits[solver] = fit_law({"N": n, "D": d}, loss, "ND", bootstrap=args.bootstrap, solver=solver)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            print(f"solver={solver}, {fits[solver].starts} starts + {args.bootstrap} bootstrap refits: "
                  f"{wall:.2f} s wall, {cpu:.2f} s CPU")
    for solver, fit in fits.items():
        print(f"{solver}: points {fit.points}, Huber loss {fit.huber_loss:.10g}, converged {fit.converged}, "
              f"residual sd {np.std(fit.residuals):.4f}")
        for name, estimate in fit.estimates.items():
            print(f"  {name:5} {estimate.value:10.4g}  [{estimate.low:.4g}, {estimate.high:.4g}]")
    worst = {part: max(abs(getattr(fits["auto"].estimates[k], part) / getattr(e, part) - 1)
                       for k, e in fits["lbfgs"].estimates.items()) for part in ("value", "low", "high")}
    print("largest relative difference, auto vs lbfgs: "
          + ", ".join(f"{part} {gap:.1e}" for part, gap in worst.items()))


if __name__ == "__main__":
    main()
