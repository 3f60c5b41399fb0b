"""How long a Pareto front and its hypervolume take on 100,000 points.

    python benchmarks/bench_pareto.py [--points 100000] [--repeats 5]

Three data sets: 2 and 3 objectives drawn uniformly (small fronts, the usual
case), and 3 objectives on a plane (every point on the front, the worst case
for the sweep). Each time is the median of the repeats after one warm-up,
as wall and CPU (user + system) seconds; on a shared machine the wall time
swings with load, the CPU time does not.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from archsearch.analysis import hypervolume, nondominated, pareto


def data_sets(points: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    plane = rng.random((points, 2))
    return {"2 objectives, uniform": rng.random((points, 2)), "3 objectives, uniform": rng.random((points, 3)),
            "3 objectives, all on the front": np.column_stack([plane, 2 - plane.sum(axis=1)])}


def timed(call, repeats: int) -> tuple[float, float]:
    call()
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        call()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"{'data':32} {'front':>7} {'front s (wall/cpu)':>19} {'hypervolume s':>14} {'pareto() s':>16}")
    for name, points in data_sets(args.points).items():
        front = nondominated(points)
        reference = np.full(points.shape[1], 2.5)
        columns = {f"o{j}": points[:, j] for j in range(points.shape[1])}
        objectives = ",".join(columns)
        front_wall, front_cpu = timed(lambda: nondominated(points), args.repeats)
        volume_wall, volume_cpu = timed(lambda: hypervolume(points[front], reference), args.repeats)
        whole_wall, whole_cpu = timed(lambda: pareto(columns, objectives), args.repeats)
        print(f"{name:32} {len(front):7d} {front_wall:9.3f}/{front_cpu:.3f} {volume_wall:8.3f}/{volume_cpu:.3f} "
              f"{whole_wall:9.3f}/{whole_cpu:.3f}")


if __name__ == "__main__":
    main()
