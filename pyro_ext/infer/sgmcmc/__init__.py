"""Stochastic-gradient MCMC with repulsive forces (thesis sections 2.2-2.3)."""

from .kernels import SGHMC, SGLD, AdamSGLD, SGMCMCKernel
from .potential import ParticlePotential, SamplerDivergenceError
from .repulsion import Coupling, RBFKernel, stein_coupling
from .schedules import ConstantStepSize, CyclicalStepSize, PolynomialDecay
from .updates import adam_sgld_update, sghmc_update, sgld_update

__all__ = [
    "AdamSGLD",
    "ConstantStepSize",
    "Coupling",
    "CyclicalStepSize",
    "ParticlePotential",
    "PolynomialDecay",
    "RBFKernel",
    "SGHMC",
    "SGLD",
    "SGMCMCKernel",
    "SamplerDivergenceError",
    "adam_sgld_update",
    "sghmc_update",
    "sgld_update",
    "stein_coupling",
]
