"""Retail Bayesian structural time series with Nerlove-Arrow goodwill (thesis sec. 1.2)."""

from .allocation import (
    AllocationResult,
    InfeasibleAllocationError,
    ParetoFrontier,
    StrategyEvaluation,
    allocate_budget,
    evaluate_strategies,
    pareto_frontier,
)
from .attribution import channel_contributions, contribution_summary, plot_contributions, roas
from .model import (
    THESIS_MODEL,
    NoiseScales,
    PolarTransform,
    RetailBSTS,
    SpikeSlabNormal,
    goodwill_offset,
)
from .simulate import RetailData, simulate_retail

__all__ = [
    "THESIS_MODEL",
    "AllocationResult",
    "InfeasibleAllocationError",
    "NoiseScales",
    "ParetoFrontier",
    "PolarTransform",
    "RetailBSTS",
    "RetailData",
    "SpikeSlabNormal",
    "StrategyEvaluation",
    "allocate_budget",
    "channel_contributions",
    "contribution_summary",
    "plot_contributions",
    "evaluate_strategies",
    "goodwill_offset",
    "pareto_frontier",
    "roas",
    "simulate_retail",
]
