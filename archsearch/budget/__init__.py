"""Exact counts, analytic FLOPs and the width solver."""

from archsearch.budget.count import count_params, flops_per_token, state_size
from archsearch.budget.solve import BudgetError, Solution, solve

__all__ = ["BudgetError", "Solution", "count_params", "flops_per_token", "solve", "state_size"]
