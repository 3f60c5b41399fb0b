"""Analyses over result tables: Pareto fronts (and, later, scaling fits). Torch-free."""

from archsearch.analysis.pareto import pareto_front, parse_objectives

__all__ = ["pareto_front", "parse_objectives"]
