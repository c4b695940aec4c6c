"""Inference: stochastic-gradient MCMC kernels with repulsion and a particle-aware MCMC."""

from .mcmc import MCMC
from .sgmcmc import (
    SGHMC,
    SGLD,
    AdamSGLD,
    ConstantStepSize,
    CyclicalStepSize,
    PolynomialDecay,
    RBFKernel,
    SamplerDivergenceError,
    SGMCMCKernel,
)

__all__ = [
    "AdamSGLD",
    "ConstantStepSize",
    "CyclicalStepSize",
    "MCMC",
    "PolynomialDecay",
    "RBFKernel",
    "SGHMC",
    "SGLD",
    "SGMCMCKernel",
    "SamplerDivergenceError",
]
