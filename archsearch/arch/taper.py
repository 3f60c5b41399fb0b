"""Taper schedules: how a fixed total of MLP width is spread over depth.

Tapered Language Models (https://arxiv.org/abs/2606.23670) give early layers
more MLP width than late ones under a fixed parameter budget; a cosine from
1.5x to 0.5x of the mean width worked best there. Here a schedule is a profile
over depth, scaled so the widths sum to exactly the uniform model's total.
``ratio`` is the widest layer over the narrowest (3.0 gives 1.5x -> 0.5x).

Torch-free: the planner calls this for every trial.
"""

from __future__ import annotations

import math
from functools import lru_cache

SHAPES = ("uniform", "cosine", "linear", "sigmoid", "reverse")


@lru_cache(maxsize=4096)
def profile(shape: str, num_layers: int, ratio: float) -> tuple[float, ...]:
    """Relative widths over depth with mean 1; first over last is ``ratio``."""
    if shape not in SHAPES:
        raise ValueError(f"unknown taper shape {shape!r}; expected one of {SHAPES}")
    if num_layers == 1 or shape == "uniform":
        return (1.0,) * num_layers
    xs = [i / (num_layers - 1) for i in range(num_layers)]
    # each falls from 1 at the first layer to 0 at the last
    if shape in ("cosine", "reverse"):
        falls = [0.5 * (1 + math.cos(math.pi * x)) for x in xs]
    elif shape == "linear":
        falls = [1 - x for x in xs]
    else:
        sig = [1 / (1 + math.exp(-10 * (x - 0.5))) for x in xs]
        lo, hi = sig[0], sig[-1]
        falls = [(hi - s) / (hi - lo) for s in sig]
    raw = [1 + (ratio - 1) * f for f in falls]
    if shape == "reverse":
        raw.reverse()
    mean = sum(raw) / num_layers
    return tuple(r / mean for r in raw)


def taper_widths(*, shape: str, ratio: float, num_layers: int, total: int, multiple_of: int = 8) -> list[int]:
    """Per-layer widths, each a multiple of ``multiple_of``, summing to ``total``.

    ``total`` must be a multiple of ``multiple_of`` and leave every layer at
    least one multiple. Rounding drift is pushed into the middle layers, where
    it changes the shape least.
    """
    if total % multiple_of:
        raise ValueError(f"total width {total} is not a multiple of {multiple_of}")
    units = total // multiple_of
    if units < num_layers:
        raise ValueError(f"total width {total} cannot give {num_layers} layers {multiple_of} each")
    rel = profile(shape, num_layers, ratio)
    counts = [max(1, round(r * units / num_layers)) for r in rel]
    drift = units - sum(counts)
    order = _middle_first(num_layers)
    step = 1 if drift > 0 else -1
    while drift:
        moved = False
        for i in order:
            if drift == 0:
                break
            if counts[i] + step >= 1:
                counts[i] += step
                drift -= step
                moved = True
        if not moved:  # cannot happen while units >= num_layers
            raise ValueError("taper rounding failed")
    return [c * multiple_of for c in counts]


@lru_cache(maxsize=1024)
def _middle_first(num_layers: int) -> tuple[int, ...]:
    return tuple(sorted(range(num_layers), key=lambda i: (abs(i - (num_layers - 1) / 2), i)))
