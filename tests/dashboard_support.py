"""A small store written by hand for the dashboard and report tests (no Ray, no torch).

Two families: transformers over three taper shapes, and looped hybrids with a
loop count (an axis transformers do not have), each arm at three sizes, with
learning curves whose loss falls with size.
"""

from __future__ import annotations

import math

import archsearch as A

HOSTILE = "<img src=x onerror=alert(1)>"
SIZES = (1_000, 4_000, 16_000)


def spec(family: str, widths: list[int], *, loops: int | None = None) -> dict:
    mixers = ["mamba", "attention"] if family == "hybrid" else ["attention"]
    layers = [{"mixer": mixers[i % len(mixers)], "mlp": "swiglu", "mlp_width": w, "options": {}}
              for i, w in enumerate(widths)]
    return {"family": family, "vocab_size": 256, "d_model": 16, "num_heads": 2, "layers": layers,
            "structure": "looped" if loops else "stack", "options": {"loops": loops} if loops else {}}


def trial(trial_id: str, *, family: str, axes: dict, params: int, loops: int | None = None) -> dict:
    widths = [48, 32, 16] if axes.get("taper.shape") != "uniform" else [32, 32, 32]
    return dict(trial_id=trial_id, spec=spec(family, widths, loops=loops), axes={"family": family, **axes}, seed=0,
                match="params", target=float(params), params=params, total_params=params + 4096,
                flops_per_token=6.0 * params, match_error=0.001, achieved=float(params), d_model=16, num_layers=3,
                recipe={"steps": 1}, data={"kind": "text"})


def result(val_loss: float, *, points: int = 5) -> dict:
    curve = [dict(step=10 * (i + 1), tokens=640 * (i + 1), train_loss=val_loss + 1.0 / (i + 1),
                  val_loss=val_loss + 1.0 / (i + 1) - 0.1, val_accuracy=0.3, lr=1e-3) for i in range(points)]
    return dict(train_loss=val_loss - 0.05, val_loss=val_loss, val_accuracy=0.3, steps=10 * points,
                tokens=640 * points, wall_time_s=1.0, tokens_per_s=640.0, curve=curve)


def train_points(trial_id: str, val_loss: float, *, steps: int = 50, every: int = 5) -> list[tuple[str, dict]]:
    """The training-loss rows a run logs every ``every`` steps, falling towards ``val_loss``."""
    return [(trial_id, dict(step=step, tokens=64 * step, train_loss=val_loss + 5.0 / step, lr=1e-3,
                            tokens_per_s=640.0)) for step in range(every, steps + 1, every)]


def arms(shapes=("uniform", "cosine", "reverse")) -> list[tuple[str, dict, int | None]]:
    """(family, axes, loops) of every arm."""
    out = [("transformer", {"taper.shape": shape}, None) for shape in shapes]
    return out + [("hybrid", {"taper.shape": "cosine", "loops": loops}, loops) for loops in (2, 4)]


def loss_of(arm: int, params: int) -> float:
    """A power law per arm: 2 + (3 + arm / 2) * N^-0.3."""
    return 2.0 + (3.0 + arm / 2) * math.pow(params, -0.3)


def write_store(path, *, study: str = "s", shapes=("uniform", "cosine", "reverse"), finish: bool = True) -> list[str]:
    """A store at ``path`` with every arm at every size; returns the trial ids."""
    ids = []
    with A.open_store(path) as store:
        store.add_study(name=study, path=f"{study}.yaml", config={})
        planned = []
        for i, (family, axes, loops) in enumerate(arms(shapes)):
            for params in SIZES:
                trial_id = f"{study}-{family}-{i}-{params}"
                planned.append(trial(trial_id, family=family, axes=axes, params=params, loops=loops))
                ids.append((trial_id, loss_of(i, params)))
        store.add_trials(study, planned)
        if finish:
            for trial_id, loss in ids:
                store.add_train_points(train_points(trial_id, loss))
                store.finish(trial_id, result(loss))
    return [trial_id for trial_id, _ in ids]
