"""Stochastic-gradient MCMC with repulsive forces (thesis sections 2.2-2.3)."""

from ..errors import SamplerDivergenceError
from ..potential import LogJointMessenger, ParticlePotential, SupportMap
from ..tracing import ModelNotTraceableError
from .adaptation import StepSizeAdaptation, bias_bounded_step_size, stationary_variance_error
from .distributed import RankFailedError, Shard
from .kernels import (
    KERNELS,
    SGHMC,
    SGLD,
    AdamSGLD,
    PreconditionedSGHMC,
    SGMCMCKernel,
    get_kernel,
)
from .repulsion import Coupling, RBFKernel, stein_coupling
from .schedules import ConstantStepSize, CyclicalStepSize, PolynomialDecay
from .updates import (
    SAMPLERS,
    Sampler,
    adam_sgld_update,
    get_sampler,
    preconditioned_sghmc_update,
    sghmc_update,
    sgld_update,
)

__all__ = [
    "AdamSGLD",
    "KERNELS",
    "LogJointMessenger",
    "ModelNotTraceableError",
    "SAMPLERS",
    "Sampler",
    "get_kernel",
    "get_sampler",
    "ConstantStepSize",
    "Coupling",
    "CyclicalStepSize",
    "ParticlePotential",
    "PolynomialDecay",
    "PreconditionedSGHMC",
    "RBFKernel",
    "RankFailedError",
    "SGHMC",
    "SGLD",
    "SGMCMCKernel",
    "SamplerDivergenceError",
    "Shard",
    "StepSizeAdaptation",
    "SupportMap",
    "adam_sgld_update",
    "bias_bounded_step_size",
    "preconditioned_sghmc_update",
    "sghmc_update",
    "sgld_update",
    "stein_coupling",
    "stationary_variance_error",
]
