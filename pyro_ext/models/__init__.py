"""Models: Bayesian neural networks (thesis sections 1.3.2 and 2.3.3)."""

from . import bnn
from .bnn import BayesianMLP, expected_calibration_error, log_predictive_density, predictive_moments, rmse

__all__ = [
    "BayesianMLP",
    "bnn",
    "expected_calibration_error",
    "log_predictive_density",
    "predictive_moments",
    "rmse",
]
