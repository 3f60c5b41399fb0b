"""How long `archsearch plan` takes on a 1,000-point space (no torch module is built).

    python benchmarks/bench_plan.py

Prints the time of the whole command (start-up, imports, parsing, expansion,
width solving, counting, JSON) and of the planning call alone. On a shared
machine wall time swings with load; CPU time (user + system) does not, and
on an idle machine the two agree.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STUDY = """\
name: bench
space:
  axes:
    family: [transformer, gated_attention, mamba, gdn]
    num_layers: {low: 2, high: 51, grid: 50}
    taper:
      shape: [cosine, linear, sigmoid, reverse, uniform]
      ratio: 3.0
budget:
  targets: [2.0e+6]
"""


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "study.yaml"
        path.write_text(STUDY)
        start, before = time.perf_counter(), _child_cpu()
        out = subprocess.run([sys.executable, "-m", "archsearch.cli", "plan", str(path), "--json"],
                             capture_output=True, text=True, check=True).stdout
        command, command_cpu = time.perf_counter() - start, _child_cpu() - before
        import json

        import archsearch as A

        study = A.load_study(path)
        A.plan(study)  # warm the imports
        start, before = time.perf_counter(), time.process_time()
        trials = A.plan(study)
        call, call_cpu = time.perf_counter() - start, time.process_time() - before
    assert len(json.loads(out)) == len(trials)
    print(f"trials: {len(trials)}")
    print(f"archsearch plan --json (whole command): {command:.2f} s wall, {command_cpu:.2f} s CPU")
    print(f"A.plan(study) (planning alone):          {call:.2f} s wall, {call_cpu:.2f} s CPU "
          f"({1e3 * call_cpu / len(trials):.2f} ms CPU per trial)")


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    main()
