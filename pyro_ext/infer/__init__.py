"""Inference: stochastic-gradient MCMC kernels with repulsion, a particle-aware MCMC, and
variationally inferred sampling (VIS)."""

from .mcmc import MCMC
from .sgmcmc import (
    SGHMC,
    SGLD,
    AdamSGLD,
    ConstantStepSize,
    CyclicalStepSize,
    ModelNotTraceableError,
    PolynomialDecay,
    RBFKernel,
    SamplerDivergenceError,
    SGMCMCKernel,
)
from .vis import VIS

__all__ = [
    "AdamSGLD",
    "ConstantStepSize",
    "CyclicalStepSize",
    "MCMC",
    "ModelNotTraceableError",
    "PolynomialDecay",
    "RBFKernel",
    "SGHMC",
    "SGLD",
    "SGMCMCKernel",
    "SamplerDivergenceError",
    "VIS",
]
