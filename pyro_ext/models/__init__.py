"""Models: Bayesian neural networks (thesis sections 1.3.2 and 2.3.3), the variational
autoencoders of the VIS experiments (section 2.4.2) and the retail Bayesian structural time
series of chapter 1.2 (``pyro_ext.models.bsts``)."""

from . import bnn, bsts, vae
from .bnn import (
    BayesianMLP,
    expected_calibration_error,
    log_predictive_density,
    predictive_moments,
    rmse,
)
from .bsts import RetailBSTS, simulate_retail
from .vae import CVAE, VAE, importance_log_likelihood, refined_mean_proposal

__all__ = [
    "BayesianMLP",
    "CVAE",
    "RetailBSTS",
    "VAE",
    "bnn",
    "bsts",
    "expected_calibration_error",
    "importance_log_likelihood",
    "log_predictive_density",
    "predictive_moments",
    "refined_mean_proposal",
    "rmse",
    "simulate_retail",
    "vae",
]
