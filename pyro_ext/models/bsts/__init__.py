"""
Retail Bayesian structural time series with Nerlove-Arrow goodwill (thesis sec. 1.2).

The package is split by concern: ``distributions`` (the spike-and-slab prior, the polar
noise scales), ``goodwill`` (the eq. 1.4 recursion), ``model`` (:class:`RetailBSTS`: its
priors and the model function), ``collapsed`` (the point mass's likelihood with the
coefficients integrated out, and its indicator moves), ``fit`` (data preparation, the lag
chosen by the evidence, the samplers), ``forecast`` (the posterior predictive),
``attribution`` (contributions and ROAS), ``allocation`` (budget allocation) and
``simulate`` (data with known truth). ``collapsed``, ``fit`` and ``forecast`` are mixins of
:class:`RetailBSTS`, so its methods stay where a user looks for them.
"""

from .allocation import (
    AllocationResult,
    InfeasibleAllocationError,
    ParetoFrontier,
    StrategyEvaluation,
    allocate_budget,
    evaluate_strategies,
    pareto_frontier,
)
from .attribution import (
    channel_contributions,
    contribution_summary,
    plot_contributions,
    response_curves,
    roas,
    sales_components,
)
from .model import (
    THESIS_MODEL,
    ChannelEffectPrior,
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
    "ChannelEffectPrior",
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
    "response_curves",
    "roas",
    "sales_components",
    "simulate_retail",
]
