"""Plant defects in the code that decides results, one at a time, and see which the tests catch.

    python tools/mutation_check.py              # every mutant; prints each and the score
    python tools/mutation_check.py pareto fit   # only the mutants of these areas
    python tools/mutation_check.py --list       # the mutants, without running anything

Run on demand, not in CI: each mutant runs the tests aimed at its module, in
the tier ``TIER`` (no Ray, nothing slow; seconds to a minute or two each). The work happens in a copy of the
repository's tracked files in a temporary folder, so a crash or an interrupt
never leaves a planted defect in the working tree. A mutant is *killed* when
its tests fail (or run past ``TIMEOUT_S``, which counts as caught: a defect
that hangs the tests is seen), *survives* when they pass. A mutant whose text
is no longer in its file is reported as stale, so a refactor cannot make
this list silently test nothing.

Each mutant is one small, plausible mistake: a comparison loosened, an input
left out of a hash, an off-by-one in a promotion, a status or count written
wrong. The areas are the modules whose bugs change a study's numbers
silently: budget (parameter counts, the width solver), planner ids, pareto,
fit, compare, store writes and halving.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 600
# the tiers a mutant's tests run in: no Ray and nothing marked slow (minutes each, for a handful of
# mutants; the default-tier tests aimed at these modules are what this checks)
TIER = "not ray and not slow and not gpu and not browser"


@dataclass(frozen=True)
class Mutant:
    area: str
    path: str  # relative to the repository root
    old: str  # exact text, found once in the file
    new: str
    tests: tuple[str, ...]
    what: str


# pytest node ids are fine too: the count tests against the built module live in the zoo's contract
BUDGET = ("tests/test_budget.py", "tests/zoo/test_contract.py::test_parameter_count_is_exact")
PLANNER = ("tests/test_trial_ids.py", "tests/test_plan.py")
PARETO = ("tests/test_pareto.py",)
FIT = ("tests/test_fit.py", "tests/test_fit_batched.py")
COMPARE = ("tests/test_compare.py",)
STORE = ("tests/test_store.py", "tests/test_twins.py")
HALVING = ("tests/test_halving.py", "tests/test_searcher_contract.py")

MUTANTS = [
    # budget: counts and the width solver
    Mutant("budget", "archsearch/arch/structures/stack_counts.py",
           "return sum(per_layer(spec, layer_params)) + spec.d_model",
           "return sum(per_layer(spec, layer_params))", BUDGET, "final norm left out of the parameter count"),
    Mutant("budget", "archsearch/budget/count.py",
           "(1 if spec.tie_embeddings else 2)", "(1 if spec.tie_embeddings else 1)", BUDGET,
           "an untied head not counted"),
    Mutant("budget", "archsearch/budget/solve.py", "if abs(error) <= tolerance:", "if abs(error) < 2 * tolerance:",
           BUDGET, "the solver's tolerance doubled"),
    Mutant("budget", "archsearch/budget/solve.py", "if best is None or rank < best[0]:",
           "if best is None or rank > best[0]:", BUDGET, "the solver keeps the worst-ranked candidate"),
    Mutant("budget", "archsearch/budget/solve.py", "if target < smallest:", "if target < smallest / 2:", BUDGET,
           "a target below the smallest model accepted"),
    # planner ids
    Mutant("planner", "archsearch/planner.py", '"data": data, ', "", PLANNER, "the data left out of the trial id"),
    Mutant("planner", "archsearch/planner.py", ', "seed": seed}', "}", PLANNER, "the seed left out of the trial id"),
    Mutant("planner", "archsearch/planner.py", '"recipe": deciding(recipe), ', "", PLANNER,
           "the recipe left out of the trial id"),
    Mutant("planner", "archsearch/planner.py", "    if pair is not None:\n        described",
           "    if False:\n        described", PLANNER, "a baseline's partner left out of its id"),
    Mutant("planner", "archsearch/planner.py", "return _digest(spec, recipe, data, seed, None)",
           'return _digest(spec, recipe, data, seed, "pair")', PLANNER, "the train key unlike the plain id"),
    # pareto
    Mutant("pareto", "archsearch/analysis/pareto.py", "return i >= 0 and self.ys[i] <= y",
           "return i >= 0 and self.ys[i] < y", PARETO, "the 3-objective sweep's tie rule"),
    Mutant("pareto", "archsearch/analysis/pareto.py", "if size == 0 or not (front[:size] <= point)",
           "if size == 0 or not (front[:size] < point)", PARETO, "the n-objective sweep's tie rule"),
    Mutant("pareto", "archsearch/analysis/pareto.py", "keep = unique[:, 1] < before", "keep = unique[:, 1] <= before",
           PARETO, "the 2-objective sweep keeps ties"),
    Mutant("pareto", "archsearch/analysis/pareto.py", "dominated |= (pivot <= unique).all(axis=1) & (pivot < unique)",
           "dominated |= (pivot <= unique).all(axis=1) & (pivot <= unique)", PARETO,
           "the prefilter removes a pivot's equals"),
    Mutant("pareto", "archsearch/analysis/pareto.py", "REFERENCE_MARGIN = 0.1", "REFERENCE_MARGIN = 0.0", PARETO,
           "the default reference point's margin"),
    Mutant("pareto", "archsearch/analysis/pareto.py", "volume += stairs.area * (heights[n + 1] - heights[n])",
           "volume += stairs.area * (heights[n + 1] - heights[0])", PARETO,
           "the 3-D hypervolume's slab height"),
    # fit
    Mutant("fit", "archsearch/analysis/fit.py", "slope = np.clip(residual, -self.delta, self.delta)",
           "slope = np.clip(residual, -2 * self.delta, 2 * self.delta)", FIT, "the Huber objective's delta"),
    Mutant("fit", "archsearch/analysis/laws.py", "for q in ((1 - level) / 2, (1 + level) / 2):",
           "for q in ((1 - level), (1 + level) / 2):", FIT, "the interval's lower quantile"),
    Mutant("fit", "archsearch/analysis/laws.py", "gap = np.exp(log_target) - np.exp(e)",
           "gap = np.exp(log_target) + np.exp(e)", FIT, "the multiplier's loss gap above the floor"),
    Mutant("fit", "archsearch/analysis/laws.py", "return float(np.exp(exponent) / compute) if exponent <= LOG_MAX",
           "return float(np.exp(exponent) * compute) if exponent <= LOG_MAX", FIT,
           "the compute multiplier's ratio inverted"),
    # compare
    Mutant("compare", "archsearch/analysis/compare.py", "se = float(d.std(ddof=1)) / math.sqrt(n)",
           "se = float(d.std(ddof=0)) / math.sqrt(n)", COMPARE, "the paired test's spread biased"),
    Mutant("compare", "archsearch/analysis/compare.py", "half = float(stats.t.ppf(0.5 + level / 2, df)) * se",
           "half = float(stats.norm.ppf(0.5 + level / 2)) * se", COMPARE, "a normal interval for a t one"),
    Mutant("compare", "archsearch/analysis/compare.py", "running = max(running, min(1.0, (len(tested) - rank) * p))",
           "running = min(1.0, (len(tested) - rank) * p)", COMPARE, "Holm's adjustment not monotone"),
    Mutant("compare", "archsearch/analysis/compare.py", "p = float(2 * stats.t.sf(abs(mean) / se, df))",
           "p = float(stats.t.sf(abs(mean) / se, df))", COMPARE, "a one-sided p-value"),
    # store writes
    Mutant("store", "archsearch/store/writes.py", '["diverged" if diverged else "completed", diverged,',
           '["completed", diverged,', STORE, "a diverged trial written completed"),
    Mutant("store", "archsearch/store/writes.py", 'con.execute("DELETE FROM metrics WHERE trial_id = ?", [trial_id])\n'
           '            if result["curve"]:', 'if result["curve"]:', STORE, "a retried trial's old curve kept"),
    Mutant("store", "archsearch/store/writes.py", "[int(new_attempt), trial_id])", "[1, trial_id])", STORE,
           "a promotion counted as a new attempt"),
    Mutant("store", "archsearch/store/writes.py", "(SELECT arg_min(trial_id, val_loss) FROM trials",
           "(SELECT arg_max(trial_id, val_loss) FROM trials", STORE, "the sweep's best is its worst"),
    # halving
    Mutant("halving", "archsearch/search/halving.py", "for entry in ranked[:len(members) // self.eta]:",
           "for entry in ranked[:len(members) // self.eta + 1]:", HALVING, "one trial too many promoted"),
    Mutant("halving", "archsearch/search/halving.py", "return float(self.eta ** -(self.rungs - 1 - rung))",
           "return float(self.eta ** -(self.rungs - rung))", HALVING, "every rung's share of tokens off by one"),
    Mutant("halving", "archsearch/search/halving.py",
           "return sum(1 for e in members if rung in e.results) >= below // self.eta",
           "return sum(1 for e in members if rung in e.results) > below // self.eta", HALVING,
           "a synchronous rung never complete"),
    Mutant("halving", "archsearch/search/halving.py", "if values is None or entry.rung == self.rungs - 1:",
           "if entry.rung == self.rungs - 1:", HALVING, "a failed rung's trial never reported to the sampler"),
    Mutant("halving", "archsearch/search/halving.py", "and any(x < y for x, y in zip(a, b))",
           "and any(x <= y for x, y in zip(a, b))", HALVING, "multi-objective ranks: equals dominate"),
    Mutant("halving", "archsearch/search/halving.py", "order += sorted(front, key=lambda i: -distance[i])",
           "order += sorted(front, key=lambda i: distance[i])", HALVING, "crowding tie-break reversed"),
]


def copy_of_the_repository(into: Path) -> Path:
    """The tracked files (as they are in the working tree) under ``into``."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return into


def run_tests(copy: Path, tests: tuple[str, ...]) -> tuple[str, float, str]:
    """``killed`` (a test failed, or they ran past TIMEOUT_S) or ``survived``, the seconds taken,
    and the end of pytest's report."""
    env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    began = time.monotonic()
    try:
        command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", TIER, *tests]
        done = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return "killed (timeout)", time.monotonic() - began, ""
    outcome = "survived" if done.returncode == 0 else "killed" if done.returncode == 1 else f"error {done.returncode}"
    return outcome, time.monotonic() - began, (done.stdout + done.stderr)[-3000:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("areas", nargs="*", help="only these areas: " + ", ".join(sorted({m.area for m in MUTANTS})))
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if not args.areas or m.area in args.areas]
    if args.list:
        for mutant in chosen:
            print(f"{mutant.area:8} {mutant.path}: {mutant.what}")
        return 0
    results: list[tuple[Mutant, str]] = []
    with tempfile.TemporaryDirectory(prefix="archsearch-mutants-") as folder:
        copy = copy_of_the_repository(Path(folder))
        baseline, seconds, report = run_tests(copy, tuple(sorted({t for m in chosen for t in m.tests})))
        if baseline != "survived":
            print(f"{report}\nthe unmutated tests do not pass ({baseline}); fix them first", file=sys.stderr)
            return 2
        print(f"unmutated: pass ({seconds:.0f} s)", flush=True)
        for mutant in chosen:
            path = copy / mutant.path
            original = path.read_text()
            if original.count(mutant.old) != 1:
                outcome, seconds, report = "stale (text not found once)", 0.0, ""
            else:
                path.write_text(original.replace(mutant.old, mutant.new))
                try:
                    outcome, seconds, report = run_tests(copy, mutant.tests)
                finally:
                    path.write_text(original)
            results.append((mutant, outcome))
            print(f"{outcome:18} {seconds:5.0f} s  {mutant.area:8} {mutant.what}", flush=True)
            if outcome.startswith("error"):
                print(report, flush=True)
    counted = [(m, o) for m, o in results if o.startswith(("killed", "survived"))]
    killed = sum(o.startswith("killed") for _, o in counted)
    print(f"\nscore: {killed} of {len(counted)} mutants killed"
          + (f"; {len(results) - len(counted)} stale or in error" if len(counted) < len(results) else ""))
    return 0 if killed == len(counted) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
