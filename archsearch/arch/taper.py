"""Taper schedules: how a fixed total of MLP width is spread over depth.

Tapered Language Models (https://arxiv.org/abs/2606.23670) give early layers
more MLP width than late ones under a fixed parameter budget; a cosine from
1.5x to 0.5x of the mean width worked best there. Here a schedule is a profile
over depth, scaled so the widths sum to exactly the uniform model's total.
``ratio`` is the widest layer over the narrowest (3.0 gives 1.5x -> 0.5x).

Smooth shapes (``cosine``, ``linear``, ``sigmoid``) fall from the first layer
to the last; ``reverse`` is the cosine mirrored. The step shapes are the
paper's three-group experiment: the layers split into early, middle and late
thirds and one third is ``ratio`` times as wide as the other two
(``step_early``, ``step_middle``, ``step_late``).

Torch-free: the planner calls this for every trial.
"""

from __future__ import annotations

import math
from functools import lru_cache

from archsearch.space.schema import TAPER_SHAPES

SHAPES = TAPER_SHAPES
# shapes defined as the exact mirror (reversed widths) of another
MIRRORS = {"reverse": "cosine", "step_late": "step_early"}
# shapes that are neither non-increasing nor mirrored: rounding ties go to the middle layers
CENTRED = ("uniform", "step_middle")


@lru_cache(maxsize=4096)
def profile(shape: str, num_layers: int, ratio: float) -> tuple[float, ...]:
    """Relative widths over depth with mean 1; widest over narrowest is ``ratio``."""
    if shape not in SHAPES:
        raise ValueError(f"unknown taper shape {shape!r}; expected one of {SHAPES}")
    if shape in MIRRORS:
        return profile(MIRRORS[shape], num_layers, ratio)[::-1]
    if num_layers == 1 or shape == "uniform":
        return (1.0,) * num_layers
    if shape.startswith("step_"):
        raw = [ratio if group == shape[len("step_"):] else 1.0 for group in depth_groups(num_layers)]
    else:
        raw = [1 + (ratio - 1) * f for f in _falls(shape, num_layers)]
    mean = sum(raw) / num_layers
    return tuple(r / mean for r in raw)


def _falls(shape: str, num_layers: int) -> list[float]:
    """The smooth shapes over x = l / (L - 1), each falling from 1 at the first layer to 0 at the last."""
    xs = [i / (num_layers - 1) for i in range(num_layers)]
    if shape == "cosine":
        return [0.5 * (1 + math.cos(math.pi * x)) for x in xs]
    if shape == "linear":
        return [1 - x for x in xs]
    sig = [1 / (1 + math.exp(-10 * (x - 0.5))) for x in xs]
    lo, hi = sig[0], sig[-1]
    return [(hi - s) / (hi - lo) for s in sig]


def depth_groups(num_layers: int) -> list[str]:
    """Each layer's third: "early", "middle" or "late".

    The early and late groups have round(L / 3) layers each, so the late one
    mirrors the early one; the middle takes the rest (12 layers: 4, 4, 4;
    8: 3, 2, 3; 4: 1, 2, 1; with 2 layers the middle is empty).
    """
    edge = round(num_layers / 3)
    return ["early" if i < edge else "late" if i >= num_layers - edge else "middle" for i in range(num_layers)]


def taper_widths(*, shape: str, ratio: float, num_layers: int, total: int, multiple_of: int = 8) -> list[int]:
    """Per-layer widths, each a multiple of ``multiple_of``, summing to ``total``.

    ``total`` must be a multiple of ``multiple_of`` and leave every layer at
    least one multiple. Each layer gets the floor or the ceiling of its share
    (largest remainders take the spare multiples), so the rounded widths keep
    the profile's order: a falling shape stays non-increasing, ``reverse`` and
    ``step_late`` are exactly the reversed widths of ``cosine`` and
    ``step_early``. A layer whose share is under one multiple gets one and the
    others share the rest.
    """
    if total % multiple_of:
        raise ValueError(f"total width {total} is not a multiple of {multiple_of}")
    if total // multiple_of < num_layers:
        raise ValueError(f"total width {total} cannot give {num_layers} layers {multiple_of} each")
    return list(_widths(shape, ratio, num_layers, total // multiple_of, multiple_of))


# the solver asks for the same few totals at many d_model
@lru_cache(maxsize=8192)
def _widths(shape: str, ratio: float, num_layers: int, units: int, multiple_of: int) -> tuple[int, ...]:
    if shape in MIRRORS:
        return _widths(MIRRORS[shape], ratio, num_layers, units, multiple_of)[::-1]
    counts = _apportion(profile(shape, num_layers, ratio), units, centred=shape in CENTRED)
    return tuple(c * multiple_of for c in counts)


def _apportion(weights: tuple[float, ...], units: int, *, centred: bool) -> list[int]:
    """``units`` split over layers in proportion to ``weights``, each at least 1 (largest remainder).

    Ties between equal remainders go to the earlier layer (so a falling profile
    stays non-increasing) or, when ``centred``, to the one nearer the middle.
    """
    n = len(weights)
    fixed: set[int] = set()  # layers held at one unit because their share is below it
    free = list(range(n))
    while True:
        scale = (units - len(fixed)) / sum(weights[i] for i in free)
        low = [i for i in free if weights[i] * scale < 1]
        if not low:
            break
        fixed.update(low)
        free = [i for i in free if i not in fixed]
        if not free:  # units == n: one each
            return [1] * n
    counts = [1] * n
    remainders = []
    for i in free:
        share = weights[i] * scale
        counts[i] = int(share)
        remainders.append((counts[i] - share, abs(i - (n - 1) / 2) if centred else i, i))
    spare = units - sum(counts)
    if spare:
        for _, _, i in sorted(remainders)[:spare]:
            counts[i] += 1
    return counts
