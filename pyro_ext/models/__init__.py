"""Models: Bayesian neural networks (thesis sections 1.3.2 and 2.3.3) and the variational
autoencoders of the VIS experiments (section 2.4.2)."""

from . import bnn, vae
from .bnn import (
    BayesianMLP,
    expected_calibration_error,
    log_predictive_density,
    predictive_moments,
    rmse,
)
from .vae import CVAE, VAE, importance_log_likelihood

__all__ = [
    "BayesianMLP",
    "CVAE",
    "VAE",
    "bnn",
    "expected_calibration_error",
    "importance_log_likelihood",
    "log_predictive_density",
    "predictive_moments",
    "rmse",
    "vae",
]
