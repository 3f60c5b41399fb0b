"""For the analysis tests: a store of finished trials whose losses follow known
scaling laws, and the CLI's one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

import archsearch as A
from archsearch.cli import app

# family -> (E, A, alpha) of L(N) = E + A / N^alpha
LAWS = {"transformer": (1.5, 40.0, 0.30), "mamba": (1.4, 60.0, 0.32)}
SIZES = [2e5, 5e5, 1e6, 2e6, 5e6, 1e7, 2e7]


def law_loss(family: str, n: float) -> float:
    e, a, alpha = LAWS[family]
    return e + a * n**-alpha


def write_store(path: Path, *, noise: float = 0.003, seed: int = 0, trials: list[dict] | None = None) -> Path:
    """One completed trial per family and size (or the given ``trials``: family,
    params, achieved, target, val_loss, tokens_per_s; optionally axes, seed and
    train_loss). Losses carry a little multiplicative noise; each trial trains
    on 20 tokens per parameter."""
    rng = np.random.default_rng(seed)
    if trials is None:
        trials = [dict(family=f, params=int(n), achieved=float(int(n)), target=float(n),
                       val_loss=law_loss(f, n) * (1 + noise * rng.standard_normal()), tokens_per_s=1e9 / n)
                  for f in LAWS for n in SIZES]
    with A.open_store(path) as store:
        store.add_study(name="scaling", path="scaling.yaml", config={"budget": {"tolerance": 0.05}})
        rows = [dict(trial_id=f"t{i}", spec={"family": t["family"], "layers": [{"mlp_width": 8}]},
                     axes=t.get("axes", {"family": t["family"], "taper": "cosine" if i % 2 else "uniform"}),
                     seed=t.get("seed", 0),
                     match="params", target=t["target"], achieved=t["achieved"], params=t["params"],
                     total_params=t["params"] + 1000, flops_per_token=6.0 * t["params"],
                     match_error=t["achieved"] / t["target"] - 1, d_model=16, num_layers=2,
                     recipe={"steps": 1, "lr": 1e-3}, data={"kind": "text"}) for i, t in enumerate(trials)]
        store.add_trials("scaling", rows)
        for i, t in enumerate(trials):
            store.finish(f"t{i}", dict(train_loss=t.get("train_loss", t["val_loss"]), val_loss=t["val_loss"],
                                       val_accuracy=0.5, steps=10, tokens=20 * t["params"], wall_time_s=1.0,
                                       tokens_per_s=t["tokens_per_s"], curve=[]))
    return path


def one_line_error(*args: str) -> str:
    """Run the CLI, expect exit 2 and a single line; return that line."""
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


def cli_json(*args: str) -> dict:
    """Run the CLI with ``--json``; expect success and return the parsed output."""
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


# A looped point's three arms under the two protocols, as (axes, match, layers, (E, A, alpha)) of
# L(N) = E + A / N^alpha: the looped arm (2 layers looped twice), its iso-param baseline (the same
# 2 layers once) and its iso-FLOP baseline (4 distinct layers), with one axes dict for both baselines.
PROTOCOL_ARMS = {
    "looped": ({"arm": "looped"}, "params", 2, (2.0, 30.0, 0.30)),
    "param": ({"arm": "baseline"}, "iso_param", 2, (2.2, 30.0, 0.25)),
    "flop": ({"arm": "baseline"}, "iso_flop", 4, (1.9, 30.0, 0.35)),
}


def protocol_loss(arm: str, n: float, seed: int) -> float:
    e, a, alpha = PROTOCOL_ARMS[arm][3]
    return e + a * n**-alpha + seed / 100


def protocol_store(path: Path, *, sizes=(20_000,), seeds=range(3)) -> Path:
    """A looped study run under ``budget.protocol`` iso_param and iso_flop into
    one store: each of ``PROTOCOL_ARMS`` at each size and seed (loss
    ``protocol_loss``), the looped arms matched on params."""
    rows, losses = [], {}
    for name, (axes, match, layers, _) in PROTOCOL_ARMS.items():
        for n in sizes:
            for seed in seeds:
                trial_id = f"{name}-{n}-{seed}"
                spec = {"family": "looped", "structure": "looped" if name == "looped" else "stack",
                        "layers": [{"mixer": "mamba", "mlp_width": 8}] * layers}
                rows.append(dict(trial_id=trial_id, spec=spec, axes={"family": "looped", "loops": 2, **axes},
                                 seed=seed, match=match, target=float(n), achieved=float(n), params=int(n),
                                 total_params=int(n) + 1000, flops_per_token=6.0 * n, match_error=0.0, d_model=16,
                                 num_layers=layers, recipe={"steps": 1}, data={"kind": "task"}))
                losses[trial_id] = protocol_loss(name, n, seed)
    with A.open_store(path) as store:
        store.add_study(name="loop", path="loop.yaml", config={})
        store.add_trials("loop", rows)
        for trial_id, loss in losses.items():
            store.finish(trial_id, dict(train_loss=loss, val_loss=loss, val_accuracy=0.5, steps=10, tokens=20_000,
                                        wall_time_s=1.0, tokens_per_s=1.0, curve=[]))
    return path
