"""Completed trial rows on a known law, for the report and figure tests."""

from __future__ import annotations

import json


def rows_of(arms: dict[str, tuple[list[int], float]], seeds: int = 2) -> list[dict]:
    """Completed transformer rows: per taper shape, trials at each of its
    sizes (``seeds`` each) on the law 2 + scale * N^-0.3."""
    layers = json.dumps({"family": "transformer", "layers": [{"mixer": "attention", "mlp_width": 32}]})
    out = []
    for shape, (sizes, scale) in arms.items():
        axes = {"family": "transformer", "taper.shape": shape}
        for size in sizes:
            for seed in range(seeds):
                out.append(dict(trial_id=f"{shape}-{size}-{seed}", family="transformer", axes=axes, params=size,
                                target=size, match="params", achieved=size, match_error=0.0, d_model=16,
                                num_layers=1, val_loss=2 + scale * size ** -0.3 * (1 + seed / 1000),
                                tokens_per_s=1.0, spec=layers))
    return out
