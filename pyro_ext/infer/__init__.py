"""Inference: stochastic-gradient MCMC kernels with repulsion, their compound with Gibbs
moves on discrete sites, a particle-aware MCMC,
variationally inferred sampling (VIS), and natural-gradient VI (IVON, VOGN, VON)."""

from .errors import (
    DivergenceError,
    EscapedParticleWarning,
    SamplerDivergenceError,
    SlowMixingWarning,
)
from .evidence import ELBOEstimate, elbo_estimate
from .gibbs import Gibbs
from .mcmc import MCMC
from .ngvi import NaturalGradientVI, NGVIDivergenceError
from .potential import PerParticle
from .sgmcmc import (
    SGHMC,
    SGLD,
    AdamSGLD,
    ConstantStepSize,
    CyclicalStepSize,
    ModelNotTraceableError,
    PolynomialDecay,
    PreconditionedSGHMC,
    RankFailedError,
    RBFKernel,
    SGMCMCKernel,
)
from .tuning import StepSizeTrial, StepSizeTuning, tune_step_size
from .vis import VIS, VISDivergenceError

__all__ = [
    "ELBOEstimate",
    "elbo_estimate",
    "AdamSGLD",
    "PreconditionedSGHMC",
    "PerParticle",
    "ConstantStepSize",
    "CyclicalStepSize",
    "DivergenceError",
    "Gibbs",
    "MCMC",
    "NGVIDivergenceError",
    "NaturalGradientVI",
    "ModelNotTraceableError",
    "PolynomialDecay",
    "RBFKernel",
    "RankFailedError",
    "SGHMC",
    "SGLD",
    "SGMCMCKernel",
    "SamplerDivergenceError",
    "SlowMixingWarning",
    "EscapedParticleWarning",
    "StepSizeTrial",
    "StepSizeTuning",
    "VIS",
    "VISDivergenceError",
    "tune_step_size",
]
