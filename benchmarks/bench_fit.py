"""How long the Chinchilla L(N, D) fit takes: the full grid of starts, then the bootstrap.

    python benchmarks/bench_fit.py [--bootstrap 200]

Fits tests/data/chinchilla_svg_extracted_data.csv less its 5 highest losses
(as Besiroglu et al. did) from all 4,500 starts, and prints the estimates,
the wall and CPU (user + system) seconds of the grid and of the bootstrap.
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
    args = parser.parse_args()
    table = read_csv(DATA).sort_by("loss")
    table = table.slice(0, table.num_rows - 5)
    n = table.column("Model Size").to_numpy()
    d = table.column("Training FLOP").to_numpy() / (6 * n)
    loss = table.column("loss").to_numpy()
    fit_law({"N": n[:20], "D": d[:20]}, loss[:20], "ND", bootstrap=0, grid=False)  # imports
    for label, bootstrap in (("grid of 4,500 starts", 0), (f"grid + {args.bootstrap} bootstrap refits",
                                                           args.bootstrap)):
        wall, cpu = time.perf_counter(), time.process_time()
        fit = fit_law({"N": n, "D": d}, loss, "ND", bootstrap=bootstrap)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(f"{label}: {wall:.1f} s wall, {cpu:.1f} s CPU")
    for name, estimate in fit.estimates.items():
        print(f"  {name:5} {estimate.value:10.4g}  [{estimate.low:.4g}, {estimate.high:.4g}]")
    print(f"  points {fit.points}, Huber loss {fit.huber_loss:.6g}, converged {fit.converged}, "
          f"residual sd {np.std(fit.residuals):.4f}")


if __name__ == "__main__":
    main()
