"""Pareto fronts: non-dominated rows only, with min and max objectives."""

from __future__ import annotations

import pytest

from archsearch.analysis import pareto_front, parse_objectives

ROWS = [dict(id=i, loss=loss, params=p, speed=s) for i, (loss, p, s) in enumerate(
    [(3.0, 10, 5.0), (2.5, 20, 4.0), (2.6, 30, 9.0), (2.0, 40, 1.0), (3.5, 5, 2.0), (2.5, 25, 3.0)])]


def test_front_is_the_non_dominated_rows():
    front = pareto_front(ROWS, [("loss", "min"), ("params", "min")])
    assert [r["id"] for r in front] == [3, 1, 0, 4]


def test_max_objectives_flip_the_direction():
    front = pareto_front(ROWS, parse_objectives("loss,speed:max"))
    assert {r["id"] for r in front} == {1, 2, 3}  # 2 beats 0 on both


def test_per_second_columns_default_to_max():
    assert parse_objectives("val_loss,tokens_per_s") == [("val_loss", "min"), ("tokens_per_s", "max")]


def test_unknown_column_and_direction_are_refused():
    with pytest.raises(ValueError, match="no column"):
        pareto_front(ROWS, [("nope", "min")])
    with pytest.raises(ValueError, match="min or max"):
        parse_objectives("loss:up")
