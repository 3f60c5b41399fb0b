"""Taper schedules keep the uniform model's MLP budget and have the right shape."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from archsearch.arch.taper import SHAPES, depth_groups, profile, taper_widths

FALLING = ("cosine", "linear", "sigmoid", "step_early")  # non-increasing over depth
RISING = ("reverse", "step_late")  # non-decreasing
MIRROR_OF = {"reverse": "cosine", "step_late": "step_early"}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("num_layers", [1, 2, 5, 12, 24])
def test_widths_sum_to_the_uniform_total(shape, num_layers):
    total = 8 * 37 * num_layers
    widths = taper_widths(shape=shape, ratio=3.0, num_layers=num_layers, total=total, multiple_of=8)
    assert sum(widths) == total
    assert len(widths) == num_layers
    assert all(w % 8 == 0 and w >= 8 for w in widths)


def _curve(shape: str, num_layers: int, ratio: float) -> list[float]:
    """The documented curve, written out here rather than read from taper.py: 1 + (ratio - 1) f(x),
    f falling from 1 to 0 over x = l / (L - 1), scaled to mean 1; reverse is the cosine mirrored."""
    xs = [i / (num_layers - 1) for i in range(num_layers)]
    if shape in ("cosine", "reverse"):
        falls = [(1 + math.cos(math.pi * x)) / 2 for x in xs]
    elif shape == "linear":
        falls = [1 - x for x in xs]
    else:
        sig = [1 / (1 + math.exp(-10 * (x - 0.5))) for x in xs]
        falls = [(sig[-1] - s) / (sig[-1] - sig[0]) for s in sig]
    raw = [1 + (ratio - 1) * f for f in falls]
    raw = raw[::-1] if shape == "reverse" else raw
    return [r * num_layers / sum(raw) for r in raw]


@pytest.mark.parametrize("shape", ["cosine", "linear", "sigmoid", "reverse"])
def test_tapers_are_wider_early_and_reverse_is_wider_late(shape):
    """Each shape is strictly wider at its wide end, ordered over depth, and follows its own curve
    to within one rounding step (8) at every layer.

    Planted mutation (issue 18): with ``linear``, ``sigmoid`` and ``reverse`` made to return
    uniform widths (``taper_widths`` returning ``[total // num_layers] * num_layers`` for them),
    this test fails for all three; the old ``>=`` / ``<=`` version passed. Swapping two shapes'
    curves (linear computed as cosine) fails the curve check."""
    widths = taper_widths(shape=shape, ratio=3.0, num_layers=12, total=12 * 512, multiple_of=8)
    wide_first = shape != "reverse"
    ordered = widths if wide_first else widths[::-1]
    assert ordered[0] > ordered[-1], widths
    assert all(a >= b for a, b in zip(ordered, ordered[1:])), widths
    assert ordered[0] / ordered[-1] == pytest.approx(3.0, rel=0.05), widths
    for width, rel in zip(widths, _curve(shape, 12, 3.0)):
        assert abs(width - 512 * rel) < 8, (widths, shape)


def test_cosine_runs_from_one_and_a_half_to_half_the_mean():
    rel = profile("cosine", 24, 3.0)
    assert rel[0] == pytest.approx(1.5) and rel[-1] == pytest.approx(0.5)
    assert sum(rel) / 24 == pytest.approx(1.0)


def test_uniform_is_flat_when_the_total_divides():
    assert taper_widths(shape="uniform", ratio=3.0, num_layers=4, total=4 * 64) == [64] * 4


@pytest.mark.parametrize("shape", SHAPES)
def test_one_multiple_per_layer_is_the_only_split_of_the_smallest_total(shape):
    assert taper_widths(shape=shape, ratio=3.0, num_layers=6, total=6 * 8, multiple_of=8) == [8] * 6


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


def test_the_issues_cosine_stays_monotone_after_rounding():
    # issue 9: the middle-first drift gave ..., 896, 1024, 896, ... here
    widths = taper_widths(shape="cosine", ratio=3.0, num_layers=24, total=23936, multiple_of=128)
    assert all(a >= b for a, b in zip(widths, widths[1:])), widths
    assert sum(widths) == 23936
    assert taper_widths(shape="reverse", ratio=3.0, num_layers=24, total=23936, multiple_of=128) == widths[::-1]


@pytest.mark.parametrize(("num_layers", "sizes"), [(12, (4, 4, 4)), (8, (3, 2, 3)), (4, (1, 2, 1)),
                                                   (3, (1, 1, 1)), (2, (1, 0, 1))])
def test_step_schedules_split_depth_into_thirds(num_layers, sizes):
    groups = depth_groups(num_layers)
    assert tuple(groups.count(g) for g in ("early", "middle", "late")) == sizes
    assert groups == sorted(groups, key=["early", "middle", "late"].index)


@pytest.mark.parametrize("group", ["early", "middle", "late"])
def test_a_step_schedule_widens_one_third_by_the_ratio(group):
    """TLM's three-group experiment (papers.md §1): one third of the layers wider, the rest
    narrower, total kept. 12 layers, ratio 3: weights 3 x 4 + 1 x 8 = 20 shares of 200 units."""
    widths = taper_widths(shape=f"step_{group}", ratio=3.0, num_layers=12, total=200 * 8, multiple_of=8)
    wide = {"early": range(0, 4), "middle": range(4, 8), "late": range(8, 12)}[group]
    assert widths == [240 if i in wide else 80 for i in range(12)]


def _unimodal(widths: list[int]) -> bool:
    peak = widths.index(max(widths))
    return (all(a <= b for a, b in zip(widths[:peak], widths[1:peak + 1]))
            and all(a >= b for a, b in zip(widths[peak:], widths[peak + 1:])))


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(shape=st.sampled_from(SHAPES), ratio=st.floats(1.0, 20.0), num_layers=st.integers(1, 64),
       multiple_of=st.sampled_from([1, 8, 64, 128]), extra=st.integers(0, 5000))
def test_rounded_widths_keep_the_shape_and_the_total(shape, ratio, num_layers, multiple_of, extra):
    """For any shape, ratio, depth and multiple: the total is kept, falling shapes never rise and
    rising ones never fall after rounding, the mirrored shapes are exact mirrors, the middle step
    has one peak, and (where no layer is held at one multiple) every layer is within one multiple
    of its share of the profile."""
    units = num_layers + extra
    total = units * multiple_of
    widths = taper_widths(shape=shape, ratio=ratio, num_layers=num_layers, total=total, multiple_of=multiple_of)
    assert sum(widths) == total and all(w >= multiple_of and w % multiple_of == 0 for w in widths)
    if shape in FALLING:
        assert all(a >= b for a, b in zip(widths, widths[1:])), widths
    if shape in RISING:
        assert all(a <= b for a, b in zip(widths, widths[1:])), widths
        forward = taper_widths(shape=MIRROR_OF[shape], ratio=ratio, num_layers=num_layers, total=total,
                               multiple_of=multiple_of)
        assert widths == forward[::-1]
    if shape in ("step_middle", "uniform"):
        assert _unimodal(widths), widths
    shares = [r * units / num_layers for r in profile(shape, num_layers, ratio)]
    if min(shares) >= 1:
        assert all(abs(w / multiple_of - s) < 1 for w, s in zip(widths, shares)), (widths, shares)


def test_the_cached_widths_are_the_computed_ones_and_cannot_be_changed_through_a_result():
    """``_widths`` is memoised (the solver asks for the same totals at many d_model): past the
    cache, on every shape (mirrored ones reverse a cached tuple), the widths equal a fresh
    computation, and editing a returned list changes nothing the next caller gets."""
    from archsearch.arch import taper

    taper._widths.cache_clear()
    for shape in SHAPES:
        for num_layers, units in ((1, 3), (5, 17), (12, 100)):
            first = taper_widths(shape=shape, ratio=3.0, num_layers=num_layers, total=8 * units)
            first[0] += 8  # a caller's edit
            hits = taper._widths.cache_info().hits
            cached = taper_widths(shape=shape, ratio=3.0, num_layers=num_layers, total=8 * units)
            assert taper._widths.cache_info().hits > hits  # this one came from the cache
            taper._widths.cache_clear()
            fresh = taper_widths(shape=shape, ratio=3.0, num_layers=num_layers, total=8 * units)
            assert cached == fresh and sum(fresh) == 8 * units, (shape, num_layers)
