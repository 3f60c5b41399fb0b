"""The quickstart's first picture shows the effect it demonstrates: with its
own recipe and data, a bigger model reaches a lower validation loss."""

from __future__ import annotations

from pathlib import Path

import pytest

import archsearch as A
from archsearch.train import train_trial

QUICKSTART = Path(__file__).resolve().parents[1] / "studies" / "quickstart.yaml"


@pytest.mark.slow
def test_uniform_arm_loss_falls_with_size():
    """The uniform arm's four rungs, trained as `archsearch run` trains them
    (same plan, recipe, data and seed; one thread each, without Ray). At the
    old 150 steps the 400k model ended above the 180k one (2.54 vs 2.38)."""
    trials = sorted((t for t in A.plan(A.load_study(QUICKSTART)) if t.axes["taper.shape"] == "uniform"),
                    key=lambda t: t.params)
    assert len(trials) == 4
    losses = [train_trial(spec=t.spec, recipe=t.recipe, data=t.data, seed=t.seed, threads=1).val_loss
              for t in trials]
    assert all(bigger < smaller - 0.01 for smaller, bigger in zip(losses, losses[1:])), losses
