"""Retail Bayesian structural time series with Nerlove-Arrow goodwill (thesis sec. 1.2)."""

from .allocation import allocate_budget, pareto_frontier
from .model import RetailBSTS, SpikeSlabNormal, goodwill_offset
from .simulate import RetailData, simulate_retail

__all__ = [
    "RetailBSTS",
    "RetailData",
    "SpikeSlabNormal",
    "allocate_budget",
    "goodwill_offset",
    "pareto_frontier",
    "simulate_retail",
]
