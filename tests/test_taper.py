"""Taper schedules keep the uniform model's MLP budget and have the right shape."""

from __future__ import annotations

import pytest

from archsearch.arch.taper import SHAPES, profile, taper_widths


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("num_layers", [1, 2, 5, 12, 24])
def test_widths_sum_to_the_uniform_total(shape, num_layers):
    total = 8 * 37 * num_layers
    widths = taper_widths(shape=shape, ratio=3.0, num_layers=num_layers, total=total, multiple_of=8)
    assert sum(widths) == total
    assert len(widths) == num_layers
    assert all(w % 8 == 0 and w >= 8 for w in widths)


@pytest.mark.parametrize("shape", ["cosine", "linear", "sigmoid"])
def test_tapers_are_wider_early_and_reverse_is_wider_late(shape):
    widths = taper_widths(shape=shape, ratio=3.0, num_layers=12, total=12 * 512, multiple_of=8)
    assert all(a >= b for a, b in zip(widths, widths[1:]))
    reverse = taper_widths(shape="reverse", ratio=3.0, num_layers=12, total=12 * 512, multiple_of=8)
    assert all(a <= b for a, b in zip(reverse, reverse[1:]))


def test_cosine_runs_from_one_and_a_half_to_half_the_mean():
    rel = profile("cosine", 24, 3.0)
    assert rel[0] == pytest.approx(1.5) and rel[-1] == pytest.approx(0.5)
    assert sum(rel) / 24 == pytest.approx(1.0)


def test_uniform_is_flat_when_the_total_divides():
    assert taper_widths(shape="uniform", ratio=3.0, num_layers=4, total=4 * 64) == [64] * 4


def test_impossible_totals_are_refused():
    with pytest.raises(ValueError, match="multiple"):
        taper_widths(shape="cosine", ratio=3.0, num_layers=4, total=100, multiple_of=8)
    with pytest.raises(ValueError, match="cannot give"):
        taper_widths(shape="cosine", ratio=3.0, num_layers=4, total=16, multiple_of=8)


def test_unknown_shape_is_refused():
    with pytest.raises(ValueError, match="unknown taper shape"):
        profile("wavy", 4, 2.0)


def test_reproduces_the_reference_cosine_taper():
    # papers.md §11: L = 24, mean width 4096, cosine 1.5x -> 0.5x, multiples of 64
    widths = taper_widths(shape="cosine", ratio=3.0, num_layers=24, total=24 * 4096, multiple_of=64)
    assert widths[:3] == [6144, 6144, 6080] and widths[-2:] == [2048, 2048]
    assert sum(widths) == 24 * 4096
